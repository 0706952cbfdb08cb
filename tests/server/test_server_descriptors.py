"""Descriptors within a budget (issue 24, item 1; store/registry.py, docs/operations.md "Open files").

A request needs a bounded number of descriptors whatever the number of packs it froze:
packs are opened on demand within --max-open-packs and closed between reads. Under the
usual container limit (``ulimit -n 1024``) a repository of many packs is cloned whole and
fsck-clean, the descriptors fall back within the budget, and the next request works. A
request that fails gives back what it took. At start the soft limit is raised to the hard
one, and one line says when the limits cannot hold the budgets.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from pathlib import Path

import pytest
from gitspout.server.store.confine import LinkGuard, OutsideRoot
from gitspout.server.store.fscache import DirCache
from gitspout.server.store.fsops import FsOps
from gitspout.server.store.odb import ObjectSnapshot, PackRegistry
from gitutil import Git, deleted_files, fsck, open_files, repo_state, start_server, wait_until
from rawhttp import metric
from repos_fixture import build_many_packs

PACKS = 600  # 1,200 descriptors if every pack stayed open: past ulimit -n 1024
NOFILE = 1024  # the common container default
BUDGET = 256  # --max-open-packs, default
SLACK = 64  # sockets, listeners, logs, the pool's pins: what is not a pack


@pytest.fixture(scope="module")
def many_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    root = tmp_path_factory.mktemp("manypacks")
    build_many_packs(git, root / "many.git", PACKS)
    return root


def _pack_fds(pid: int, root: Path) -> int:
    return sum(1 for t in open_files(pid) if t.startswith(str(root)))


def test_clone_of_600_packs_under_ulimit_1024(many_root: Path, git: Git, tmp_path: Path) -> None:
    """Before: 1,200 descriptors wanted, `[Errno 24] Too many open files`, HTTP 500, and the
    server stuck at 1,023 descriptors answering 500 until restarted."""
    srv = start_server(many_root, nofile=NOFILE)
    try:
        for n, version in enumerate(("2", "0", "2")):
            dest = tmp_path / f"clone{n}"
            git.run("-c", f"protocol.version={version}", "clone", "-q", "--bare",
                    f"{srv.url}/many.git", str(dest), timeout=120)
            fsck(git, dest)
            if n == 0:
                ref = tmp_path / "ref"
                git.run("clone", "-q", "--bare", f"file://{many_root / 'many.git'}", str(ref))
                assert repo_state(git, dest) == repo_state(git, ref)
            # Back within the budget once the request is over (its leases ended).
            assert wait_until(lambda: metric(srv.port, "gitspout_open_files") <= BUDGET, 10)
            assert _pack_fds(srv.proc.pid, many_root) <= BUDGET
            assert len(open_files(srv.proc.pid)) <= BUDGET + SLACK
        assert metric(srv.port, 'gitspout_open_files_closed_total{reason="evicted"}') > 0
        assert not [line for line in srv.lines if "Too many open files" in line]
    finally:
        srv.stop()


def test_start_raises_the_soft_limit_and_says_when_budgets_do_not_fit(
        fixture_root: Path) -> None:
    srv = start_server(fixture_root, nofile=(512, 4096))
    try:
        limits = Path(f"/proc/{srv.proc.pid}/limits").read_text()
        soft = re.search(r"Max open files\s+(\d+)\s+(\d+)", limits)
        assert soft is not None and soft.groups() == ("4096", "4096"), limits
        assert not [line for line in srv.lines if "descriptor limit" in line]
    finally:
        srv.stop()
    out: list[str] = []
    srv = start_server(fixture_root, nofile=512, output=out)  # 256 + 512 + reserve > 512
    try:
        said = [x for x in out if "descriptor limit" in x]  # said before "serving"
        assert len(said) == 1 and "descriptor limit 512" in said[0], out
        assert "--max-open-packs 256" in said[0] and "--max-connections 512" in said[0]
    finally:
        srv.stop()


def test_a_snapshot_that_fails_gives_back_its_packs(git: Git, tmp_path: Path) -> None:
    """An error after packs were leased (here an alternate leading outside the root,
    refused after objects/pack was read) gives the leases back at once: before, they
    stayed taken, so a repack's old pack stayed open (deleted) for good."""
    root = tmp_path / "root"
    repo = build_many_packs(git, root / "r.git", 3)
    outside = tmp_path / "outside"
    build_many_packs(git, outside, 1, seed=1)
    (repo / "objects" / "info").mkdir(exist_ok=True)
    (repo / "objects" / "info" / "alternates").write_text(f"{outside / 'objects'}\n")
    registry = PackRegistry(max_open=BUDGET)
    dirs = DirCache(guard=LinkGuard(str(root), False))
    with pytest.raises(OutsideRoot):
        ObjectSnapshot(str(repo / "objects"), 20, registry, FsOps(), dirs=dirs)
    assert len(registry) == 0 or all(item.leases == 0 for item in registry._open.values())
    os.remove(repo / "objects" / "info" / "alternates")
    git.run("repack", "-adq", cwd=repo)
    with ObjectSnapshot(str(repo / "objects"), 20, registry, FsOps(), dirs=dirs) as snap:
        assert len(snap.packs) == 1
    assert deleted_files(os.getpid(), repo) == []


def test_threads_reading_many_packs_under_a_tiny_budget_read_the_right_bytes(
        many_root: Path) -> None:
    """Four threads read every object of the 600 packs through their own snapshots while
    the budget (4: two packs) closes files between reads: each object must hash to its
    id (a descriptor number used after it was closed would read another pack)."""
    registry = PackRegistry(max_open=4)
    objects = str(many_root / "many.git" / "objects")
    errors: list[BaseException] = []

    def reader(k: int) -> None:
        try:
            with ObjectSnapshot(objects, 20, registry, FsOps(), dirs=DirCache()) as snap:
                packs = snap.packs[k * 150:] + snap.packs[:k * 150]  # all, in turns
                for pack in packs:
                    for pos in range(pack.count):
                        oid = pack.oid_at(pos)
                        type_num, data = snap.read_packed(pack, pack.offset_at(pos))
                        name = {1: b"commit", 2: b"tree", 3: b"blob", 4: b"tag"}[type_num]
                        head = name + b" %d\0" % len(data)
                        assert hashlib.sha1(head + data).digest() == oid
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[:3]
    assert registry.evicted > 0 and registry.handles <= 4
