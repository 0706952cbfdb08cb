"""Fixtures for the HTTP adapter tests: extra servers (small caps, symlinks, a big pack) and
a check after every test that the session server is still alive and serving.

Module names in this directory must not repeat those of the ``server`` package (``http``,
``repos``...): without an ``__init__.py`` this directory can join ``server``'s namespace.
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from gitutil import Git, LiveServer, copy_repo, start_server  # noqa: E402
from rawhttp import SMALL_MAX_BODY, SMALL_MAX_INFLATED, assert_serving  # noqa: E402

BIG_BLOB_BYTES = 16 << 20


@pytest.fixture(autouse=True)
def session_server_survives(server: LiveServer) -> Iterator[None]:
    """Whatever a test sent, the shared server must still be up and answering afterwards."""
    yield
    assert server.alive(), "gitspout exited"
    assert_serving(server.port)


@pytest.fixture(scope="session")
def oids(git: Git, fixture_root: Path) -> dict[str, str]:
    def rev(repo: str, ref: str) -> str:
        return git.out("--git-dir", str(fixture_root / repo), "rev-parse", ref).strip()

    return {
        "basic_main": rev("basic.git", "refs/heads/main"),
        "basic_feature": rev("basic.git", "refs/heads/feature"),
        "basic_first": git.out("--git-dir", str(fixture_root / "basic.git"), "rev-list",
                               "--max-parents=0", "main").strip(),
        "hidden_main": rev("hidden.git", "refs/heads/main"),
        "hidden_secret": rev("hidden.git", "refs/hidden/secret"),
        "hidden_other": rev("hidden.git", "refs/other/thing"),
        "sha256_main": rev("sha256.git", "refs/heads/main"),
    }


@pytest.fixture(scope="session")
def small_server(fixture_root: Path) -> Iterator[LiveServer]:
    """The fixture root served with small body caps (raw and inflated)."""
    srv = start_server(fixture_root, extra_args=[
        "--max-body", str(SMALL_MAX_BODY), "--max-inflated-body", str(SMALL_MAX_INFLATED)])
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def symlink_root(tmp_path_factory: pytest.TempPathFactory, fixture_root: Path) -> Path:
    """A root holding basic.git and symlinks that point inside and outside of it.

    Served names and what they should give:
      basic.git, alias.git -> basic.git, grp/inner.git -> ../basic.git,
      up -> .. (so up/root/basic.git lands back inside)                      200
      escape.git -> <abs outside>/basic.git, relescape.git -> ../outside/basic.git,
      linkdir -> <abs outside> (linkdir/basic.git), rootlink -> /, loop.git -> loop.git,
      dangling.git -> missing.git                                              404
    """
    base = tmp_path_factory.mktemp("symlinks")
    root, outside = base / "root", base / "outside"
    root.mkdir()
    outside.mkdir()
    copy_repo(fixture_root / "basic.git", root / "basic.git")
    copy_repo(fixture_root / "basic.git", outside / "basic.git")
    os.symlink("basic.git", root / "alias.git")
    (root / "grp").mkdir()
    os.symlink("../basic.git", root / "grp" / "inner.git")
    os.symlink("..", root / "up")
    os.symlink(str(outside / "basic.git"), root / "escape.git")
    os.symlink("../outside/basic.git", root / "relescape.git")
    os.symlink(str(outside), root / "linkdir")
    os.symlink("/", root / "rootlink")
    os.symlink("loop.git", root / "loop.git")
    os.symlink("missing.git", root / "dangling.git")
    return root


@pytest.fixture(scope="session")
def symlink_server(symlink_root: Path) -> Iterator[LiveServer]:
    srv = start_server(symlink_root)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def big_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> tuple[Path, str]:
    """A root with big.git: one commit holding a 16 MiB incompressible blob. Returns the
    root and the commit id."""
    root = tmp_path_factory.mktemp("big")
    repo = root / "big.git"
    git.run("init", "-q", "--bare", "-b", "main", str(repo))
    blob_file = tmp_path_factory.mktemp("bigblob") / "blob.bin"
    blob_file.write_bytes(random.Random(20240611).randbytes(BIG_BLOB_BYTES))
    gd = ["--git-dir", str(repo)]
    blob = git.out(*gd, "hash-object", "-w", str(blob_file)).strip()
    tree = git.out(*gd, "mktree", input=f"100644 blob {blob}\tbig.bin\n".encode()).strip()
    env = {"GIT_AUTHOR_DATE": "1600000000 +0000", "GIT_COMMITTER_DATE": "1600000000 +0000"}
    commit = git.out(*gd, "commit-tree", tree, "-m", "big", env=env).strip()
    git.run(*gd, "update-ref", "refs/heads/main", commit)
    git.run(*gd, "repack", "-adq")
    return root, commit


@pytest.fixture(scope="session")
def big_server(big_root: tuple[Path, str]) -> Iterator[LiveServer]:
    """big.git served with a pool of 2 threads, so that leaked workers would show."""
    srv = start_server(big_root[0], extra_args=["--threads", "2"])
    yield srv
    srv.stop()


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    """An empty directory for a server's ``--pack-cache-dir``."""
    d = tmp_path / "cache"
    d.mkdir()
    return d
