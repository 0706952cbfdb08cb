"""store/packedrefs.py ``RefSegment.serial``, what core/refdigest.py digests: a segment's
serial is never another's, even where CPython gives a new segment the address (``id``) of
a freed one. (The digest against a live server: tests/server/test_server_bundles.py.)"""

from __future__ import annotations

from gitspout.server.store.packedrefs import RefSegment


def test_serials_survive_address_reuse() -> None:
    ids, serials = set(), set()
    for i in range(200):
        seg = RefSegment(b"%040x refs/heads/b%d\n" % (i, i), 40)
        ids.add(id(seg))
        serials.add(seg.serial)
        del seg
    assert len(ids) < 200  # addresses were reused: a digest of ids would have matched
    assert len(serials) == 200  # serials never are
