"""core/refdigest.py: a segment's serial is never another's, even where CPython gives a
new segment the address (``id``) of a freed one, and the weak map forgets a segment with
it. (The digest against a live server: tests/server/test_server_bundles.py.)"""

from __future__ import annotations

import gc
import weakref

from gitspout.server.core import refdigest
from gitspout.server.store.packedrefs import RefSegment


def test_serials_survive_address_reuse() -> None:
    ids, serials, gone = set(), set(), []
    for i in range(200):
        seg = RefSegment(b"%040x refs/heads/b%d\n" % (i, i), 40)
        ids.add(id(seg))
        with refdigest._lock:
            n = refdigest._serial(seg)
            assert refdigest._serial(seg) == n  # one serial for its whole life
        serials.add(n)
        gone.append(weakref.ref(seg))
        del seg
    assert len(ids) < 200  # addresses were reused: a digest of ids would have matched
    assert len(serials) == 200  # serials never are
    gc.collect()
    assert all(ref() is None for ref in gone)
    with refdigest._lock:  # freed segments left the map (no other test's are looked at)
        assert not [s for s in refdigest._serials.values() if s in serials]
