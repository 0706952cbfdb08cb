"""Incremental ref state (issue 11): a packed-refs rewrite is diffed against the last
parse, and loose refs are merged into the segments of their name range only."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

from gitspout.protocol.refs import Ref
from gitspout.server.store import packedrefs as P
from gitspout.server.store import refcache as C
from gitspout.server.store import refs as R
from gitspout.server.store.errors import StorageError
from gitutil import poll

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


def _refs(p: P.PackedRefs) -> list[Ref]:
    return [r for s in p.segments for r in s.refs()]


def _no_peel(oid: bytes) -> bytes | None:
    return None


HEADER = b"# pack-refs with: peeled fully-peeled sorted \n"


def test_diffed_parse_equals_full_parse_and_reuses_segments() -> None:
    rng = random.Random(11)
    entries = {b"refs/heads/b%05d" % i: (_oid(rng), _oid(rng) if i % 7 == 0 else None)
               for i in range(0, 20000, 2)}
    data = _file(entries, HEADER)
    parsed = P.parse_packed_refs(data, HEX, _no_peel)
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
        diffed = P.reparse_packed_refs(parsed, new, HEX, _no_peel)
        full = P.parse_packed_refs(new, HEX, _no_peel)
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
    old = P.parse_packed_refs(_file(entries, HEADER), HEX, _no_peel)
    new = _file(entries, b"# pack-refs with: peeled sorted \n")
    peels: list[bytes] = []
    diffed = P.reparse_packed_refs(old, new, HEX, lambda o: peels.append(o) or None)
    assert not diffed.fully_peeled and _refs(diffed) == _refs(old)
    unsorted = b"".join(_file({n: entries[n]}, b"") for n in reversed(sorted(entries)))
    p = P.parse_packed_refs(unsorted, HEX, _no_peel)
    assert not p.diffable and [r.name for r in _refs(p)] == sorted(entries)
    assert [r.peeled for r in _refs(p)] == [entries[n][1] for n in sorted(entries)]


def test_garbage_lines_raise_storage_error() -> None:
    """A line of packed-refs that is no entry fails the request as a storage fault (C git
    dies on it too), whether the file is parsed whole or diffed against its last parse."""
    rng = random.Random(8)
    entries = {b"refs/heads/b%05d" % i: (_oid(rng), None) for i in range(3000)}
    good = _file(entries, HEADER)
    old = P.parse_packed_refs(good, HEX, _no_peel)
    at = good.index(b" refs/heads/b01500\n") - HEX  # the start of that line
    peel = b"^" + _oid(rng) + b"\n"
    for garbage in (b"not a ref line\n", b"\n", peel + peel,
                    b"z" * 40 + b" refs/heads/zz\n", _oid(rng) + b" \n",
                    b"# comment\n", _oid(rng)[:-1] + b" refs/heads/short\n"):
        bad = good[:at] + garbage + good[at:]
        # Checked when the refs are first used (the split that encodes them anyway).
        for parse in (lambda d: _refs(P.parse_packed_refs(d, HEX, _no_peel)),
                      lambda d: _refs(P.reparse_packed_refs(old, d, HEX, _no_peel))):
            try:
                parse(bad)
            except StorageError as exc:
                assert "packed-refs" in str(exc)
            else:
                raise AssertionError(f"{garbage!r} was accepted")
    try:
        P.parse_packed_refs(good[:-1], HEX, _no_peel)
    except StorageError as exc:
        assert "unterminated" in str(exc)
    else:
        raise AssertionError("an unterminated last line was accepted")


def test_loose_refs_merge_into_their_segment_only() -> None:
    rng = random.Random(5)
    entries = {b"refs/heads/b%05d" % i: (_oid(rng), None) for i in range(5000)}
    packed = P.parse_packed_refs(_file(entries, HEADER), HEX, _no_peel)
    cache = C.RefCache()
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


def test_file_read_by_blocks_parses_and_diffs_as_bytes(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """packed-refs read from its file a block at a time (blocks much smaller than the
    file, so entries straddle them) gives the parse and the diff of the bytes in memory."""
    monkeypatch.setattr(R, "BLOCK", 3000)
    rng = random.Random(12)
    entries = {b"refs/tags/t%05d" % i: (_oid(rng), _oid(rng) if i % 3 else None)
               for i in range(4000)}
    path = tmp_path / "packed-refs"
    fs = R.FsOps()

    def parse_file(old: P.PackedRefs | None) -> P.PackedRefs:
        fd = fs.open_or_none(str(path))
        assert fd is not None
        try:
            f = P.PackedFile(fd, fs)
            return P.parse_packed_refs(f, HEX, _no_peel) if old is None else \
                P.reparse_packed_refs(old, f, HEX, _no_peel)
        finally:
            import os
            os.close(fd)

    path.write_bytes(_file(entries, HEADER))
    parsed = parse_file(None)
    assert _refs(parsed) == _refs(P.parse_packed_refs(path.read_bytes(), HEX, _no_peel))
    for step in range(20):
        names = sorted(entries)
        if step % 5 == 4:
            del entries[rng.choice(names)]
        else:
            entries[rng.choice(names)] = (_oid(rng), _oid(rng) if step % 2 else None)
        path.write_bytes(_file(entries, HEADER))
        diffed = parse_file(parsed)
        assert HEADER + b"".join(s.raw for s in diffed.segments) == path.read_bytes(), step
        assert _refs(diffed) == _refs(P.parse_packed_refs(path.read_bytes(), HEX, _no_peel))
        reused = {id(s) for s in parsed.segments} & {id(s) for s in diffed.segments}
        assert len(reused) >= len(parsed.segments) - 3, step
        parsed = diffed
    assert parse_file(parsed) is parsed  # unchanged: the same parse


def _age(path: str, stamp: int) -> None:
    """Set a directory's mtime to ``stamp`` seconds before this test's start, so that its
    listing is trusted (not racy)."""
    t = (_T0 - stamp) * 1_000_000_000
    os.utime(path, ns=(t, t))


_T0 = int(time.time())


def test_kept_loose_refs_of_a_directory_follow_its_changes(tmp_path: Path) -> None:
    """A directory's loose refs are kept with its listing (_Reader._directory): a warm read
    opens no ref file, and a ref that git moves, adds or deletes there is seen at once."""
    from gitspout.server.store.fscache import DirCache
    from gitspout.server.store.fsops import FsOps

    repo = tmp_path / "r.git"
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)

    def git(*args: str) -> str:
        return subprocess.run(["git", "--git-dir", str(repo), *args], check=True,
                              capture_output=True, text=True).stdout.strip()

    tree = git("hash-object", "-t", "tree", "-w", "--stdin")
    c1 = git("commit-tree", "-m", "1", tree)
    c2 = git("commit-tree", "-m", "2", tree)
    for i in range(20):
        git("update-ref", f"refs/heads/topic/b{i:02d}", c1)
    heads = str(repo / "refs" / "heads")
    dirs, cache = DirCache(), C.RefCache()

    def read(stamp: int) -> tuple[dict[bytes, bytes], FsOps]:
        for d in (str(repo), str(repo / "refs"), heads, heads + "/topic"):
            _age(d, stamp)
        fs = FsOps()
        snap = R.read_ref_snapshot(str(repo), fs, dirs, cache, HEX, _no_peel)
        return {r.name: r.oid for r in snap.refs}, fs

    first, _ = read(100)
    assert set(first.values()) == {c1.encode()} and len(first) == 20
    again, fs = read(100)
    assert again == first and fs.counts["open"] == 0  # kept: no ref file opened

    git("update-ref", "refs/heads/topic/b07", c2)  # lock, write, rename: a new mtime
    git("update-ref", "refs/heads/topic/new", c2)
    git("update-ref", "-d", "refs/heads/topic/b03")
    moved, _ = read(50)
    expected = dict(first)
    expected[b"refs/heads/topic/b07"] = expected[b"refs/heads/topic/new"] = c2.encode()
    del expected[b"refs/heads/topic/b03"]
    assert moved == expected
    assert read(50)[0] == expected


def _waiting_in(thread: threading.Thread, function: str) -> bool:
    """``thread`` is blocked in a wait (an Event's, a Condition's) called from ``function``."""
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None or frame.f_code.co_name != "wait":
        return False
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


def test_concurrent_ref_reads_are_shared_only_when_fresh() -> None:
    """RefCache.shared_read: a request that arrived before a read began gets that read's
    snapshot; one that arrived after it began never does, in progress or finished."""
    cache = C.RefCache()

    class Snap:
        pass

    began, release = threading.Event(), threading.Event()
    calls: list[Snap] = []

    def read() -> Snap:
        calls.append(Snap())
        began.set()
        assert release.wait(10)
        return calls[-1]

    got: dict[str, object] = {}

    def request(name: str, arrived: int) -> threading.Thread:
        t = threading.Thread(target=lambda: got.__setitem__(
            name, cache.shared_read((), arrived, read)))  # type: ignore[arg-type]
        t.start()
        return t

    early = time.monotonic_ns()
    first = request("first", early)
    assert began.wait(10)
    late = time.monotonic_ns()
    joined, after = request("joined", early), request("after", late)
    # Both are waiting for the first read, in progress: not finished ones.
    poll(lambda: _waiting_in(joined, "shared_read") and _waiting_in(after, "shared_read"),
         10, "both requests to wait in shared_read")
    assert len(calls) == 1
    release.set()
    for t in (first, joined, after):
        t.join(10)
    assert len(calls) == 2
    assert got["joined"] is got["first"] is calls[0]
    assert got["after"] is calls[1]
    # The newest finished read: taken while its snapshot lives, by requests that arrived
    # before it began.
    assert cache.shared_read((), early, read) is calls[1]  # type: ignore[arg-type]
    assert cache.shared_read((), late, read) is calls[1]  # type: ignore[arg-type]
    assert len(calls) == 2
    # A read of every ref answers a request for some prefixes, never the other way round.
    heads = (b"refs/heads/",)
    assert cache.shared_read(heads, early, read) is calls[1]  # type: ignore[arg-type]
    now = time.monotonic_ns()
    assert cache.shared_read(heads, now, read) is calls[2]  # type: ignore[arg-type]
    assert cache.shared_read((), now, read) is calls[3]  # type: ignore[arg-type]
    assert cache.shared_read(heads, now, read) is calls[3]  # type: ignore[arg-type]
