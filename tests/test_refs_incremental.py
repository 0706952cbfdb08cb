"""Incremental ref state (issue 11): a packed-refs rewrite is diffed against the last
parse, and loose refs are merged into the segments of their name range only."""

from __future__ import annotations

import random

from gitspout.protocol.refs import Ref
from gitspout.server.store import refs as R
from gitspout.server.store.errors import StorageError

HEX = 40


def _oid(rng: random.Random) -> bytes:
    return b"%040x" % rng.getrandbits(160)


def _file(entries: dict[bytes, tuple[bytes, bytes | None]], header: bytes) -> bytes:
    out = [header]
    for name in sorted(entries):
        oid, peeled = entries[name]
        out.append(oid + b" " + name + b"\n")
        if peeled is not None:
            out.append(b"^" + peeled + b"\n")
    return b"".join(out)


def _refs(p: R._PackedRefs) -> list[Ref]:
    return [r for s in p.segments for r in s.refs()]


def _no_peel(oid: bytes) -> bytes | None:
    return None


HEADER = b"# pack-refs with: peeled fully-peeled sorted \n"


def test_diffed_parse_equals_full_parse_and_reuses_segments() -> None:
    rng = random.Random(11)
    entries = {b"refs/heads/b%05d" % i: (_oid(rng), _oid(rng) if i % 7 == 0 else None)
               for i in range(0, 20000, 2)}
    data = _file(entries, HEADER)
    parsed = R._parse_packed_refs(data, HEX, _no_peel)
    assert len(parsed) == len(entries)
    for step in range(60):
        op = rng.randrange(4)
        names = sorted(entries)
        if op == 0:  # a moved ref
            entries[rng.choice(names)] = (_oid(rng), None)
        elif op == 1:  # a deleted one
            del entries[rng.choice(names)]
        elif op == 2:  # a new one (pack-refs of a loose ref)
            entries[b"refs/heads/b%05d" % rng.randrange(1, 20000, 2)] = (_oid(rng), _oid(rng))
        else:  # several at once, far apart
            for _ in range(3):
                entries[rng.choice(names)] = (_oid(rng), None)
        new = _file(entries, HEADER)
        diffed = R._reparse_packed_refs(parsed, new, HEX, _no_peel)
        full = R._parse_packed_refs(new, HEX, _no_peel)
        assert _refs(diffed) == _refs(full), step
        # The segments are the file's own lines, in order: nothing else of it is kept.
        assert HEADER + b"".join(s.raw for s in diffed.segments) == new, step
        if op != 3:
            reused = {id(s) for s in parsed.segments} & {id(s) for s in diffed.segments}
            assert len(reused) >= len(parsed.segments) - 2, step
        parsed = diffed
        for name in rng.sample(sorted(entries), 5):
            assert parsed.get(name) == entries[name][0]
        assert parsed.get(b"refs/heads/zzz") is None


def test_header_change_and_unsorted_file_parse_fully() -> None:
    rng = random.Random(3)
    entries = {b"refs/tags/t%03d" % i: (_oid(rng), _oid(rng)) for i in range(50)}
    old = R._parse_packed_refs(_file(entries, HEADER), HEX, _no_peel)
    new = _file(entries, b"# pack-refs with: peeled sorted \n")
    peels: list[bytes] = []
    diffed = R._reparse_packed_refs(old, new, HEX, lambda o: peels.append(o) or None)
    assert not diffed.fully_peeled and _refs(diffed) == _refs(old)
    unsorted = b"".join(_file({n: entries[n]}, b"") for n in reversed(sorted(entries)))
    p = R._parse_packed_refs(unsorted, HEX, _no_peel)
    assert not p.diffable and [r.name for r in _refs(p)] == sorted(entries)
    assert [r.peeled for r in _refs(p)] == [entries[n][1] for n in sorted(entries)]


def test_garbage_lines_raise_storage_error() -> None:
    """A line of packed-refs that is no entry fails the request as a storage fault (C git
    dies on it too), whether the file is parsed whole or diffed against its last parse."""
    rng = random.Random(8)
    entries = {b"refs/heads/b%05d" % i: (_oid(rng), None) for i in range(3000)}
    good = _file(entries, HEADER)
    old = R._parse_packed_refs(good, HEX, _no_peel)
    at = good.index(b" refs/heads/b01500\n") - HEX  # the start of that line
    peel = b"^" + _oid(rng) + b"\n"
    for garbage in (b"not a ref line\n", b"\n", peel + peel,
                    b"z" * 40 + b" refs/heads/zz\n", _oid(rng) + b" \n",
                    _oid(rng) + b" two names\n", b"# comment\n"):
        bad = good[:at] + garbage + good[at:]
        for parse in (lambda d: R._parse_packed_refs(d, HEX, _no_peel),
                      lambda d: R._reparse_packed_refs(old, d, HEX, _no_peel)):
            try:
                parse(bad)
            except StorageError as exc:
                assert "packed-refs" in str(exc)
            else:
                raise AssertionError(f"{garbage!r} was accepted")
    try:
        R._parse_packed_refs(good[:-1], HEX, _no_peel)
    except StorageError as exc:
        assert "unterminated" in str(exc)
    else:
        raise AssertionError("an unterminated last line was accepted")


def test_loose_refs_merge_into_their_segment_only() -> None:
    rng = random.Random(5)
    entries = {b"refs/heads/b%05d" % i: (_oid(rng), None) for i in range(5000)}
    packed = R._parse_packed_refs(_file(entries, HEADER), HEX, _no_peel)
    cache = R.RefCache()
    a = _oid(rng)
    loose: dict[bytes, Ref | None] = {b"refs/heads/b02500": Ref(b"refs/heads/b02500", a),
                                      b"refs/heads/b00010": None,
                                      b"refs/heads/new": Ref(b"refs/heads/new", a)}
    segs = R._segments_of(packed, loose, cache)
    base = list(packed.segments)
    assert sum(s not in base for s in segs) == 3
    refs = [r for s in segs for r in s.refs()]
    want = {n: Ref(n, o) for n, (o, _) in entries.items()}
    del want[b"refs/heads/b00010"]
    want[b"refs/heads/b02500"] = Ref(b"refs/heads/b02500", a)
    want[b"refs/heads/new"] = Ref(b"refs/heads/new", a)
    assert refs == [want[n] for n in sorted(want)]
    again = R._segments_of(packed, dict(loose), cache)
    assert all(x is y for x, y in zip(segs, again, strict=True))
