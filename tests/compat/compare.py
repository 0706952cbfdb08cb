"""Run the same git command against gitspout (http://) and C git (file://) and compare."""

from __future__ import annotations

from pathlib import Path

from gitutil import Git, LiveServer, RepoState, fsck, repo_state

VERSIONS = ("0", "1", "2")


def http_url(server: LiveServer, name: str) -> str:
    return f"{server.url}/{name}"


def file_url(server: LiveServer, name: str) -> str:
    return f"file://{server.root / name}"


def clone_both(
    git: Git, server: LiveServer, repo: str, dest: Path, version: str, *args: str
) -> tuple[Path, Path]:
    """``git clone args`` from gitspout and from file://; both must succeed and fsck."""
    ours, theirs = dest / f"http-v{version}", dest / f"file-v{version}"
    base = ["-c", f"protocol.version={version}", "clone", "-q", *args]
    git.run(*base, http_url(server, repo), str(ours))
    git.run(*base, file_url(server, repo), str(theirs))
    return ours, theirs


def _without_tags(refs: str) -> str:
    return "".join(line for line in refs.splitlines(True) if " refs/tags/" not in line)


def assert_same(
    git: Git, ours: Path, theirs: Path, check_fsck: bool = True, tags: bool = True
) -> RepoState:
    """Same refs, shallow file, HEAD and objects. ``tags=False`` leaves tag refs out: the
    client's tag auto-following after a fetch differs between its stateless (HTTP) and
    stateful (file://) transports even when the server's answers are byte-identical."""
    a, b = repo_state(git, ours), repo_state(git, theirs)
    if tags:
        assert a.refs == b.refs
    else:
        assert _without_tags(a.refs) == _without_tags(b.refs)
    assert a.shallow == b.shallow
    assert a.head == b.head
    missing = b.objects - a.objects
    assert not missing, f"{len(missing)} objects missing over http, e.g. {sorted(missing)[:3]}"
    if check_fsck:
        fsck(git, ours)
    return a
