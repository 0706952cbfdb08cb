"""A shallow client's haves: what it has is not sent again.

A shallow client has the whole tree of every commit it has. ``git fetch --depth 1`` after
a one-file commit declares its old tip as shallow and as a have: the new tip, at the new
boundary, is diffed against it and only what changed is sent (C git: 6 objects, not the
tree of 200 files). A deepen sends history under the client's commits: the trees of its
haves are marked in full, as pack-objects does for shallow clients
(``--objects-edge-aggressive``).

Each request is answered by gitspout and by C git's upload-pack (``--stateless-rpc``): the
same shallow lines; gitspout's objects are C git's, or fewer by objects the client has.
Then the real client: ``clone --depth 1``, a push, ``fetch --depth 1``, over HTTP and
over file://, the same refs and objects, and fsck.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import Committer, Git, LiveServer, fsck, repo_state, start_server
from packutil import c_git_v2_answer, objects_reachable, shallow_info_and_objects
from rawhttp import DELIM, FLUSH, pkt_lines, post_upload_pack

FILES = 60


@pytest.fixture(scope="module")
def sh_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    root = tmp_path_factory.mktemp("shroot")
    work = tmp_path_factory.mktemp("shwork") / "w"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work, start=1_650_000_000)
    c.commit({f"src/f{i}.txt": f"file {i}\n" * (i + 3) for i in range(FILES)}, "base")
    for k in range(6):
        c.commit({f"src/f{k}.txt": f"change {k}\n", "top.txt": f"top {k}\n"}, f"c{k}")
    for bitmaps in (False, True):
        repo = root / ("bitmap.git" if bitmaps else "plain.git")
        git.run("clone", "-q", "--bare", "--no-local", str(work), str(repo))
        git.run("-c", f"repack.writeBitmaps={str(bitmaps).lower()}", "repack", "-adq", cwd=repo)
    return root


@pytest.fixture(scope="module")
def sh_server(sh_root: Path) -> Iterator[LiveServer]:
    srv = start_server(sh_root)
    yield srv
    srv.stop()


def _rev(git: Git, repo: Path, name: str) -> str:
    return git.out("rev-parse", name, cwd=repo).strip()


CASES = {
    "fetch --depth 1": ("main~1", ["deepen 1"]),
    "deepen-relative": ("main~2", ["deepen 1", "deepen-relative"]),
    "deepen": ("main~2", ["deepen 4"]),
    "no deepen": ("main~2", []),
    "unshallow": ("main", ["deepen 2147483647"]),
}


@pytest.mark.parametrize("repo", ["plain.git", "bitmap.git"])
@pytest.mark.parametrize("case", list(CASES))
def test_shallow_haves_are_not_sent_again(git: Git, sh_server: LiveServer, sh_root: Path,
                                          repo: str, case: str) -> None:
    gitdir = sh_root / repo
    had, deepen = CASES[case]
    have = _rev(git, gitdir, had)
    body = pkt_lines("command=fetch", "object-format=sha1") + DELIM + pkt_lines(
        f"want {_rev(git, gitdir, 'main')}", f"shallow {have}", *deepen, f"have {have}",
        "ofs-delta", "no-progress", "done") + FLUSH
    resp = post_upload_pack(sh_server.port, body, repo=repo, version=2)
    assert resp.status == 200 and resp.complete
    ours = shallow_info_and_objects(git, resp.body)
    theirs = shallow_info_and_objects(git, c_git_v2_answer(git, gitdir, body).stdout)
    assert ours[0] == theirs[0]
    assert ours[1] <= theirs[1], sorted(ours[1] - theirs[1])
    has = {have} | objects_reachable(git, gitdir, f"{have}^{{tree}}")
    assert theirs[1] - ours[1] <= has, sorted(theirs[1] - ours[1] - has)
    if case == "fetch --depth 1":
        assert len(ours[1]) == 5  # the commit, two trees, two blobs: as C git


@pytest.mark.parametrize("version", ["0", "2"])
def test_fetch_depth_1_after_a_push_sends_what_changed(git: Git, sh_server: LiveServer,
                                                       sh_root: Path, tmp_path: Path,
                                                       version: str) -> None:
    repo = tmp_path / "repo.git"
    git.run("clone", "-q", "--bare", "--no-local", str(sh_root / "plain.git"), str(repo))
    srv = start_server(tmp_path)
    try:
        ours, theirs = tmp_path / "ours", tmp_path / "theirs"
        for url, dest in ((f"{srv.url}/repo.git", ours), (f"file://{repo}", theirs)):
            git.run("-c", f"protocol.version={version}", "clone", "-q", "--depth", "1",
                    url, str(dest))
        work = tmp_path / "w"
        git.run("clone", "-q", str(repo), str(work))
        (work / "src" / "f7.txt").write_text("pushed\n")
        git.run("commit", "-qam", "one file", cwd=work)
        git.run("push", "-q", "origin", "main", cwd=work)
        received = []
        for clone in (ours, theirs):
            packs = clone / ".git" / "objects" / "pack"
            before, had = set(packs.glob("*.idx")), repo_state(git, clone).objects
            git.run("-c", f"protocol.version={version}", "-c", "fetch.unpackLimit=1",
                    "fetch", "-q", "--depth", "1", cwd=clone)
            (new,) = set(packs.glob("*.idx")) - before
            ids = {line.split()[1] for line in
                   git.run("show-index", input=new.read_bytes()).stdout.decode().splitlines()}
            received.append(ids - had)  # less the bases index-pack --fix-thin appended
            fsck(git, clone)
        assert repo_state(git, ours) == repo_state(git, theirs)
        assert received[0] == received[1] and len(received[0]) < FILES  # not the whole tree
    finally:
        srv.stop()
