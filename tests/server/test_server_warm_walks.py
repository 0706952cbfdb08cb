"""Warm after a restart without bitmaps (issue 28; server/packgen/walkrecord.py).

A repository with no bitmap (two packs by fast-import, annotated tags, loose objects) is
cloned by a walk of its history. A live gitspout clones it with real C git (full,
``--filter=blob:none``, and a shallow clone with the tags of its history) and keeps each walk in the
closure store; a new process on the same pack-cache directory serves the same clones from
those records (counted ``loaded`` on /metrics) instead of walking. A push between the two
makes the clone's wants new: it is walked again. Every clone is fsck-clean and holds what
the same clone over ``file://`` holds. A record written by other code, or a repository's
walks past WALKS_KEPT, are not loaded.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from gitspout.server.graph.enumeration import Enumeration
from gitspout.server.packgen.order import PackOrder
from gitspout.server.packgen.reuse import ReusePackSource
from gitspout.server.packgen.selection import Selection
from gitspout.server.packgen.walkrecord import (
    DISK_WALK_OBJECTS,
    STORE_SHARE,
    WALKS_KEPT,
    _where,
    decode_walk,
    encode_walk,
    load_walk,
    save_walk,
)
from gitspout.server.store.closurestore import ClosureStore
from gitspout.server.store.fscache import DirCache
from gitspout.server.store.fsops import FsOps
from gitspout.server.store.odb import ObjectSnapshot, PackRegistry
from gitutil import Committer, Git, LiveServer, fsck, poll, repo_state, start_server
from warmkit import clone_equal, store_counts, store_files

SPECS = ("", "blob:none")


def _fast_import(git: Git, repo: Path, first: int, count: int) -> None:
    """``count`` commits on main by fast-import (one pack), each changing a file of d/."""
    parts = []
    for i in range(first, first + count):
        body = f"version {i}\n" * (1 + i % 5)
        msg = f"commit {i}\n"
        parts.append(f"blob\nmark :{2 * i + 1}\ndata {len(body)}\n{body}\n")
        parent = (f"from :{2 * i}\n" if i > first else
                  "from refs/heads/main^0\n" if first else "")
        parts.append(f"commit refs/heads/main\nmark :{2 * i + 2}\n"
                     f"committer T <t@example.com> {1_600_000_000 + 60 * i} +0000\n"
                     f"data {len(msg)}\n{msg}{parent}"
                     f"M 100644 :{2 * i + 1} d/f{i % 7}.txt\n\n")
    git.run("fast-import", "--quiet", cwd=repo, input="".join(parts).encode())


@pytest.fixture
def plain_root(git: Git, tmp_path: Path) -> Path:
    """app.git: 1,500 commits in two packs and a few loose objects, no bitmap. A blob:none
    clone lists 4,500 objects, past DISK_WALK_OBJECTS."""
    root = tmp_path / "root"
    repo = root / "app.git"
    git.run("init", "-q", "--bare", "-b", "main", str(repo))
    git.run("config", "uploadpack.allowFilter", "true", cwd=repo)
    _fast_import(git, repo, 0, 1200)
    _fast_import(git, repo, 1200, 300)
    for n, rev in ((1, "main~1000"), (2, "main~300"), (3, "main~2")):  # include-tag's
        git.run("tag", "-a", f"v{n}", rev, "-m", f"release {n}", cwd=repo)
    _push(git, repo, tmp_path, "loose")
    packs = os.listdir(repo / "objects" / "pack")
    assert not [p for p in packs if p.endswith(".bitmap")]
    assert len([p for p in packs if p.endswith(".pack")]) == 2
    return root


def _push(git: Git, repo: Path, tmp: Path, name: str) -> None:
    """One commit pushed to main (loose objects)."""
    work = tmp / f"work-{name}"
    if not work.exists():
        git.run("clone", "-q", str(repo), str(work))
    Committer(git, work).commit({f"{name}.txt": f"{name}\n"}, name)
    git.run("push", "-q", "origin", "main", cwd=work)


def _shallow_equal(git: Git, srv: LiveServer, tmp: Path, name: str) -> None:
    """``clone --bare --depth 1400`` (with the tags in that history), fsck-
    clean, with the refs, objects and shallow boundary of the same clone over ``file://``."""
    dest, ref = tmp / name, tmp / f"{name}-file"
    git.run("-c", "protocol.version=2", "clone", "-q", "--bare", "--depth", "1400",
            f"{srv.url}/app.git", str(dest))
    git.run("clone", "-q", "--bare", "--depth", "1400", f"file://{srv.root / 'app.git'}",
            str(ref))
    fsck(git, dest)
    assert repo_state(git, dest) == repo_state(git, ref)
    assert (dest / "shallow").read_text() == (ref / "shallow").read_text()
    assert "refs/tags/v2" in git.out("show-ref", cwd=dest)


def _serve_clones(git: Git, root: Path, cache: Path, tmp: Path, tag: str,
                  walks: int) -> dict[str, float]:
    """A fresh process clones (full, blob:none, shallow), each equal to ``file://``; it is
    stopped once ``walks`` walk records are on disk (its last step writes what is
    queued). Returns its closure-store counts."""
    srv = start_server(root, ["--pack-cache-dir", str(cache)])
    try:
        for spec in SPECS:
            clone_equal(git, srv, tmp, f"{tag}-{spec or 'full'}", spec)
        _shallow_equal(git, srv, tmp, f"{tag}-shallow")
        poll(lambda: len(_walks(cache)) >= walks, 30, "walks written")
        return store_counts(srv.port)
    finally:
        srv.stop()


def _walks(cache: Path) -> dict[str, int]:
    """The walk records on disk: name -> inode (a record written again is a new file)."""
    return {p.name: p.stat().st_ino for p in store_files(cache) if p.name.startswith("walk-")}


def test_restarted_server_loads_the_walks_instead_of_walking(
        git: Git, plain_root: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    first = _serve_clones(git, plain_root, cache, tmp_path, "first", 3)
    assert first.get("loaded", 0) == 0, first
    walks = _walks(cache)
    assert len(walks) == 3, walks  # the full, the blob:none and the shallow clone's
    # Each holds at least DISK_WALK_OBJECTS ids: the walks were kept for their size.
    assert all(p.stat().st_size > 20 * DISK_WALK_OBJECTS
               for p in store_files(cache) if p.name.startswith("walk-"))
    second = _serve_clones(git, plain_root, cache, tmp_path, "second", 0)
    # Every clone read its walk (and the layouts of its entries, all loaded, none
    # computed); nothing was walked, so no walk was written again: the same files, read
    # after the second process stopped.
    assert second.get("loaded", 0) >= 3 and second.get("written", 0) == 0, second
    assert second.get("corrupt", 0) == second.get("stale", 0) == 0, second
    assert _walks(cache) == walks


def test_push_between_restarts_walks_again(git: Git, plain_root: Path,
                                           tmp_path: Path) -> None:
    """The wants after a push are new: their walk is not the one kept, and is made (and
    kept) afresh; the clones hold the pushed commit, as over ``file://``."""
    cache = tmp_path / "cache"
    cache.mkdir()
    _serve_clones(git, plain_root, cache, tmp_path, "first", 3)
    before = _walks(cache)
    _push(git, plain_root / "app.git", tmp_path, "pushed")
    second = _serve_clones(git, plain_root, cache, tmp_path, "second", 6)
    assert second.get("loaded", 0) == 0, second
    after = _walks(cache)
    assert len(after) == 6 and set(before) < set(after), (before, after)


def test_a_tag_hidden_between_restarts_is_not_sent_from_a_kept_walk(
        git: Git, plain_root: Path, tmp_path: Path) -> None:
    """A guard on the walk's key: once ``refs/tags/v2`` is hidden, no clone of the next
    process gets its tag object (reachable from it alone), although the walks kept
    before listed it; each clone is the same as over ``file://`` with the same config
    (but for that object, see below)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    _serve_clones(git, plain_root, cache, tmp_path, "first", 3)
    repo = plain_root / "app.git"
    tag = git.out("rev-parse", "refs/tags/v2", cwd=repo).strip()
    git.run("config", "uploadpack.hideRefs", "refs/tags/v2", cwd=repo)
    srv = start_server(plain_root, ["--pack-cache-dir", str(cache)])
    try:
        dests = []
        for spec in SPECS:
            clone_equal(git, srv, tmp_path, f"hidden-{spec or 'full'}", spec)
            dests.append(tmp_path / f"hidden-{spec or 'full'}")
        dest, ref = tmp_path / "hidden-shallow", tmp_path / "hidden-shallow-file"
        for url, to in ((f"{srv.url}/app.git", dest), (f"file://{repo}", ref)):
            git.run("-c", "protocol.version=2", "clone", "-q", "--bare", "--depth", "1400",
                    url, str(to))
        fsck(git, dest)
        # C git's include-tag adds every tag of a commit sent, a hidden one too (over
        # file:// the clone gets v2's tag object, though no ref names it); gitspout never
        # sends what only a hidden ref reaches.
        got, want = repo_state(git, dest), repo_state(git, ref)
        assert got == dataclasses.replace(want, objects=want.objects - {tag})
        dests.append(dest)
        for d in dests:
            assert git.run("cat-file", "-e", tag, cwd=d, check=False).returncode != 0, d
            assert "refs/tags/v2" not in git.out("show-ref", cwd=d, check=False)
        # Three new walks, for the wants without v2: none of the kept ones was used.
        poll(lambda: len(_walks(cache)) >= 6, 30, "new walks written")
    finally:
        srv.stop()


class _Odb:
    """What walkrecord reads of an ObjectSnapshot."""

    objects_dir = "/srv/git/app.git/objects"
    hash_len = 20


def _enum(seed: int, n: int = DISK_WALK_OBJECTS) -> Enumeration:
    return Enumeration([(seed.to_bytes(4, "big") + i.to_bytes(16, "big"), 1 + i % 4)
                        for i in range(n)], set())


def test_a_walk_written_by_other_code_is_stale(tmp_path: Path) -> None:
    """The store puts a digest of the server's source before every identity: what an
    older gitspout walked (another filter rule, other hints) is not loaded by this one."""
    order, enum = PackOrder(wants=(b"\1" * 20,)), _enum(1)
    old = ClosureStore(str(tmp_path), 64 << 20, code=b"another version!")
    save_walk(old, _Odb(), order, enum)  # type: ignore[arg-type]
    old.flush()
    assert load_walk(old, _Odb(), order) == enum  # type: ignore[arg-type]
    new = ClosureStore(str(tmp_path), 64 << 20)
    assert load_walk(new, _Odb(), order) is None  # type: ignore[arg-type]
    assert new.stats.results["stale"] == 1  # and its file removed
    assert not list((tmp_path / "gitspout-closures").glob("*/walk-*"))


def test_only_clones_walks_are_kept_and_no_more_than_walks_kept(tmp_path: Path) -> None:
    store = ClosureStore(str(tmp_path), 64 << 20)
    odb = _Odb()
    fetch = PackOrder(wants=(b"\1" * 20,), common=(b"\2" * 20,))
    save_walk(store, odb, fetch, _enum(0))  # type: ignore[arg-type]
    small = PackOrder(wants=(b"\3" * 20,))
    save_walk(store, odb, small, _enum(0, DISK_WALK_OBJECTS - 1))  # type: ignore[arg-type]
    orders = [PackOrder(wants=(bytes([i]) * 20,), thin=True) for i in range(10, 11 + WALKS_KEPT)]
    for i, order in enumerate(orders):  # one after the other, each used later than the last
        save_walk(store, odb, order, _enum(i))  # type: ignore[arg-type]
        store.flush()
        # Each earlier walk a second older: two writes within one tick of the file
        # system's clock would share an mtime, and the trim's order be the names'.
        for path in (tmp_path / "gitspout-closures").glob("*/walk-*"):
            st = path.stat()
            os.utime(path, (st.st_atime, st.st_mtime - 1))
    names = list((tmp_path / "gitspout-closures").glob("*/walk-*"))
    assert len(names) == WALKS_KEPT, names
    assert load_walk(store, odb, fetch) is None  # type: ignore[arg-type]
    assert load_walk(store, odb, small) is None  # type: ignore[arg-type]
    assert load_walk(store, odb, orders[0]) is None  # type: ignore[arg-type]  # trimmed
    # The walk does not depend on thin, ofs-delta or packfile-URI exclusions: one record.
    plain = PackOrder(wants=orders[-1].wants, exclude=frozenset({b"\4" * 20}))
    assert load_walk(store, odb, plain) == _enum(len(orders) - 1)  # type: ignore[arg-type]


def test_a_walk_may_take_half_the_store_and_no_more(tmp_path: Path) -> None:
    """git/git's full clone walk (842k objects, 21 MB) is over a quarter of the default
    store: a walk may take half of it (STORE_SHARE), and what is larger is not kept."""
    store = ClosureStore(str(tmp_path), 4 << 20)
    odb = _Odb()
    fits, over, based = (PackOrder(wants=(bytes([i]) * 20,)) for i in (1, 2, 3))
    save_walk(store, odb, fits, _enum(1, 60_000))  # type: ignore[arg-type]  # 1.5 MB
    save_walk(store, odb, over, _enum(2, 90_000))  # type: ignore[arg-type]  # 2.25 MB
    # Its ids and types fit (1.25 MB); with its hints' bases outside the walk, 2.25 MB.
    outside = _enum(3, 50_000)
    outside.hints.update((oid, b"\xff" + oid[1:]) for oid, _ in outside.objects)
    save_walk(store, odb, based, outside)  # type: ignore[arg-type]
    store.flush()
    assert load_walk(store, odb, fits) == _enum(1, 60_000)  # type: ignore[arg-type]
    assert load_walk(store, odb, over) is None  # type: ignore[arg-type]
    assert load_walk(store, odb, based) is None  # type: ignore[arg-type]
    assert store.stats.results.get("dropped", 0) == 0  # not even queued
    # Other records still take a quarter at most: the same payload is dropped.
    payload = encode_walk(_enum(1, 60_000), 20)
    store.save("other", "record", b"id", payload)
    assert store.stats.results["dropped"] == 1
    store.save("other", "record", b"id", payload, share=STORE_SHARE)
    store.flush()
    assert store.load("other", "record", b"id") == payload
    with pytest.raises(ValueError):
        store.save("other", "whole", b"id", b"", share=1)


def test_walk_record_round_trip_and_damage() -> None:
    ids = [bytes([i % 256, i // 256]) * 10 for i in range(300)]
    hints = dict(zip(ids[:50], ids[230:280], strict=True))  # bases that are not objects
    hints.update(zip(ids[60:160], ids[100:200], strict=True))  # bases among the objects
    hints.update(zip(ids[290:295], ids[:5], strict=True))  # hinted ids that are not objects
    hints[ids[295]] = ids[296]
    enum = Enumeration([(oid, 1 + i % 4) for i, oid in enumerate(ids[:200])],
                       set(ids[200:230]), hints, dict(zip(ids[50:60], ids[280:290], strict=True)))
    data = encode_walk(enum, 20)
    assert decode_walk(data, 20) == enum
    # Hints between two objects take four bytes: 100 of them, 50 + 6 with ids.
    assert len(data) == 48 + 200 * 25 + (30 + 50 + 12 + 20) * 20
    assert decode_walk(data, 32) is None  # another hash length
    assert decode_walk(data[:-1], 20) is None
    assert decode_walk(data + b"\0", 20) is None
    assert decode_walk(data[:10], 20) is None
    at = 48 + 200 * 21  # the first object's base: one past the ids it may name, the last
    past = data[:at] + (200 + 50).to_bytes(4, "little") + data[at + 4:]
    assert decode_walk(past, 20) is None
    last = decode_walk(data[:at] + (200 + 49).to_bytes(4, "little") + data[at + 4:], 20)
    assert last is not None and last.hints[ids[0]] != hints[ids[0]]
    # An object its own base (a planted record) is refused: it could be written as a
    # delta of itself.
    itself = data[:at] + (0).to_bytes(4, "little") + data[at + 4:]
    assert decode_walk(itself, 20) is None
    empty = Enumeration([], set())
    assert decode_walk(encode_walk(empty, 20), 20) == empty
    with pytest.raises(ValueError):  # an id of another length is refused, not written
        encode_walk(Enumeration([(b"short", 1)], set()), 20)


def test_a_record_its_reader_cannot_use_is_removed_and_counted_corrupt(
        tmp_path: Path) -> None:
    """A record whose identity matches (the store's checksum is whole) but whose payload
    is no walk, as one planted in the store's directory would be: not loaded, removed."""
    store = ClosureStore(str(tmp_path), 64 << 20)
    odb, order = _Odb(), PackOrder(wants=(b"\1" * 20,))
    save_walk(store, odb, order, _enum(1))  # type: ignore[arg-type]
    store.flush()
    assert load_walk(store, odb, order) == _enum(1)  # type: ignore[arg-type]
    assert store.stats.results["loaded"] == 1
    scope, name, identity = _where(odb, order)  # type: ignore[arg-type]
    store.save(scope, name, identity, encode_walk(_enum(1), 20)[:-1])
    store.flush()
    assert load_walk(store, odb, order) is None  # type: ignore[arg-type]
    assert store.stats.results["corrupt"] == 1 and store.stats.results["loaded"] == 1
    assert not list((tmp_path / "gitspout-closures").glob("*/walk-*"))


def test_a_hint_to_itself_is_not_written_as_a_delta(git: Git, tmp_path: Path) -> None:
    """A walk's hints come from a record on disk now; one that names an object its own
    base (or a chain back to it) must not make the writer send a delta of the object
    against itself: a corrupt pack."""
    repo = tmp_path / "loose.git"
    git.run("init", "-q", "--bare", str(repo))
    text = "".join(f"line {i}\n" for i in range(400)).encode()
    blobs = [git.out("hash-object", "-w", "--stdin", cwd=repo, input=text + bytes([i]) * 40)
             .strip() for i in range(3)]
    a, b, c = (bytes.fromhex(x) for x in blobs)
    hints = {a: a, b: c, c: b}  # itself; a cycle that leads back
    with ObjectSnapshot(str(repo / "objects"), 20, PackRegistry(), FsOps(),
                        dirs=DirCache()) as odb:
        source = ReusePackSource(odb, Selection([], [a, b, c]), ofs_delta=True,
                                 delta_hints=hints, listed_only=True)
        pack = b"".join(ch for ch in source.chunks() if isinstance(ch, bytes))
    out = tmp_path / "out.pack"
    out.write_bytes(pack)
    git.run("init", "-q", "--bare", str(tmp_path / "check.git"))
    git.run("index-pack", "--strict", "-o", str(tmp_path / "out.idx"), str(out),
            cwd=tmp_path / "check.git")
    listed = git.out("verify-pack", "-v", str(tmp_path / "out.idx"), cwd=tmp_path / "check.git")
    assert {line.split()[0] for line in listed.splitlines() if " blob " in line} == set(blobs)
    assert source.stats.deltas == 1  # c against b (or b against c): only a real base
