"""Lazy fetches after a partial clone: blobs and trees wanted by id, checked at C git's cost.

A blobless clone's checkout asks for the blobs of the tip's tree by id, and every later
``git show`` of an old file for one more. Each want must be reachable from a visible ref
(ARCHITECTURE.md I7): that check walked every commit and every tree of the history, per
request (0.4 s for one old blob of dulwich, where git-http-backend answers in 0.04 s).
Now the closure of the visible tips is kept across requests (bitmaps where the repository
has them, else a table of ids), and the tips' own trees are tried first.

Checked here: the real client's blobless clone, checkout and lazy fetch of an old blob,
fsck-clean and equal to file://; wants of blobs and trees reachable only from a hidden ref
refused in v0 and v2, before and after the closure is cached; and, by count, that a warm
lazy fetch reads no tree.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import Committer, Git, LiveServer, fsck, start_server
from packutil import InBandError, pack_bytes, pack_object_ids
from rawhttp import DELIM, FLUSH, pkt_lines, post_upload_pack


@pytest.fixture(scope="module")
def lz_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    root = tmp_path_factory.mktemp("lzroot")
    work = tmp_path_factory.mktemp("lzwork") / "w"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work, start=1_670_000_000)
    for n in range(40):
        c.commit({f"d{n % 4}/f{n % 7}.txt": f"version {n} of this file\n" * 20,
                  "top.txt": f"top {n}\n"}, f"commit {n}")
    git.run("checkout", "-q", "-b", "secret", cwd=work)
    c.commit({"secret/key.txt": "only a hidden ref reaches this\n"}, "secret")
    git.run("checkout", "-q", "main", cwd=work)
    for bitmaps in (False, True):
        repo = root / ("bitmap.git" if bitmaps else "plain.git")
        git.run("clone", "-q", "--bare", "--no-local", str(work), str(repo))
        git.run("update-ref", "refs/hidden/secret", "refs/heads/secret", cwd=repo)
        git.run("update-ref", "-d", "refs/heads/secret", cwd=repo)
        git.run("-c", f"repack.writeBitmaps={str(bitmaps).lower()}", "repack", "-adq", cwd=repo)
        for key, value in (("uploadpack.allowFilter", "true"),
                           ("uploadpack.hideRefs", "refs/hidden")):
            git.run("config", key, value, cwd=repo)
    return root


@pytest.fixture(scope="module")
def lz_server(lz_root: Path) -> Iterator[LiveServer]:
    srv = start_server(lz_root)
    yield srv
    srv.stop()


def _old_file(back: int) -> str:
    """``main~back:PATH`` of the file that commit ``main~back`` wrote (of 40 commits)."""
    n = 39 - back
    return f"main~{back}:d{n % 4}/f{n % 7}.txt"


def _fetch(port: int, repo: str, oids: list[str], version: int) -> bytes:
    if version == 2:
        args = [f"want {o}" for o in oids] + ["ofs-delta", "no-progress", "done"]
        body = (pkt_lines("command=fetch", "object-format=sha1") + DELIM + pkt_lines(*args)
                + FLUSH)
    else:
        first = f"want {oids[0]} multi_ack_detailed side-band-64k ofs-delta no-progress"
        body = pkt_lines(first, *(f"want {o}" for o in oids[1:])) + FLUSH + pkt_lines("done")
    resp = post_upload_pack(port, body, repo=repo, version=version)
    assert resp.status == 200 and resp.complete
    return resp.body


def _objects_read(srv: LiveServer) -> int:
    """Lookups in the cache of inflated commits and trees: what a walk reads."""
    with urllib.request.urlopen(f"{srv.url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    prefix = 'gitspout_cache_lookups_total{cache="objects",'
    return sum(int(float(line.rpartition(" ")[2])) for line in text.splitlines()
               if line.startswith(prefix))


@pytest.mark.parametrize("repo", ["plain.git", "bitmap.git"])
@pytest.mark.parametrize("version", [0, 2])
def test_lazy_wants_follow_the_reachability_rule(git: Git, lz_server: LiveServer, lz_root: Path,
                                                 repo: str, version: int) -> None:
    gitdir = lz_root / repo
    rev = lambda name: git.out("rev-parse", name, cwd=gitdir).strip()  # noqa: E731
    allowed = {"tip blob": rev("main:top.txt"), "old blob": rev(_old_file(30)),
               "old tree": rev("main~25:d2")}
    hidden = {"hidden blob": rev("refs/hidden/secret:secret/key.txt"),
              "hidden tree": rev("refs/hidden/secret:secret")}
    for _ in range(2):  # cold, then from the closure kept
        for name, oid in allowed.items():
            pack = pack_bytes(_fetch(lz_server.port, repo, [oid], version))
            assert pack is not None, name
            assert oid in pack_object_ids(git, pack), name
        for name, oid in hidden.items():
            body = _fetch(lz_server.port, repo, [allowed["tip blob"], oid], version)
            with pytest.raises(InBandError, match="not our ref"):
                pack_bytes(body)
            assert pack_bytes(body.split(b"ERR", 1)[0]) is None, name


def test_warm_lazy_fetch_reads_no_tree(git: Git, lz_root: Path) -> None:
    """Once the closure of the tips is known, a lazy fetch of an old blob looks it up
    there: no commit or tree is read, only the wanted blob itself, twice at most (its type,
    then its entry). A walk read every commit and tree of the history: 171 lookups here."""
    srv = start_server(lz_root)
    try:
        gitdir = lz_root / "plain.git"
        olds = [git.out("rev-parse", _old_file(n), cwd=gitdir).strip() for n in (33, 29, 21)]
        pack_bytes(_fetch(srv.port, "plain.git", [olds[0]], 2))
        before = _objects_read(srv)
        for oid in olds[1:]:
            pack = pack_bytes(_fetch(srv.port, "plain.git", [oid], 2))
            assert pack is not None and oid in pack_object_ids(git, pack)
        assert _objects_read(srv) - before <= 2 * len(olds[1:])
    finally:
        srv.stop()


@pytest.mark.parametrize("repo", ["plain.git", "bitmap.git"])
def test_blobless_clone_checkout_and_lazy_fetch(git: Git, lz_server: LiveServer, lz_root: Path,
                                                tmp_path: Path, repo: str) -> None:
    """The real client, from gitspout and over file://: the same files and the same
    objects fetched lazily, fsck-clean."""
    gitdir = lz_root / repo
    old = git.out("rev-parse", _old_file(30), cwd=gitdir).strip()
    seen = {}
    for name, url in (("http", f"{lz_server.url}/{repo}"), ("file", f"file://{gitdir}")):
        dest = tmp_path / name
        git.run("clone", "-q", "--filter=blob:none", url, str(dest))
        content = git.out("cat-file", "-p", old, cwd=dest)
        fsck(git, dest)
        listing = git.out("ls-files", "-s", cwd=dest)
        have = git.out("cat-file", "--batch-all-objects", "--batch-check=%(objectname)", cwd=dest)
        seen[name] = (content, listing, set(have.split()))
    assert seen["http"] == seen["file"]
