"""A client that read an annotated tag before it was moved (``git tag -f``: nightly,
latest) asks for the old tag object. C git's check passes it (its commit is reachable),
so the clone racing the re-tag succeeds; gitspout serves it too, and the same objects as C
git. A tag object that a hidden ref holds, or passes through, or whose commit only a
hidden ref reaches, is still refused (never an object reachable only from a hidden ref)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import Committer, Git, LiveServer, start_server
from packutil import InBandError, c_git_v2_answer, pack_bytes, pack_object_ids
from rawhttp import DELIM, FLUSH, pkt_lines, post_upload_pack


@pytest.fixture(scope="module")
def mt_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    root = tmp_path_factory.mktemp("mtroot")
    work = tmp_path_factory.mktemp("mtwork") / "w"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    c.commit({"a.txt": "one\n"}, "one")
    repo = root / "r.git"
    git.run("clone", "-q", "--bare", "--no-local", str(work), str(repo))
    gd = ["--git-dir", str(repo)]
    git.run(*gd, "tag", "-a", "-m", "nightly 1", "nightly", "main")
    git.run(*gd, "tag", "-a", "-m", "outer", "outer", "nightly")  # a tag of a tag
    (repo / "old-nightly").write_text(git.out(*gd, "rev-parse", "nightly"))
    (repo / "old-outer").write_text(git.out(*gd, "rev-parse", "outer"))
    # Then both move on, as a nightly job does, and leave the old tag objects behind.
    Committer(git, work).commit({"a.txt": "two\n"}, "two")
    git.run("push", "-q", str(repo), "main", cwd=work)
    git.run(*gd, "tag", "-f", "-a", "-m", "nightly 2", "nightly", "main")
    git.run(*gd, "tag", "-f", "-a", "-m", "outer 2", "outer", "nightly")
    # Hidden: a tag held by a hidden ref; a dangling tag of it; a commit only hidden
    # refs reach, and a dangling tag of that commit.
    git.run(*gd, "config", "uploadpack.hideRefs", "refs/hidden")
    secret = git.out(*gd, "commit-tree", "-p", "main", "-m", "secret",
                     git.out(*gd, "rev-parse", "main^{tree}").strip()).strip()
    git.run(*gd, "update-ref", "refs/hidden/secret", secret)
    git.run(*gd, "tag", "-a", "-m", "held", "held", "main~1")
    git.run(*gd, "update-ref", "refs/hidden/held", "held")
    git.run(*gd, "update-ref", "-d", "refs/tags/held")
    held = git.out(*gd, "rev-parse", "refs/hidden/held").strip()
    (repo / "held").write_text(held)
    (repo / "of-held").write_text(_dangling_tag(git, repo, held, "tag", "of held"))
    (repo / "of-secret").write_text(_dangling_tag(git, repo, secret, "commit", "of secret"))
    # deep.git: a hidden ref naming a chain of 70 tags. Peeling stops at 64, and the tags
    # beyond (reached from the hidden ref only) must not pass for tags nothing refers to.
    deep = root / "deep.git"
    shutil.copytree(repo, deep)
    inner = _dangling_tag(git, deep, git.out(*gd, "rev-parse", "main").strip(), "commit", "deep")
    (deep / "deep").write_text(inner)
    outer = inner
    for i in range(70):
        outer = _dangling_tag(git, deep, outer, "tag", f"wrap {i}")
    git.run("--git-dir", str(deep), "update-ref", "refs/hidden/long", outer)
    (deep / "old-nightly").write_text((repo / "old-nightly").read_text())
    return root


def _dangling_tag(git: Git, repo: Path, target: str, kind: str, msg: str) -> str:
    body = (f"object {target}\ntype {kind}\ntag dangling\n"
            f"tagger T <t@example.com> 1600000000 +0000\n\n{msg}\n")
    return git.out("--git-dir", str(repo), "hash-object", "-t", "tag", "-w", "--stdin",
                   input=body.encode()).strip()


@pytest.fixture(scope="module")
def mt_server(mt_root: Path) -> Iterator[LiveServer]:
    srv = start_server(mt_root)
    yield srv
    srv.stop()


def _fetch(port: int, oid: str, repo: str = "r.git") -> bytes:
    body = pkt_lines("command=fetch", "object-format=sha1") + DELIM + pkt_lines(
        f"want {oid}", "ofs-delta", "no-progress", "done") + FLUSH
    resp = post_upload_pack(port, body, repo=repo, version=2)
    assert resp.status == 200 and resp.complete
    return resp.body


@pytest.mark.parametrize("name", ["old-nightly", "old-outer"])
def test_old_tag_object_is_served_as_c_git_does(git: Git, mt_server: LiveServer, mt_root: Path,
                                                tmp_path: Path, name: str) -> None:
    repo = mt_root / "r.git"
    oid = (repo / name).read_text().strip()
    assert oid not in git.out("--git-dir", str(repo), "for-each-ref", "--format=%(objectname)")
    ours = pack_bytes(_fetch(mt_server.port, oid))
    body = pkt_lines("command=fetch", "object-format=sha1") + DELIM + pkt_lines(
        f"want {oid}", "ofs-delta", "no-progress", "done") + FLUSH
    theirs = pack_bytes(c_git_v2_answer(git, repo, body).stdout)
    assert ours is not None and theirs is not None
    assert pack_object_ids(git, ours) == pack_object_ids(git, theirs)
    assert oid in pack_object_ids(git, ours)
    # The real client: fetch the old tag by id into a clone made before it moved.
    clone = tmp_path / "c"
    git.run("clone", "-q", f"{mt_server.url}/r.git", str(clone))
    git.run("fetch", "-q", "origin", oid, cwd=clone)
    assert git.out("cat-file", "-t", oid, cwd=clone).strip() == "tag"


@pytest.mark.parametrize("repo, name", [("r.git", "held"), ("r.git", "of-held"),
                                        ("r.git", "of-secret"), ("deep.git", "deep"),
                                        ("deep.git", "old-nightly")])
def test_tags_hidden_refs_reach_are_refused(mt_server: LiveServer, mt_root: Path, repo: str,
                                            name: str) -> None:
    """In deep.git even the old nightly tag is refused: a hidden chain cut at the peel
    limit leaves unknown which tags it passes, so no tag nothing names is served there."""
    oid = (mt_root / repo / name).read_text().strip()
    with pytest.raises(InBandError, match=f"not our ref {oid}"):
        pack_bytes(_fetch(mt_server.port, oid, repo))
