"""Warm after a restart (issue 28; server/store/closurestore.py, docs/ARCHITECTURE.md
"Closure store").

A live gitspout clones a bitmapped repository whose tips the bitmaps do not cover (commits
after the repack, loose and in a second pack, a branch off old history), with real C git,
full and ``--filter=blob:none``. It is stopped; a new process on the same pack-cache
directory serves the same clones from the closures the first one left, counted on
/metrics, without walking (``result="missed"`` counts every walk of such a closure). Every
clone is fsck-clean and holds what the same clone over ``file://`` holds. A repack between
the two processes makes the stored closures stale, a ref change makes them miss, a damaged
file is removed: each is counted, and the answers stay right.
"""

from __future__ import annotations

import os
import random
import struct
from array import array
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from gitspout.protocol.filters import parse_filter_spec
from gitspout.server.app.config import load_config
from gitspout.server.app.metrics import RequestRecord
from gitspout.server.app.state import ServerState
from gitspout.server.graph.bitmapwalk import ALL, COMMITS, TREES, BitmapIndex, open_bitmap_index
from gitspout.server.packgen import layout
from gitspout.server.packgen.layoutrecord import Layout, decode_layout, encode_layout, load_layout
from gitspout.server.store.closurestore import (
    STORE_DIR,
    TMP_AGE,
    ClosureStore,
    decode_record,
    encode_record,
)
from gitspout.server.store.lru import ByteLRU
from gitspout.server.store.objformat import ids_digest
from gitspout.server.store.packs import PackFile
from gitspout.server.store.revindex import facts_key
from gitutil import Committer, Git, LiveServer, poll, start_server
from rawhttp import metric
from warmkit import clone_equal, store_counts, store_files

FILTERS = ("blob:none", "")  # blob:none first: a full closure would answer it


def _build(git: Git, root: Path) -> Path:
    """app.git: a bitmapped pack, then commits after it (a second pack, then loose) on
    main and on a branch from old history, and a tag: tips no bitmap covers."""
    work = root.parent / f"{root.name}-work"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    for i in range(12):
        c.commit({f"d{i % 3}/f{i}.txt": f"line {i}\n" * (i + 5), "top.txt": f"v{i}\n"},
                 f"commit {i}")
    c.tag("v1", "release 1")
    repo = root / "app.git"
    git.run("clone", "-q", "--bare", "--no-local", str(work), str(repo))
    git.run("config", "uploadpack.allowFilter", "true", cwd=repo)
    git.run("repack", "-q", "-adb", cwd=repo)
    git.run("checkout", "-q", "-b", "side", "HEAD~6", cwd=work)
    c.commit({"side.txt": "side\n", "d1/f4.txt": "changed on side\n"}, "side 1")
    git.run("checkout", "-q", "main", cwd=work)
    for i in range(3):
        c.commit({f"d2/new{i}.txt": f"new {i}\n", "top.txt": f"after {i}\n"}, f"after {i}")
    git.run("push", "-q", str(repo), "main", "side", cwd=work)
    git.run("repack", "-q", "-d", cwd=repo)  # a second pack, no bitmap
    for i in range(2):
        c.commit({f"d0/loose{i}.txt": f"loose {i}\n"}, f"loose {i}")
    c.tag("v2", "release 2")
    git.run("push", "-q", str(repo), "main", "v2", cwd=work)  # loose objects
    assert len(list((repo / "objects" / "pack").glob("*.bitmap"))) == 1
    return repo


@pytest.fixture
def warm_root(tmp_path: Path, git: Git) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    _build(git, root)
    return root


def _start(root: Path, cache: Path, *extra: str) -> LiveServer:
    return start_server(root, ["--pack-cache-dir", str(cache), *extra])


def _clones(git: Git, srv: LiveServer, tmp: Path, tag: str) -> None:
    for spec in FILTERS:
        clone_equal(git, srv, tmp, f"{tag}-{spec or 'full'}", spec)


def _first_process(git: Git, root: Path, cache: Path, tmp: Path, *extra: str) -> dict[str, float]:
    """Clone with a fresh process, wait until what it walked is on disk, stop it."""
    srv = _start(root, cache, *extra)
    try:
        _clones(git, srv, tmp, "first")
        counts = poll(lambda: (c := store_counts(srv.port)) and c.get("written", 0) >= 2 and c,
                      30, "closures written")
        assert counts["loaded"] == 0 and counts["missed"] >= 2, counts
    finally:
        srv.stop()
    return counts


def test_restarted_server_loads_closures_instead_of_walking(
        warm_root: Path, git: Git, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    _first_process(git, warm_root, cache, tmp_path)
    assert len(store_files(cache)) >= 2
    srv = _start(warm_root, cache)
    try:
        _clones(git, srv, tmp_path, "second")
        counts = store_counts(srv.port)
        # One closure a clone, read from the disk; no closure walked (none missed).
        assert counts["loaded"] == 2 and counts["missed"] == 0, counts
        assert counts["stale"] == counts["corrupt"] == 0, counts
    finally:
        srv.stop()


def test_workers_share_the_store_across_a_restart(
        warm_root: Path, git: Git, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    _first_process(git, warm_root, cache, tmp_path, "--workers", "2")
    srv = _start(warm_root, cache, "--workers", "2")
    try:
        _clones(git, srv, tmp_path, "second")
        counts = store_counts(srv.port)  # summed over the workers
        assert counts["loaded"] == 2 and counts["missed"] == 0, counts
        # The bytes of the one shared directory, once: each worker counts it whole.
        on_disk = sum(p.stat().st_size for p in store_files(cache))
        assert metric(srv.port, "gitspout_closure_store_bytes") == on_disk
    finally:
        srv.stop()


def test_repack_between_restarts_makes_the_closures_stale(
        warm_root: Path, git: Git, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    _first_process(git, warm_root, cache, tmp_path)
    old = store_files(cache)
    # A new bitmapped pack of new commits: the old bitmap's checksum names no pack now.
    work = tmp_path / "work"
    git.run("clone", "-q", str(warm_root / "app.git"), str(work))
    Committer(git, work, start=1_700_000_000).commit({"late.txt": "late\n"}, "late")
    git.run("push", "-q", "origin", "main", cwd=work)
    git.run("repack", "-q", "-adb", cwd=warm_root / "app.git")
    srv = _start(warm_root, cache)
    try:
        _clones(git, srv, tmp_path, "second")
        counts = store_counts(srv.port)
        assert counts["loaded"] == 0 and counts["stale"] >= 2, counts
        assert not set(old) & set(store_files(cache))  # the old pack's closures are gone
    finally:
        srv.stop()


def _work_clone(git: Git, repo: Path, tmp: Path) -> tuple[Path, Committer]:
    work = tmp / "work"
    git.run("clone", "-q", str(repo), str(work))
    return work, Committer(git, work, start=1_700_000_000)


def test_push_between_restarts_walks_from_the_stored_closure(
        warm_root: Path, git: Git, tmp_path: Path) -> None:
    """After a push no stored closure is exact, but the last one is a base: the restarted
    process walks only what the push added (``result="based"``), and so does a live one
    after the next push."""
    cache = tmp_path / "cache"
    cache.mkdir()
    _first_process(git, warm_root, cache, tmp_path)
    repo = warm_root / "app.git"
    work, c = _work_clone(git, repo, tmp_path)
    c.commit({"d1/pushed.txt": "pushed\n", "top.txt": "pushed\n"}, "pushed 1")
    c.commit({"d2/pushed.txt": "pushed 2\n"}, "pushed 2")
    git.run("checkout", "-q", "-b", "topic", cwd=work)
    c.commit({"d0/topic.txt": "topic\n"}, "topic 1")
    c.tag("v3", "release 3")
    git.run("push", "-q", "origin", "main", "topic", "v3", cwd=work)
    srv = _start(warm_root, cache)
    try:
        _clones(git, srv, tmp_path, "second")
        counts = store_counts(srv.port)
        assert counts["loaded"] == 0 and counts["based"] == 2, counts
        # A live process after the next push: its own closures are the base.
        c.commit({"d0/topic.txt": "topic 2\n"}, "topic 2")
        git.run("push", "-q", "origin", "topic", cwd=work)
        _clones(git, srv, tmp_path, "third")
        counts = store_counts(srv.port)
        assert counts["based"] == 4, counts
    finally:
        srv.stop()


@pytest.mark.parametrize("merge", ["merge", "fast-forward"])
def test_branch_merged_and_deleted_between_restarts_keeps_the_base(
        warm_root: Path, git: Git, tmp_path: Path, merge: str) -> None:
    """The usual life of a pull request: a topic branch pushed, then merged into main
    (a merge commit, or main fast-forwarded to it) and deleted. Its tip is still
    reachable, so the last stored closure is the base after the restart."""
    repo = warm_root / "app.git"
    work, c = _work_clone(git, repo, tmp_path)
    c.commit({"top.txt": "main 0\n"}, "main 0")  # an old main that no tag names
    git.run("checkout", "-q", "-b", "topic", cwd=work)
    c.commit({"d1/topic.txt": "topic\n"}, "topic 1")
    c.commit({"d2/topic.txt": "topic\n"}, "topic 2")
    git.run("push", "-q", "origin", "main", "topic", cwd=work)
    cache = tmp_path / "cache"
    cache.mkdir()
    _first_process(git, warm_root, cache, tmp_path)
    git.run("checkout", "-q", "main", cwd=work)
    if merge == "merge":
        c.commit({"top.txt": "main moved on\n"}, "main 1")
        git.run("-c", "user.name=t", "-c", "user.email=t@x", "merge", "-q", "--no-ff",
                "-m", "merge topic", "topic", cwd=work)
    else:
        git.run("merge", "-q", "--ff-only", "topic", cwd=work)
    git.run("push", "-q", "origin", "main", ":topic", cwd=work)
    srv = _start(warm_root, cache)
    try:
        _clones(git, srv, tmp_path, "second")
        counts = store_counts(srv.port)
        assert counts["loaded"] == 0 and counts["based"] == 2, counts
    finally:
        srv.stop()


def _rewrite_side(git: Git, repo: Path, tmp: Path, change: str) -> None:
    """Make the commit only ``side`` reaches unreachable from what is advertised."""
    if change == "delete":
        git.run("update-ref", "-d", "refs/heads/side", cwd=repo)
    elif change == "hide":
        git.run("config", "uploadpack.hideRefs", "refs/heads/side", cwd=repo)
    else:  # force-push: side rewritten from its parent
        work, c = _work_clone(git, repo, tmp)
        git.run("checkout", "-q", "-b", "side", "origin/side~1", cwd=work)
        c.commit({"side.txt": "rewritten\n"}, "side 2")
        git.run("push", "-q", "-f", "origin", "side", cwd=work)


@pytest.mark.parametrize("change", ["delete", "hide", "force-push"])
def test_ref_change_between_restarts_is_not_served_from_the_store(
        warm_root: Path, git: Git, tmp_path: Path, change: str) -> None:
    """A ref deleted, hidden or force-pushed: its old tip's objects must come neither from
    the old tips' closure nor from one built on it."""
    cache = tmp_path / "cache"
    cache.mkdir()
    _first_process(git, warm_root, cache, tmp_path)
    repo = warm_root / "app.git"
    _rewrite_side(git, repo, tmp_path, change)
    srv = _start(warm_root, cache)
    try:
        _clones(git, srv, tmp_path, "second")
        counts = store_counts(srv.port)
        assert counts["loaded"] == counts["based"] == 0 and counts["missed"] >= 2, counts
        side = git.out("-C", str(tmp_path / "first-full"), "rev-parse", "side").strip()
        got = git.out("-C", str(tmp_path / "second-full"), "cat-file", "--batch-check",
                      input=(side + "\n").encode())
        assert "missing" in got  # the old side's commit was not sent
    finally:
        srv.stop()


def test_closure_from_a_stored_base_is_the_closure(
        warm_root: Path, git: Git, tmp_path: Path) -> None:
    """Ref states drawn at random from the repository's objects (commits in and out of
    the bitmap, tags, trees, blobs), one after another as pushes would leave them: at each
    level, the closure built on the previous state's stored one is exactly the closure
    walked from nothing. Both ways are taken: states whose old roots the new ones reach,
    and states that drop one."""
    repo = warm_root / "app.git"
    listed = git.out("--git-dir", str(repo), "rev-list", "--objects", "--all")
    objects = sorted({bytes.fromhex(line[:40]) for line in listed.splitlines()})
    tags = git.out("--git-dir", str(repo), "for-each-ref", "--format=%(objectname)",
                   "refs/tags").split()
    objects += [bytes.fromhex(t) for t in tags]
    state = ServerState.create(load_config({"root": str(warm_root)}, env={}))
    ctx = state.view(state.scope(RequestRecord()), state.resolver.resolve("app.git"))
    rng = random.Random(28)
    taken = {True: 0, False: 0}
    try:
        bi = open_bitmap_index(ctx.src)
        assert bi is not None
        for level in (ALL, TREES, COMMITS):
            (tmp_path / level).mkdir()
            disk = ClosureStore(str(tmp_path / level), 1 << 26)
            roots = set(rng.sample(objects, 3))
            for _ in range(40):
                bi.reach_cached(roots, ByteLRU("sets", 1 << 26), level=level, disk=disk)
                disk.flush()
                before = disk.stats.results["based"]
                kept = set(rng.sample(sorted(roots), rng.randint(len(roots) // 2, len(roots))))
                roots = kept | set(rng.sample(objects, rng.randint(1, 3)))
                got = bi.reach_cached(roots, ByteLRU("sets", 1 << 26), level=level, disk=disk)
                want = bi.reach(roots, level=level)
                assert (got.bits, got.extra) == (want.bits, want.extra), level
                taken[disk.stats.results["based"] > before] += 1
    finally:
        ctx.close()
    assert taken[True] >= 10 and taken[False] >= 10, taken


def _in_process(warm_root: Path):  # type: ignore[no-untyped-def]
    state = ServerState.create(load_config({"root": str(warm_root)}, env={}))
    return state.view(state.scope(RequestRecord()), state.resolver.resolve("app.git"))


def _ids(git: Git, repo: Path, *revs: str) -> list[bytes]:
    return [bytes.fromhex(git.out("--git-dir", str(repo), "rev-parse", r).strip()) for r in revs]


def _age(cache: Path, seconds: float) -> None:
    """Date every record back, so that the next write or touch is the newest."""
    for f in cache.rglob("*.clo"):
        st = f.stat()
        os.utime(f, (st.st_atime - seconds, st.st_mtime - seconds))


@pytest.fixture
def indexed(warm_root: Path, tmp_path: Path) -> Iterator[tuple[Path, ClosureStore, BitmapIndex]]:
    """(a cache directory, a closure store in it, app.git's bitmap index), in process."""
    cache = tmp_path / "cache"
    cache.mkdir()
    ctx = _in_process(warm_root)
    try:
        bi = open_bitmap_index(ctx.src)
        assert bi is not None
        yield cache, ClosureStore(str(cache), 1 << 26), bi
    finally:
        ctx.close()


def _stored(bi: BitmapIndex, disk: ClosureStore, roots: list[bytes]) -> None:
    """The closure of ``roots`` computed with a fresh memory cache, and on disk."""
    bi.reach_cached(roots, ByteLRU("sets", 1 << 26), disk=disk)
    disk.flush()


def test_a_record_whose_payload_is_no_closure_is_removed_and_walked_again(
        warm_root: Path, git: Git, indexed: tuple[Path, ClosureStore, BitmapIndex]) -> None:
    """Records whose identity matches (whole to the store's checksum) but whose payload is
    no closure, or no roots (planted in the store's directory): not counted loaded,
    removed and counted corrupt, and the closure is walked and exact."""
    repo = warm_root / "app.git"
    old_main, new_main = _ids(git, repo, "main~2", "main")
    cache, disk, bi = indexed
    _stored(bi, disk, [old_main])
    planted = store_files(cache)
    assert len(planted) >= 2  # the closure and its roots
    for path in planted:
        found = decode_record(path.read_bytes())
        assert found is not None
        path.write_bytes(encode_record(found[0], b"\0" * 3))
    got = bi.reach_cached([old_main], ByteLRU("sets", 1 << 26), disk=disk)
    # A later state finds no base either: the roots record is no roots.
    newer = bi.reach_cached([new_main], ByteLRU("sets", 1 << 26), disk=disk)
    assert disk.stats.results["loaded"] == 0, disk.stats.results
    assert disk.stats.results["corrupt"] == len(planted), disk.stats.results
    for reach, roots in ((got, [old_main]), (newer, [new_main])):
        want = bi.reach(roots)
        assert (reach.bits, reach.extra) == (want.bits, want.extra)
    disk.flush()
    for path in store_files(cache):  # written again, whole
        found = decode_record(path.read_bytes())
        assert found is not None and found[1] != b"\0" * 3


def test_a_base_whose_branch_went_is_passed_over_for_an_older_one(
        warm_root: Path, git: Git, indexed: tuple[Path, ClosureStore, BitmapIndex]) -> None:
    """States main~2, then side (newest), then main: both lack one root of the new state
    and have one it lacks, so the newest is tried first. It fails the check (side is not
    reachable from main), and the older state is the base instead of a walk from
    nothing. The closure is exact."""
    repo = warm_root / "app.git"
    old_main, new_main, side = _ids(git, repo, "main~2", "main", "side")
    cache, disk, bi = indexed
    _stored(bi, disk, [old_main])
    _age(cache, 60)
    _stored(bi, disk, [side])
    before = disk.stats.results["based"]
    got = bi.reach_cached([new_main], ByteLRU("sets", 1 << 26), disk=disk)
    assert disk.stats.results["based"] == before + 1, disk.stats.results
    want = bi.reach([new_main])
    assert (got.bits, got.extra) == (want.bits, want.extra)


def test_a_branch_fast_forwarded_in_and_deleted_keeps_the_base(
        warm_root: Path, git: Git, indexed: tuple[Path, ClosureStore, BitmapIndex]) -> None:
    """main at main~2 and a topic branch two commits ahead; main fast-forwarded to the
    topic, which is deleted. The old main is below the held root, not met by any walk
    from the new roots that leaves the base alone: the held root's commits are walked
    down to it, and the base is used. The closure is exact."""
    repo = warm_root / "app.git"
    old_main, topic = _ids(git, repo, "main~2", "main")
    cache, disk, bi = indexed
    _stored(bi, disk, [old_main, topic])
    for level in (ALL, TREES):  # for TREES, the ALL base (a superset) once filtered
        before = disk.stats.results["based"]
        got = bi.reach_cached([topic], ByteLRU("sets", 1 << 26), level=level, disk=disk)
        assert disk.stats.results["based"] == before + 1, disk.stats.results
        want = bi.reach([topic], level=level)
        if level == TREES:
            for r in (got, want):
                bi.apply_filter(r, parse_filter_spec("blob:none"), [topic])
        assert (got.bits, got.extra) == (want.bits, want.extra), level


def test_the_base_is_the_last_state_of_all_the_refs(
        warm_root: Path, git: Git, indexed: tuple[Path, ClosureStore, BitmapIndex],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """After a push, the base is the previous state of all the refs, not a newer one of a
    single tag's that leaves more to walk; and a stored state far larger than the new one
    (a mirror's every ref, for a small fetch) is not even read."""
    repo = warm_root / "app.git"
    old_main, new_main, side, v1 = _ids(git, repo, "main~1", "main", "side", "v1")
    listed = git.out("--git-dir", str(repo), "rev-list", "--objects", "--all")
    many = [bytes.fromhex(line[:40]) for line in listed.splitlines()]
    assert len(many) > 60  # more than twice the new state's 3 roots and a margin of 16
    cache, disk, bi = indexed
    for k, state in enumerate(([old_main, side, v1], [v1], many)):  # oldest first
        _stored(bi, disk, state)
        _age(cache, 60 * (3 - k))
    bases: list[bytes] = []
    read: list[str] = []
    load_kinds, load_roots = bi._load_kinds, bi._load_roots
    monkeypatch.setattr(bi, "_load_kinds", lambda d, digest, kinds, count=True: (
        bases.append(digest) if not count else None, load_kinds(d, digest, kinds, count))[1])
    monkeypatch.setattr(bi, "_load_roots", lambda d, scope, name: (
        read.append(name), load_roots(d, scope, name))[1])
    new = [new_main, side, v1]
    before = disk.stats.results["based"]
    got = bi.reach_cached(new, ByteLRU("sets", 1 << 26), disk=disk)
    assert disk.stats.results["based"] == before + 1
    assert bases == [ids_digest([old_main, side, v1])]
    assert len(read) == 2 and ids_digest(many).hex()[:40] not in " ".join(read)
    want = bi.reach(new)
    assert (got.bits, got.extra) == (want.bits, want.extra)


def test_a_state_loaded_whole_stays_the_newest_base(
        warm_root: Path, git: Git, indexed: tuple[Path, ClosureStore, BitmapIndex]) -> None:
    """A state read back whole from the store is touched as a base too: it is the first
    of the recent root sets, ahead of one written later but not used since."""
    repo = warm_root / "app.git"
    main, side = _ids(git, repo, "main", "side")
    cache, disk, bi = indexed
    _stored(bi, disk, [main])
    _age(cache, 120)
    _stored(bi, disk, [side])
    _age(cache, 60)
    prefix = f"{bi.pack.checksum.hex()[:16]}-roots-"
    scope = bi._scope()
    side_first = disk.recent(scope, prefix, 8)
    assert len(side_first) == 2
    bi.reach_cached([main], ByteLRU("sets", 1 << 26), disk=disk)  # loaded whole
    assert disk.stats.results["loaded"] == 1, disk.stats.results
    assert disk.recent(scope, prefix, 8) == side_first[::-1]


def test_a_state_served_from_memory_stays_a_base(
        warm_root: Path, git: Git, indexed: tuple[Path, ClosureStore, BitmapIndex]) -> None:
    """A live process serving one state from memory touches its roots record, at most
    once in 30 seconds: it stays ahead of states written since, which only happens once."""
    repo = warm_root / "app.git"
    main, side = _ids(git, repo, "main", "side")
    cache, disk, bi = indexed
    memory = ByteLRU("sets", 1 << 26)
    bi.reach_cached([side], memory, disk=disk)
    disk.flush()
    _age(cache, 120)
    _stored(bi, disk, [main])
    _age(cache, 60)
    prefix, scope = f"{bi.pack.checksum.hex()[:16]}-roots-", bi._scope()
    main_first = disk.recent(scope, prefix, 8)
    bi.reach_cached([side], memory, disk=disk)  # from memory
    assert disk.stats.results["loaded"] == 0
    side_first = disk.recent(scope, prefix, 8)
    assert side_first == main_first[::-1]
    _age(cache, 600)  # side's record now older than main's was; no touch within 30 s
    bi.reach_cached([main], ByteLRU("sets", 1 << 26), disk=disk)  # loaded: touched
    bi.reach_cached([side], memory, disk=disk)
    assert disk.recent(scope, prefix, 8) == main_first


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_damaged_store_file_is_removed_and_walked_again(
        warm_root: Path, git: Git, tmp_path: Path, damage: str) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    _first_process(git, warm_root, cache, tmp_path)
    files = store_files(cache)
    for path in files:
        data = bytearray(path.read_bytes())
        if damage == "flip":
            data[len(data) // 2] ^= 0x40
        elif damage == "truncate":
            del data[len(data) - 7:]
        else:
            data = bytearray()
        path.write_bytes(bytes(data))
    srv = _start(warm_root, cache)
    try:
        _clones(git, srv, tmp_path, "second")
        counts = poll(lambda: (c := store_counts(srv.port)) and c.get("written", 0) >= 2 and c,
                      30, "closures written again")
        assert counts["loaded"] == 0 and counts["corrupt"] == len(files), counts
    finally:
        srv.stop()
    for path in store_files(cache):  # written again, whole
        assert decode_record(path.read_bytes()) is not None


def _build_long(git: Git, root: Path) -> None:
    """long.git: 1,500 commits by fast-import, each changing a file under d/: a blob:none
    clone sends over 4,096 entries of the bitmapped pack, whose layout is kept on disk
    (packgen/layoutrecord.py DISK_LAYOUT_ENTRIES)."""
    repo = root / "app.git"
    git.run("init", "-q", "--bare", "-b", "main", str(repo))
    parts = []
    for i in range(1500):
        body = f"version {i}\n" * (1 + i % 5)
        msg = f"commit {i}\n"
        parts.append(f"blob\nmark :{2 * i + 1}\ndata {len(body)}\n{body}\n")
        parts.append(f"commit refs/heads/main\nmark :{2 * i + 2}\n"
                     f"committer T <t@example.com> {1_600_000_000 + 60 * i} +0000\n"
                     f"data {len(msg)}\n{msg}"
                     + (f"from :{2 * i}\n" if i else "")
                     + f"M 100644 :{2 * i + 1} d/f{i % 7}.txt\n\n")
    git.run("fast-import", "--quiet", cwd=repo, input="".join(parts).encode())
    git.run("config", "uploadpack.allowFilter", "true", cwd=repo)
    git.run("repack", "-q", "-adb", cwd=repo)


def test_restarted_server_loads_a_large_layout(git: Git, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    _build_long(git, root)
    cache = tmp_path / "cache"
    cache.mkdir()
    srv = _start(root, cache)
    try:
        clone_equal(git, srv, tmp_path, "first", "blob:none")
        # the filtered closure and the layout of its entries
        poll(lambda: (c := store_counts(srv.port)) and c.get("written", 0) >= 2 and c,
             30, "closure and layout written")
    finally:
        srv.stop()
    assert any("-layout" in p.name for p in store_files(cache))
    srv = _start(root, cache)
    try:
        clone_equal(git, srv, tmp_path, "second", "blob:none")
        counts = store_counts(srv.port)
        assert counts["loaded"] == 2 and counts["missed"] == 0, counts
    finally:
        srv.stop()


# -- the store alone -------------------------------------------------------------------


def test_clone_after_a_push_sends_the_pack_body_whole(git: Git, tmp_path: Path) -> None:
    """After a push, a full clone is every entry of the bitmapped pack plus the loose
    objects: the pack's body goes out as one run, with no layout computed (nor kept on
    disk, where a blob:none clone's layout, of part of the pack, is). Real clones, equal
    to ``file://``."""
    root = tmp_path / "root"
    root.mkdir()
    _build_long(git, root)
    work, c = _work_clone(git, root / "app.git", tmp_path)
    c.commit({"d/pushed.txt": "pushed\n", "d/f1.txt": "changed by the push\n"}, "pushed")
    git.run("push", "-q", "origin", "main", cwd=work)
    cache = tmp_path / "cache"
    cache.mkdir()
    srv = _start(root, cache)
    try:
        clone_equal(git, srv, tmp_path, "full", "")
        clone_equal(git, srv, tmp_path, "blobless", "blob:none")
    finally:
        srv.stop()  # its last step writes what is queued for the store (state.close)
    layouts = [p for p in store_files(cache) if "-layout" in p.name]
    assert len(layouts) == 1, layouts  # the blob:none clone's alone
    # The bitmapped pack's delta facts, which chose the one run, are kept for the next
    # process.
    assert [p for p in store_files(cache) if p.name.endswith("-deltas.clo")]


def test_the_one_run_layout_is_the_computed_one(git: Git, tmp_path: Path) -> None:
    """Every entry of a pack: the one-run layout places each entry where the computed
    layout does (later deltas against them refer to those places); a selection one entry
    short, or of repeated ranks, is not taken for every entry."""
    root = tmp_path / "root"
    root.mkdir()
    _build_long(git, root)
    (base,) = [str(p)[:-5] for p in (root / "app.git" / "objects" / "pack").glob("*.pack")]
    pack = PackFile(base, 20, ("one-run", base))
    n = pack.count
    whole = layout.layout_for(pack, range(n))
    computed = layout._vector_layout(pack, array("I", range(n)), False)
    assert whole is not None and computed is not None and type(whole) is not type(computed)
    assert len(whole.starts) == len(computed.starts) == 1
    assert (whole.starts, whole.stops, whole.size, whole.deltas, whole.literals) == (
        computed.starts, computed.stops, computed.size, computed.deltas, computed.literals)
    assert [whole.out_offset(r) for r in range(n)] == [computed.out_offset(r) for r in range(n)]
    assert whole.out_offset(n) is None
    assert not layout._every_entry(pack, array("I", range(n - 1)))
    assert not layout._every_entry(pack, array("I", [0, *range(n - 2), n - 1]))


@pytest.mark.parametrize("ofs", [True, False])
def test_a_packs_delta_facts_are_kept_for_the_next_process(git: Git, tmp_path: Path,
                                                           ofs: bool) -> None:
    """Whether a pack holds a REF_DELTA, and how many deltas: computed from every entry's
    header once, then read from the store by a new process's PackFile, which reads no
    header for them. Not counted as a closure or a layout loaded, missed or written."""
    root = tmp_path / "root"
    root.mkdir()
    _build_long(git, root)
    repo = root / "app.git"
    # Without OFS_DELTA, pack-objects writes every delta as a REF_DELTA.
    git.run("-c", f"repack.useDeltaBaseOffset={str(ofs).lower()}", "repack", "-q", "-adf",
            cwd=repo)
    (base,) = [str(p)[:-5] for p in (repo / "objects" / "pack").glob("*.pack")]
    (tmp_path / "cache").mkdir()
    (tmp_path / "other").mkdir()
    store = ClosureStore(str(tmp_path / "cache"), 1 << 20)
    assert store.enabled
    first = PackFile(base, 20, ("first", base))
    bases = np.frombuffer(first.base_ranks(), dtype=np.int32)
    want = (bool((bases < 0).any()),
            int(np.count_nonzero(bases != np.arange(len(bases), dtype=np.int32))))
    assert want[0] is not ofs and want[1] > 1000
    assert first.delta_facts(store, "scope") == want
    store.flush()
    assert [p.name for p in store_files(tmp_path / "cache")] == [f"{first.checksum.hex()[:16]}-deltas.clo"]
    second = PackFile(base, 20, ("second", base))
    assert second.delta_facts(store, "scope") == want
    assert second.has_ref_deltas() is want[0]
    assert "base_ranks" not in second.extra  # read from the store, not from the pack
    assert store.stats.results["written"] == store.stats.results["loaded"] == 0
    # A store that lost the record: computed again.
    other = ClosureStore(str(tmp_path / "other"), 1 << 20)
    third = PackFile(base, 20, ("third", base))
    assert third.delta_facts(other, "scope") == want and "base_ranks" in third.extra
    # A record under the right identity whose payload is no facts: removed, counted
    # corrupt, and written again from the pack.
    other.flush()
    other.save(*facts_key(first, "scope"), b"\x01" * 3, count=False)
    other.flush()
    fourth = PackFile(base, 20, ("fourth", base))
    assert fourth.delta_facts(other, "scope") == want and "base_ranks" in fourth.extra
    assert other.stats.results["corrupt"] == 1
    other.flush()
    fifth = PackFile(base, 20, ("fifth", base))
    assert fifth.delta_facts(other, "scope") == want and "base_ranks" not in fifth.extra
    # The right length, but as many deltas as entries: no pack is all deltas.
    other.save(*facts_key(first, "scope"), struct.pack("<?Q", False, first.count), count=False)
    other.flush()
    sixth = PackFile(base, 20, ("sixth", base))
    assert sixth.delta_facts(other, "scope") == want and "base_ranks" in sixth.extra
    assert other.stats.results["corrupt"] == 2


def test_record_round_trip_and_damage() -> None:
    data = encode_record(b"identity", b"payload" * 100)
    assert decode_record(data) == (b"identity", b"payload" * 100)
    for bad in (data[:-1], data + b"x", data[:20], b"",
                data[:40] + bytes([data[40] ^ 1]) + data[41:]):
        assert decode_record(bad) is None


def test_store_answers_only_its_identity_and_keeps_its_budget(tmp_path: Path) -> None:
    store = ClosureStore(str(tmp_path), 4096)
    store.save("s", "a", b"id-a", b"x" * 600)
    store.flush()
    assert store.load("s", "a", b"id-a") == b"x" * 600
    assert store.load("s", "a", b"id-b") is None  # another pack: stale, removed
    assert store.load("s", "a", b"id-a") is None
    assert store.stats.results["stale"] == 1 and store.stats.results["missed"] == 1
    for k in range(12):  # 12 files of about 700 bytes in a budget of 4 KiB
        store.save("s", f"n{k}", b"id", b"y" * 600)
    store.flush()
    total = sum(p.stat().st_size for p in (tmp_path / STORE_DIR).glob("*/*.clo"))
    assert total <= 4096 and store.stats.results["evicted"] > 0
    assert store.load("s", "n11", b"id") == b"y" * 600  # the newest kept


def test_stores_sharing_a_directory_keep_it_within_the_whole_budget(tmp_path: Path) -> None:
    """Two workers' stores on one directory, each with the pod's whole budget (8 KiB, the
    sixteenth of --pack-cache-size) and ``shared``: writing in turn, the directory never
    holds more than that budget, and it is used, not a worker's half of it (each counts
    the directory again after its writes)."""
    stores = [ClosureStore(str(tmp_path), 8192, shared=True) for _ in range(2)]
    most = 0
    for k in range(40):
        store = stores[k % 2]
        store.save("s", f"w{k % 2}-{k}", b"id", b"z" * 600)
        store.flush()
        total = sum(p.stat().st_size for p in (tmp_path / STORE_DIR).glob("*/*.clo"))
        assert total <= 8192, (k, total)
        most = max(most, total)
    assert most > 6144, most  # more than three quarters: the whole budget holds records
    assert sum(s.stats.results["evicted"] for s in stores) > 0


def _leftovers(cache: Path, scope: str) -> tuple[Path, Path]:
    """A killed writer's temporary file (untouched for longer than TMP_AGE) and one being
    written by a live process now, in ``scope`` of the store in ``cache``."""
    folder = cache / STORE_DIR / scope
    folder.mkdir(parents=True, mode=0o700, exist_ok=True)
    os.chmod(cache / STORE_DIR, 0o700)
    stale, fresh = folder / ".tmp-4242-1-1", folder / ".tmp-4243-1-1"
    stale.write_bytes(b"GSCLOSR\0half a record")
    fresh.write_bytes(b"GSCLOSR\0being written")
    old = stale.stat().st_mtime - TMP_AGE - 60
    os.utime(stale, (old, old))
    return stale, fresh


def test_killed_writers_temporary_files_are_removed(tmp_path: Path) -> None:
    """A process killed between writing a record and renaming it leaves its temporary file:
    the next store on the directory removes it (counted corrupt), on start and when it
    evicts; a young one (another process writing now) stays."""
    stale, fresh = _leftovers(tmp_path, "s")
    store = ClosureStore(str(tmp_path), 4096)
    assert not stale.exists() and fresh.exists()
    assert store.stats.results["corrupt"] == 1 and store.stats.bytes == 0
    stale, fresh = _leftovers(tmp_path, "t")  # planted while it runs: its trim finds them
    for k in range(12):
        store.save("s", f"n{k}", b"id", b"y" * 600)
    store.flush()
    assert store.stats.results["evicted"] > 0
    assert not stale.exists() and fresh.exists()
    assert store.stats.results["corrupt"] == 2


def test_server_start_removes_killed_writers_temporary_files(tmp_path: Path) -> None:
    cache, root = tmp_path / "cache", tmp_path / "root"
    root.mkdir()
    stale, fresh = _leftovers(cache, "s")
    srv = _start(root, cache)
    try:
        assert not stale.exists() and fresh.exists()
        assert store_counts(srv.port)["corrupt"] == 1
    finally:
        srv.stop()
    assert fresh.exists()


def test_store_refuses_a_directory_others_may_write(tmp_path: Path) -> None:
    (tmp_path / STORE_DIR).mkdir(mode=0o777)
    os.chmod(tmp_path / STORE_DIR, 0o777)
    store = ClosureStore(str(tmp_path), 1 << 20)
    assert not store.enabled
    store.save("s", "a", b"id", b"x")
    assert store.load("s", "a", b"id") is None
    assert not list((tmp_path / STORE_DIR).iterdir())



def test_store_stays_with_the_directory_it_checked(tmp_path: Path) -> None:
    """Whoever may write to the cache directory (an emptyDir is mode 0777) may rename the
    store away and put their own in its place: the store keeps using the directory it
    found private, never reads the planted one."""
    base = tmp_path / "cache"
    base.mkdir()
    os.chmod(base, 0o777)
    store = ClosureStore(str(base), 1 << 20)
    assert store.enabled
    store.save("s", "a", b"id", b"ours")
    store.flush()
    (base / STORE_DIR).rename(base / "moved")
    planted = ClosureStore(str(base), 1 << 20)  # as a stranger would make it
    planted.save("s", "b", b"id", b"planted")
    planted.flush()
    assert store.load("s", "b", b"id") is None
    assert store.load("s", "a", b"id") == b"ours"
    store.save("s", "c", b"id", b"more")
    store.flush()
    assert (base / "moved" / "s").is_dir() and not (base / STORE_DIR / "s" / "c.clo").exists()

def test_layout_record_round_trip_and_mismatch() -> None:
    layout = Layout(array("I", [1, 2, 5]), array("Q", [0, 10, 30]), b"lit",
                    array("Q", [0, 3, 3]), array("Q", [100, 140]), array("Q", [120, 160]),
                    60, 1, 1, 0)
    data = encode_layout(layout)
    assert decode_layout(data, array("I", [1, 2, 5])) == layout
    assert decode_layout(data, array("I", [1, 2, 6])) is None  # other entries
    for bad in (data[:-1], data + b"x", data[:50], b""):
        assert decode_layout(bad, array("I", [1, 2, 5])) is None


def test_a_layout_record_that_is_no_layout_is_removed(tmp_path: Path) -> None:
    """A layout record whose identity matches but whose payload is no layout of the
    entries asked for is not loaded: removed and counted corrupt; a good one is loaded."""
    layout = Layout(array("I", [1, 2, 5]), array("Q", [0, 10, 30]), b"lit",
                    array("Q", [0, 3, 3]), array("Q", [100, 140]), array("Q", [120, 160]),
                    60, 1, 1, 0)
    disk = ClosureStore(str(tmp_path), 1 << 26)
    good, bad = ("scope", "layout-good", b"id-good"), ("scope", "layout-bad", b"id-bad")
    disk.save(*good, encode_layout(layout))
    disk.save(*bad, encode_layout(layout)[:-1])
    disk.flush()
    assert load_layout(disk, good, array("I", [1, 2, 5])) == layout
    assert load_layout(disk, bad, array("I", [1, 2, 5])) is None
    assert disk.stats.results["loaded"] == 1 and disk.stats.results["corrupt"] == 1
    assert [p.name for p in (tmp_path / STORE_DIR / "scope").iterdir()] == ["layout-good.clo"]
