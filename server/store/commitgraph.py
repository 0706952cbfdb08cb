"""A lazy reader for ``objects/info/commit-graph`` (Documentation/gitformat-commit-graph).

Parents, root tree, commit time and generation come from the file without inflating the
commit. The file is mapped once per (path, inode) and shared by every request.
"""

from __future__ import annotations

import errno
import os
import struct
import sys
from array import array
from bisect import bisect_left

from .errors import StorageError
from .fsops import nonblocking
from .mapped import map_whole
from .objformat import HASH_ID_LEN, trailer_matches

__all__ = ["CommitGraph", "CommitGraphError", "open_commit_graph", "GraphEntry"]

_NO_PARENT = 0x70000000
_EXTRA_EDGES = 0x80000000
_LAST_EDGE = 0x80000000

GraphEntry = tuple[bytes, tuple[bytes, ...], int, int]
"""(root tree, parents, commit time, generation) with binary ids."""


class CommitGraphError(StorageError):
    """The commit-graph file is not one we can use; commits are then parsed instead."""

    kind = "commit-graph"
    what = "corrupt commit-graph"


class CommitGraph:
    """One commit-graph file, mapped; lookups by binary commit id."""

    HANDLES = 1  # the map

    def __init__(self, path: str, hash_len: int, inode: int | None = None,
                 verify: bool = True) -> None:
        self.path = path
        # Registry bookkeeping, as for a PackFile (store/registry.py).
        self.key: tuple[object, ...] = (os.path.dirname(path), os.path.basename(path), inode)
        self.leases = 0
        self.retired = False
        self.handles = self.HANDLES
        with open(path, "rb", opener=nonblocking) as fh:
            if verify and inode is not None and os.fstat(fh.fileno()).st_ino != inode:
                raise FileNotFoundError(errno.ENOENT, "replaced since it was listed", path)
            self._map = map_whole(fh.fileno())
        try:
            self._parse(hash_len)
        except BaseException:
            self._map.close()
            raise

    def close(self) -> None:
        if not self._map.closed:
            self._map.close()

    def files(self) -> tuple[tuple[str, object], ...]:
        return ((self.path, self.key[2]),)

    def _parse(self, hash_len: int) -> None:
        m = self._map
        if m[:4] != b"CGPH" or m[4] != 1:
            raise CommitGraphError("not a commit-graph v1 file")
        if HASH_ID_LEN.get(m[5]) != hash_len:
            raise CommitGraphError("commit-graph hash does not match the repository")
        if m[7] != 0:
            raise CommitGraphError("split commit-graphs are not supported")
        sizes = self._chunk_sizes(hash_len)
        for need in (b"OIDF", b"OIDL", b"CDAT"):
            if need not in sizes:
                raise CommitGraphError(f"commit-graph lacks chunk {need.decode()}")
        self.hash_len = hash_len
        fan, _ = sizes[b"OIDF"]
        self._fanout = struct.unpack_from(">256I", m, fan)
        self.count = n = self._fanout[255]
        self._oidl = sizes[b"OIDL"][0]
        self._cdat = sizes[b"CDAT"][0]
        self._width = hash_len + 16
        edge = sizes.get(b"EDGE")
        self._edge = edge[0] if edge is not None else None
        self._edges_count = edge[1] // 4 if edge is not None else 0
        # What C git checks when it loads a graph: chunk sizes that fit the commit count
        # and a fan-out that never decreases.
        if sizes[b"OIDF"][1] != 1024 or sizes[b"OIDL"][1] != n * hash_len or \
                sizes[b"CDAT"][1] != n * self._width or \
                any(a > b for a, b in zip(self._fanout, self._fanout[1:], strict=False)):
            raise CommitGraphError("commit-graph chunks do not fit its commit count")
        self._prefixes: array | None = None
        self._verify_checksum(hash_len)

    def _chunk_sizes(self, hash_len: int) -> dict[bytes, tuple[int, int]]:
        """Chunk id -> (offset, size), from the table of contents (its last entry, id 0,
        marks where the last chunk ends); every chunk lies before the trailing checksum."""
        m = self._map
        count = m[6]
        table_end = 8 + 12 * (count + 1)
        if len(m) < table_end + hash_len:
            raise CommitGraphError("truncated commit-graph")
        entries = [struct.unpack_from(">4sQ", m, 8 + 12 * i) for i in range(count + 1)]
        out: dict[bytes, tuple[int, int]] = {}
        for (cid, off), (_, nxt) in zip(entries, entries[1:], strict=False):
            if not table_end <= off <= nxt <= len(m) - hash_len:
                raise CommitGraphError("commit-graph chunk offsets out of order or range")
            out[cid] = (off, nxt - off)
        return out

    def _verify_checksum(self, hash_len: int) -> None:
        """The file ends with a checksum of what precedes it. Checked once per file
        version (the registry keeps the graph by inode): about 1 ms per MB, so that
        damaged parents or trees never lead a walk astray (or outside I7)."""
        if not trailer_matches(self._map, hash_len):
            raise CommitGraphError("commit-graph checksum does not match its contents")

    def _load_prefixes(self) -> array:
        """The first 4 bytes of every commit id as integers, for bisection in C (4 bytes a
        commit, kept while the file is open): a walk looks up thousands of commits."""
        h, base, n = self.hash_len, self._oidl, self.count
        names = self._map[base : base + n * h]  # a copy: no export of the map outlives this
        prefixes = array("I")
        prefixes.frombytes(memoryview(names).cast("I")[:: h // 4].tobytes())
        if sys.byteorder == "little":
            prefixes.byteswap()
        self._prefixes = prefixes
        return prefixes

    def find(self, oid: bytes) -> int:
        prefixes = self._prefixes if self._prefixes is not None else self._load_prefixes()
        first = oid[0]
        lo = self._fanout[first - 1] if first else 0
        hi = self._fanout[first]
        key = int.from_bytes(oid[:4], "big")
        i = bisect_left(prefixes, key, lo, hi)
        m, h, base = self._map, self.hash_len, self._oidl
        while i < hi and prefixes[i] == key:
            at = base + i * h
            if m[at : at + h] == oid:
                return i
            i += 1
        return -1

    def _oid(self, pos: int) -> bytes:
        at = self._oidl + pos * self.hash_len
        return self._map[at : at + self.hash_len]

    def entry(self, oid: bytes) -> GraphEntry | None:
        """(tree, parents, time, generation) of commit ``oid``, or None if not in the graph."""
        pos = self.find(oid)
        return None if pos < 0 else self.entry_at(pos)

    def entry_at(self, pos: int) -> GraphEntry:
        """:meth:`entry` of the commit at graph position ``pos`` (as :meth:`find` gave)."""
        m, h = self._map, self.hash_len
        at = self._cdat + pos * self._width
        tree = m[at : at + h]
        p1, p2, high, low = struct.unpack_from(">IIII", m, at + h)
        parents: list[bytes] = []
        if p1 != _NO_PARENT:
            if p1 >= self.count:
                raise CommitGraphError(f"commit-graph parent position {p1} out of range")
            parents.append(self._oid(p1))
        if p2 & _EXTRA_EDGES and p2 != _NO_PARENT:
            parents.extend(self._edges(p2 & 0x7FFFFFFF))
        elif p2 != _NO_PARENT:
            if p2 >= self.count:
                raise CommitGraphError(f"commit-graph parent position {p2} out of range")
            parents.append(self._oid(p2))
        time = ((high & 0x3) << 32) | low
        return tree, tuple(parents), time, high >> 2

    def first_parent_tree(self, oid: bytes) -> bytes | None:
        """The root tree of the first parent of commit ``oid`` (read at the parent's
        position, which the entry gives: no second lookup), or None for a root commit
        or a commit not in the graph."""
        pos = self.find(oid)
        if pos < 0:
            return None
        (p1,) = struct.unpack_from(">I", self._map, self._cdat + pos * self._width + self.hash_len)
        if p1 == _NO_PARENT:
            return None
        if p1 >= self.count:
            raise CommitGraphError(f"commit-graph parent position {p1} out of range")
        at = self._cdat + p1 * self._width
        return self._map[at : at + self.hash_len]

    def _edges(self, start: int) -> list[bytes]:
        if self._edge is None:
            raise CommitGraphError("commit-graph EDGE chunk missing")
        out = []
        i = start
        while True:
            if i >= self._edges_count:
                raise CommitGraphError("commit-graph EDGE list runs past its chunk")
            (value,) = struct.unpack_from(">I", self._map, self._edge + 4 * i)
            if value & 0x7FFFFFFF >= self.count:
                raise CommitGraphError("commit-graph parent position out of range")
            out.append(self._oid(value & 0x7FFFFFFF))
            if value & _LAST_EDGE:
                return out
            i += 1


def open_commit_graph(objects_dir: str, hash_len: int, inode: int,
                      verify: bool = True) -> CommitGraph:
    """Map ``objects/info/commit-graph``, which must have ``inode`` (the registry keeps the
    graph by path and inode: git writes it with a lock file and a rename, so a new graph
    has a new inode). Raises OSError or CommitGraphError."""
    path = os.path.join(objects_dir, "info", "commit-graph")
    try:
        return CommitGraph(path, hash_len, inode, verify)
    except (ValueError, struct.error) as exc:
        raise CommitGraphError(f"unreadable commit-graph: {exc}") from None
