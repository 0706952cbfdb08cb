"""One pack file and its index, cached for the life of the process.

Pack files never change; only the set of packs does (ARCHITECTURE.md I1). A
:class:`PackFile` keeps its ``.idx`` mapped (:mod:`.packindex`) and its ``.pack`` open,
reads its entries (:mod:`.packentry`), and computes the reverse index (:mod:`.revindex`)
and bitmaps lazily, once, as derived data kept within --cache-memory. It is safe to share
between threads.
"""

from __future__ import annotations

import errno
import os
import struct
import threading
import zlib
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from .faults import FaultCounts
from .fsops import READ_FLAGS
from .lru import ByteLRU, MemoryBudget
from .mapped import Mapped
from .packentry import EntryHeader, PackFormatError, encode_entry_header, parse_entry_header
from .packindex import PackIndex, replaced
from .revindex import ReverseIndex

__all__ = ["PackFile", "PackedLocation", "PackFormatError", "Windows", "EntryHeader",
           "parse_entry_header", "encode_entry_header", "close_files"]

_HEADER_READ = 64  # enough for any entry header: type/size varint + OFS varint or REF id
_WHOLE_READ = 1 << 20  # entries up to this size are read in one go (read_entry)
WINDOW = 1 << 16  # bytes of a pack read at once for a request's small entries (Windows)
WINDOWS = 64  # windows one request keeps: 4 MiB


class PackedLocation(NamedTuple):
    """Where a packed object is (a tuple: one is made per object read)."""

    pack: PackFile
    pos: int
    offset: int


def close_files(files: tuple[int, Mapped]) -> None:
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


class PackFile(PackIndex, ReverseIndex):
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
        # Set by the registry: the budget of its caches (decoded bitmaps, bitmaps.py) and
        # where unusable files are counted (a bad .rev, here).
        self.memory: MemoryBudget | None = None
        self.faults: FaultCounts | None = None
        self.unkept: set[str] = set()
        # ``verify`` is False for symlinked files, whose listed inode is the link's.
        self._want = (key[2], key[3]) if verify and len(key) == 4 else (None, None)
        # The open files, (pack descriptor, index map), or None: set and taken under
        # ``_io``; the reads in progress (one item each: see the class docstring), and
        # whether a caller holds the raw descriptor (``fd``: pinned until no lease is left).
        self._io = threading.Lock()
        self._pins: deque[None] = deque()
        self._raw = False
        self._files: tuple[int, Mapped] | None = None
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

    @property
    def checksum(self) -> bytes:
        """The pack's checksum, as its index names it (the pack's identity on disk)."""
        return self._checksum

    # -- open files --------------------------------------------------------------

    def _open_files(self) -> tuple[int, Mapped]:
        """Map the index and open the pack (under ``_io``, or before anyone else sees this
        object), checking that both are the files the listing named; a reopen also checks
        that the pack has the size it had."""
        want_idx, want_pack = self._want
        idx = self._map_index(self.base + ".idx", want_idx)
        fd = -1
        try:
            fd = os.open(self.base + ".pack", READ_FLAGS)
            st = os.fstat(fd)
            if want_pack is not None and st.st_ino != want_pack:
                raise replaced(self.base + ".pack")
            if self.pack_size >= 0 and st.st_size != self.pack_size:
                raise replaced(self.base + ".pack")
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

    def _pin(self) -> tuple[int, Mapped]:
        """Hold the files open for one read (opening them again if they were closed) and
        return them; :meth:`_unpin` after it, whatever happens. Opening may raise OSError
        (FileNotFoundError when the pack was replaced since it was listed)."""
        self._pins.append(None)  # first the pin, then the look (class docstring)
        files = self._files
        return files if files is not None else self._reopen()

    def _unpin(self) -> None:
        self._pins.pop()

    def _reopen(self) -> tuple[int, Mapped]:
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
    def pinned(self) -> Iterator[tuple[int, Mapped]]:
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

    def detach(self) -> tuple[int, Mapped] | None:
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
