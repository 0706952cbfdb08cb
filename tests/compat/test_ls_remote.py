"""ls-remote against gitspout equals ls-remote against C git over file://."""

from __future__ import annotations

import pytest
from compare import VERSIONS, file_url, http_url

REPOS = ["basic.git", "hidden.git", "multipack.git", "sha256.git", "team/app", "team/app.git"]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("repo", REPOS)
def test_ls_remote_matches_file(git, server, repo, version):
    args = ["-c", f"protocol.version={version}", "ls-remote"]
    on_disk = "team/app" if repo.startswith("team") else repo
    ours = git.out(*args, http_url(server, repo))
    theirs = git.out(*args, file_url(server, on_disk))
    assert ours == theirs
    assert ours.startswith(git.out("rev-parse", "HEAD", cwd=server.root / on_disk).strip())


@pytest.mark.parametrize("version", VERSIONS)
def test_ls_remote_symref(git, server, version):
    args = ["-c", f"protocol.version={version}", "ls-remote", "--symref"]
    ours = git.out(*args, http_url(server, "basic.git"))
    theirs = git.out(*args, file_url(server, "basic.git"))
    assert ours == theirs
    assert ours.startswith("ref: refs/heads/main\tHEAD\n")


@pytest.mark.parametrize("version", VERSIONS)
def test_ls_remote_patterns(git, server, version):
    for flags, patterns in (([], ["refs/tags/*"]), ([], ["main"]), (["--heads"], []),
                            (["--tags"], ["v*"]), ([], ["refs/heads/feature", "v1.0"])):
        args = ["-c", f"protocol.version={version}", "ls-remote", *flags]
        ours = git.out(*args, http_url(server, "basic.git"), *patterns)
        theirs = git.out(*args, file_url(server, "basic.git"), *patterns)
        assert ours == theirs and ours


@pytest.mark.parametrize("version", VERSIONS)
def test_hidden_refs_not_listed(git, server, version):
    ours = git.out("-c", f"protocol.version={version}", "ls-remote", http_url(server, "hidden.git"))
    assert "refs/hidden" not in ours
    assert "refs/other/thing" not in ours
    assert "refs/other/visible" in ours


@pytest.mark.parametrize("version", VERSIONS)
def test_empty_repo(git, server, version):
    args = ["-c", f"protocol.version={version}", "ls-remote", "--symref"]
    ours = git.out(*args, http_url(server, "empty.git"))
    theirs = git.out(*args, file_url(server, "empty.git"))
    assert ours == theirs


@pytest.mark.parametrize("version", VERSIONS)
def test_100k_refs(git, server, version):
    args = ["-c", f"protocol.version={version}", "ls-remote"]
    ours = git.out(*args, http_url(server, "manyrefs.git"))
    theirs = git.out(*args, file_url(server, "manyrefs.git"))
    assert ours.count("\n") > 100_000
    assert ours == theirs
