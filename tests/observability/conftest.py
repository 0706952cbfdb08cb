"""Fixtures for the observability tests: a small served repository (with a bitmap, so
clones take the verbatim/bitmap paths), fresh copies of it, and dedicated gitspout servers
whose output is kept (the JSON access log) and whose counters no other test touches."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from gitutil import Committer, Git  # noqa: E402
from obsutil import REPO, CapturedServer, make_root, start_captured  # noqa: E402


@pytest.fixture(scope="session")
def obs_template(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    """A bare repository: 24 commits on main, a branch, tags; one pack with a bitmap and a
    commit-graph, and a few more commits as a second pack (so clones generate objects)."""
    base = tmp_path_factory.mktemp("obs")
    work = base / "work"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work, start=1_690_000_000)
    for i in range(20):
        c.commit({"README.md": f"# obs\n\nrevision {i}\n",
                  f"src/m{i % 4}.py": "".join(f"x{j} = {i * j}\n" for j in range(30 + i)),
                  f"docs/p{i % 3}.txt": f"page {i}\n" * 12}, f"commit {i}")
        if i == 8:
            c.tag("v1", "release 1")
    git.run("branch", "side", "HEAD~3", cwd=work)
    bare = base / "template" / REPO
    git.run("clone", "-q", "--bare", "--no-local", str(work), str(bare))
    git.run("repack", "-adqb", cwd=bare)
    git.run("commit-graph", "write", "--reachable", cwd=bare)
    for i in range(4):
        c.commit({f"late/f{i}.txt": f"late {i}\n" * 40}, f"late {i}")
    git.run("push", "-q", str(bare), "main", cwd=work)
    git.run("config", "uploadpack.allowFilter", "true", cwd=bare)
    return bare


@pytest.fixture
def obs_root(tmp_path: Path, obs_template: Path) -> Path:
    """A served root of this test's own."""
    return make_root(tmp_path / "served", obs_template)


@pytest.fixture
def start_server() -> Iterator[Callable[..., CapturedServer]]:
    """A factory for dedicated gitspout processes; every one is stopped at teardown."""
    started: list[CapturedServer] = []

    def start(root: Path, *extra: str) -> CapturedServer:
        srv = start_captured(root, extra)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()
