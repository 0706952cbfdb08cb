"""Repository formats (``core.repositoryformatversion``, ``extensions.*``) and the
old-style symlinked HEAD, served as C git serves them over ``file://`` (setup.c,
refs/files-backend.c; store/repoformat.py, docs/operations.md).

- A repository C git refuses to open (version 2, an unknown extension in version 1, a
  v1-only extension in version 0, an objectFormat or refStorage it does not know) is
  refused with 403 and C git's reason, in every protocol version and for a fetch, never
  served and never a 5xx. Before, gitspout served version 2 and unknown extensions, and
  answered an unknown refStorage with 500.
- What C git serves (unknown extensions in version 0, none at all without a version) is
  served, the same refs.
- ``HEAD -> refs/heads/feature`` (a symlink) is a symref to feature, whether the branch
  is loose or packed (the link then dangles); a symlinked HEAD that names no ref is no
  repository (404), as C git says; one that leads outside the root is never read.
  Before, a dangling one made the repository 404 and a loose one was advertised with no
  symref target.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import Git, LiveServer, copy_repo, fsck, start_server
from offloadkit import NEW_GIT
from rawhttp import get_info_refs, post_upload_pack, v2_command

UNSET = None
# name -> (config settings in order (value UNSET: the key removed), C git's reason for
# refusing it (None: served), whether the CI's git 2.39 agrees (else only a git >= 2.55,
# GITSPOUT_TEST_NEW_GIT, is the ground truth))
CASES: dict[str, tuple[list[tuple[str, str | None]], str | None, bool]] = {
    "v2": ([("core.repositoryformatversion", "2")],
           "Expected git repo version <= 1, found 2", True),
    "v1k": ([("core.repositoryformatversion", "1k")],
            "Expected git repo version <= 1, found 1024", True),
    "v1-unknown": ([("core.repositoryformatversion", "1"), ("extensions.frobnicate", "true")],
                   "unknown repository extension found: frobnicate", True),
    "v1-unknown-sub": ([("core.repositoryformatversion", "1"), ("extensions.Frob.Nicate", "1")],
                       "unknown repository extension found: Frob.nicate", True),
    "v1-known-any-case": ([("core.repositoryformatversion", "1"), ("extensions.NoOp-V1", "x"),
                           ("extensions.PreciousObjects", "true"),
                           ("extensions.WORKTREECONFIG", "false")], None, True),
    "v1-objectformat-bogus": ([("core.repositoryformatversion", "1"),
                               ("extensions.objectFormat", "sha3")],
                              "unsupported object format sha3", False),
    "v1-refstorage-bogus": ([("core.repositoryformatversion", "1"),
                             ("extensions.refStorage", "someday")],
                            "unsupported ref storage format 'someday'", False),
    "v1-newer-extensions": ([("core.repositoryformatversion", "1"),
                             ("extensions.relativeWorktrees", "true"),
                             ("extensions.submodulePathConfig", "true")], None, False),
    "v0-unknown": ([("core.repositoryformatversion", "0"), ("extensions.frobnicate", "true")],
                   None, True),
    "v0-noop-v1": ([("core.repositoryformatversion", "0"), ("extensions.noop-v1", "true")],
                   "repo version is 0, but v1-only extension found: noop-v1", True),
    "v0-objectformat": ([("core.repositoryformatversion", "0"),
                         ("extensions.objectFormat", "sha1")],
                        "repo version is 0, but v1-only extension found: objectformat", True),
    "v0-refstorage": ([("core.repositoryformatversion", "0"),
                       ("extensions.refStorage", "files")],
                      "repo version is 0, but v1-only extension found: refstorage", False),
    "v0-historical": ([("core.repositoryformatversion", "0"), ("extensions.noop", "1"),
                       ("extensions.preciousObjects", "true"),
                       ("extensions.partialClone", "origin")], None, True),
    "no-version": ([("core.repositoryformatversion", UNSET), ("extensions.frobnicate", "true"),
                    ("extensions.noop-v1", "true")], None, True),
}


def _new_git() -> str | None:
    """A git of at least 2.55 (it knows every extension the table names)."""
    if not NEW_GIT or not shutil.which(NEW_GIT):
        return None
    out = subprocess.run([NEW_GIT, "version"], capture_output=True, timeout=30).stdout.split()
    major, minor = (int(x) for x in out[2].decode().split(".")[:2])
    return NEW_GIT if (major, minor) >= (2, 55) else None


def _configure(git: Git, repo: Path, settings: list[tuple[str, str | None]]) -> None:
    config = repo / "config"
    for key, value in settings:
        if value is UNSET:
            git.run("config", "-f", str(config), "--unset", key)
        else:
            git.run("config", "-f", str(config), key, value)


@pytest.fixture(scope="module")
def formats(tmp_path_factory: pytest.TempPathFactory, git: Git,
            fixture_root: Path) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("formats")
    for name, (settings, _, _) in CASES.items():
        copy_repo(fixture_root / "basic.git", root / f"{name}.git")
        _configure(git, root / f"{name}.git", settings)
    srv = start_server(root)
    yield srv
    srv.stop()


def _c_git(git_bin: str, git: Git, url: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([git_bin, "ls-remote", "--symref", url], capture_output=True,
                          timeout=60, env={**os.environ, "HOME": str(git.home)})


def _c_reason(stderr: bytes) -> str:
    """C git's fatal message on one line (it lists extensions on lines of their own)."""
    text = stderr.decode(errors="replace")
    text = text.split("fatal: ", 1)[1] if "fatal: " in text else text
    text = text.split("\nfatal:", 1)[0]
    return " ".join(text.split())


@pytest.mark.parametrize("name", sorted(CASES))
def test_repository_format_as_c_git(git: Git, formats: LiveServer, fixture_root: Path,
                                    name: str) -> None:
    _, reason, old_git_agrees = CASES[name]
    repo = f"{name}.git"
    local = f"file://{formats.root / repo}"
    ours = git.run("ls-remote", "--symref", f"{formats.url}/{repo}", check=False)
    ours_v0 = git.run("-c", "protocol.version=0", "ls-remote", f"{formats.url}/{repo}",
                      check=False)
    # The ground truth: C git over file://, a git that knows every extension if there is one.
    truth = _new_git() or ("git" if old_git_agrees else None)
    theirs = _c_git(truth, git, local) if truth is not None else None
    if reason is None:
        assert ours.returncode == 0, ours.stderr
        assert ours_v0.returncode == 0, ours_v0.stderr
        # Every case is a copy of basic.git: the same refs as it, over file://.
        same = git.run("ls-remote", "--symref", f"file://{fixture_root / 'basic.git'}").stdout
        assert ours.stdout == same
        assert ours_v0.stdout == git.run("ls-remote", f"file://{fixture_root / 'basic.git'}").stdout
        if theirs is not None:
            assert theirs.returncode == 0 and theirs.stdout == ours.stdout, theirs.stderr
        return
    if theirs is not None:
        assert theirs.returncode != 0
        if reason.startswith(("Expected", "unknown", "repo version")):
            assert _c_reason(theirs.stderr) == reason, theirs.stderr
    for proc in (ours, ours_v0):
        err = proc.stderr.decode(errors="replace")
        assert proc.returncode != 0
        assert f"unsupported repository format: {reason}" in err, err
        assert "403" in err, err
    for version in (0, 1, 2):
        resp = get_info_refs(formats.port, repo=repo, version=version)
        assert resp.status == 403, (version, resp.status, resp.body[:200])
        assert reason.encode() in resp.body
    fetch = post_upload_pack(formats.port, v2_command("ls-refs"), repo=repo, version=2)
    assert fetch.status == 403, fetch.body[:200]
    formats.wait_for_line(f"refusing /{repo}: {reason}")
    assert formats.alive()


def test_refused_repository_is_served_once_mended(git: Git, formats: LiveServer,
                                                  tmp_path: Path) -> None:
    """The verdict follows the config: mended, the repository is served at the next
    request (a refusal is not kept), and is refused again when it changes back."""
    repo = formats.root / "mend.git"
    shutil.copytree(formats.root / "v2.git", repo)
    url = f"{formats.url}/mend.git"
    assert get_info_refs(formats.port, repo="mend.git").status == 403
    _configure(git, repo, [("core.repositoryformatversion", "1")])
    assert git.run("ls-remote", url).stdout == git.run("ls-remote", f"file://{repo}").stdout
    _configure(git, repo, [("extensions.frobnicate", "true")])
    assert get_info_refs(formats.port, repo="mend.git").status == 403


def test_worktree_config_is_part_of_the_config(git: Git, formats: LiveServer) -> None:
    """extensions.worktreeConfig puts config.worktree into the config C git's upload-pack
    reads: a hideRefs there hides the ref, from gitspout too."""
    repo = formats.root / "wtconfig.git"
    shutil.copytree(formats.root / "v1-known-any-case.git", repo)
    _configure(git, repo, [("extensions.worktreeConfig", "true")])
    (repo / "config.worktree").write_text("[uploadpack]\n\thideRefs = refs/heads/feature\n")
    theirs = git.run("ls-remote", f"file://{repo}").stdout
    assert b"refs/heads/feature" not in theirs
    assert git.run("ls-remote", f"{formats.url}/wtconfig.git").stdout == theirs
    assert b"refs/heads/feature" not in git.run(
        "-c", "protocol.version=0", "ls-remote", f"{formats.url}/wtconfig.git").stdout


# -- HEAD as a symlink ----------------------------------------------------------------

@pytest.fixture(scope="module")
def linked_heads(tmp_path_factory: pytest.TempPathFactory, git: Git,
                 fixture_root: Path) -> Iterator[LiveServer]:
    base = tmp_path_factory.mktemp("linked-heads")
    root, outside = base / "root", base / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "HEAD").write_text("ref: refs/heads/main\n")
    for name, target in (("packed", "refs/heads/feature"), ("loose", "refs/heads/feature"),
                         ("not-a-ref", "HEAD.real"),
                         ("outside", "refs/../../../outside/HEAD")):
        repo = root / f"{name}.git"
        copy_repo(fixture_root / "basic.git", repo)
        git.run("--git-dir", str(repo), "pack-refs", "--all")
        if name == "loose":
            oid = git.out("--git-dir", str(repo), "rev-parse", "refs/heads/feature").strip()
            (repo / "refs" / "heads" / "feature").write_text(oid + "\n")
        (repo / "HEAD.real").write_text("ref: refs/heads/feature\n")
        (repo / "HEAD").unlink()
        os.symlink(target, repo / "HEAD")
    assert not (root / "packed.git" / "refs" / "heads" / "feature").exists()  # dangles
    srv = start_server(root)
    yield srv
    srv.stop()


@pytest.mark.parametrize("name", ["packed", "loose"])
def test_symlinked_head_is_a_symref(git: Git, linked_heads: LiveServer, tmp_path: Path,
                                    name: str) -> None:
    repo = f"{name}.git"
    local = f"file://{linked_heads.root / repo}"
    theirs = git.out("ls-remote", "--symref", local)
    assert theirs.startswith("ref: refs/heads/feature\tHEAD\n"), theirs
    for version in ("2", "0"):
        ours = git.out("-c", f"protocol.version={version}", "ls-remote", "--symref",
                       f"{linked_heads.url}/{repo}")
        assert ours == theirs, version
    dest = tmp_path / "clone"
    git.run("clone", "-q", f"{linked_heads.url}/{repo}", str(dest))
    assert git.out("symbolic-ref", "HEAD", cwd=dest).strip() == "refs/heads/feature"
    assert (dest / "feature").is_dir()  # feature's tree is checked out
    fsck(git, dest)


def test_symlinked_head_to_no_ref_is_no_repository(git: Git, linked_heads: LiveServer) -> None:
    """C git: "does not appear to be a git repository"; gitspout: 404, as for none."""
    local = git.run("ls-remote", f"file://{linked_heads.root / 'not-a-ref.git'}", check=False)
    assert local.returncode != 0 and b"does not appear to be a git repository" in local.stderr
    for version in (0, 2):
        assert get_info_refs(linked_heads.port, repo="not-a-ref.git",
                             version=version).status == 404


def test_symlinked_head_outside_the_root_is_never_read(git: Git,
                                                       linked_heads: LiveServer) -> None:
    """``refs/../..`` is no ref name: C git would read the file the link leads to, here
    outside the root, which gitspout refuses as it refuses any such link (404, logged)."""
    proc = git.run("ls-remote", "--symref", f"{linked_heads.url}/outside.git", check=False)
    assert proc.returncode != 0
    assert b"not found" in proc.stderr, proc.stderr
    line = linked_heads.wait_for_line("refusing /outside.git: ")
    assert "outside the root" in line
    assert linked_heads.alive()
