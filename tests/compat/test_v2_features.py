"""v2 features a repository has to switch on: ref-in-want, sideband-all, session-id."""

from __future__ import annotations

import shutil
import uuid

import pytest
from compare import assert_same, file_url, fsck, http_url, repo_state


@pytest.fixture
def configured_repo(git, server):
    """A copy of basic.git with ref-in-want, sideband-all and session ids switched on."""
    name = f"feat-{uuid.uuid4().hex[:8]}.git"
    path = server.root / name
    shutil.copytree(server.root / "basic.git", path)
    for key in ("uploadpack.allowRefInWant", "uploadpack.allowSidebandAll",
                "transfer.advertiseSID"):
        git.run("config", key, "true", cwd=path)
    yield name
    shutil.rmtree(path, ignore_errors=True)


def _trace(git, cwd, *args):
    proc = git.run(*args, cwd=cwd, env={"GIT_TRACE_PACKET": "1"})
    return proc.stderr.decode(errors="replace")


@pytest.mark.parametrize("depth", [None, "1"])
def test_fetch_with_want_ref(git, server, tmp_path, configured_repo, depth):
    """With ref-in-want the client names the ref; the answer's wanted-refs section comes
    after shallow-info (spec order), so a shallow fetch by ref name works too. The ground
    truth is the same fetch from the same history without ref-in-want, because C git
    2.39 itself sends the sections in the other order and its own client dies on that."""
    ours, theirs, cgit = tmp_path / "ours", tmp_path / "theirs", tmp_path / "cgit"
    for dest in (ours, theirs, cgit):
        git.run("init", "-q", str(dest))
    extra = ["--depth", depth] if depth else []
    spec = "refs/heads/feature:refs/heads/feature"
    trace = _trace(git, ours, "-c", "protocol.version=2", "fetch", *extra,
                   http_url(server, configured_repo), spec)
    assert "want-ref refs/heads/feature" in trace
    assert "wanted-refs" in trace
    git.run("-c", "protocol.version=2", "fetch", *extra, file_url(server, "basic.git"), spec,
            cwd=theirs)
    assert_same(git, ours, theirs)
    proc = git.run("-c", "protocol.version=2", "fetch", *extra,
                   file_url(server, configured_repo), spec, cwd=cgit, check=False)
    if depth:
        assert b"expected 'packfile', received 'shallow-info'" in proc.stderr
    else:
        assert proc.returncode == 0


def test_want_ref_of_unknown_ref_fails(git, server, tmp_path, configured_repo):
    dest = tmp_path / "c"
    git.run("init", "-q", str(dest))
    proc = git.run("-c", "protocol.version=2", "fetch", http_url(server, configured_repo),
                   "refs/heads/nope:refs/heads/nope", cwd=dest, check=False)
    assert proc.returncode != 0


def test_sideband_all_clone(git, server, tmp_path, configured_repo):
    dest = tmp_path / "c"
    trace = _trace(git, tmp_path, "-c", "protocol.version=2", "clone",
                   http_url(server, configured_repo), str(dest))
    theirs = tmp_path / "theirs"
    git.run("-c", "protocol.version=2", "clone", "-q", file_url(server, configured_repo),
            str(theirs))
    assert repo_state(git, dest) == repo_state(git, theirs)
    fsck(git, dest)
    assert "> sideband-all" in trace  # the client asked for it, and got a usable answer


def test_session_id_advertised(git, server, configured_repo):
    proc = git.run("-c", "protocol.version=2", "-c", "transfer.advertiseSID=true", "ls-remote",
                   http_url(server, configured_repo), env={"GIT_TRACE_PACKET": "1"})
    assert "session-id=gitspout-" in proc.stderr.decode()
