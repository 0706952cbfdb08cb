"""Warm after a restart without bitmaps (issue 28; server/packgen/walkrecord.py).

A repository with no bitmap (two packs by fast-import, then loose objects) is cloned by a
walk of its history. A live gitspout clones it with real C git, full and
``--filter=blob:none``, and keeps each walk in the closure store; a new process on the same
pack-cache directory serves the same clones from those records (counted ``loaded`` on
/metrics) instead of walking. A push between the two makes the clone's wants new: it is
walked again. Every clone is fsck-clean and holds what the same clone over ``file://``
holds.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from gitspout.server.graph.enumeration import Enumeration
from gitspout.server.packgen.walkrecord import DISK_WALK_OBJECTS, decode_walk, encode_walk
from gitutil import Committer, Git, poll, start_server
from warmkit import clone_equal, store_counts, store_files

SPECS = ("", "blob:none")


def _fast_import(git: Git, repo: Path, first: int, count: int) -> None:
    """``count`` commits on main by fast-import (one pack), each changing a file of d/."""
    parts = []
    for i in range(first, first + count):
        body = f"version {i}\n" * (1 + i % 5)
        msg = f"commit {i}\n"
        parts.append(f"blob\nmark :{2 * i + 1}\ndata {len(body)}\n{body}\n")
        parent = (f"from :{2 * i}\n" if i > first else
                  "from refs/heads/main^0\n" if first else "")
        parts.append(f"commit refs/heads/main\nmark :{2 * i + 2}\n"
                     f"committer T <t@example.com> {1_600_000_000 + 60 * i} +0000\n"
                     f"data {len(msg)}\n{msg}{parent}"
                     f"M 100644 :{2 * i + 1} d/f{i % 7}.txt\n\n")
    git.run("fast-import", "--quiet", cwd=repo, input="".join(parts).encode())


@pytest.fixture
def plain_root(git: Git, tmp_path: Path) -> Path:
    """app.git: 1,500 commits in two packs and a few loose objects, no bitmap. A blob:none
    clone lists 4,500 objects, past DISK_WALK_OBJECTS."""
    root = tmp_path / "root"
    repo = root / "app.git"
    git.run("init", "-q", "--bare", "-b", "main", str(repo))
    git.run("config", "uploadpack.allowFilter", "true", cwd=repo)
    _fast_import(git, repo, 0, 1200)
    _fast_import(git, repo, 1200, 300)
    _push(git, repo, tmp_path, "loose")
    packs = os.listdir(repo / "objects" / "pack")
    assert not [p for p in packs if p.endswith(".bitmap")]
    assert len([p for p in packs if p.endswith(".pack")]) == 2
    assert 3 * 1500 >= DISK_WALK_OBJECTS
    return root


def _push(git: Git, repo: Path, tmp: Path, name: str) -> None:
    """One commit pushed to main (loose objects)."""
    work = tmp / f"work-{name}"
    if not work.exists():
        git.run("clone", "-q", str(repo), str(work))
    Committer(git, work).commit({f"{name}.txt": f"{name}\n"}, name)
    git.run("push", "-q", "origin", "main", cwd=work)


def _serve_clones(git: Git, root: Path, cache: Path, tmp: Path, tag: str,
                  written: int) -> dict[str, float]:
    """A fresh process clones (full, then blob:none), each equal to ``file://``; it is
    stopped once ``written`` records are on disk (its last step writes what is queued).
    Returns its closure-store counts."""
    srv = start_server(root, ["--pack-cache-dir", str(cache)])
    try:
        for spec in SPECS:
            clone_equal(git, srv, tmp, f"{tag}-{spec or 'full'}", spec)
        return poll(lambda: (c := store_counts(srv.port)) and c.get("written", 0) >= written
                    and c, 30, "walks written")
    finally:
        srv.stop()


def _walks(cache: Path) -> list[str]:
    return sorted(p.name for p in store_files(cache) if p.name.startswith("walk-"))


def test_restarted_server_loads_the_walks_instead_of_walking(
        git: Git, plain_root: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    first = _serve_clones(git, plain_root, cache, tmp_path, "first", 2)
    assert first.get("loaded", 0) == 0, first
    walks = _walks(cache)
    assert len(walks) == 2, walks  # the full clone's and the blob:none clone's
    second = _serve_clones(git, plain_root, cache, tmp_path, "second", 0)
    # Both clones read their walk; nothing was walked, so nothing new was written.
    assert second.get("loaded", 0) == 2 and second.get("written", 0) == 0, second
    assert _walks(cache) == walks


def test_push_between_restarts_walks_again(git: Git, plain_root: Path,
                                           tmp_path: Path) -> None:
    """The wants after a push are new: their walk is not the one kept, and is made (and
    kept) afresh; the clones hold the pushed commit, as over ``file://``."""
    cache = tmp_path / "cache"
    cache.mkdir()
    _serve_clones(git, plain_root, cache, tmp_path, "first", 2)
    before = _walks(cache)
    _push(git, plain_root / "app.git", tmp_path, "pushed")
    second = _serve_clones(git, plain_root, cache, tmp_path, "second", 2)
    assert second.get("loaded", 0) == 0, second
    after = _walks(cache)
    assert len(after) == 4 and set(before) < set(after), (before, after)


def test_walk_record_round_trip_and_damage() -> None:
    ids = [bytes([i % 256, i // 256]) * 10 for i in range(300)]
    enum = Enumeration([(oid, 1 + i % 4) for i, oid in enumerate(ids[:200])],
                       set(ids[200:230]), dict(zip(ids[:50], ids[230:280], strict=True)),
                       dict(zip(ids[50:60], ids[280:290], strict=True)))
    data = encode_walk(enum, 20)
    assert decode_walk(data, 20) == enum
    assert decode_walk(data, 32) is None  # another hash length
    assert decode_walk(data[:-1], 20) is None
    assert decode_walk(data + b"\0", 20) is None
    assert decode_walk(data[:10], 20) is None
    with pytest.raises(ValueError):  # an id of another length is refused, not written
        encode_walk(Enumeration([(b"short", 1)], set()), 20)
