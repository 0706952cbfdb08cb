"""Every delta in a pack follows its base (DESIGN.md invariant 11; PROTOCOL-NOTES 14).

C git's index-pack accepts a delta whose base comes later in the pack; libgit2's and
isomorphic-git's indexers resolve deltas in pack order and do not (a depth-1 clone of
dulwich's branches came out corrupt from libgit2). So whatever path makes the pack, the
pack gitspout sends has each delta's base earlier in it, or (thin pack) outside it, as
pack-objects writes it; OFS_DELTA for a base in the pack when the client asked for
ofs-delta, REF_DELTA otherwise. Each pack is parsed here, indexed by ``git index-pack
--strict``, and its object set compared with C git's upload-pack for the same request.

The shapes that used to break it: new deltas against the object at the same path in the
parent commit, which pack order puts later (shallow clones of several branches); a pack
as ``index-pack --fix-thin`` leaves a pushed one, REF_DELTA entries before the bases it
appended; and a pack repacked without delta-base-offset, which went out verbatim.
"""

from __future__ import annotations

import hashlib
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from dulwich.pack import create_delta
from gitutil import Committer, Git, LiveServer, start_server
from packutil import (
    REF_DELTA,
    c_git_v2_answer,
    pack_bytes,
    pack_entries,
    pack_offsets,
    pack_order_faults,
)
from rawhttp import DELIM, FLUSH, pkt_lines, post_upload_pack


def _history(git: Git, work: Path) -> None:
    """Edits to a few files on main and on four branches that leave it at different
    points: shallow tips whose files are stored as deltas against older versions."""
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    lines = [f"line {i} of a file long enough to be stored as deltas\n" for i in range(300)]
    for n in range(24):
        lines[(n * 37) % 300] = f"edited in commit {n}\n"
        c.commit({"a.txt": "".join(lines), f"d/{n % 3}.txt": "".join(lines[n:] + lines[:n])},
                 f"commit {n}")
        if n % 6 == 5:
            git.run("branch", f"b{n}", cwd=work)
    for n in (5, 11, 17, 23):
        git.run("checkout", "-q", f"b{n}", cwd=work)
        mine = list(lines)
        mine[n] = f"branch b{n} was here\n"
        c.commit({"a.txt": "".join(mine), "d/0.txt": "".join(mine[::-1])}, f"on b{n}")
    git.run("checkout", "-q", "main", cwd=work)


def _git_objects(git: Git, gitdir: Path) -> list[tuple[str, str, bytes]]:
    """(id, type, content) of every object of ``gitdir``."""
    ids = git.out("cat-file", "--batch-all-objects", "--batch-check=%(objectname)",
                  cwd=gitdir).split()
    out = git.run("cat-file", "--batch", cwd=gitdir, input="\n".join(ids).encode() + b"\n").stdout
    objects, pos = [], 0
    while pos < len(out):
        eol = out.index(b"\n", pos)
        oid, kind, size = out[pos:eol].decode().split()
        start = eol + 1
        objects.append((oid, kind, out[start : start + int(size)]))
        pos = start + int(size) + 1
    return objects


def _header(kind: int, size: int) -> bytes:
    c = (kind << 4) | (size & 0x0F)
    size >>= 4
    out = bytearray()
    while size:
        out.append(c | 0x80)
        c = size & 0x7F
        size >>= 7
    out.append(c)
    return bytes(out)


def _fix_thin_like(git: Git, gitdir: Path) -> None:
    """Replace the packs of ``gitdir`` with one laid out as ``index-pack --fix-thin``
    leaves a pushed pack: blobs as REF_DELTA entries against other blobs of the same size
    class, every base written whole at the end."""
    types = {"commit": 1, "tree": 2, "blob": 3, "tag": 4}
    objects = _git_objects(git, gitdir)
    blobs = sorted((o for o in objects if o[1] == "blob"), key=lambda o: len(o[2]))
    bases = {o[0] for o in blobs[::2]}
    entries, tail = [], []
    for i, (oid, kind, data) in enumerate(blobs):
        if oid not in bases and i > 0:
            base_oid, _, base_data = blobs[i - 1]
            delta = b"".join(create_delta(base_data, data))
            entries.append(_header(REF_DELTA, len(delta)) + bytes.fromhex(base_oid)
                           + zlib.compress(delta))
        else:
            tail.append(_header(types[kind], len(data)) + zlib.compress(data))
    for _oid, kind, data in objects:
        if kind != "blob":
            entries.append(_header(types[kind], len(data)) + zlib.compress(data))
    body = b"PACK" + (2).to_bytes(4, "big") + len(entries + tail).to_bytes(4, "big")
    body += b"".join(entries + tail)
    pack = body + hashlib.sha1(body).digest()
    packdir = gitdir / "objects" / "pack"
    for old in packdir.iterdir():
        old.unlink()
    git.run("index-pack", "--stdin", cwd=gitdir, input=pack)
    git.run("fsck", "--no-dangling", cwd=gitdir)


def _push_after_gc(git: Git, gitdir: Path, work: Path) -> None:
    """A bitmapped pack, then a push into it (loose objects): a clone is every entry of
    the pack, copied as one run of its body (packgen/layout.py), and the loose objects."""
    git.run("repack", "-q", "-adb", "--depth=50", "--window=50", cwd=gitdir)
    git.run("clone", "-q", str(gitdir), str(work))
    c = Committer(git, work, start=1_700_000_000)
    text = (work / "a.txt").read_text()
    c.commit({"a.txt": text.replace("line 7 ", "pushed 7 "), "new.txt": "new\n"}, "pushed")
    git.run("push", "-q", "origin", "main", cwd=work)
    assert git.out("count-objects", cwd=gitdir).split()[0] != "0"


@pytest.fixture(scope="module")
def order_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    root = tmp_path_factory.mktemp("orderroot")
    work = tmp_path_factory.mktemp("orderwork") / "w"
    _history(git, work)
    for name in ("gc.git", "refdelta.git", "fixthin.git", "gcpushed.git"):
        git.run("clone", "-q", "--bare", "--no-local", str(work), str(root / name))
        git.run("config", "uploadpack.allowFilter", "true", cwd=root / name)
    git.run("repack", "-q", "-adb", "--depth=50", "--window=50", cwd=root / "gc.git")
    git.run("-c", "repack.useDeltaBaseOffset=false", "repack", "-q", "-adfb", cwd=root / "refdelta.git")
    _fix_thin_like(git, root / "fixthin.git")
    _push_after_gc(git, root / "gcpushed.git", work.parent / "pushwork")
    un = root / "un.git"
    git.run("init", "-q", "--bare", str(un))
    for rev in ("main~16", "main~8", "main"):
        git.run("push", "-q", str(un), f"{rev}:refs/heads/main", cwd=work)
    git.run("push", "-q", str(un), "refs/heads/b*:refs/heads/b*", cwd=work)
    git.run("config", "uploadpack.allowFilter", "true", cwd=un)
    return root


@pytest.fixture(scope="module")
def order_server(order_root: Path) -> Iterator[LiveServer]:
    srv = start_server(order_root)
    yield srv
    srv.stop()


SHAPES = {
    "clone": [],
    "depth 1": ["deepen 1"],
    "blobless": ["filter blob:none"],
    "fetch": ["have {old}"],
    "thin fetch": ["have {old}", "thin-pack"],
    "deepen 1 -> 3": ["deepen 3", "shallow {tips}"],
}


def _request(git: Git, gitdir: Path, shape: str, ofs: bool) -> tuple[bytes, set[bytes]]:
    """The v2 fetch of every branch in ``shape``, and the ids the client has."""
    refs = git.out("for-each-ref", "--format=%(objectname)", "refs/heads", cwd=gitdir).split()
    old = git.out("rev-parse", "main~10", cwd=gitdir).strip()
    args = [f"want {r}" for r in refs]
    for a in SHAPES[shape]:
        args += [a.format(old=old, tips=t) for t in (refs if "{tips}" in a else [""])]
    args += (["ofs-delta"] if ofs else []) + ["no-progress", "done"]
    body = pkt_lines("command=fetch", "object-format=sha1") + DELIM + pkt_lines(*args) + FLUSH
    # What the client has: the history under its have, or the whole trees of the commits
    # it is shallow at.
    had = [old] if "have" in " ".join(args) else []
    had += ["--no-walk", *refs] if "shallow" in " ".join(args) else []
    listing = git.out("rev-list", "--objects", *had, cwd=gitdir) if had else ""
    return body, {bytes.fromhex(line.split()[0]) for line in listing.splitlines()}


@pytest.mark.parametrize("repo", ["gc.git", "un.git", "refdelta.git", "fixthin.git",
                                  "gcpushed.git"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("ofs", [True, False])
def test_every_delta_follows_its_base(git: Git, order_server: LiveServer, order_root: Path,
                                      repo: str, shape: str, ofs: bool) -> None:
    gitdir = order_root / repo
    body, has = _request(git, gitdir, shape, ofs)
    resp = post_upload_pack(order_server.port, body, repo=repo, version=2)
    assert resp.status == 200 and resp.complete
    pack = pack_bytes(resp.body)
    assert pack is not None
    entries = pack_entries(pack)
    thin = "thin" in shape
    offsets = pack_offsets(git, pack, gitdir / "objects" if thin else None)
    assert pack_order_faults(entries, offsets, ofs, has if thin else set()) == []
    theirs = pack_bytes(c_git_v2_answer(git, gitdir, body).stdout)
    assert theirs is not None
    c_git = set(pack_offsets(git, theirs, gitdir / "objects" if thin else None))
    # Nothing C git would not send, and of what it sends, only what the client has may be
    # left out (a deepen: C git resends files of the commits the client is shallow at).
    assert set(offsets) - c_git == set()
    assert c_git - set(offsets) <= has


def test_shallow_clone_of_every_branch_is_sound(git: Git, order_server: LiveServer,
                                                tmp_path: Path) -> None:
    """The real client's depth-1 clone of every branch: new deltas against the parent's
    version of a file are made, and each follows its base."""
    dest = tmp_path / "c.git"
    git.run("clone", "-q", "--bare", "--depth", "1", "--no-single-branch",
            f"{order_server.url}/gc.git", str(dest))
    git.run("fsck", cwd=dest)
    (pack,) = (dest / "objects" / "pack").glob("*.pack")
    data = pack.read_bytes()
    entries = pack_entries(data)
    assert sum(1 for _, kind, _ in entries if kind in (6, 7)) > 0, "the clone has deltas"
    assert pack_order_faults(entries, pack_offsets(git, data), True) == []
    verify = subprocess.run(["git", "verify-pack", str(pack)], capture_output=True, timeout=60)
    assert verify.returncode == 0, verify.stderr


@pytest.mark.parametrize("repo", ["gc.git", "un.git"])
def test_a_deepen_deltifies_against_what_the_client_has(git: Git, order_server: LiveServer,
                                                        order_root: Path, repo: str) -> None:
    """A thin deepen (the client has its shallow tips whole) sends the changed files as
    deltas of the client's versions, as pack-objects --thin does with its preferred bases:
    no more objects whole than C git sends whole. (gitspout sent the older versions whole:
    git stores them as deltas of the newer ones, which the pack also sends.)"""
    gitdir = order_root / repo
    refs = git.out("for-each-ref", "--format=%(objectname)", "refs/heads", cwd=gitdir).split()
    args = [f"want {r}" for r in refs] + [f"shallow {r}" for r in refs] + \
        [f"have {r}" for r in refs] + ["deepen 6", "thin-pack", "ofs-delta", "no-progress", "done"]
    body = pkt_lines("command=fetch", "object-format=sha1") + DELIM + pkt_lines(*args) + FLUSH
    resp = post_upload_pack(order_server.port, body, repo=repo, version=2)
    ours = pack_bytes(resp.body)
    theirs = pack_bytes(c_git_v2_answer(git, gitdir, body).stdout)
    assert ours is not None and theirs is not None

    def whole(pack: bytes) -> int:
        return sum(1 for _, kind, _ in pack_entries(pack) if kind < 6)

    assert whole(ours) <= whole(theirs), (whole(ours), whole(theirs), len(ours), len(theirs))


def test_a_deepen_deltifies_a_file_against_the_clients_next_version(
        git: Git, order_server: LiveServer, order_root: Path, tmp_path: Path) -> None:
    """A file that stays the same over the commits a deepen sends, and that git stores
    whole (its older versions as deltas of it), has only those older versions on its delta
    hint chain: a cycle. Its next version, which the client has from its shallow tip, is
    the base C git finds (by name, among its preferred bases). gitspout sent it whole: a
    deepen of dulwich's history was 1.6x C git's bytes."""
    work = tmp_path / "w"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    base = [f"line {i} of a file that grows and then shrinks again\n" for i in range(2000)]
    c.commit({"g.txt": "0\n"}, "the root, without f")
    c.commit({"f.txt": "".join(base[:1500])}, "f v0")
    c.commit({"f.txt": "".join(base)}, "f v1: the largest, stored whole")
    for n in range(3):
        c.commit({"g.txt": f"{n + 1}\n"}, f"g {n}")
    c.commit({"f.txt": "".join(base[:1900])}, "f v2: the client's")
    for n in range(3):
        c.commit({"g.txt": f"{n + 10}\n"}, f"g {n + 10}")
    gitdir = order_root / "nextversion.git"
    git.run("clone", "-q", "--bare", "--no-local", str(work), str(gitdir))
    git.run("repack", "-q", "-adf", "--window=50", "--depth=50", cwd=gitdir)
    v1 = git.out("rev-parse", "main~7:f.txt", cwd=gitdir).strip()
    stored = git.out("verify-pack", "-v", *map(str, (gitdir / "objects" / "pack").glob("*.idx")),
                     cwd=gitdir)
    assert any(line.split()[:2] == [v1, "blob"] and len(line.split()) == 5
               for line in stored.splitlines()), "v1 is expected stored whole"
    tip = git.out("rev-parse", "main", cwd=gitdir).strip()
    args = [f"want {tip}", f"shallow {tip}", f"have {tip}", "deepen 20", "thin-pack",
            "ofs-delta", "no-progress", "done"]
    body = pkt_lines("command=fetch", "object-format=sha1") + DELIM + pkt_lines(*args) + FLUSH
    resp = post_upload_pack(order_server.port, body, repo="nextversion.git", version=2)
    ours = pack_bytes(resp.body)
    theirs = pack_bytes(c_git_v2_answer(git, gitdir, body).stdout)
    assert ours is not None and theirs is not None

    def whole_blobs(pack: bytes) -> int:
        return sum(1 for _, kind, _ in pack_entries(pack) if kind == 3)

    assert whole_blobs(ours) <= whole_blobs(theirs), (whole_blobs(ours), whole_blobs(theirs))
    assert len(ours) < 2 * len(theirs), (len(ours), len(theirs))
    # The real client resolves the thin deltas against what its shallow clone holds.
    dest = tmp_path / "client"
    git.run("clone", "-q", "--bare", "--depth", "1", f"{order_server.url}/nextversion.git",
            str(dest))
    git.run("-c", "protocol.version=2", "fetch", "-q", "--deepen=20", "origin",
            "+refs/heads/*:refs/heads/*", cwd=dest)
    git.run("fsck", "--strict", cwd=dest)
    assert git.out("rev-list", "--count", "main", cwd=dest).strip() == \
        git.out("rev-list", "--count", "main", cwd=gitdir).strip()
