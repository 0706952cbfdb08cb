"""A client that does not ask for ``ofs-delta`` never gets an OFS_DELTA entry
(gitprotocol-capabilities: "the server MUST NOT send them"): stored deltas go out as
REF_DELTA, whatever path copies them (a run of entries, a filtered layout, a thin fetch).
The object set is C git's for the same request, and ``git index-pack`` accepts the pack.
With ``ofs-delta`` the same requests do reuse OFS_DELTA entries, so the check bites."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import Committer, Git, LiveServer, start_server
from packutil import (
    OFS_DELTA,
    REF_DELTA,
    c_git_v2_answer,
    objects_reachable,
    pack_bytes,
    pack_entries,
    pack_object_ids,
)
from rawhttp import DELIM, FLUSH, pkt_lines, post_upload_pack


def entry_kinds(pack: bytes) -> Counter[int]:
    """How many entries of each type number ``pack`` holds (parsed by the tests' own
    reader, not the server's)."""
    return Counter(kind for _, kind, _ in pack_entries(pack))


@pytest.fixture(scope="module")
def od_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    """A history of edits to a few large files (deltas), served gc'd with a bitmap and
    unmaintained (a pack per push)."""
    root = tmp_path_factory.mktemp("odroot")
    work = tmp_path_factory.mktemp("odwork") / "w"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    lines = [f"line {i} of a file long enough to be stored as deltas\n" for i in range(400)]
    for n in range(30):
        lines[(n * 37) % 400] = f"edited in commit {n}\n"
        c.commit({"a.txt": "".join(lines), f"d/{n % 4}.txt": "".join(lines[n:] + lines[:n])},
                 f"commit {n}")
    gc = root / "gc.git"
    git.run("clone", "-q", "--bare", "--no-local", str(work), str(gc))
    git.run("repack", "-q", "-adb", "--depth=50", "--window=50", cwd=gc)
    git.run("config", "uploadpack.allowFilter", "true", cwd=gc)
    un = root / "un.git"
    git.run("init", "-q", "--bare", str(un))
    for rev in ("main~20", "main~10", "main"):
        git.run("push", "-q", str(un), f"{rev}:refs/heads/main", cwd=work)
    git.run("config", "uploadpack.allowFilter", "true", cwd=un)
    return root


@pytest.fixture(scope="module")
def od_server(od_root: Path) -> Iterator[LiveServer]:
    srv = start_server(od_root)
    yield srv
    srv.stop()


SHAPES = {
    "clone": [],
    "blobless": ["filter blob:none"],
    "fetch": ["have {old}"],
    "thin fetch": ["have {old}", "thin-pack"],
}


@pytest.mark.parametrize("repo", ["gc.git", "un.git"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("ofs", [False, True])
def test_v2_deltas_follow_ofs_delta(git: Git, od_server: LiveServer, od_root: Path, repo: str,
                                    shape: str, ofs: bool) -> None:
    gitdir = od_root / repo
    tip = git.out("rev-parse", "main", cwd=gitdir).strip()
    old = git.out("rev-parse", "main~15", cwd=gitdir).strip()
    args = [f"want {tip}", *(a.format(old=old) for a in SHAPES[shape])]
    args += (["ofs-delta"] if ofs else []) + ["no-progress", "done"]
    body = pkt_lines("command=fetch", "object-format=sha1") + DELIM + pkt_lines(*args) + FLUSH
    resp = post_upload_pack(od_server.port, body, repo=repo, version=2)
    assert resp.status == 200 and resp.complete
    pack = pack_bytes(resp.body)
    assert pack is not None
    kinds = entry_kinds(pack)
    if ofs:
        assert kinds[OFS_DELTA] > 0, "requests with ofs-delta reuse OFS_DELTA entries"
    else:
        assert kinds[OFS_DELTA] == 0 and kinds[REF_DELTA] > 0, kinds
    theirs = pack_bytes(c_git_v2_answer(git, gitdir, body).stdout)
    assert theirs is not None
    if "thin" not in shape:
        assert pack_object_ids(git, pack) == pack_object_ids(git, theirs)
    else:  # listing a thin pack's ids needs its bases (index-pack --fix-thin): count them
        assert sum(kinds.values()) == int.from_bytes(theirs[8:12], "big")


@pytest.mark.parametrize("repo", ["gc.git", "un.git"])
def test_v0_clone_without_ofs_delta(git: Git, od_server: LiveServer, od_root: Path,
                                    repo: str) -> None:
    gitdir = od_root / repo
    tip = git.out("rev-parse", "main", cwd=gitdir).strip()
    body = pkt_lines(f"want {tip} side-band-64k no-progress") + FLUSH + pkt_lines("done")
    resp = post_upload_pack(od_server.port, body, repo=repo)
    assert resp.status == 200 and resp.complete
    pack = pack_bytes(resp.body)
    assert pack is not None
    kinds = entry_kinds(pack)
    assert kinds[OFS_DELTA] == 0 and kinds[REF_DELTA] > 0, kinds
    assert pack_object_ids(git, pack) == objects_reachable(git, gitdir, tip)
