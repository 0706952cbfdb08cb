"""Alternates as C git reads them (issue 24, item 6; store/odb.py ``_load_alternates``).

An ``objects/info/alternates`` file naming the repository's own objects directory N times
cost N + N^2 + ... + N^5 object snapshots per request (12 lines: 15 s and +220 MB per
fetch). C git links each real path once and never its own directory; so do we, and the
object directories of a request are capped, with one log line.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from gitspout.server.store import odb
from gitspout.server.store.fscache import DirCache
from gitspout.server.store.fsops import FsOps
from gitspout.server.store.odb import ObjectSnapshot, PackRegistry
from gitutil import Git, copy_repo, fsck, repo_state, start_server


def _fork(git: Git, root: Path, shared: Path, name: str, lines: list[str]) -> Path:
    """A bare clone of ``shared`` with no objects of its own, reading them through an
    alternates file of ``lines``."""
    fork = root / name
    git.run("clone", "-q", "--bare", "--shared", str(shared), str(fork))
    (fork / "objects" / "info" / "alternates").write_text("".join(f"{x}\n" for x in lines))
    return fork


@pytest.fixture(scope="module")
def alt_root(tmp_path_factory: pytest.TempPathFactory, git: Git, fixture_root: Path) -> Path:
    root = tmp_path_factory.mktemp("altroot")
    shared = copy_repo(fixture_root / "basic.git", root / "shared.git")
    objects = str(shared / "objects")
    _fork(git, root, shared, "one.git", [objects])
    # Its own directory three times (spelled three ways), the shared one three times.
    _fork(git, root, shared, "dups.git", ["../objects", ".", f"{root}/dups.git/objects/",
                                          objects, "../../shared.git/objects", objects + "/"])
    return root


def _snapshots(snap: ObjectSnapshot) -> int:
    return 1 + sum(_snapshots(alt) for alt in snap.alternates)


def _open(repo: Path, registry: PackRegistry, fs: FsOps) -> ObjectSnapshot:
    return ObjectSnapshot(str(repo / "objects"), 20, registry, fs, dirs=DirCache())


def test_duplicate_lines_cost_what_one_costs(alt_root: Path) -> None:
    """Before: 6 + 36 + ... + 6^5 = 9,330 snapshots for the six lines."""
    costs = {}
    for name in ("one.git", "dups.git"):
        registry, fs = PackRegistry(), FsOps()
        with _open(alt_root / name, registry, fs) as snap:
            costs[name] = (_snapshots(snap), registry.opened, len(registry))
    assert costs["dups.git"] == costs["one.git"] == (2, 1, 1), costs


def test_a_fork_takes_the_real_paths_once(alt_root: Path) -> None:
    """The real paths of the alternates and of the fork's own directory (skipped as one
    seen) are taken once per alternates file, not on every request: each is an lstat of
    every component of the path, a round trip on NFS."""
    registry, dirs = PackRegistry(), DirCache()
    taken = []
    for _ in range(3):
        fs = FsOps()
        with ObjectSnapshot(str(alt_root / "dups.git" / "objects"), 20, registry, fs,
                            dirs=dirs) as snap:
            assert _snapshots(snap) == 2
        taken.append(fs.counts["realpath"])
    assert taken == [7, 0, 0]  # six lines and its own directory, then none


def test_object_directories_are_capped_with_one_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    repo = tmp_path / "r.git"
    (repo / "objects" / "info").mkdir(parents=True)
    dirs = []
    for i in range(odb.MAX_OBJECT_DIRS + 8):
        d = tmp_path / f"alt{i}" / "objects"
        (d / "pack").mkdir(parents=True)
        dirs.append(str(d))
    (repo / "objects" / "info" / "alternates").write_text("\n".join(dirs) + "\n")
    registry = PackRegistry()
    with caplog.at_level(logging.WARNING, logger="gitspout"):
        for _ in range(2):
            with _open(repo, registry, FsOps()) as snap:
                assert _snapshots(snap) == odb.MAX_OBJECT_DIRS
    said = [r.getMessage() for r in caplog.records if "object directories" in r.getMessage()]
    assert len(said) == 1 and f"ignoring {dirs[odb.MAX_OBJECT_DIRS - 1]}" in said[0], said


def _fetch_fs_ops(lines: list[str]) -> dict[str, int]:
    fetches = [json.loads(line) for line in lines
               if line.startswith("{") and '"command":"fetch"' in line]
    return fetches[-1]["fs_ops"]


def test_clone_through_duplicate_alternates_equals_file_and_costs_one(
        alt_root: Path, git: Git, tmp_path: Path) -> None:
    srv = start_server(alt_root, ["--log-format", "json"])  # the access log's fs_ops
    try:
        ops = {}
        for name in ("one.git", "dups.git"):
            for n in range(2):  # the second is warm: what every later request costs
                dest = tmp_path / f"{name}-{n}"
                git.run("clone", "-q", "--bare", f"{srv.url}/{name}", str(dest), timeout=60)
            fsck(git, dest)
            ref = tmp_path / f"{name}-ref"
            git.run("clone", "-q", "--bare", f"file://{alt_root / name}", str(ref))
            assert repo_state(git, dest) == repo_state(git, ref)
            ops[name] = _fetch_fs_ops(srv.lines)
        assert ops["dups.git"] == ops["one.git"], ops
    finally:
        srv.stop()
