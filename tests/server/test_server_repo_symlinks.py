"""Symlinks inside a served repository (issue 8, item 2), with the real git client.

A repository under the root whose ``objects``, ``refs``, ``packed-refs``, ``HEAD``,
``config``, ``objects/pack``, a loose ref or a directory of loose refs is a symlink that
leads outside the root, or whose ``objects/info/alternates`` names (or is) something outside
it, is answered with 404 and a log line that names the link. With
``--allow-symlinks-outside-root`` the same clones work and equal ``file://``. Symlinks that
stay inside the root keep working, also when the ref is read through one.

Layout (``outside/secret.git`` holds a commit ``S`` that no repository in the root shows)::

    outside/secret.git    basic + S (loose objects) on refs/heads/secret (packed) and
                          refs/heads/secret-loose
    outside/alternates    a file naming root/basic.git/objects
    root/<name>.git       copies of secret.git without the secret refs, one link each
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from gitspout.server.app.config import load_config
from gitutil import Committer, Git, LiveServer, fsck, repo_state, start_server
from rawhttp import INFO_REFS, request


@dataclass(frozen=True)
class Layout:
    root: Path
    outside: Path
    secret: str  # the id of S

    @property
    def secret_git(self) -> Path:
        return self.outside / "secret.git"


Maker = Callable[[Path, Layout], None]


def _link(path: Path, target: Path | str) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    os.symlink(target, path)


def _whole_repo_out(repo: Path, lay: Layout) -> None:
    """The repository path itself (this was refused before; now it is logged too)."""
    shutil.rmtree(repo)
    os.symlink(lay.secret_git, repo)


def _objects_out(repo: Path, lay: Layout) -> None:
    _link(repo / "objects", lay.secret_git / "objects")


def _refs_out(repo: Path, lay: Layout) -> None:
    _link(repo / "refs", lay.secret_git / "refs")


def _packed_out(repo: Path, lay: Layout) -> None:
    _link(repo / "packed-refs", lay.secret_git / "packed-refs")


def _head_out(repo: Path, lay: Layout) -> None:
    """A HEAD link that starts with ``refs/`` (C git takes no other for a repository)
    but is no ref name (``..``): C git reads the file it leads to, outside the root."""
    _link(repo / "HEAD", "refs/../" + os.path.relpath(lay.secret_git / "HEAD", repo))


def _config_out(repo: Path, lay: Layout) -> None:
    _link(repo / "config", lay.secret_git / "config")


def _loose_ref_out(repo: Path, lay: Layout) -> None:
    os.symlink(lay.secret_git / "refs" / "heads" / "secret-loose", repo / "refs" / "heads" / "stolen")


def _ref_dir_out(repo: Path, lay: Layout) -> None:
    os.symlink(lay.secret_git / "refs" / "heads", repo / "refs" / "heads" / "sub")


def _pack_dir_out(repo: Path, lay: Layout) -> None:
    _link(repo / "objects" / "pack", lay.secret_git / "objects" / "pack")


def _pack_file_out(repo: Path, lay: Layout) -> None:
    """The pack and its index (same names as outside: both are copies) lead outside."""
    for path in (repo / "objects" / "pack").glob("pack-*"):
        _link(path, lay.secret_git / "objects" / "pack" / path.name)


def _loose_object_out(repo: Path, lay: Layout) -> None:
    """refs/heads/secret shown again, but S's loose objects are links to the outside ones."""
    (repo / "refs" / "heads" / "secret").write_text(lay.secret + "\n")
    for path in (repo / "objects").glob("[0-9a-f][0-9a-f]/*"):
        _link(path, lay.secret_git / "objects" / path.parent.name / path.name)


def _commit_graph_out(repo: Path, lay: Layout) -> None:
    _link(repo / "objects" / "info" / "commit-graph",
          lay.secret_git / "objects" / "info" / "commit-graph")


def _alternate_out(repo: Path, lay: Layout) -> None:
    """No objects of its own: all of them come from an alternate outside the root."""
    shutil.rmtree(repo / "objects")
    (repo / "objects" / "info").mkdir(parents=True)
    (repo / "objects" / "pack").mkdir()
    (repo / "objects" / "info" / "alternates").write_text(f"{lay.secret_git / 'objects'}\n")


def _alternates_file_out(repo: Path, lay: Layout) -> None:
    """The alternates file itself is outside (the directory it names is inside)."""
    shutil.rmtree(repo / "objects")
    (repo / "objects" / "info").mkdir(parents=True)
    (repo / "objects" / "pack").mkdir()
    os.symlink(lay.outside / "alternates", repo / "objects" / "info" / "alternates")


# name -> (how to make the link, the link's path in the repository, whether the
# advertisement is refused too (else only a request that reads objects is))
OUTSIDE: dict[str, tuple[Maker, str, bool]] = {
    "whole-repo-out": (_whole_repo_out, "", True),
    "objects-out": (_objects_out, "objects", True),
    "refs-out": (_refs_out, "refs", True),
    "packed-out": (_packed_out, "packed-refs", True),
    "head-out": (_head_out, "HEAD", True),
    "config-out": (_config_out, "config", True),
    "loose-ref-out": (_loose_ref_out, "refs/heads/stolen", True),
    "ref-dir-out": (_ref_dir_out, "refs/heads/sub", True),
    "pack-dir-out": (_pack_dir_out, "objects/pack", False),
    "pack-file-out": (_pack_file_out, "objects/pack/pack-", False),
    "loose-object-out": (_loose_object_out, "objects/", False),
    "commit-graph-out": (_commit_graph_out, "objects/info/commit-graph", False),
    "alternate-out": (_alternate_out, "objects/info/alternates", False),
    "alternates-file-out": (_alternates_file_out, "objects/info/alternates", False),
}


def _objects_in(repo: Path, lay: Layout) -> None:
    _link(repo / "objects", "../basic.git/objects")


def _alternate_in(repo: Path, lay: Layout) -> None:
    shutil.rmtree(repo / "objects")
    (repo / "objects" / "info").mkdir(parents=True)
    (repo / "objects" / "pack").mkdir()
    (repo / "objects" / "info" / "alternates").write_text("../../basic.git/objects\n")


def _loose_ref_in(repo: Path, lay: Layout) -> None:
    os.symlink("feature", repo / "refs" / "heads" / "alias")  # refs/heads/feature is loose


def _packed_in(repo: Path, lay: Layout) -> None:
    _link(repo / "packed-refs", "../basic.git/packed-refs")


INSIDE: dict[str, Maker] = {
    "objects-in": _objects_in,
    "alternate-in": _alternate_in,
    "loose-ref-in": _loose_ref_in,
    "packed-in": _packed_in,
}


def _copy_without_secret(git: Git, src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, symlinks=True)
    git.run("--git-dir", str(dest), "update-ref", "-d", "refs/heads/secret")
    git.run("--git-dir", str(dest), "update-ref", "-d", "refs/heads/secret-loose")
    # A loose refs/heads/feature (same value as the packed one) for the loose-ref cases.
    feature = git.out("--git-dir", str(dest), "rev-parse", "refs/heads/feature").strip()
    (dest / "refs" / "heads" / "feature").write_text(feature + "\n")


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory, git: Git, fixture_root: Path) -> Layout:
    base = tmp_path_factory.mktemp("repo-symlinks")
    root, outside = base / "root", base / "outside"
    root.mkdir()
    outside.mkdir()
    secret_git = outside / "secret.git"
    shutil.copytree(fixture_root / "basic.git", secret_git)
    work = base / "work"
    git.run("clone", "-q", str(secret_git), str(work))
    c = Committer(git, work, start=1_710_000_000)
    secret = c.commit({"secret.txt": "outside the root\n"}, "secret commit")
    git.run("push", "-q", "origin", "HEAD:refs/heads/secret", cwd=work)
    git.run("pack-refs", "--all", cwd=secret_git)
    git.run("update-ref", "refs/heads/secret-loose", secret, cwd=secret_git)
    assert (secret_git / "refs" / "heads" / "secret-loose").is_file()
    lay = Layout(root, outside, secret)
    shutil.copytree(fixture_root / "basic.git", root / "basic.git")
    (outside / "alternates").write_text(f"{root / 'basic.git' / 'objects'}\n")
    for name, (make, _, _) in OUTSIDE.items():
        _copy_without_secret(git, secret_git, root / f"{name}.git")
        make(root / f"{name}.git", lay)
    for name, make_in in INSIDE.items():
        _copy_without_secret(git, secret_git, root / f"{name}.git")
        make_in(root / f"{name}.git", lay)
    return lay


@pytest.fixture(scope="module")
def guarded(layout: Layout) -> Iterator[LiveServer]:
    srv = start_server(layout.root)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def permissive(layout: Layout) -> Iterator[LiveServer]:
    srv = start_server(layout.root, extra_args=["--allow-symlinks-outside-root"])
    yield srv
    srv.stop()


def _clone_both(git: Git, srv: LiveServer, name: str, dest: Path) -> None:
    """Clone from gitspout and from file://: same refs, HEAD, objects; both fsck."""
    ours, theirs = dest / "http", dest / "file"
    git.run("clone", "-q", "--mirror", f"{srv.url}/{name}", str(ours))
    git.run("clone", "-q", "--mirror", f"file://{srv.root / name}", str(theirs))
    fsck(git, ours)
    a, b = repo_state(git, ours), repo_state(git, theirs)
    assert a.refs == b.refs
    assert a.head == b.head
    assert not b.objects - a.objects


@pytest.mark.parametrize("name", sorted(OUTSIDE))
def test_symlink_outside_root_is_refused(git: Git, guarded: LiveServer, layout: Layout,
                                         tmp_path: Path, name: str) -> None:
    repo = f"{name}.git"
    _, link, at_advertisement = OUTSIDE[name]
    proc = git.run("clone", "-q", f"{guarded.url}/{repo}", str(tmp_path / "c"), check=False)
    assert proc.returncode != 0
    err = proc.stderr.decode(errors="replace")
    assert "not found" in err or "404" in err, err
    line = guarded.wait_for_line(f"refusing /{repo}: ")
    assert str(layout.root / repo / link) in line, line
    assert "outside the root" in line
    ls = git.run("ls-remote", f"{guarded.url}/{repo}", check=False)
    if at_advertisement:
        assert ls.returncode != 0
        # v2: the capabilities (which read no ref) pass, the ls-refs POST gets the 404.
        assert b"not found" in ls.stderr or b"404" in ls.stderr, ls.stderr
        assert request(guarded.port, "GET", f"/{repo}{INFO_REFS}").status == 404
    # Otherwise the advertisement may work: it reads objects only to peel a loose ref
    # that no earlier request peeled, so whether it meets the link depends on the order.
    assert layout.secret not in ls.stdout.decode()


@pytest.mark.parametrize("name", sorted(OUTSIDE))
def test_symlink_outside_root_allowed_by_option(git: Git, permissive: LiveServer,
                                                tmp_path: Path, name: str) -> None:
    if name == "ref-dir-out":
        # A symlinked directory under refs/ is not walked (as before this option existed):
        # the repository is served, without those refs.
        proc = git.run("ls-remote", f"{permissive.url}/{name}.git")
        assert b"refs/heads/sub/" not in proc.stdout
        return
    if name == "head-out":
        # What C git reads through the link (outside/secret.git's HEAD) is HEAD.
        dest = tmp_path / "c"
        git.run("clone", "-q", "--mirror", f"{permissive.url}/{name}.git", str(dest))
        fsck(git, dest)
        assert repo_state(git, dest).head == "ref: refs/heads/main"
        assert git.out("ls-remote", "--symref", f"{permissive.url}/{name}.git") == \
            git.out("ls-remote", "--symref", f"file://{permissive.root / name}.git")
        return
    _clone_both(git, permissive, f"{name}.git", tmp_path)


@pytest.mark.parametrize("name", sorted(INSIDE))
def test_symlink_inside_root_is_served(git: Git, guarded: LiveServer, tmp_path: Path,
                                       name: str) -> None:
    repo = f"{name}.git"
    _clone_both(git, guarded, repo, tmp_path)
    ours = git.out("ls-remote", f"{guarded.url}/{repo}")
    assert ours == git.out("ls-remote", f"file://{guarded.root / repo}")
    assert not any(f"refusing /{repo}" in line for line in guarded.lines)


def test_retargeted_link_is_seen_at_the_next_request(git: Git, guarded: LiveServer,
                                                     layout: Layout, tmp_path: Path) -> None:
    """A verdict is not kept past a change of where the link leads, even when the link
    that changes is not in the repository but further along the way (root/hop)."""
    root = layout.root
    repo = root / "hop-user.git"
    _copy_without_secret(git, layout.secret_git, repo)
    os.symlink("basic.git", root / "hop")
    _link(repo / "objects", "../hop/objects")
    url = f"{guarded.url}/hop-user.git"
    _clone_both(git, guarded, "hop-user.git", tmp_path / "before")
    os.symlink(layout.secret_git, root / "hop.new")
    os.replace(root / "hop.new", root / "hop")  # root/hop now leads outside
    proc = git.run("clone", "-q", url, str(tmp_path / "after"), check=False)
    assert proc.returncode != 0
    line = guarded.wait_for_line("refusing /hop-user.git: ")
    assert str(repo / "objects") in line
    os.symlink("basic.git", root / "hop.new")
    os.replace(root / "hop.new", root / "hop")  # and back inside
    _clone_both(git, guarded, "hop-user.git", tmp_path / "again")


def test_repointed_repository_link_serves_its_new_target(git: Git, guarded: LiveServer,
                                                         tmp_path: Path) -> None:
    """The repository path itself is a link, flipped to another repository (a blue/green
    deployment, a restore): the next request is answered from the new target, as C git
    over file:// is, not from the resolution kept from the first request."""
    root = guarded.root
    store = root / "store"
    store.mkdir()
    tips = []
    for name in ("v1", "v2"):
        work = tmp_path / name
        git.run("init", "-q", "-b", "main", str(work))
        tips.append(Committer(git, work).commit({"f.txt": f"{name}\n"}, name))
        git.run("clone", "-q", "--bare", str(work), str(store / f"{name}.git"))
    os.symlink("store/v1.git", root / "flip.git")
    url = f"{guarded.url}/flip.git"
    assert git.out("ls-remote", url, "refs/heads/main").split()[0] == tips[0]
    os.symlink("store/v2.git", root / "flip.new")
    os.replace(root / "flip.new", root / "flip.git")
    assert git.out("ls-remote", url) == git.out("ls-remote", f"file://{root / 'flip.git'}")
    assert git.out("ls-remote", url, "refs/heads/main").split()[0] == tips[1]
    _clone_both(git, guarded, "flip.git", tmp_path / "after")


def test_option_from_env_and_toml(tmp_path: Path) -> None:
    assert load_config({"root": str(tmp_path)}, env={}).allow_symlinks_outside_root is False
    cfg = load_config({"root": str(tmp_path)},
                      env={"GITSPOUT_ALLOW_SYMLINKS_OUTSIDE_ROOT": "true"})
    assert cfg.allow_symlinks_outside_root is True
    toml = tmp_path / "g.toml"
    toml.write_text("allow-symlinks-outside-root = true\n")
    assert load_config({"root": str(tmp_path), "config": str(toml)},
                       env={}).allow_symlinks_outside_root is True
