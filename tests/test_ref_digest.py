"""core/refdigest.py: a segment's serial is never another's, even where CPython gives a
new segment the address (``id``) of a freed one, and the weak map forgets a segment with
it. (The digest against a live server: tests/server/test_server_bundles.py.)"""

from __future__ import annotations

import gc

from gitspout.server.core import refdigest
from gitspout.server.store.packedrefs import RefSegment


def test_serials_survive_address_reuse() -> None:
    gc.collect()
    before = len(refdigest._serials)
    ids, serials = set(), set()
    for i in range(200):
        seg = RefSegment(b"%040x refs/heads/b%d\n" % (i, i), 40)
        ids.add(id(seg))
        with refdigest._lock:
            n = refdigest._serial(seg)
            assert refdigest._serial(seg) == n  # one serial for its whole life
        serials.add(n)
        del seg
    assert len(ids) < 200  # addresses were reused: a digest of ids would have matched
    assert len(serials) == 200  # serials never are
    gc.collect()
    assert len(refdigest._serials) == before  # freed segments left the map
