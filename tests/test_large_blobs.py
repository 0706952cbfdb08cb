"""The candidates of ``--blob-uri-threshold`` (store/packscan.py ``large_whole_blobs``)
against git: blobs around each size a type/size varint can hold (2,048 and 262,144 bytes
need one byte more), stored whole, with a delta and a tree beside them; every limit gives
exactly the whole blobs of that size or more, with their sizes as ``git cat-file -s``."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from gitspout.server.core.context import RequestContext
from gitspout.server.store.packscan import large_whole_blobs
from gitspout.server.store.registry import PackRegistry
from gitspout.server.store.repos import RepoResolver
from gitutil import Committer, Git

SIZES = [10, 2047, 2048, 2049, 262143, 262144, 262145, 400000]


@pytest.fixture(scope="module")
def sized_repo(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    work = tmp_path_factory.mktemp("sizedwork") / "w"
    git.run("init", "-q", "-b", "main", str(work))
    rnd = random.Random(29)
    c = Committer(git, work)
    c.commit({f"b{n}.bin": rnd.randbytes(n) for n in SIZES}, "sizes")
    data = bytearray((work / "b400000.bin").read_bytes())
    data[10:20] = b"y" * 10
    c.commit({"b400000.bin": bytes(data)}, "a delta of 400,000 bytes")
    root = tmp_path_factory.mktemp("sizedroot")
    git.run("clone", "-q", "--bare", "--no-local", str(work), str(root / "r.git"))
    git.run("repack", "-q", "-adf", cwd=root / "r.git")
    return root


def test_large_whole_blobs_as_git_sizes_them(git: Git, sized_repo: Path) -> None:
    repo = sized_repo / "r.git"
    listed = git.out("cat-file", "--batch-all-objects",
                     "--batch-check=%(objectname) %(objecttype) %(objectsize) %(deltabase)",
                     cwd=repo)
    whole = {}
    for line in listed.splitlines():
        oid, kind, size, base = line.split()
        if kind == "blob" and set(base) == {"0"}:
            whole[oid] = int(size)
    assert len(whole) == len(SIZES)  # one of the two 400,000-byte versions is a delta
    resolver = RepoResolver(str(sized_repo), False)
    ctx = RequestContext(resolver.resolve("r.git"), PackRegistry(), b"test")
    try:
        (pack,) = ctx.odb.packs
        for limit in [1, *SIZES, 400001]:
            got = {pack.oid_at(pack.pack_order[rank]).hex(): size
                   for rank, size in large_whole_blobs(pack, limit)}
            assert got == {o: s for o, s in whole.items() if s >= limit}, limit
    finally:
        ctx.close()
