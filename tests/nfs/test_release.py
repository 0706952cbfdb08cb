"""Replaced packs are released (store/registry.py; docs/ARCHITECTURE.md I1; docs/operations.md "Open files").

A pack that its directory no longer lists (``git repack -ad``, ``git gc --prune=now``) is
closed once the last request that froze it ends, so that no ``(deleted)`` file stays open
or mapped in the server (on local disk its space would never be freed; on NFS it would
stay behind as a ``.nfsXXXX`` silly-rename file, on FUSE as ``.fuse_hidden*``).

- store-level, deterministic: leases, retirement, the open-file budget, the sweep, a
  repository that disappears;
- live: clones (each fsck'ed) while another process pushes, repacks and gcs many times,
  on local disk and on the latencyfs FUSE mount; afterwards the server holds no deleted
  file and the mount has no hidden file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from gitspout.server.store.fscache import DirCache
from gitspout.server.store.fsops import FsOps
from gitspout.server.store.odb import ObjectSnapshot, PackRegistry
from gitutil import Committer, Git, deleted_files, git_env, open_files, start_server, wait_until
from mount import MountFactory


def _make_repo(git: Git, where: Path, name: str = "r.git", commits: int = 3) -> tuple[Path, Path]:
    work = where / f"{name}-work"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    for i in range(commits):
        c.commit({f"f{i}.txt": f"content {i}\n" * 10}, f"c{i}")
    repo = where / name
    git.run("clone", "-q", "--bare", "--no-local", str(work), str(repo))
    git.run("config", "gc.auto", "0", cwd=repo)
    git.run("gc", "-q", cwd=repo)
    git.run("remote", "add", "served", str(repo), cwd=work)
    return repo, work


def _push_and_repack(git: Git, repo: Path, work: Path, n: int) -> None:
    Committer(git, work, start=1_700_000_000 + 1000 * n).commit({f"n{n}.txt": f"{n}\n"}, f"n{n}")
    git.run("push", "-q", "served", "HEAD:main", cwd=work)
    git.run("repack", "-adq", cwd=repo)


def _snapshot(repo: Path, registry: PackRegistry) -> ObjectSnapshot:
    return ObjectSnapshot(str(repo / "objects"), 20, registry, FsOps(), dirs=DirCache())


def _head(git: Git, repo: Path) -> bytes:
    return bytes.fromhex(git.out("rev-parse", "main", cwd=repo).strip())


def _mine(repo: Path) -> list[str]:
    return deleted_files(os.getpid(), repo)


def test_replaced_pack_closes_when_its_last_lease_ends(git: Git, tmp_path: Path) -> None:
    repo, work = _make_repo(git, tmp_path)
    registry = PackRegistry()
    old = _snapshot(repo, registry)
    tip = _head(git, repo)
    assert old.read(tip)[0] == 1
    _push_and_repack(git, repo, work, 1)
    new = _snapshot(repo, registry)  # lists objects/pack: the old pack is retired...
    assert new.read(_head(git, repo))[0] == 1
    assert _mine(repo), "the old pack should still be open: a request holds it"
    registry.objects.clear()
    assert old.read(tip)[0] == 1  # ...but stays readable by the request that froze it
    old.close()
    assert _mine(repo) == []  # ...and is closed when that request ends
    assert registry.released == 1
    new.close()
    assert registry.open_files == 1 and registry.handles == 2


def test_cache_entries_of_a_replaced_pack_are_dropped(git: Git, tmp_path: Path) -> None:
    repo, work = _make_repo(git, tmp_path)
    registry = PackRegistry()
    with _snapshot(repo, registry) as snap:
        snap.read(_head(git, repo))
        key = snap.packs[0].key
    assert any(isinstance(k, tuple) and k[0] == key for k in registry.objects._data)
    _push_and_repack(git, repo, work, 1)
    _snapshot(repo, registry).close()
    assert not any(isinstance(k, tuple) and k[0] == key for k in registry.objects._data)


def test_budget_holds_for_leased_packs_and_never_closes_one_being_read(
        git: Git, tmp_path: Path) -> None:
    repos = [_make_repo(git, tmp_path, f"r{i}.git")[0] for i in range(4)]
    registry = PackRegistry(max_open=4)  # two packs (a descriptor and a map each)
    held = [_snapshot(r, registry) for r in repos]
    # Leased, but nobody reads them at this instant: closed for the budget, as C git
    # closes pack descriptors past its limit (a request may freeze thousands of packs).
    assert registry.handles <= 4
    for snap, repo in zip(held, repos, strict=True):
        registry.objects.clear()
        assert snap.read(_head(git, repo))[0] == 1  # opened again on demand
        assert registry.handles <= 4
    busy = held[0].packs[0]
    with busy.pinned():  # a read in progress: never closed under it
        for snap, repo in zip(held[1:], repos[1:], strict=True):
            registry.objects.clear()
            assert snap.read(_head(git, repo))[0] == 1
            assert not busy.closed
    for snap in held:
        snap.close()
    assert registry.handles <= 4 and registry.evicted >= 4
    before = len(open_files(os.getpid()))
    for repo in repos:  # closed packs open again on demand
        with _snapshot(repo, registry) as snap:
            registry.objects.clear()
            assert snap.read(_head(git, repo))[0] == 1
        assert registry.handles <= 4
    assert len(open_files(os.getpid())) <= before + 1


def test_replaced_pack_a_request_holds_is_never_closed_for_the_budget(
        git: Git, tmp_path: Path) -> None:
    repo, work = _make_repo(git, tmp_path)
    other, _ = _make_repo(git, tmp_path, "other.git")
    registry = PackRegistry(max_open=4)
    old = _snapshot(repo, registry)
    tip = _head(git, repo)
    assert old.read(tip)[0] == 1
    _push_and_repack(git, repo, work, 1)
    with _snapshot(repo, registry) as new:  # retires the old pack
        assert new.read(_head(git, repo))[0] == 1
        with _snapshot(other, registry) as third:  # over the budget now
            assert third.read(_head(git, other))[0] == 1
            assert not old.packs[0].closed  # it could not be opened again: kept
            assert registry.evicted >= 1  # the new pack, leased but not read, was closed
    registry.objects.clear()
    assert old.read(tip)[0] == 1
    old.close()
    assert _mine(repo) == []


def test_reopen_checks_the_inode(git: Git, tmp_path: Path) -> None:
    repo, _work = _make_repo(git, tmp_path)
    registry = PackRegistry(max_open=2)
    snap = _snapshot(repo, registry)
    pack = snap.packs[0]
    key = pack.key
    snap.close()
    other, _ = _make_repo(git, tmp_path, "other.git")
    _snapshot(other, registry).close()  # evicts the first pack
    assert key not in registry._open
    with pytest.raises(FileNotFoundError):
        registry.get(pack.base, 20, (key[0], key[1], key[2], 1), FsOps())  # wrong inode


def test_sweep_closes_packs_of_a_repository_nobody_asks_for(git: Git, tmp_path: Path) -> None:
    repo, work = _make_repo(git, tmp_path)
    registry = PackRegistry()
    _snapshot(repo, registry).close()
    _push_and_repack(git, repo, work, 1)
    assert _mine(repo)
    assert registry.sweep() == 1
    assert _mine(repo) == [] and registry.open_files == 0


def test_vanished_repository_is_forgotten(git: Git, tmp_path: Path) -> None:
    repo, _work = _make_repo(git, tmp_path)
    git.run("commit-graph", "write", "--reachable", cwd=repo)
    registry = PackRegistry()
    with _snapshot(repo, registry) as snap:
        assert snap.commit_graph() is not None
        snap.read(_head(git, repo))
    assert registry.open_files == 2
    shutil.rmtree(repo)
    assert len(_mine(repo)) >= 2
    registry.forget_repository(str(repo / "objects"))
    assert _mine(repo) == [] and registry.open_files == 0 and len(registry.objects) == 0


# -- live: clones while another process repacks -------------------------------------

ROUNDS = 8


def _repack_loop(git: Git, repo: Path, work: Path, url: str, scratch: Path,
                 clients: int = 2) -> tuple[int, list[str]]:
    """Clone and fsck in ``clients`` threads while the writer pushes, ``repack -ad``s and
    ``gc --prune=now``s ROUNDS times; (clones, failures)."""
    env = git_env(git.home)
    stop = threading.Event()
    failures: list[str] = []
    count = [0]
    lock = threading.Lock()

    def run(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=120, check=False)

    def client(k: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            dest = scratch / f"c{k}-{n}"
            res = run(["-c", f"protocol.version={2 if n % 2 else 0}", "clone", "-q", "--bare",
                       url, str(dest)])
            if res.returncode == 0:
                res = run(["fsck", "--no-progress", "--no-dangling"], cwd=dest)
            with lock:
                if res.returncode != 0:
                    failures.append(f"client {k} #{n}: {res.stderr.strip()}")
                else:
                    count[0] += 1
            shutil.rmtree(dest, ignore_errors=True)

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    for th in threads:
        th.start()
    try:
        c = Committer(git, work, start=1_710_000_000)
        for i in range(ROUNDS):
            for step in (["repack", "-adq"], ["gc", "-q", "--prune=now"]):
                c.commit({f"w{i}/{step[0]}.txt": f"round {i}\n" * (10 + i)}, f"{step[0]} {i}")
                for args, cwd in ((["push", "-q", "served", "HEAD:main"], work), (step, repo)):
                    res = run(args, cwd)
                    if res.returncode != 0:
                        failures.append(f"writer {' '.join(args)}: {res.stderr.strip()}")
    finally:
        stop.set()
        for th in threads:
            th.join(180)
    return count[0], failures


def _assert_released(pid: int, under: Path) -> None:
    # The last clone's requests may still be ending; replaced packs that no request listed
    # afterwards are closed by the sweep (--sweep-interval 0.5 here).
    ok = wait_until(lambda: not deleted_files(pid, under), timeout=10)
    assert ok, f"deleted files still held by the server: {deleted_files(pid, under)}"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_repack_loop_leaves_no_deleted_file_open(git: Git, tmp_path: Path) -> None:
    repo, work = _make_repo(git, tmp_path / "served", commits=20)
    scratch = tmp_path / "clones"
    scratch.mkdir()
    server = start_server(repo.parent, ["--sweep-interval", "0.5"])
    try:
        clones, failures = _repack_loop(git, repo, work, f"{server.url}/{repo.name}", scratch)
        assert not failures, "\n".join(failures[:5])
        assert clones >= 4
        _assert_released(server.proc.pid, repo.parent)
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_repack_loop_on_the_mount_leaves_nothing_behind(
        git: Git, tmp_path: Path, latency_mount: MountFactory) -> None:
    src = tmp_path / "served"
    repo, work = _make_repo(git, src, commits=20)
    mount = latency_mount(src, delay_ms=0.1)
    on_mount = mount.path / repo.name
    git.run("remote", "set-url", "served", str(on_mount), cwd=work)
    scratch = tmp_path / "clones"
    scratch.mkdir()
    server = start_server(mount.path, ["--sweep-interval", "0.5"])
    try:
        clones, failures = _repack_loop(git, on_mount, work, f"{server.url}/{repo.name}",
                                        scratch)
        assert not failures, "\n".join(failures[:5])
        assert clones >= 2
        _assert_released(server.proc.pid, mount.path)

        def hidden() -> list[str]:
            return [str(p) for p in src.rglob("*")
                    if p.name.startswith((".fuse_hidden", ".nfs"))]

        # The daemon removes a hidden file once the kernel releases it: soon after the
        # last descriptor closed, not at once.
        assert wait_until(lambda: not hidden(), 10), \
            f"files left behind on the mount: {hidden()}"
    finally:
        server.stop()


@pytest.mark.parametrize("damaged", [False, True])
def test_large_index_is_hashed_in_the_background(git: Git, tmp_path: Path, damaged: bool,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """An index over VERIFY_INLINE_MAX (set to 0 here) is usable at once and hashed by a
    background thread. A match is remembered; a mismatch (one CRC byte flipped: every
    lookup still works) retires the pack: the request holding it reads on, as C git would,
    and a later snapshot skips the pack as one damaged from the start."""
    from gitspout.server.store import registry as registry_mod

    monkeypatch.setattr(registry_mod, "VERIFY_INLINE_MAX", 0)
    repo, _ = _make_repo(git, tmp_path)
    (idx,) = (repo / "objects" / "pack").glob("*.idx")
    if damaged:
        data = bytearray(idx.read_bytes())
        count = int.from_bytes(data[8 + 1020 : 8 + 1024], "big")
        data[8 + 1024 + count * 20 + 1] ^= 0xFF
        idx.write_bytes(bytes(data))
    registry = PackRegistry()
    tip = _head(git, repo)
    snap = _snapshot(repo, registry)
    (pack,) = snap.packs
    assert snap.read(tip)[0] == 1  # usable before the hash is done
    if damaged:
        assert wait_until(lambda: not registry._open, timeout=10), "the damaged pack stays open"
        assert snap.read(tip)[0] == 1  # the holder reads on
        later = _snapshot(repo, registry)
        assert later.packs == [] and later.broken, "a later request must skip the pack"
        later.close()
    else:
        assert wait_until(lambda: pack.knows("verified"), timeout=10)
        assert list(registry._open) == [pack.key]
    snap.close()
    assert not _mine(repo)
