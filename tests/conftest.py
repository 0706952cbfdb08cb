"""Shared fixtures: a hermetic git, fixture repositories under one root, a live gitspout."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from gitutil import Git, LiveServer, start_server  # noqa: E402
from repos_fixture import build_fixture_root, build_long_root  # noqa: E402


@pytest.fixture(scope="session")
def git(tmp_path_factory: pytest.TempPathFactory) -> Git:
    home = tmp_path_factory.mktemp("home")
    (home / ".gitconfig").write_text(
        "[init]\n\tdefaultBranch = main\n[protocol]\n\tallow = always\n"
        "[advice]\n\tdetachedHead = false\n"
    )
    return Git(home)


@pytest.fixture(scope="session")
def fixture_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    """A directory of fixture repositories built with the git CLI (see repos_fixture.py)."""
    root = tmp_path_factory.mktemp("served")
    build_fixture_root(git, root, tmp_path_factory.mktemp("build"))
    return root


@pytest.fixture(scope="session")
def server(fixture_root: Path) -> Iterator[LiveServer]:
    """A gitspout process serving ``fixture_root`` on 127.0.0.1."""
    srv = start_server(fixture_root)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def long_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    """A root with a 1,500-commit history, with and without bitmaps (repos_fixture.py)."""
    root = tmp_path_factory.mktemp("long")
    build_long_root(git, root)
    return root


@pytest.fixture(scope="session")
def long_server(long_root: Path) -> Iterator[LiveServer]:
    srv = start_server(long_root)
    yield srv
    srv.stop()
