"""``filter tree:<depth>`` on wanted trees (a lazy fetch names trees by id): a tree the
client named stands where a commit would, its entries at depth 0, as C git's
list-objects-filter counts them. Every answer is compared with C git's upload-pack."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import Committer, Git, LiveServer, start_server
from packutil import c_git_v2_answer, shallow_info_and_objects
from rawhttp import DELIM, FLUSH, pkt_lines, post_upload_pack


@pytest.fixture(scope="module")
def tf_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    root = tmp_path_factory.mktemp("tfroot")
    work = tmp_path_factory.mktemp("tfwork") / "w"
    git.run("init", "-q", "-b", "main", str(work))
    Committer(git, work).commit({"top.txt": "top\n", "d/mid.txt": "mid\n",
                                 "d/e/low.txt": "low\n", "d/e/f/deep.txt": "deep\n"}, "one")
    git.run("tag", "-a", "-m", "a tree", "treetag", "HEAD^{tree}", cwd=work)
    repo = root / "r.git"
    git.run("clone", "-q", "--bare", "--no-local", str(work), str(repo))
    git.run("config", "uploadpack.allowFilter", "true", cwd=repo)
    return root


@pytest.fixture(scope="module")
def tf_server(tf_root: Path) -> Iterator[LiveServer]:
    srv = start_server(tf_root)
    yield srv
    srv.stop()


@pytest.mark.parametrize("want", ["HEAD^{tree}", "HEAD:d", "HEAD:d/e", "treetag", "HEAD"])
@pytest.mark.parametrize("depth", [0, 1, 2, 3])
def test_tree_depth_of_wanted_trees_as_c_git(git: Git, tf_server: LiveServer, tf_root: Path,
                                             want: str, depth: int) -> None:
    repo = tf_root / "r.git"
    oid = git.out("rev-parse", want, cwd=repo).strip()
    body = pkt_lines("command=fetch", "object-format=sha1") + DELIM + pkt_lines(
        f"want {oid}", f"filter tree:{depth}", "ofs-delta", "no-progress", "done") + FLUSH
    resp = post_upload_pack(tf_server.port, body, repo="r.git", version=2)
    assert resp.status == 200 and resp.complete
    ours = shallow_info_and_objects(git, resp.body)
    assert ours == shallow_info_and_objects(git, c_git_v2_answer(git, repo, body).stdout)
