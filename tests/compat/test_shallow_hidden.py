"""The real git client, made to send ``shallow`` lines that name hidden commits.

An attacker obtains a shallow clone whose boundary is ``S2``, a commit that the served
repository hides (from a copy where it was not hidden, say), points it at gitspout and asks
to deepen it. git then sends ``shallow S2`` with ``deepen 1`` + ``deepen-relative``
(``fetch --deepen``) or ``deepen 2147483647`` (``fetch --unshallow``). Nothing reachable
only from the hidden refs may arrive, in any protocol version. (C git 2.39's own
upload-pack leaks ``S`` in the ``--unshallow`` form, so file:// is no ground truth here.)
"""

from __future__ import annotations

import shutil

import pytest
from compare import VERSIONS, http_url
from gitutil import LiveServer, start_server
from hidden_fixture import Leak, build_leak_repo


@pytest.fixture(scope="module")
def leak(tmp_path_factory, git) -> Leak:
    return build_leak_repo(git, tmp_path_factory.mktemp("leakroot"),
                           tmp_path_factory.mktemp("leakwork"))


@pytest.fixture(scope="module")
def leak_server(leak):
    srv: LiveServer = start_server(leak.root)
    yield srv
    srv.stop()


def _attacker_clone(git, leak, tmp_path):
    """A depth-1 clone of S2, taken from a copy of the repository that does not hide it."""
    open_copy = tmp_path / "open.git"
    shutil.copytree(leak.gitdir, open_copy)
    git.run("config", "--unset-all", "uploadpack.hideRefs", cwd=open_copy)
    clone = tmp_path / "attacker"
    git.run("clone", "-q", "--depth", "1", "--no-local", "-b", "main",
            f"file://{open_copy}", str(clone))
    git.run("fetch", "-q", "--depth", "1", "origin", "refs/hidden/secret2:refs/stolen/s2", cwd=clone)
    shallow = (clone / ".git" / "shallow").read_text().split()
    assert leak.s2 in shallow
    assert git.run("cat-file", "-e", leak.s, cwd=clone, check=False).returncode != 0
    return clone


def _objects_in(git, clone) -> set[str]:
    out = git.out("cat-file", "--batch-all-objects", "--batch-check=%(objectname)", cwd=clone)
    return set(out.split())


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("how", [["--deepen", "1"], ["--unshallow"]], ids=["deepen", "unshallow"])
def test_deepening_a_hidden_shallow_commit_sends_nothing_hidden(git, leak, leak_server, tmp_path,
                                                               version, how):
    clone = _attacker_clone(git, leak, tmp_path)
    git.run("remote", "set-url", "origin", http_url(leak_server, "leak.git"), cwd=clone)
    before = _objects_in(git, clone)
    # The fetch may succeed or fail; either way nothing hidden may have come in.
    git.run("-c", f"protocol.version={version}", "fetch", "-q", *how, "origin",
            "refs/heads/main:refs/remotes/origin/main", cwd=clone, check=False)
    received = _objects_in(git, clone) - before
    assert not received & leak.hidden_only, sorted(received & leak.hidden_only)
    assert git.run("cat-file", "-e", leak.s, cwd=clone, check=False).returncode != 0
    # What did arrive is the visible history, whole: main can be walked and checked.
    assert received <= leak.visible
    tip = git.out("rev-parse", "refs/remotes/origin/main", cwd=clone).strip()
    assert tip == leak.tip
    git.run("rev-list", "--objects", "refs/remotes/origin/main", cwd=clone)
