"""v2 ``ls-refs`` with ``ref-prefix`` on a repository that has both loose and packed refs.

The ground truth is C git's own answer: the same request bytes are fed to
``git upload-pack --stateless-rpc`` and its output must equal gitspout's response body byte
for byte. Prefixes are plain string prefixes (``refs/heads/ma`` matches ``main`` and
``mainline``, ``refs/heads/zz`` matches nothing), whichever of the two stores a ref is in.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import Git, LiveServer, copy_repo, fsck, repo_state, start_server, wait_until
from rawhttp import metric, post_upload_pack, v2_command

# Each entry is one ls-refs request's prefixes.
PREFIX_SETS: list[tuple[str, ...]] = [
    ("refs/heads/zz",),
    ("refs/heads/ma",),
    ("refs/ta",),
    ("refs/heads/lo", "refs/tags/"),
    ("refs/heads/zeta/",),
    ("refs/heads/zeta/x",),
    ("HEAD",),
    ("refs/remotes/origin/HEAD",),
    ("refs/remotes/origin/ma",),
    # What `git fetch URL main` sends.
    ("main", "refs/main", "refs/tags/main", "refs/heads/main", "refs/remotes/main",
     "refs/remotes/main/HEAD", "refs/tags/"),
]


@pytest.fixture(scope="module")
def mixed_repo(git: Git, server: LiveServer) -> Iterator[str]:
    """A copy of basic.git (every ref packed) plus loose refs: a loose ``main`` that
    overrides the packed one, ``mainline``, ``loose-a``, ``zeta/x``, a loose tag, and a loose
    symref ``refs/remotes/origin/HEAD`` to the loose ``refs/remotes/origin/main``."""
    name = f"prefix-{uuid.uuid4().hex[:8]}.git"
    path = server.root / name
    shutil.copytree(server.root / "basic.git", path)
    gd = ["--git-dir", str(path)]
    first = git.out(*gd, "rev-list", "--max-parents=0", "main").strip()
    feature = git.out(*gd, "rev-parse", "refs/heads/feature").strip()
    main = git.out(*gd, "rev-parse", "refs/heads/main").strip()
    git.run(*gd, "update-ref", "refs/heads/main", feature)  # loose, shadows packed main
    git.run(*gd, "update-ref", "refs/heads/mainline", first)
    git.run(*gd, "update-ref", "refs/heads/loose-a", main)
    git.run(*gd, "update-ref", "refs/heads/zeta/x", first)
    git.run(*gd, "update-ref", "refs/tags/loose-tag", first)
    git.run(*gd, "update-ref", "refs/remotes/origin/main", main)
    git.run(*gd, "symbolic-ref", "refs/remotes/origin/HEAD", "refs/remotes/origin/main")
    assert (path / "refs" / "heads" / "main").is_file()
    assert "refs/heads/feature" in (path / "packed-refs").read_text()
    yield name
    shutil.rmtree(path, ignore_errors=True)


def _ls_refs_body(prefixes: tuple[str, ...]) -> bytes:
    args = ("peel", "symrefs", "unborn", *(f"ref-prefix {p}" for p in prefixes))
    return v2_command("ls-refs", ("agent=git/2.39.5", "object-format=sha1"), args)


def _c_git_answer(git: Git, path: Path, body: bytes) -> bytes:
    proc = git.run("upload-pack", "--stateless-rpc", str(path), input=body,
                   env={"GIT_PROTOCOL": "version=2"})
    return proc.stdout


@pytest.mark.parametrize("prefixes", PREFIX_SETS, ids=lambda p: "+".join(p))
def test_ls_refs_prefix_matches_c_git(git: Git, server: LiveServer, mixed_repo: str,
                                      prefixes: tuple[str, ...]) -> None:
    body = _ls_refs_body(prefixes)
    expected = _c_git_answer(git, server.root / mixed_repo, body)
    resp = post_upload_pack(server.port, body, repo=mixed_repo, version=2)
    assert resp.status == 200
    assert resp.body == expected, (prefixes, resp.body.decode(errors="replace"),
                                   expected.decode(errors="replace"))


def test_ls_refs_partial_component_prefix_returns_nothing(git: Git, server: LiveServer,
                                                          mixed_repo: str) -> None:
    """The case from issue 8: before the fix every loose ref in refs/heads/ came back."""
    resp = post_upload_pack(server.port, _ls_refs_body(("refs/heads/zz",)), repo=mixed_repo,
                            version=2)
    assert resp.status == 200
    assert resp.body == b"0000"


@pytest.mark.parametrize("branch", ["main", "mainline", "zeta/x"])
def test_fetch_single_branch(git: Git, server: LiveServer, mixed_repo: str, tmp_path: Path,
                             branch: str) -> None:
    """`git fetch URL <branch>` (which sends ref-prefix lines) gets the same objects and
    FETCH_HEAD as from file://."""
    results = []
    for kind, url in (("http", f"{server.url}/{mixed_repo}"),
                      ("file", f"file://{server.root / mixed_repo}")):
        dest = tmp_path / kind
        git.run("init", "-q", "--bare", str(dest))
        git.run("-c", "protocol.version=2", "fetch", "-q", "--no-tags", url,
                f"refs/heads/{branch}:refs/heads/{branch}", cwd=dest)
        fsck(git, dest)
        results.append(repo_state(git, dest))
    assert results[0] == results[1]
    assert results[0].refs.strip().endswith(f"refs/heads/{branch}")


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) << 10 for line in fh if line.startswith("VmRSS:"))


def test_huge_ref_prefixes_are_answered_and_not_kept(git: Git, fixture_root: Path,
                                                     tmp_path: Path) -> None:
    """Eight ls-refs, each with 130 ref-prefixes of 60 KB (8 MB, one of them a real one):
    answered as C git answers, and nothing of them kept after: they used to be the keys
    of the answer caches (whose budgets count values), 8 MB held per request."""
    root = tmp_path / "root"
    copy_repo(fixture_root / "basic.git", root / "basic.git")
    srv = start_server(root)
    try:
        first = _ls_refs_body(("refs/heads/",))
        assert post_upload_pack(srv.port, first, repo="basic.git", version=2).status == 200
        # The scenario: idle until the idle trimmer has looked (memory.TRIM_DELAY after the
        # request), so that the baseline is trimmed.
        assert wait_until(lambda: metric(srv.port, "gitspout_heap_trim_checks_total") > 0, 10)
        before = _rss(srv.proc.pid)
        for k in range(8):
            prefixes = ("refs/heads/", *(f"refs/{k}{i:04d}" + "x" * 60_000 for i in range(130)))
            body = _ls_refs_body(prefixes)
            resp = post_upload_pack(srv.port, body, repo="basic.git", version=2, timeout=60)
            assert resp.status == 200
            if k == 0:
                assert resp.body == _c_git_answer(git, root / "basic.git", body)
        # Idle again: once the heap trim has run, nothing of the 8 MB per request is kept.
        kept = lambda: _rss(srv.proc.pid) - before  # noqa: E731
        assert wait_until(lambda: kept() < 32 << 20, 20), \
            f"{kept() >> 20} MB kept after the requests"
    finally:
        srv.stop()
