"""Every check a pack sent by the server must pass (issue 23), independent of any client.

* the order rule and the OFS/REF choice (packparse.order_violations): a delta's base comes
  earlier in the pack or, in a thin pack, is an object the client declared it has;
  ``ofs-delta`` negotiated means OFS_DELTA for every base in the pack, never REF_DELTA to
  one; without it, no OFS_DELTA at all;
* C git's ``index-pack`` takes it, with the objects the client has (a repository holding
  exactly those) as alternates: ``--strict`` (every link present) unless a shallow cut or a
  filter leaves links out (then ``--fsck-objects``), ``--fix-thin`` for a thin pack;
* libgit2's indexer takes it (libgit2idx.py), and what libgit2 writes is a valid pack and
  index for C git (``git verify-pack``: libgit2 accepts a delta before its base but writes
  a bad CRC for it, which is what its clones then fail fsck with);
* the ids C git gives the entries are the ids resolved here from the bytes (a check of this
  harness itself).
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from libgit2idx import Libgit2IndexError
from libgit2idx import index_pack as libgit2_index
from packparse import CatFile, Pack, index_with_git, object_ids, order_violations, parse_pack


@dataclass(frozen=True)
class Expect:
    """What the request asked for, as far as the checks need it."""

    ofs_delta: bool
    thin: bool = False  # thin-pack: a delta's base may be an object the client has
    self_contained: bool = True  # no shallow cut, no filter: the pack and the client's
    # objects together hold every link (index-pack --strict)
    haves: tuple[str, ...] = ()  # the client has everything these reach
    shallow: tuple[str, ...] = ()  # the client has these commits and their trees (depth 1)


def client_objects(served: Path, expect: Expect) -> frozenset[str]:
    """The objects the client of ``expect`` has (its haves' closures, its shallow commits
    with their trees), as the served repository names them."""
    found: set[str] = set()
    for revs, no_walk in ((expect.haves, []), (expect.shallow, ["--no-walk"])):
        if not revs:
            continue
        out = subprocess.run(["git", "-C", str(served), "rev-list", "--objects", *no_walk,
                              "--stdin"], input="".join(r + "\n" for r in revs).encode(),
                             capture_output=True, check=True, timeout=120).stdout.decode()
        found.update(line.split()[0] for line in out.splitlines() if line)
    return frozenset(found)


def client_state(served: Path, objects: frozenset[str], into: Path) -> Path:
    """A bare repository holding exactly ``objects``: what the client has, for
    ``--fix-thin`` and for libgit2's thin-pack bases."""
    subprocess.run(["git", "init", "-q", "--bare", str(into)], check=True, timeout=60)
    if objects:
        pack = subprocess.run(["git", "-C", str(served), "pack-objects", "--stdout", "-q"],
                              input="".join(o + "\n" for o in sorted(objects)).encode(),
                              capture_output=True, check=True, timeout=120).stdout
        subprocess.run(["git", "-C", str(into), "index-pack", "--stdin"], input=pack,
                       capture_output=True, check=True, timeout=120)
    return into


@dataclass
class Verdict:
    pack: Pack
    ids: dict[int, str]
    order: list[str]  # order rule and OFS/REF choice
    c_git: str | None  # why C git's index-pack refused it (or the ids disagree)
    libgit2: str | None  # why libgit2 refused it, or C git refused what libgit2 wrote

    @property
    def problems(self) -> list[str]:
        return self.order + [p for p in (self.c_git, self.libgit2) if p]

    def summary(self) -> str:
        """One line: how many order violations (and the first), then each indexer's word."""
        parts = []
        if self.order:
            parts.append(f"{len(self.order)} order violations, e.g. {self.order[0]}")
        parts.append(f"C git: {self.c_git or 'ok'}")
        parts.append(f"libgit2: {self.libgit2 or 'ok'}")
        return "; ".join(parts)


def check_pack(data: bytes, served: Path, expect: Expect) -> Verdict:
    """Every check of the module docstring on one pack (:attr:`Verdict.problems`)."""
    pack = parse_pack(data)
    cat = CatFile(served)
    try:
        ids = object_ids(pack, cat)
    finally:
        cat.close()
    has = client_objects(served, expect)
    order = order_violations(pack, ids, has if expect.thin else frozenset(), expect.ofs_delta)
    with tempfile.TemporaryDirectory(prefix="interop-check-") as tmp:
        state = client_state(served, has, Path(tmp) / "client.git")
        c_git = _c_git(data, state, expect, ids)
        lg2 = _libgit2(data, state, Path(tmp) / "lg2", expect.thin)
    return Verdict(pack, ids, order, c_git, lg2)


def _c_git(data: bytes, state: Path, expect: Expect, ids: dict[int, str]) -> str | None:
    try:
        by_git = index_with_git(state, data, thin=expect.thin, strict=expect.self_contained,
                                fsck_objects=True)
    except AssertionError as exc:
        return str(exc).strip()
    if by_git != ids:
        return (f"harness: ids resolved here differ from C git's at "
                f"{sorted(set(by_git.items()) ^ set(ids.items()))[:2]}")
    return None


def _libgit2(data: bytes, state: Path, out: Path, thin: bool) -> str | None:
    try:
        done = libgit2_index(data, out, state / "objects" if thin else None)
    except Libgit2IndexError as exc:
        return str(exc)
    proc = subprocess.run(["git", "verify-pack", str(done.idx)], capture_output=True, timeout=120)
    if proc.returncode != 0:
        return ("indexed, but wrote a pack/index that git verify-pack rejects: "
                + " ".join((proc.stderr + proc.stdout).decode(errors="replace").split())[-200:])
    return None
