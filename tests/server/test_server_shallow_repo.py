"""A repository that is itself shallow (``$GIT_DIR/shallow``), and the empty tree.

C git advertises a shallow repository's shallow commits (``shallow`` lines after the refs
in v0; a ``shallow-info`` section in every v2 fetch), never walks past them, and a client
with ``--reject-shallow`` refuses to clone it. gitspout sent no shallow lines, walked
into the missing parents and answered ``cannot read repository ...: missing object``
(git's t5539.2 and t5601.112). Every result here is compared with the same command over
file://: refs, the client's shallow file, its objects, and fsck.

The empty tree exists in every repository, stored or not, as in C git: a commit whose
tree is the empty tree that no file holds is served (t5702.78 failed with MissingObject).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.request import urlopen

import pytest
from gitutil import Committer, Git, LiveServer, fsck, start_server


@pytest.fixture(scope="module")
def sh_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    root = tmp_path_factory.mktemp("shrepo")
    src = tmp_path_factory.mktemp("shsrc") / "src"
    git.run("init", "-q", "-b", "main", str(src))
    c = Committer(git, src, start=1_680_000_000)
    for n in range(12):
        c.commit({f"f{n % 4}.txt": f"version {n}\n" * 10, "top.txt": f"{n}\n"}, f"commit {n}")
        if n == 8:
            git.run("branch", "side", cwd=src)
    git.run("tag", "-a", "-m", "tag", "v1", "main~1", cwd=src)
    git.run("clone", "-q", "--bare", "--depth", "3", "--no-single-branch",
            f"file://{src}", str(root / "sh.git"))
    # A commit whose tree is the empty tree, which no file holds (t5702.78).
    empty = root / "empty.git"
    git.run("init", "-q", "--bare", str(empty))
    commit = git.run("hash-object", "-t", "commit", "-w", "--stdin", cwd=empty, input=(
        b"tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904\n"
        b"author A <a@b> 1234567890 +0000\ncommitter A <a@b> 1234567890 +0000\n\nempty\n"
    )).stdout.decode().strip()
    git.run("update-ref", "refs/heads/main", commit, cwd=empty)
    git.run("symbolic-ref", "HEAD", "refs/heads/main", cwd=empty)
    assert not list((empty / "objects").glob("4b/825dc6*"))
    return root


@pytest.fixture(scope="module")
def sh_server(sh_root: Path) -> Iterator[LiveServer]:
    srv = start_server(sh_root)
    yield srv
    srv.stop()


def _state(git: Git, repo: Path) -> tuple[str, str, frozenset[str]]:
    """Refs, shallow commits and objects of a client repository. The shallow file as a
    set: C git's v2 answer names a shallow commit of the repository once per branch that
    reaches it (shallow.c walks it once per path), and its client writes each line."""
    refs = git.out("for-each-ref", "--format=%(objectname) %(refname)", cwd=repo)
    shallow = (repo / "shallow").read_text() if (repo / "shallow").exists() else ""
    objects = git.out("cat-file", "--batch-all-objects", "--batch-check=%(objectname)", cwd=repo)
    return refs, " ".join(sorted(set(shallow.split()))), frozenset(objects.split())


def _both(git: Git, srv: LiveServer, root: Path, tmp: Path, version: int, repo: str,
          *steps: tuple[str, ...]) -> None:
    """Run ``steps`` (git arguments; ``{url}`` and ``{dest}`` filled in) against gitspout
    and over file://, then compare the two clients."""
    states = []
    for name, url in (("http", f"{srv.url}/{repo}"), ("file", f"file://{root / repo}")):
        dest = tmp / f"{name}-v{version}"
        for step in steps:
            args = [a.format(url=url, dest=dest) for a in step]
            git.run("-c", f"protocol.version={version}", *args,
                    cwd=dest if dest.exists() else tmp)
        fsck(git, dest)
        states.append(_state(git, dest))
    assert states[0] == states[1]


@pytest.mark.parametrize("version", [0, 2])
def test_clone_of_a_shallow_repository(git: Git, sh_server: LiveServer, sh_root: Path,
                                       tmp_path: Path, version: int) -> None:
    _both(git, sh_server, sh_root, tmp_path, version, "sh.git",
          ("clone", "-q", "--bare", "{url}", "{dest}"))
    assert (tmp_path / f"http-v{version}" / "shallow").read_text()


@pytest.mark.parametrize("version", [0, 2])
def test_depth_and_deepen_from_a_shallow_repository(git: Git, sh_server: LiveServer,
                                                    sh_root: Path, tmp_path: Path,
                                                    version: int) -> None:
    _both(git, sh_server, sh_root, tmp_path, version, "sh.git",
          ("clone", "-q", "--bare", "--depth", "1", "--no-single-branch", "{url}", "{dest}"),
          ("fetch", "-q", "--deepen", "1", "origin", "+refs/heads/*:refs/heads/*"),
          ("fetch", "-q", "--unshallow", "origin", "+refs/heads/*:refs/heads/*"))


def test_reject_shallow_refuses_it(git: Git, sh_server: LiveServer, sh_root: Path,
                                   tmp_path: Path) -> None:
    """As over file://, v2 (C git's client, over HTTP, checks only the v2 answer)."""
    for name, url in (("http", f"{sh_server.url}/sh.git"), ("file", f"file://{sh_root}/sh.git")):
        proc = git.run("-c", "protocol.version=2", "clone", "--reject-shallow", "--no-local",
                       url, str(tmp_path / name), check=False)
        assert proc.returncode != 0
        assert b"source repository is shallow, reject to clone." in proc.stderr
        assert not (tmp_path / name).exists()


def test_v0_advertisement_lists_the_shallow_commits(git: Git, sh_server: LiveServer,
                                                    sh_root: Path) -> None:
    """The shallow lines after the refs, before the flush, as git-http-backend sends."""
    with urlopen(f"{sh_server.url}/sh.git/info/refs?service=git-upload-pack",
                                timeout=10) as resp:
        body = resp.read()
    c_git = subprocess.run(["git", "upload-pack", "--advertise-refs", "--stateless-rpc",
                            str(sh_root / "sh.git")], capture_output=True, check=True).stdout
    lines = re.findall(rb"[0-9a-f]{4}shallow [0-9a-f]{40}\n", c_git)
    assert lines and c_git.endswith(b"".join(lines) + b"0000")
    assert body.endswith(b"".join(lines) + b"0000")


@pytest.mark.parametrize("version", [0, 2])
def test_the_empty_tree_is_in_every_repository(git: Git, sh_server: LiveServer, sh_root: Path,
                                               tmp_path: Path, version: int) -> None:
    _both(git, sh_server, sh_root, tmp_path, version, "empty.git",
          ("clone", "-q", "--bare", "{url}", "{dest}"))
    objects = _state(git, tmp_path / f"http-v{version}")[2]
    assert "4b825dc642cb6eb9a060e54bf8d69288fbee4904" in objects


def test_the_empty_tree_costs_no_rescan(git: Git, sh_root: Path, tmp_path: Path) -> None:
    """The empty tree is found without listing the pack directory again: a rescan is for
    a true miss (an object a concurrent repack moved), and the empty tree never is one."""
    srv = start_server(sh_root, ["--log-format", "json"])  # the access log's fs_ops
    try:
        dest = tmp_path / "clone"
        git.run("clone", "-q", "--bare", f"{srv.url}/empty.git", str(dest), timeout=60)
        fsck(git, dest)
        fetches = [json.loads(line) for line in srv.lines
                   if line.startswith("{") and '"command":"fetch"' in line]
        assert fetches and fetches[-1]["status"] == 200
        assert "rescan" not in fetches[-1]["fs_ops"], fetches[-1]["fs_ops"]
    finally:
        srv.stop()
