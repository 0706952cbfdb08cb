"""One pack file and its index, cached for the life of the process.

Pack files never change; only the set of packs does (ARCHITECTURE.md I1). A
:class:`PackFile` keeps its ``.idx`` mapped and its ``.pack`` open, and computes the reverse
index (entry boundaries) and bitmaps lazily, once. It is safe to share between threads.
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
import sys
import threading
import zlib
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np

from .errors import StorageError
from .faults import report_unusable
from .lru import ByteLRU
from .objformat import OFS_DELTA, REF_DELTA, TYPE_NAMES, trailer_matches
from .packscan import base_ranks_of

__all__ = ["PackFile", "PackFormatError", "Windows", "EntryHeader", "parse_entry_header",
           "encode_entry_header", "as_array", "close_files"]

_IDX_MAGIC = b"\377tOc"
_HEADER_READ = 64  # enough for any entry header: type/size varint + OFS varint or REF id
_WHOLE_READ = 1 << 20  # entries up to this size are read in one go (read_entry)
WINDOW = 1 << 16  # bytes of a pack read at once for a request's small entries (Windows)
WINDOWS = 64  # windows one request keeps: 4 MiB


class PackFormatError(StorageError):
    """A pack or index file is not in a format we can read."""

    what = "corrupt pack"
    kind = "pack"


class EntryHeader(NamedTuple):
    """A pack entry's header: ``type_num`` (1-4, 6 or 7), inflated ``size`` (of the delta
    for deltas), ``data_offset`` where the zlib stream starts, and the delta base as an
    absolute pack offset (OFS_DELTA) or a binary object id (REF_DELTA). A tuple: one is
    made per entry read."""

    type_num: int
    size: int
    data_offset: int
    base_offset: int | None = None
    base_oid: bytes | None = None


def parse_entry_header(buf: bytes | memoryview, offset: int, hash_len: int) -> EntryHeader:
    """Decode the entry header at the start of ``buf`` (read from pack ``offset``)."""
    c = buf[0]
    type_num = (c >> 4) & 7
    size = c & 15
    i = 1
    if c & 0x80:
        shift = 4
        while True:
            c = buf[i]
            i += 1
            size |= (c & 0x7F) << shift
            if not c & 0x80:
                break
            shift += 7
    if type_num == OFS_DELTA:
        c = buf[i]
        i += 1
        rel = c & 0x7F
        while c & 0x80:
            c = buf[i]
            i += 1
            rel = ((rel + 1) << 7) | (c & 0x7F)
        return EntryHeader(type_num, size, offset + i, offset - rel, None)
    if type_num == REF_DELTA:
        return EntryHeader(type_num, size, offset + i + hash_len, None, bytes(buf[i : i + hash_len]))
    if type_num not in TYPE_NAMES:
        raise PackFormatError(f"bad object type {type_num} at offset {offset}")
    return EntryHeader(type_num, size, offset + i, None, None)


def encode_ofs_distance(dist: int) -> bytes:
    """The OFS_DELTA distance varint (pack-format: base-128, each continuation adds one)."""
    out = bytearray([dist & 0x7F])
    dist >>= 7
    while dist:
        dist -= 1
        out.append(0x80 | (dist & 0x7F))
        dist >>= 7
    out.reverse()
    return bytes(out)


def encode_entry_header(type_num: int, size: int, base: int | bytes | None = None) -> bytes:
    """Encode an entry header; ``base`` is the relative distance for OFS_DELTA (positive)
    or the binary base id for REF_DELTA."""
    out = bytearray()
    c = (type_num << 4) | (size & 15)
    size >>= 4
    while size:
        out.append(c | 0x80)
        c = size & 0x7F
        size >>= 7
    out.append(c)
    if type_num == OFS_DELTA:
        assert isinstance(base, int) and base > 0
        out += encode_ofs_distance(base)
    elif type_num == REF_DELTA:
        assert isinstance(base, bytes)
        out += base
    return bytes(out)


def as_array(code: str, values: np.ndarray) -> array:
    """A numpy vector as an ``array`` of ``code`` (native byte order), copied once."""
    dtype = np.uint32 if code == "I" else np.uint64
    out = array(code, bytes(len(values) * np.dtype(dtype).itemsize))
    np.frombuffer(out, dtype=dtype)[:] = values  # written in place: no bytes in between
    return out


def _sort_positions(offsets: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """Index positions in the order of their (distinct) ``offsets``, all below ``limit``,
    and the offsets in that order: a radix sort, 16 bits a pass (numpy's stable sort of
    16-bit keys is a counting sort), on 32-bit keys for a pack under 4 GiB (two passes).
    The keys travel with the order, so the sorted offsets cost no gather of their own.
    git/git's 841k entries: 19 ms, against 60 ms for ``argsort`` plus the gather."""
    keys = offsets.astype(np.uint32) if limit <= 1 << 32 else offsets
    word = keys.dtype.type
    order: np.ndarray | None = None
    shift = 0
    while True:
        digit = ((keys >> word(shift)) & word(0xFFFF)).astype(np.uint16)
        step = np.argsort(digit, kind="stable")
        order = step if order is None else order[step]
        keys = keys[step]
        shift += 16
        if not limit - 1 >> shift:
            return order.astype(np.uint32), keys


def _replaced(path: str) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, "replaced since it was listed", path)


class _LazyBaseRanks(Sequence[int]):
    """Base ranks of the entries asked for, each read from its header once."""

    def __init__(self, pack: PackFile) -> None:
        self._pack = pack
        self._known: dict[int, int] = {}

    def __getitem__(self, rank: int) -> int:  # type: ignore[override]
        base = self._known.get(rank)
        if base is None:
            base = self._known[rank] = self._pack.base_rank_at(rank)
        return base

    def __len__(self) -> int:
        return self._pack.count


def close_files(files: tuple[int, mmap.mmap]) -> None:
    """Close what :meth:`PackFile.detach` took away from a pack."""
    fd, idx = files
    os.close(fd)
    idx.close()


class Windows:
    """One request's aligned windows of the packs it reads entries from (``WINDOWS`` of
    ``WINDOW`` bytes at most, the oldest dropped first): many small entries, one read."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[tuple[int, int], bytes] = {}

    def get(self, pack: PackFile, at: int) -> bytes:
        key = (id(pack), at)  # the request leases its packs: ids stay theirs meanwhile
        win = self._held.get(key)
        if win is None:
            if len(self._held) >= WINDOWS:
                del self._held[next(iter(self._held))]
            win = self._held[key] = pack.read_raw(at, at + WINDOW)
        return win


class PackFile:
    """A ``pack-*.pack`` with its v2 ``.idx``. ``key`` identifies it across rescans:
    (pack directory, stem, idx inode, pack inode). The files opened must be the ones the
    listing named: a different inode (a repack replaced them since) raises
    FileNotFoundError, as a file already gone does (ARCHITECTURE.md I1).

    The :class:`~.registry.PackRegistry` owns its life: ``leases`` counts the requests
    that froze it; ``retired`` once its directory stopped listing it (then it is closed
    once no request holds it). Its files (the ``.pack`` descriptor and the ``.idx`` map)
    are opened on demand, by name and inode, and may be closed between two reads to stay
    within ``--max-open-packs``, leased or not, as C git closes pack descriptors past its
    limit: a request of a repository with thousands of packs then needs a few
    descriptors, not two per pack. Every read *pins* the files (:meth:`_pin`) for its
    duration, and a pinned pack is never closed: a descriptor number is never used after
    it was closed (it may name another file by then).

    A pin costs no lock (a read of an index entry is a microsecond; two locks per read
    made lookups twice as slow). It rests on what CPython's GIL makes atomic: a
    ``deque.append``/``pop`` and one attribute load or store. A reader appends its pin,
    *then* loads ``_files``; :meth:`detach` (under ``_io``) takes ``_files`` away only if
    no pin is there, and puts it back if a pin came meanwhile. Either the detacher sees
    the reader's pin, or the reader sees ``None`` and opens the files again under
    ``_io``."""

    HANDLES = 2  # the .pack descriptor and the .idx map

    def __init__(self, base: str, hash_len: int, key: tuple[object, ...],
                 verify: bool = True) -> None:
        self.base = base
        self.name = os.path.basename(base)
        self.hash_len = hash_len
        self.key = key
        self.leases = 0  # guarded by the registry's lock
        self.retired = False
        self._lock = threading.RLock()
        # Data computed from the files (name prefixes, reverse index, base ranks, bitmaps):
        # kept in ``extra`` while the cache below keeps it too (--cache-memory), which
        # tells the registry when to forget it; ``unkept`` is what the cache refused (too
        # large for it), forgotten once no request holds the pack.
        self.data_cache: ByteLRU[tuple[object]] | None = None
        self.unkept: set[str] = set()
        # ``verify`` is False for symlinked files, whose listed inode is the link's.
        self._want = (key[2], key[3]) if verify and len(key) == 4 else (None, None)
        # The open files, (pack descriptor, index map), or None: set and taken under
        # ``_io``; the reads in progress (one item each: see the class docstring), and
        # whether a caller holds the raw descriptor (``fd``: pinned until no lease is left).
        self._io = threading.Lock()
        self._pins: deque[None] = deque()
        self._raw = False
        self._files: tuple[int, mmap.mmap] | None = None
        # Told (outside ``_io``) when the files were opened again: the registry counts them;
        # asked to close what nobody reads when the process is out of descriptors.
        self.on_open: Callable[[PackFile], None] | None = None
        self.on_exhausted: Callable[[], None] | None = None
        self.reopened = 0
        self.pack_size = -1
        self._open_files()
        self._sorted_offsets: array | None = None
        self._pack_order: array | None = None
        self._rank_of: array | None = None
        self._prefixes: array | None = None
        self._bisections: int | None = None  # lookups left before the prefixes pay (find)
        self.extra: dict[str, object] = {}  # lazily computed per-pack data (bitmaps, ...)

    # -- open files --------------------------------------------------------------

    def _open_files(self) -> tuple[int, mmap.mmap]:
        """Map the index and open the pack (under ``_io``, or before anyone else sees this
        object), checking that both are the files the listing named; a reopen also checks
        that the pack has the size it had."""
        want_idx, want_pack = self._want
        idx = self._map_index(self.base + ".idx", want_idx)
        fd = -1
        try:
            fd = os.open(self.base + ".pack", os.O_RDONLY | os.O_CLOEXEC)
            st = os.fstat(fd)
            if want_pack is not None and st.st_ino != want_pack:
                raise _replaced(self.base + ".pack")
            if self.pack_size >= 0 and st.st_size != self.pack_size:
                raise _replaced(self.base + ".pack")
            self.pack_size = st.st_size
            self._checksum = idx[len(idx) - 2 * self.hash_len : len(idx) - self.hash_len]
            self._check_pack_header(fd)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            idx.close()
            raise
        self._files = (fd, idx)
        return fd, idx

    def _pin(self) -> tuple[int, mmap.mmap]:
        """Hold the files open for one read (opening them again if they were closed) and
        return them; :meth:`_unpin` after it, whatever happens. Opening may raise OSError
        (FileNotFoundError when the pack was replaced since it was listed)."""
        self._pins.append(None)  # first the pin, then the look (class docstring)
        files = self._files
        return files if files is not None else self._reopen()

    def _unpin(self) -> None:
        self._pins.pop()

    def _reopen(self) -> tuple[int, mmap.mmap]:
        """The files, opened again under ``_io`` (the caller's pin is in); out of
        descriptors, the registry is asked to close what nobody reads, once."""
        for attempt in (1, 2):
            try:
                with self._io:
                    held = self._files
                    if held is not None:
                        return held  # opened, or put back, meanwhile
                    files = self._open_files()
                    self.reopened += 1
                break
            except OSError as exc:
                if attempt == 2 or exc.errno not in (errno.EMFILE, errno.ENFILE) \
                        or self.on_exhausted is None:
                    raise
                self.on_exhausted()
        if self.on_open is not None:
            self.on_open(self)
        return files

    @contextmanager
    def pinned(self) -> Iterator[tuple[int, mmap.mmap]]:
        """The files held open for the block (:meth:`_pin`)."""
        try:
            yield self._pin()
        finally:
            self._unpin()

    @property
    def fd(self) -> int:
        """The ``.pack`` descriptor, for a caller that reads it itself (a whole pack sent
        as it is): the files then stay open until no request leases this pack any more
        (the registry calls :meth:`drop_raw`)."""
        with self.pinned():
            with self._io:
                self._raw = True
                files = self._files
                assert files is not None  # pinned: nobody took them away
                return files[0]

    def drop_raw(self) -> None:
        """No lease is left: nobody holds the raw descriptor any more."""
        with self._io:
            self._raw = False

    @property
    def handles(self) -> int:
        """Descriptors (and maps) held now: 2 while open, 0 once closed."""
        return self.HANDLES if self._files is not None else 0

    def detach(self) -> tuple[int, mmap.mmap] | None:
        """Close the files if nobody reads them now (never blocks: None when busy, pinned
        or closed already). Returns what to close, outside any lock (:func:`close_files`);
        the next read opens them again."""
        if not self._io.acquire(blocking=False):
            return None
        try:
            files = self._files
            if self._pins or self._raw or files is None:
                return None
            self._files = None
            if self._pins:  # a read pinned them meanwhile: it may hold them, put back
                self._files = files
                return None
        finally:
            self._io.release()
        return files

    # -- index ----------------------------------------------------------------

    def _map_index(self, path: str, inode: object = None) -> mmap.mmap:
        with open(path, "rb") as fh:
            if inode is not None and os.fstat(fh.fileno()).st_ino != inode:
                raise _replaced(path)
            idx = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
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

    def _check_pack_header(self, fd: int) -> None:
        """The pack must start with its header and end with the checksum its index
        records: a truncated or foreign pack is never served (two small reads, at each
        open)."""
        head = os.pread(fd, 12, 0)
        if head[:4] != b"PACK" or struct.unpack(">I", head[8:12])[0] != self.count:
            raise self.corrupt("header does not match its index")
        h = self.hash_len
        if self.pack_size < 12 + h or os.pread(fd, h, self.pack_size - h) != self._checksum:
            raise self.corrupt("trailer does not match its index (truncated?)")

    def corrupt(self, detail: str, suffix: str = ".pack") -> PackFormatError:
        """The error for a fault in this pack's ``suffix`` file: names the file, not its
        directory (the message may reach a client; the log adds the repository)."""
        name = self.name + suffix
        return PackFormatError(f"{name}: {detail}", pack=self.name + ".pack",
                               kind=suffix.lstrip("."))

    def close(self) -> None:
        """Release the descriptor and the map whoever holds them. Only the registry calls
        this, once no request holds a lease (``__del__`` is a last resort for packs opened
        outside one)."""
        with self._io:
            files, self._files = self._files, None
            self._raw = False
        if files is not None:
            close_files(files)

    @property
    def closed(self) -> bool:
        return self._files is None

    def files(self) -> tuple[tuple[str, object], ...]:
        """(path, inode) of the files this object holds open, for the registry's sweep."""
        idx_ino, pack_ino = (self.key[2], self.key[3]) if len(self.key) == 4 else (None, None)
        return ((self.base + ".idx", idx_ino), (self.base + ".pack", pack_ino))

    def __del__(self) -> None:
        try:
            self.close()
        except (OSError, AttributeError, ValueError):
            pass

    # -- derived data ------------------------------------------------------------

    def derived(self, kind: str, compute: Callable[[], tuple[Any, int]]) -> Any:
        """The data ``kind`` computed from this pack: from ``extra``, else from the shared
        cache (kept there by an earlier PackFile of the same key), else ``compute()``
        (value, cost in bytes), once."""
        if kind in self.extra:
            return self.extra[kind]
        cache = self.data_cache
        if cache is not None:
            hit = cache.get((self.key, kind))
            if hit is not None:
                self.extra[kind] = hit[0]
                return hit[0]
        with self._lock:
            if kind in self.extra:
                return self.extra[kind]
            value, cost = compute()
            self.extra[kind] = value
        if cache is None or not cache.put((self.key, kind), (value,), cost + 200):
            self.unkept.add(kind)
        return value

    def knows(self, kind: str) -> bool:
        """True when :meth:`derived` would answer ``kind`` without computing it."""
        if kind in self.extra:
            return True
        cache = self.data_cache
        return cache is not None and (self.key, kind) in cache

    def forget_derived(self, kind: str) -> None:
        """The cache let ``kind`` go: a later use computes it again (a request using it
        now keeps its own reference)."""
        self.extra.pop(kind, None)
        if kind == "prefixes":
            self._prefixes = None
        elif kind == "reverse":
            self._sorted_offsets = self._pack_order = self._rank_of = None

    def drop_unkept(self) -> None:
        for kind in list(self.unkept):
            self.forget_derived(kind)
        self.unkept.clear()

    def drop_derived(self) -> None:
        """Closed and kept only for its facts (registry ``pack_files``): its derived data
        is held by the shared cache alone, which may then let it go."""
        for kind in list(self.extra):
            self.forget_derived(kind)
        self.unkept.clear()
        self._bisections = None

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

    # -- reverse index ---------------------------------------------------------

    def _all_offsets(self) -> np.ndarray:
        """Every entry's offset in index order (numpy, no Python step per entry)."""
        n = self.count
        with self.pinned() as (_fd, idx):
            offs = np.frombuffer(idx[self._ofs_at : self._ofs_at + 4 * n],
                                 dtype=">u4").astype(np.uint64)
            tail = idx[self._large_at : len(idx) - 2 * self.hash_len]
        large = (offs & 0x80000000) != 0
        if large.any():
            table = np.frombuffer(tail, dtype=">u8")
            at = (offs[large] & 0x7FFFFFFF).astype(np.intp)
            if len(at) and int(at.max()) >= len(table):
                raise self.corrupt("large offset out of range", ".idx")
            offs[large] = table[at]
        return offs

    def _read_rev_file(self) -> np.ndarray | None:
        """pack-*.rev (git 2.31+): index positions in pack order, if present and sane: its
        size, the pack checksum it records and its own checksum are checked (it is read
        whole anyway); a damaged one is reported once and the offsets are sorted instead."""
        try:
            with open(self.base + ".rev", "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            report_unusable("rev", self.base + ".rev", self.key, exc, "sorting offsets instead")
            return None
        n, h = self.count, self.hash_len
        why = ""
        if data[:4] != b"RIDX" or len(data) != 12 + 4 * n + 2 * h:
            why = "bad header or size"
        elif data[12 + 4 * n : 12 + 4 * n + h] != self.pack_checksum():
            why = "does not belong to this pack"
        elif not trailer_matches(data, h):
            why = "checksum does not match its contents"
        if why:
            report_unusable("rev", self.base + ".rev", self.key, self.corrupt(why, ".rev"),
                            "sorting offsets instead")
            return None
        order = np.frombuffer(data, dtype=">u4", count=n, offset=12).astype(np.uint32)
        if n and int(order.max()) >= n:
            return None
        return order

    def _load_reverse(self) -> None:
        order, inverse, sorted_offsets = self.derived("reverse", self._compute_reverse)
        self._pack_order = order
        self._rank_of = inverse
        self._sorted_offsets = sorted_offsets

    def _compute_reverse(self) -> tuple[tuple[array, array, array], int]:
        """The reverse index from the .rev file, or sorted from the index's offsets (with
        numpy: a cold request must not pay a Python step per object; C git sorts too)."""
        offsets = self._all_offsets()
        order = self._read_rev_file()
        if order is None:
            order, in_order = _sort_positions(offsets, self.pack_size)
        else:
            in_order = offsets[order]
        n = self.count
        ends = np.empty(n + 1, dtype=np.uint64)
        ends[:n] = in_order
        ends[n] = self.pack_size - self.hash_len
        inverse = np.empty(n, dtype=np.uint32)
        inverse[order] = np.arange(n, dtype=np.uint32)
        # Kept as arrays: element access from Python is several times cheaper than numpy's.
        return (as_array("I", order), as_array("I", inverse), as_array("Q", ends)), 16 * n

    def rank_of_index_pos(self, pos: int) -> int:
        """Pack-order rank of the object at index position ``pos``."""
        rank_of = self._rank_of
        if rank_of is None:
            rank_of = self.derived("reverse", self._compute_reverse)[1]
            self._load_reverse()
        return rank_of[pos]  # type: ignore[no-any-return]

    @property
    def sorted_offsets(self) -> array:
        """Entry offsets in pack order, plus the trailer's offset as a sentinel."""
        offs = self._sorted_offsets
        if offs is None:
            offs = self.derived("reverse", self._compute_reverse)[2]
            self._load_reverse()
        return offs

    @property
    def pack_order(self) -> array:
        """``pack_order[i]`` is the index position of the i-th entry in pack order."""
        order = self._pack_order
        if order is None:
            order = self.derived("reverse", self._compute_reverse)[0]
            self._load_reverse()
        return order

    def base_ranks_for(self, selected: int) -> Sequence[int]:
        """Base ranks (as :meth:`base_ranks`) for an outgoing pack that copies ``selected``
        entries of this one: the whole table when it is known already or the selection is
        a large part of the pack (one sequential read of every header), else read entry by
        entry as asked (a fetch of a few objects must not parse the whole pack, cold)."""
        if "base_ranks" in self.extra or selected * 8 >= self.count:
            return self.base_ranks()  # type: ignore[no-any-return]
        cache = self.data_cache
        if cache is not None:
            hit = cache.get((self.key, "base_ranks"))
            if hit is not None:
                return hit[0]  # type: ignore[return-value]
        return _LazyBaseRanks(self)

    def base_rank_at(self, rank: int) -> int:
        """The base rank of one entry (see :meth:`base_ranks`), from its header."""
        offs = self.sorted_offsets
        hdr = self.read_header(offs[rank])
        if hdr.type_num == OFS_DELTA:
            assert hdr.base_offset is not None
            return bisect_left(offs, hdr.base_offset, 0, rank)
        return -1 if hdr.type_num == REF_DELTA else rank

    def base_ranks(self) -> array:
        """Per pack-order rank: the rank itself for whole objects, the base's rank for
        OFS_DELTA, -1 for REF_DELTA. Computed once per pack (one sequential read)."""
        ranks: array = self.derived("base_ranks", self._compute_base_ranks)
        return ranks

    def has_ref_deltas(self) -> bool:
        """True when an entry of this pack is a REF_DELTA (kept: one look at the base
        ranks per pack)."""
        found: bool = self.derived("ref_deltas", lambda: (
            bool((np.frombuffer(self.base_ranks(), dtype=np.int32) < 0).any()), 8))
        return found

    def _compute_base_ranks(self) -> tuple[array, int]:
        out = array("i", base_ranks_of(self).tobytes())  # one vector pass (packscan.py)
        return out, 4 * len(out)

    # -- entries ----------------------------------------------------------------

    def _pread(self, size: int, offset: int) -> bytes:
        """``size`` bytes of the pack at ``offset``, its files pinned meanwhile."""
        try:
            return os.pread(self._pin()[0], size, offset)
        finally:
            self._unpin()

    def read_into(self, view: memoryview, offset: int) -> int:
        """Read the pack at ``offset`` into ``view`` (one ``preadv``); bytes read."""
        try:
            return os.preadv(self._pin()[0], [view], offset)
        finally:
            self._unpin()

    def read_header(self, offset: int) -> EntryHeader:
        return self.parse_header(self._pread(_HEADER_READ, offset), offset)

    def parse_header(self, buf: bytes | memoryview, offset: int) -> EntryHeader:
        """:func:`parse_entry_header` of bytes read from this pack at ``offset``."""
        try:
            return parse_entry_header(buf, offset, self.hash_len)
        except PackFormatError as exc:
            raise self.corrupt(str(exc)) from None
        except IndexError:
            raise self.corrupt(f"truncated entry header at {offset}") from None

    def read_entry(self, offset: int, windows: Windows | None = None
                   ) -> tuple[EntryHeader, bytes | memoryview | None]:
        """The header of the entry at ``offset`` and, once the reverse index is known (it
        says where the entry ends) and the entry is small, the whole entry for
        :meth:`inflate_entry`: one read instead of a header read and a stream.

        With ``windows`` (one request's, see :class:`Windows`), the entry comes from an
        aligned window of the pack read once: walks read many small neighbouring
        entries (git writes all trees together), and a system call costs more than
        parsing an entry (docs/ARCHITECTURE.md, "Cold path")."""
        offs = self._sorted_offsets
        if offs is not None:
            count = self.count
            rank = bisect_left(offs, offset, 0, count)
            if rank < count and offs[rank] == offset:
                end = offs[rank + 1]
                buf: bytes | memoryview | None = None
                if windows is not None:
                    at = offset - offset % WINDOW
                    if end <= at + WINDOW:
                        buf = memoryview(windows.get(self, at))[offset - at : end - at]
                if buf is None and end - offset <= _WHOLE_READ:
                    buf = self._pread(end - offset, offset)
                if buf is not None:
                    return self.parse_header(buf, offset), buf
        return self.read_header(offset), None

    def inflate_entry(self, hdr: EntryHeader, buf: bytes | memoryview | None, offset: int
                      ) -> bytes:
        """:meth:`inflate`, from the bytes :meth:`read_entry` read when it did."""
        if buf is None:
            return self.inflate(hdr)
        try:
            out = zlib.decompress(memoryview(buf)[hdr.data_offset - offset :], bufsize=hdr.size or 1)
        except zlib.error as exc:
            raise self.corrupt(f"bad zlib data in entry at {hdr.data_offset}: {exc}") from None
        if len(out) != hdr.size:
            raise self.corrupt(f"bad entry size at {hdr.data_offset}")
        return out

    def read_raw(self, start: int, end: int) -> bytes:
        return self._pread(end - start, start)

    def inflate(self, hdr: EntryHeader) -> bytes:
        """Inflate the entry's zlib stream (the object, or the delta for deltas)."""
        with self.pinned() as (fd, _idx):
            return self._inflate(fd, hdr)

    def _inflate(self, fd: int, hdr: EntryHeader) -> bytes:
        want = hdr.size
        d = zlib.decompressobj()
        pos = hdr.data_offset
        chunk = max(512, want // 2 + 64)
        parts: list[bytes] = []
        got = 0
        while not d.eof:
            data = os.pread(fd, chunk, pos)
            if not data:
                raise self.corrupt(f"truncated entry at {hdr.data_offset}")
            pos += len(data)
            try:
                out = d.decompress(data, want - got + 1)
            except zlib.error as exc:
                raise self.corrupt(f"bad zlib data in entry at {hdr.data_offset}: {exc}") from None
            parts.append(out)
            got += len(out)
            chunk = max(chunk, 65536)
        result = b"".join(parts) if len(parts) != 1 else parts[0]
        if len(result) != want:
            raise self.corrupt(f"bad entry size at {hdr.data_offset}")
        return result
