"""A pack's ``.idx`` (Documentation/gitformat-pack "pack-*.idx files have the following
format", version 2): its layout checked when mapped, its checksum verified once per file
version, and lookups by name (:meth:`PackIndex.find`) and by position.

:class:`PackIndex` is a part of :class:`~.packs.PackFile`, which owns the mapped file.
"""

from __future__ import annotations

import errno
import os
import struct
import sys
from array import array
from bisect import bisect_left
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from .fsops import nonblocking
from .mapped import Mapped, map_whole
from .objformat import trailer_matches
from .packentry import PackFormatError

__all__ = ["PackIndex", "replaced"]

_IDX_MAGIC = b"\377tOc"


def replaced(path: str) -> FileNotFoundError:
    """The file at ``path`` is not the one the listing named (a repack replaced it)."""
    return FileNotFoundError(errno.ENOENT, "replaced since it was listed", path)


class PackIndex:
    """The index part of a pack: fan-out, names, offsets (mapped by :meth:`_map_index`)."""

    hash_len: int
    count: int
    fanout: array
    _names_at: int
    _crc_at: int
    _ofs_at: int
    _large_at: int
    _checksum: bytes
    _prefixes: array | None
    _bisections: int | None

    if TYPE_CHECKING:
        def pinned(self) -> AbstractContextManager[tuple[int, Mapped]]: ...
        def _pin(self) -> tuple[int, Mapped]: ...
        def _unpin(self) -> None: ...
        def derived(self, kind: str, compute: Callable[[], tuple[Any, int]]) -> Any: ...
        def knows(self, kind: str) -> bool: ...
        def corrupt(self, detail: str, suffix: str = ".pack") -> PackFormatError: ...

    def _map_index(self, path: str, inode: object = None) -> Mapped:
        with open(path, "rb", opener=nonblocking) as fh:
            if inode is not None and os.fstat(fh.fileno()).st_ino != inode:
                raise replaced(path)
            idx = map_whole(fh.fileno())
        if len(idx) < 8 + 1024 + 2 * self.hash_len:
            idx.close()
            raise self.corrupt("truncated index", ".idx")
        if idx[:4] != _IDX_MAGIC or struct.unpack(">I", idx[4:8])[0] != 2:
            idx.close()
            raise self.corrupt("only pack index version 2 is supported", ".idx")
        self.fanout = array("I", idx[8 : 8 + 1024])
        if self.fanout.itemsize == 4 and array("I", [1]).tobytes()[0] == 1:
            self.fanout.byteswap()
        self.count = self.fanout[255]
        n, h = self.count, self.hash_len
        self._names_at = 8 + 1024
        self._crc_at = self._names_at + n * h
        self._ofs_at = self._crc_at + n * 4
        self._large_at = self._ofs_at + n * 4
        if len(idx) < self._large_at + 2 * h:
            idx.close()
            raise self.corrupt("truncated index", ".idx")
        # What C git checks when it opens an index: the fan-out never decreases, and what
        # follows the offsets is a table of 8-byte large offsets (at most one per object)
        # and the two checksums. 256 compares, once per open.
        large = len(idx) - self._large_at - 2 * h
        if large % 8 or large > 8 * n or \
                any(a > b for a, b in zip(self.fanout, self.fanout[1:], strict=False)):
            idx.close()
            raise self.corrupt("bad index layout", ".idx")
        return idx

    @property
    def index_size(self) -> int:
        with self.pinned() as (_fd, idx):
            return len(idx)

    def verify_index(self) -> None:
        """Compare the index's trailing checksum with its contents, once per file version
        (the verdict is derived data, kept by key within --cache-memory): a damaged index
        would send the wrong entries under the right names. About 1 ms per MB of index,
        as much as the name prefixes the first lookup reads anyway."""
        def compute() -> tuple[bool, int]:
            with self.pinned() as (_fd, idx):
                if not trailer_matches(idx, self.hash_len):
                    raise self.corrupt("index checksum does not match its contents", ".idx")
            return True, 0

        self.derived("verified", compute)


    def _load_prefixes(self) -> array:
        """The first 4 bytes of every name as integers, for C-speed bisection. Taken as a
        strided view of the mapped index, so no per-object Python step and no copy of the
        whole name table."""
        def compute() -> tuple[array, int]:
            h, base, n = self.hash_len, self._names_at, self.count
            with self.pinned() as (_fd, idx):
                words = memoryview(idx)[base : base + n * h].cast("I")
                prefixes = array("I")
                prefixes.frombytes(words[:: h // 4].tobytes())
                words.release()
            if sys.byteorder == "little":
                prefixes.byteswap()
            return prefixes, 4 * n

        prefixes: array = self.derived("prefixes", compute)
        self._prefixes = prefixes
        return prefixes

    def find(self, oid: bytes) -> int:
        """Index position of binary ``oid``, or -1.

        Bisects the prefix array in C. A pack's first lookups (as many as it has entries
        over 1,024) bisect the mapped names in Python instead: copying out git/git's 841k
        prefixes costs 8 ms, more than a cold fetch of one commit spends on lookups.
        """
        prefixes = self._prefixes
        if prefixes is None:
            left = self._bisections
            if left is None:
                left = 0 if self.knows("prefixes") else self.count >> 10
            if left > 0:
                self._bisections = left - 1
                return self._bisect_names(oid)
            prefixes = self._load_prefixes()
        first = oid[0]
        lo = self.fanout[first - 1] if first else 0
        hi = self.fanout[first]
        key = int.from_bytes(oid[:4], "big")
        i = bisect_left(prefixes, key, lo, hi)
        if i >= hi or prefixes[i] != key:
            return -1  # most misses end here, without the index file
        h, base = self.hash_len, self._names_at
        try:
            idx = self._pin()[1]
            while i < hi and prefixes[i] == key:
                at = base + i * h
                if idx[at : at + h] == oid:
                    return i
                i += 1
        finally:
            self._unpin()
        return -1

    def _bisect_names(self, oid: bytes) -> int:
        """:meth:`find` without the prefix array."""
        first = oid[0]
        lo = self.fanout[first - 1] if first else 0
        end = hi = self.fanout[first]
        h, base = self.hash_len, self._names_at
        with self.pinned() as (_fd, idx):
            while lo < hi:
                mid = (lo + hi) >> 1
                at = base + mid * h
                if idx[at : at + h] < oid:
                    lo = mid + 1
                else:
                    hi = mid
            at = base + lo * h
            return lo if lo < end and idx[at : at + h] == oid else -1

    def oid_at(self, pos: int) -> bytes:
        at = self._names_at + pos * self.hash_len
        try:
            return self._pin()[1][at : at + self.hash_len]
        finally:
            self._unpin()

    def offset_at(self, pos: int) -> int:
        at = self._ofs_at + pos * 4
        try:
            idx = self._pin()[1]
            off = int.from_bytes(idx[at : at + 4], "big")
            if off & 0x80000000:
                at = self._large_at + (off & 0x7FFFFFFF) * 8
                if at + 8 > len(idx) - 2 * self.hash_len:
                    raise self.corrupt(f"large offset {off & 0x7FFFFFFF} out of range", ".idx")
                off = int.from_bytes(idx[at : at + 8], "big")
            return off
        finally:
            self._unpin()

    def pack_checksum(self) -> bytes:
        """The pack's trailing checksum, as recorded at the end of the index (read when
        the index was first opened)."""
        return self._checksum
