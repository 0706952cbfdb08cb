"""A repository with tens of thousands of loose refs in one directory (a mirror's
``refs/pull/*`` before ``git pack-refs``, a tag import before ``gc``).

The loose refs of a directory are read by looking each file up in the directory's
listing. The listing made a dict of its entries on every lookup: 30,000 loose refs cost
4.5e8 dict insertions, 242 s of a pool thread for one ``ls-remote`` where C git over
``file://`` takes 1.4 s. The answers must equal ``file://`` whatever their number.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitspout.server.store.fscache import Listing
from gitutil import Git, LiveServer, start_server

LOOSE = 30_000
# Far above what the answers take now (about 2 s each here), far below what they took
# with a dict per lookup (242 s for the first): git is stopped past it and the test fails.
LS_REMOTE_TIMEOUT = 120.0


def test_a_listing_makes_its_entries_by_name_once() -> None:
    """The lookup of each file of a directory costs one dict lookup, not a new dict."""
    listing = Listing((1, 2, 3), tuple((f"r{i}", i, False) for i in range(1000)), True)
    names = listing.names()
    assert names["r999"] == ("r999", 999, False) and len(names) == 1000
    assert listing.names() is names


@pytest.fixture(scope="module")
def served(git: Git, fixture_root: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, Path]]:
    """A server of one repository: basic.git with LOOSE loose refs under refs/pull/."""
    root = tmp_path_factory.mktemp("loose")
    path = root / "loose.git"
    shutil.copytree(fixture_root / "basic.git", path)
    commits = git.out("--git-dir", str(path), "rev-list", "--all").split()
    pulls = path / "refs" / "pull"
    pulls.mkdir()
    for i in range(LOOSE):  # as a fetch of refs/pull/* leaves them: one file each
        (pulls / f"{i}").write_text(commits[i % len(commits)] + "\n")
    server = start_server(root)
    yield server, path
    server.stop()


@pytest.mark.slow
@pytest.mark.parametrize("version", [2, 0])
def test_ls_remote_of_thirty_thousand_loose_refs_equals_file(
        git: Git, served: tuple[LiveServer, Path], version: int) -> None:
    server, repo = served
    url = f"{server.url}/{repo.name}"
    for _ in range(2):  # the first read, then one from what the first kept
        ours = git.out("-c", f"protocol.version={version}", "ls-remote", url,
                       timeout=LS_REMOTE_TIMEOUT)
        theirs = git.out("-c", f"protocol.version={version}", "ls-remote",
                         f"file://{repo}")
        assert ours == theirs
        assert sum(1 for line in ours.splitlines() if "\trefs/pull/" in line) == LOOSE
