"""Nothing the client has is sent again: haves of every type, and a deepen's shallow commits.

* A have of any type counts, as ``rev-list --not`` takes it: ``want T, want main, have T,
  have main, done`` (T an annotated tag) gets no object from C git; gitspout sent T again,
  and isomorphic-git, which sends the tags it has as haves, got every annotated tag on
  every fetch. Trees and blobs likewise.
* A deepen: the commits the client is shallow at, and unshallows, are on the client with
  their whole trees (upload-pack.c ``send_unshallow`` passes them to pack-objects as
  edges). A depth 1 clone then a fetch with depth 20 sent those trees' files again.

Every answer is compared with C git's upload-pack for the same request (v0 and v2).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import Committer, Git, LiveServer, fsck, objects_received, start_server
from packutil import c_git_v2_answer, pack_bytes, pack_object_ids
from rawhttp import DELIM, FLUSH, pkt_lines, post_upload_pack


@pytest.fixture(scope="module")
def hv_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    root = tmp_path_factory.mktemp("hvroot")
    work = tmp_path_factory.mktemp("hvwork") / "w"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work, start=1_660_000_000)
    lines = [f"line {i} of a file that changes now and then\n" for i in range(120)]
    for n in range(30):
        lines[(n * 7) % 120] = f"commit {n} changed this\n"
        c.commit({"a.txt": "".join(lines), f"dir{n % 5}/b.txt": f"version {n}\n" * 40},
                 f"commit {n}")
        if n % 10 == 9:
            git.run("tag", "-a", "-m", f"release {n}", f"v{n}", cwd=work)
    for bitmaps in (False, True):
        repo = root / ("bitmap.git" if bitmaps else "plain.git")
        git.run("clone", "-q", "--bare", "--no-local", str(work), str(repo))
        git.run("-c", f"repack.writeBitmaps={str(bitmaps).lower()}", "repack", "-adq", cwd=repo)
    return root


@pytest.fixture(scope="module")
def hv_server(hv_root: Path) -> Iterator[LiveServer]:
    srv = start_server(hv_root)
    yield srv
    srv.stop()


def _ids(git: Git, body: bytes) -> set[str] | None:
    pack = pack_bytes(body)
    return None if pack is None else pack_object_ids(git, pack)


def _v0_body(wants: list[str], haves: list[str]) -> bytes:
    first = f"want {wants[0]} multi_ack_detailed side-band-64k ofs-delta no-progress"
    return (pkt_lines(first, *(f"want {w}" for w in wants[1:])) + FLUSH
            + pkt_lines(*(f"have {h}" for h in haves), "done"))


def _v2_body(wants: list[str], haves: list[str]) -> bytes:
    args = [f"want {w}" for w in wants] + [f"have {h}" for h in haves]
    return (pkt_lines("command=fetch", "object-format=sha1") + DELIM
            + pkt_lines(*args, "ofs-delta", "no-progress", "done") + FLUSH)


def _c_git_v0(git: Git, gitdir: Path, body: bytes) -> bytes:
    return git.run("upload-pack", "--stateless-rpc", str(gitdir), input=body,
                   check=False).stdout


HAVES = {
    # name: (wants, haves) as revisions
    "tag and its commit": (["v29", "main"], ["v29", "main"]),
    "tag only": (["v29", "main"], ["v29"]),
    "older tag": (["v29", "main"], ["v19", "main~5"]),
    "tree": (["main"], ["main~3^{tree}", "main~3"]),
    "blob": (["main"], ["main~1:a.txt", "main~1"]),
}


@pytest.mark.parametrize("repo", ["plain.git", "bitmap.git"])
@pytest.mark.parametrize("case", list(HAVES))
@pytest.mark.parametrize("version", [0, 2])
def test_haves_of_every_type_count(git: Git, hv_server: LiveServer, hv_root: Path,
                                   repo: str, case: str, version: int) -> None:
    gitdir = hv_root / repo
    wants, haves = ([git.out("rev-parse", r, cwd=gitdir).strip() for r in revs]
                    for revs in HAVES[case])
    if version == 2:
        body = _v2_body(wants, haves)
        theirs = c_git_v2_answer(git, gitdir, body).stdout
    else:
        body = _v0_body(wants, haves)
        theirs = _c_git_v0(git, gitdir, body)
    resp = post_upload_pack(hv_server.port, body, repo=repo, version=version)
    assert resp.status == 200 and resp.complete
    ours, c_git = _ids(git, resp.body), _ids(git, theirs)
    assert c_git is not None and ours is not None
    assert ours == c_git
    if case == "tag and its commit":
        assert ours == set(), "the client has everything it wants"


@pytest.mark.parametrize("repo", ["plain.git", "bitmap.git"])
def test_deepen_sends_no_more_than_c_git(git: Git, hv_server: LiveServer, hv_root: Path,
                                         tmp_path: Path, repo: str) -> None:
    """The real client: ``clone --depth 1``, then ``fetch --depth 20``, from gitspout and
    over file://: fsck-clean, the same history, and a pack of no more objects."""
    received = {}
    for name, url in (("http", f"{hv_server.url}/{repo}"), ("file", f"file://{hv_root / repo}")):
        dest = tmp_path / name
        git.run("clone", "-q", "--bare", "--depth", "1", url, str(dest))
        received[name] = objects_received(
            git, ["fetch", "-q", "--depth", "20", "origin", "main:main"], dest,
            tmp_path / f"{name}.pack")
        fsck(git, dest)
    log = {n: git.out("rev-list", "main", cwd=tmp_path / n) for n in received}
    assert log["http"] == log["file"] and len(log["http"].split()) == 20
    assert 0 < received["http"] <= received["file"], received
