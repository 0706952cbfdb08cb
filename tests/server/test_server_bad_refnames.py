"""Loose ref files whose names are no ref names (``check_refname_format``): ``a..b``, a
space, a control character. C git advertises them with a null id (its files backend
marks them broken), so they are never tips, and clients skip them as "funny" refs.
gitspout advertised them with their ids: a v0 clone asked for ``refs/heads/x/a`` (the
name cut at the space) and failed with "no such remote ref", where C git's clone of the
same repository succeeds. They are left out now, loose or packed, so no object only they
reach is served.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import Committer, Git, LiveServer, fsck, start_server
from rawhttp import DELIM, FLUSH, pkt_lines, post_upload_pack

BAD = ("refs/heads/bad..name", "refs/heads/x/a b", "refs/tags/ctl\x01")
# In packed-refs only bytes are looked for (a space, ^, a control character, ~:?*[\),
# not sequences (``..``): server/store/packedrefs.py.
BAD_PACKED = ("refs/heads/x/a b", "refs/heads/y^z", "refs/tags/ctl\x01")


@pytest.fixture(scope="module")
def bad_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    root = tmp_path_factory.mktemp("badrefs")
    work = root.parent / f"{root.name}-work"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    for i in range(3):
        c.commit({"f.txt": f"{i}\n"}, f"c{i}")
    repo = root / "repo.git"
    git.run("clone", "-q", "--bare", str(work), str(repo))
    git.run("symbolic-ref", "HEAD", "refs/heads/main", cwd=repo)
    git.run("update-ref", "refs/heads/ok", "main~1", cwd=repo)
    # A commit only the bad refs reach.
    only = git.out("commit-tree", "main^{tree}", "-m", "only bad refs", cwd=repo).strip()
    # packed.git: the same refs in packed-refs (a file git's pack-refs may write from
    # such loose refs), sorted and peeled as git writes it.
    packed = root / "packed.git"
    git.run("clone", "-q", "--bare", str(work), str(packed))
    git.run("update-ref", "refs/heads/ok", "main~1", cwd=packed)
    git.run("pack-refs", "--all", cwd=packed)
    packed_only = git.out("commit-tree", "main^{tree}", "-m", "only bad packed refs",
                          cwd=packed).strip()
    lines = (packed / "packed-refs").read_text().splitlines()
    header, entries = lines[0], lines[1:]
    entries += [f"{packed_only} {name}" for name in BAD_PACKED]
    entries.sort(key=lambda line: line.split(" ", 1)[1].encode())
    (packed / "packed-refs").write_text("\n".join([header, *entries]) + "\n")
    for name in BAD:
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(only + "\n")
    (root / "only-repo.git").write_text(only)
    (root / "only-packed.git").write_text(packed_only)
    return root


@pytest.fixture(scope="module")
def bad_server(bad_root: Path) -> Iterator[LiveServer]:
    srv = start_server(bad_root)
    yield srv
    srv.stop()


@pytest.mark.parametrize("repo", ["repo.git", "packed.git"])
@pytest.mark.parametrize("version", ["0", "2"])
@pytest.mark.parametrize("mirror", [False, True])
def test_clones_skip_refs_with_bad_names(git: Git, bad_root: Path, bad_server: LiveServer,
                                         tmp_path: Path, version: str, mirror: bool,
                                         repo: str) -> None:
    mode = ["--mirror"] if mirror else ["--bare"]
    dest = tmp_path / "http"
    proc = git.run("-c", f"protocol.version={version}", "clone", "-q", *mode,
                   f"{bad_server.url}/{repo}", str(dest), check=False)
    assert proc.returncode == 0, proc.stderr
    fsck(git, dest)
    refs = git.out("for-each-ref", "--format=%(refname)", cwd=dest).split()
    assert sorted(refs) == ["refs/heads/main", "refs/heads/ok"], refs
    # C git over file:// (v0: its v2 mirror clone asks for the null id and fails).
    if version == "0":
        ref = tmp_path / "file"
        git.run("-c", "protocol.version=0", "clone", "-q", *mode,
                f"file://{bad_root / repo}", str(ref))
        assert sorted(git.out("for-each-ref", "--format=%(refname)", cwd=ref).split()) == refs


@pytest.mark.parametrize("repo", ["repo.git", "packed.git"])
def test_an_object_only_bad_refs_reach_is_not_served(bad_root: Path, bad_server: LiveServer,
                                                     repo: str) -> None:
    only = (bad_root / f"only-{repo}").read_text()
    body = pkt_lines("command=fetch", "object-format=sha1") + DELIM + pkt_lines(
        f"want {only}", "done") + FLUSH
    resp = post_upload_pack(bad_server.port, body, repo, version=2)
    assert resp.status == 200 and b"not our ref" in resp.body, resp.body[:300]
    ls = post_upload_pack(bad_server.port, pkt_lines("command=ls-refs", "object-format=sha1")
                          + FLUSH, repo, version=2)
    assert b"bad..name" not in ls.body and b"x/a" not in ls.body and only.encode() not in ls.body
