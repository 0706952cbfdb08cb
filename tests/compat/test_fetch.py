"""Fetches after the clone: incremental fetches, fetches by id, hidden objects."""

from __future__ import annotations

import shutil
import uuid

import pytest
from compare import VERSIONS, assert_same, clone_both, file_url, fsck, http_url, repo_state
from gitutil import Committer
from repos_fixture import SECRET_TEXT


@pytest.fixture
def mutable_repo(git, server):
    """A private copy of basic.git under the served root, and a work tree to commit from."""
    name = f"mut-{uuid.uuid4().hex[:8]}.git"
    dest = server.root / name
    shutil.copytree(server.root / "basic.git", dest)
    yield name, dest
    shutil.rmtree(dest, ignore_errors=True)


def _push_commits(git, repo_path, tmp_path, n, start=1_700_000_000):
    work = tmp_path / f"work-{uuid.uuid4().hex[:6]}"
    git.run("clone", "-q", str(repo_path), str(work))
    c = Committer(git, work, start=start)
    for i in range(n):
        c.commit({f"new/file{i}.txt": f"new content {i}\n" * 50,
                  "README.md": f"# fixture\n\nupdated {i}\n"}, f"new {i}")
    git.run("push", "-q", "origin", "main", cwd=work)
    return work


@pytest.mark.parametrize("version", VERSIONS)
def test_incremental_fetch(git, server, tmp_path, mutable_repo, version):
    name, path = mutable_repo
    ours, theirs = clone_both(git, server, name, tmp_path, version)
    _push_commits(git, path, tmp_path, 3)
    for clone in (ours, theirs):
        git.run("-c", f"protocol.version={version}", "fetch", "-q", cwd=clone)
        git.run("merge", "-q", "--ff-only", "origin/main", cwd=clone)
    assert_same(git, ours, theirs)
    assert "updated 2" in (ours / "README.md").read_text()


@pytest.mark.parametrize("version", VERSIONS)
def test_fetch_after_gc_and_new_branch(git, server, tmp_path, mutable_repo, version):
    name, path = mutable_repo
    ours, theirs = clone_both(git, server, name, tmp_path, version)
    work = _push_commits(git, path, tmp_path, 2)
    git.run("push", "-q", "origin", "HEAD:refs/heads/topic", cwd=work)
    git.run("gc", "-q", "--prune=now", cwd=path)
    for clone in (ours, theirs):
        git.run("-c", f"protocol.version={version}", "fetch", "-q", "--prune", cwd=clone)
    assert_same(git, ours, theirs)


def test_fetch_reachable_non_tip_by_id_v2(git, server, tmp_path):
    ours, theirs = clone_both(git, server, "basic.git", tmp_path, "2", "--depth", "1")
    old = git.out("rev-parse", "main~5", cwd=server.root / "basic.git").strip()
    for clone in (ours, theirs):
        git.run("-c", "protocol.version=2", "fetch", "-q", "--depth", "1", "origin", old, cwd=clone)
        git.run("cat-file", "-e", old + "^{commit}", cwd=clone)
    assert_same(git, ours, theirs)


@pytest.mark.parametrize("version", VERSIONS)
def test_fetch_hidden_object_by_id_fails(git, server, tmp_path, version):
    hidden = server.root / "hidden.git"
    secret = git.out("rev-parse", "refs/hidden/secret", cwd=hidden).strip()
    clone = tmp_path / "c"
    git.run("clone", "-q", http_url(server, "hidden.git"), str(clone))
    proc = git.run("-c", f"protocol.version={version}", "fetch", "origin", secret,
                   cwd=clone, check=False)
    assert proc.returncode != 0
    assert b"not our ref" in proc.stderr  # refused by the server, not by the client
    proc = git.run("cat-file", "-e", secret, cwd=clone, check=False)
    assert proc.returncode != 0
    blob = git.out("rev-parse", "refs/hidden/secret:secret.txt", cwd=hidden).strip()
    proc = git.run("-c", f"protocol.version={version}", "fetch", "origin", blob,
                   cwd=clone, check=False)
    assert proc.returncode != 0
    assert SECRET_TEXT.encode() not in (clone / ".git" / "FETCH_HEAD").read_bytes() \
        if (clone / ".git" / "FETCH_HEAD").exists() else True


def test_hidden_refs_not_in_mirror(git, server, tmp_path):
    for version in VERSIONS:
        clone = tmp_path / f"m{version}"
        git.run("-c", f"protocol.version={version}", "clone", "-q", "--mirror",
                http_url(server, "hidden.git"), str(clone))
        refs = git.out("for-each-ref", "--format=%(refname)", cwd=clone)
        assert "refs/hidden" not in refs and "refs/other/thing" not in refs
        secret = git.out("rev-parse", "refs/hidden/secret", cwd=server.root / "hidden.git").strip()
        assert git.run("cat-file", "-e", secret, cwd=clone, check=False).returncode != 0
        fsck(git, clone)


@pytest.mark.parametrize("version", VERSIONS)
def test_unborn_head_follows_server(git, server, tmp_path, version):
    name = f"unborn-{uuid.uuid4().hex[:6]}.git"
    path = server.root / name
    git.run("init", "-q", "--bare", "-b", "trunk", str(path))
    try:
        ours, theirs = clone_both(git, server, name, tmp_path, version)
        a, b = repo_state(git, ours), repo_state(git, theirs)
        assert a == b
        if version == "2":
            assert a.head == "ref: refs/heads/trunk"
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("version", VERSIONS)
def test_new_repo_appears_without_restart(git, server, tmp_path, version):
    name = f"late-{uuid.uuid4().hex[:6]}.git"
    shutil.copytree(server.root / "basic.git", server.root / name)
    try:
        ours = git.out("-c", f"protocol.version={version}", "ls-remote", http_url(server, name))
        theirs = git.out("-c", f"protocol.version={version}", "ls-remote", file_url(server, name))
        assert ours == theirs
    finally:
        shutil.rmtree(server.root / name, ignore_errors=True)


def _total(stderr: str) -> int:
    import re

    m = re.search(r"Total (\d+) \(delta", stderr)
    assert m, stderr
    return int(m[1])


@pytest.mark.parametrize("version", ["0", "2"])
def test_fetch_sends_no_more_objects_than_c_git(git, server, tmp_path, mutable_repo, version):
    """The walk marks the client's side sparsely (git's pack.useSparse): a commit on top of
    one the client has, and a merge of a branch it has already fetched (the merged files
    must not be sent again), cost no more objects than C git's upload-pack sends. (No
    bitmap, so that the walk answers.)"""
    name, path = mutable_repo
    for bitmap in path.glob("objects/pack/*.bitmap"):
        bitmap.unlink()
    ours, theirs = clone_both(git, server, name, tmp_path, version)
    work = tmp_path / "work"
    git.run("clone", "-q", str(path), str(work))
    c = Committer(git, work, start=1_750_000_000)
    git.run("checkout", "-q", "-b", "topic", cwd=work)
    c.commit({"topic/big.txt": "a file from the topic branch\n" * 200}, "topic")
    git.run("push", "-q", "origin", "topic", cwd=work)
    for clone in (ours, theirs):
        git.run("-c", f"protocol.version={version}", "fetch", "-q", cwd=clone)
    git.run("checkout", "-q", "main", cwd=work)
    c.commit({"README.md": "# fixture\n\non main\n"}, "main moves")
    git.run("merge", "-q", "--no-ff", "-m", "merge topic", "topic", cwd=work)
    c.commit({"README.md": "# fixture\n\nafter the merge\n"}, "after")
    git.run("push", "-q", "origin", "main", cwd=work)
    totals = []
    for clone in (ours, theirs):
        res = git.run("-c", f"protocol.version={version}", "fetch", "--progress", cwd=clone)
        totals.append(_total(res.stderr.decode()))
    assert_same(git, ours, theirs)
    assert totals[0] <= totals[1], f"gitspout sent {totals[0]} objects, C git {totals[1]}"
