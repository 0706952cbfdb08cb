"""A lazy reader for ``objects/info/commit-graph`` (Documentation/gitformat-commit-graph).

Parents, root tree, commit time and generation come from the file without inflating the
commit. The file is mapped once per (path, inode) and shared by every request.
"""

from __future__ import annotations

import mmap
import os
import struct

from .errors import StorageError
from .lru import ByteLRU
from .objformat import HASH_ID_LEN

__all__ = ["CommitGraph", "load_commit_graph", "GraphEntry"]

_NO_PARENT = 0x70000000
_EXTRA_EDGES = 0x80000000
_LAST_EDGE = 0x80000000

GraphEntry = tuple[bytes, tuple[bytes, ...], int, int]
"""(root tree, parents, commit time, generation) with binary ids."""


class CommitGraphError(StorageError):
    """The commit-graph file is not one we can use; commits are then parsed instead."""


class CommitGraph:
    """One commit-graph file, mapped; lookups by binary commit id."""

    def __init__(self, path: str, hash_len: int) -> None:
        with open(path, "rb") as fh:
            self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        m = self._map
        if m[:4] != b"CGPH" or m[4] != 1:
            raise CommitGraphError("not a commit-graph v1 file")
        if HASH_ID_LEN.get(m[5]) != hash_len:
            raise CommitGraphError("commit-graph hash does not match the repository")
        if m[7] != 0:
            raise CommitGraphError("split commit-graphs are not supported")
        chunks: dict[bytes, int] = {}
        for i in range(m[6]):
            cid, off = struct.unpack_from(">4sQ", m, 8 + 12 * i)
            chunks[cid] = off
        for need in (b"OIDF", b"OIDL", b"CDAT"):
            if need not in chunks:
                raise CommitGraphError(f"commit-graph lacks chunk {need.decode()}")
        self.hash_len = hash_len
        fan = chunks[b"OIDF"]
        self._fanout = struct.unpack_from(">256I", m, fan)
        self.count = self._fanout[255]
        self._oidl = chunks[b"OIDL"]
        self._cdat = chunks[b"CDAT"]
        self._edge = chunks.get(b"EDGE")
        self._width = hash_len + 16

    def find(self, oid: bytes) -> int:
        first = oid[0]
        lo = self._fanout[first - 1] if first else 0
        hi = self._fanout[first]
        m, h, base = self._map, self.hash_len, self._oidl
        while lo < hi:
            mid = (lo + hi) >> 1
            at = base + mid * h
            name = m[at : at + h]
            if name < oid:
                lo = mid + 1
            elif name > oid:
                hi = mid
            else:
                return mid
        return -1

    def _oid(self, pos: int) -> bytes:
        at = self._oidl + pos * self.hash_len
        return self._map[at : at + self.hash_len]

    def entry(self, oid: bytes) -> GraphEntry | None:
        """(tree, parents, time, generation) of commit ``oid``, or None if not in the graph."""
        pos = self.find(oid)
        if pos < 0:
            return None
        m, h = self._map, self.hash_len
        at = self._cdat + pos * self._width
        tree = m[at : at + h]
        p1, p2, high, low = struct.unpack_from(">IIII", m, at + h)
        parents: list[bytes] = []
        if p1 != _NO_PARENT:
            parents.append(self._oid(p1))
        if p2 & _EXTRA_EDGES and p2 != _NO_PARENT:
            parents.extend(self._edges(p2 & 0x7FFFFFFF))
        elif p2 != _NO_PARENT:
            parents.append(self._oid(p2))
        time = ((high & 0x3) << 32) | low
        return tree, tuple(parents), time, high >> 2

    def _edges(self, start: int) -> list[bytes]:
        if self._edge is None:
            raise CommitGraphError("commit-graph EDGE chunk missing")
        out = []
        i = start
        while True:
            (value,) = struct.unpack_from(">I", self._map, self._edge + 4 * i)
            out.append(self._oid(value & 0x7FFFFFFF))
            if value & _LAST_EDGE:
                return out
            i += 1


# path -> (inode, its graph or None when unusable), for COMMIT_GRAPHS object directories
# (docs/ARCHITECTURE.md, "Caches"). An entry holds a mapping, not memory.
COMMIT_GRAPHS = 4096
_cache = ByteLRU[tuple[int, CommitGraph | None]]("commit_graphs", COMMIT_GRAPHS, unit="entries")


def load_commit_graph(objects_dir: str, hash_len: int, inode: int | None) -> CommitGraph | None:
    """The repository's commit-graph, cached by (path, inode); None if absent or unusable.
    git writes the file with a lock file and a rename, so a new graph has a new inode."""
    if inode is None:
        return None
    path = os.path.join(objects_dir, "info", "commit-graph")
    cached = _cache.get(path, lambda c: c[0] == inode)
    if cached is not None:
        return cached[1]
    try:
        graph: CommitGraph | None = CommitGraph(path, hash_len)
    except (OSError, ValueError, CommitGraphError, struct.error):
        graph = None
    # Replaces a graph this path had: requests still using it keep their reference.
    _cache.put(path, (inode, graph))
    return graph
