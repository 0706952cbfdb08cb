"""The refs of a repository as one request sees them (ARCHITECTURE.md I2).

Everything is read through the process-wide :class:`DirCache`: the git directory's listing
(one stat) gives the inodes of ``HEAD`` and ``packed-refs``, whose contents and parse are
reused while the inodes stay the same; loose refs are found with one walk of ``refs/``
(one stat per directory while nothing changed). A whole snapshot is reused while the state
key (every listing it came from) is unchanged. With caching off, everything is re-read.
"""

from __future__ import annotations

import binascii
import os
import threading
import time
import weakref
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter

from gitspout.protocol.refs import HeadInfo, Ref, ref_is_hidden, ref_matches_prefixes

from .errors import StorageError
from .fscache import DirCache, Listing
from .fsops import FsOps
from .lru import MEMORY, ByteLRU, MemoryBudget

__all__ = ["RefSnapshot", "RefSegment", "RefCache", "read_ref_snapshot", "Peeler", "SEGMENT_REFS",
           "SEGMENT_BYTES", "PackedRefsError"]

Peeler = Callable[[bytes], bytes | None]
"""Given a hex object id, the hex id it peels to when it is a tag, else None."""

_MAX_SYMREF_DEPTH = 5


SEGMENT_BYTES = 32 << 10
"""Bytes of packed-refs lines per segment (about 500 refs): about 32 KiB of encoded
advertisement, the unit that one change re-encodes (and the size of one write)."""

SEGMENT_REFS = 512
"""Refs per segment when refs are cut by count (segments merged with loose refs)."""

_SEGMENT_OVERHEAD = 400  # a RefSegment beside its raw bytes: the object, first/last names


class RefSegment:
    """A run of refs sorted by name, shared by every snapshot where it is unchanged.

    The refs are held in packed-refs form, as one bytes object: ``raw`` is whole lines
    ``<oid> <name>\\n``, each followed by ``^<peeled>\\n`` when the ref peels (every peeled
    value is there, as in a fully-peeled file). A segment parsed from packed-refs holds the
    file's own bytes, so the next version of the file is diffed against it by memcmp.
    ``targets`` names the targets of symbolic (loose) refs in it; usually None. Ref objects
    are made only when asked for (:meth:`refs`): 1M of them cost 200 MB and seconds, the
    bytes 60 MB and nothing (docs/ARCHITECTURE.md, "Caches")."""

    __slots__ = ("raw", "targets", "first", "last", "plain", "hex_len", "checked", "__weakref__")

    def __init__(self, raw: bytes, hex_len: int,
                 targets: dict[bytes, bytes] | None = None, checked: bool = True) -> None:
        self.raw = raw
        self.hex_len = hex_len
        self.targets = targets or None
        # No peeled line (``^`` is in no valid ref name) and no symref: the v0 and the
        # ls-refs lines of these refs are the same bytes.
        self.plain = not self.targets and b"^" not in raw
        # Bytes read from packed-refs are checked (:func:`_check_lines`) the first time
        # they are split into lines: the split that encodes or decodes them anyway.
        self.checked = checked
        if raw:
            self.first = raw[hex_len + 1:raw.find(b"\n")]
            k = raw.rfind(b"\n", 0, len(raw) - 1) + 1
            if raw[k] == 0x5E:  # ^: the last ref is the line before
                k = raw.rfind(b"\n", 0, k - 1) + 1
            self.last = raw[k + hex_len + 1:raw.find(b"\n", k)]
        else:
            self.first = self.last = b""

    def lines(self) -> list[bytes]:
        """The lines of ``raw`` (without their newlines), checked the first time: a line
        that is no entry raises :class:`PackedRefsError`."""
        lines = self.raw.split(b"\n")
        lines.pop()
        if not self.checked:
            _check_lines(lines, self.hex_len, self.plain)
            self.checked = True
        return lines

    def refs(self) -> list[Ref]:
        """The refs, made now (not kept)."""
        h = self.hex_len
        lines = self.lines()
        if self.plain:
            return [Ref(ln[h + 1:], ln[:h]) for ln in lines]
        targets = self.targets or {}
        out: list[Ref] = []
        for ln in lines:
            if ln[:1] == b"^":
                r = out[-1]
                out[-1] = Ref(r.name, r.oid, ln[1:], r.symref_target)
            else:
                name = ln[h + 1:]
                out.append(Ref(name, ln[:h], None, targets.get(name)))
        return out

    def oids(self) -> Iterable[bytes]:
        """The (hex) object ids of the refs, in order (made at C speed when plain)."""
        h = self.hex_len
        if self.plain:
            return map(itemgetter(slice(0, h)), self.lines())
        return [ln[:h] for ln in self.lines() if ln[:1] != b"^"]

    def get(self, name: bytes) -> bytes | None:
        """The object id of ``name`` in this segment, or None."""
        if not self.checked:
            self.lines()
        raw, h = self.raw, self.hex_len
        i = raw.find(b" " + name + b"\n")
        # A ref line's first space is at hex_len: the line starts hex_len bytes before it.
        while i >= 0 and not (i == h or (i > h and raw[i - h - 1] == 0x0A)):
            i = raw.find(b" " + name + b"\n", i + 1)
        return None if i < 0 else raw[i - h:i]

    @property
    def nbytes(self) -> int:
        return len(self.raw) + _SEGMENT_OVERHEAD

    def __len__(self) -> int:
        return self.raw.count(b"\n") - self.raw.count(b"\n^")

    def __repr__(self) -> str:
        return f"RefSegment({len(self)} refs)"


def _segment_of_refs(refs: Sequence[Ref], hex_len: int) -> RefSegment:
    parts: list[bytes] = []
    targets: dict[bytes, bytes] = {}
    for r in refs:
        parts.append(r.oid + b" " + r.name + b"\n")
        if r.peeled is not None:
            parts.append(b"^" + r.peeled + b"\n")
        if r.symref_target is not None:
            targets[r.name] = r.symref_target
    return RefSegment(b"".join(parts), hex_len, targets)


_EMPTY_SEGMENT = RefSegment(b"", 40)


class PackedRefsError(StorageError):
    """packed-refs holds a line that is no entry (C git dies on it too)."""

    what = "corrupt packed-refs"
    kind = "packed-refs"


def _check_lines(lines: list[bytes], hex_len: int, plain: bool) -> None:
    """Raise :class:`PackedRefsError` unless ``lines`` are entries: ``<hex id> <name>``,
    each optionally followed by ``^<hex id>`` (C git dies on anything else too). Without
    peeled lines, at C speed: the ids joined and unhexlified, the byte after each."""
    h1 = hex_len + 1
    bad = not lines
    if plain and not bad:
        try:
            binascii.unhexlify(b"".join(map(itemgetter(slice(0, hex_len)), lines)))
            bad = bytes(map(itemgetter(hex_len), lines)) != b" " * len(lines) or \
                min(map(len, lines)) <= h1
        except (binascii.Error, IndexError):
            bad = True
    elif not bad:
        after_ref = False
        for ln in lines:
            if ln[:1] == b"^":
                bad = not after_ref or len(ln) != h1 or not _is_hex(ln[1:])
                after_ref = False
            else:
                bad = ln[hex_len:h1] != b" " or len(ln) <= h1 or not _is_hex(ln[:hex_len])
                after_ref = True
            if bad:
                break
    if bad:
        after_ref = False
        for ln in lines:  # name the first bad line (a few words of it)
            if ln[:1] == b"^" and after_ref and len(ln) == h1 and _is_hex(ln[1:]):
                after_ref = False
                continue
            after_ref = ln[hex_len:h1] == b" " and _is_hex(ln[:hex_len]) and len(ln) > h1
            if not after_ref:
                raise PackedRefsError(f"packed-refs: unexpected line {ln[:80]!r}")
        raise PackedRefsError("packed-refs: no entries where entries should be")


def _is_hex(b: bytes) -> bool:
    try:
        binascii.unhexlify(b)
    except binascii.Error:
        return False
    return True


def _cut(data: bytes, lo: int, hi: int, hex_len: int) -> list[RefSegment]:
    """``data[lo:hi]`` (whole lines) in segments of about :data:`SEGMENT_BYTES` (checked
    when first split: :meth:`RefSegment.lines`). A peeled line stays with its ref."""
    out: list[RefSegment] = []
    pos = lo
    while pos < hi:
        end = hi if hi - pos <= SEGMENT_BYTES * 3 // 2 else data.find(b"\n", pos + SEGMENT_BYTES)
        if end < 0 or end >= hi - 1:
            end = hi
        else:
            end += 1
            while data.startswith(b"^", end) and end < hi:
                nl = data.find(b"\n", end)
                end = hi if nl < 0 or nl >= hi else nl + 1
        out.append(RefSegment(data[pos:end], hex_len, checked=False))
        pos = end
    return out


BLOCK = 1 << 20  # bytes of packed-refs read at a time


class _File:
    """packed-refs read by blocks (``pread``), so that neither a parse nor a diff holds
    the whole file beside its segments (60 MB more at 1M refs)."""

    def __init__(self, fd: int, fs: FsOps) -> None:
        self.fd, self.fs = fd, fs
        self.size = os.lseek(fd, 0, os.SEEK_END)

    @staticmethod
    def of(data: bytes | _File) -> _File | _Bytes:
        return _Bytes(data) if isinstance(data, bytes) else data

    def read(self, off: int, n: int) -> bytes:
        if n <= 0:
            return b""
        parts: list[bytes] = []
        while n > 0:
            self.fs.note("read")
            part = os.pread(self.fd, min(n, 1 << 24), off)
            if not part:
                raise PackedRefsError("packed-refs: shrank while it was read")
            parts.append(part)
            off += len(part)
            n -= len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)


class _Bytes:
    """A file's bytes already in memory, read as :class:`_File` is."""

    def __init__(self, data: bytes) -> None:
        self.data, self.size = data, len(data)

    def read(self, off: int, n: int) -> bytes:
        return self.data[off:off + n]


def _cut_file(f: _File | _Bytes, lo: int, hi: int, hex_len: int) -> list[RefSegment]:
    """:func:`_cut` of the file's bytes ``lo``..``hi`` (whole lines), a block at a time."""
    out: list[RefSegment] = []
    pos, want = lo, BLOCK
    while pos < hi:
        block = f.read(pos, min(want, hi - pos))
        k = len(block)
        if pos + k < hi:
            # Whole entries only: up to a line start that is not a peeled line.
            k = block.rfind(b"\n", 0, k - 1) + 1
            while k > 0 and block[k] == 0x5E:
                k = block.rfind(b"\n", 0, k - 1) + 1
            if k == 0:  # one entry longer than the block
                want *= 2
                continue
        out.extend(_cut(block, 0, k, hex_len))
        pos += k
    return out


@dataclass(frozen=True)
class _PackedRefs:
    """A parsed packed-refs file, in segments of about :data:`SEGMENT_BYTES`.

    When ``diffable``, the segments' bytes are the file's, in order after its header: the
    next version of the file is diffed against them (:func:`_reparse_packed_refs`), and
    the whole file is not kept besides them."""

    header: bytes
    fully_peeled: bool
    segments: list[RefSegment]
    diffable: bool = True
    firsts: list[bytes] = field(default_factory=list)  # first name of each segment

    def __post_init__(self) -> None:
        self.firsts[:] = [s.first for s in self.segments]

    def segment_of(self, name: bytes) -> int:
        """The index of the segment whose name range holds ``name`` (the first one for
        names before every segment)."""
        return max(0, bisect_right(self.firsts, name) - 1)

    def get(self, name: bytes) -> bytes | None:
        """The object id of a packed name, or None."""
        if not self.segments:
            return None
        return self.segments[self.segment_of(name)].get(name)

    @property
    def nbytes(self) -> int:
        """What it holds (for --cache-memory)."""
        return len(self.header) + sum(s.nbytes + 80 for s in self.segments) + 200

    def __len__(self) -> int:
        return sum(len(s) for s in self.segments)


_NO_PACKED = _PackedRefs(b"", True, [])


# Budgets, per repository, of the caches below (docs/ARCHITECTURE.md, "Caches").
PACKED_ENTRIES = 1  # the packed-refs file as it is now
SNAPSHOT_ENTRIES = 8  # ref states (all refs, or those under some prefixes)
ENCODED_ENTRIES = 8  # encoded answers: advertisements and ls-refs, by kind and ref state
MERGED_ENTRIES = 1024  # segments of packed refs with loose refs in their range
ENCODINGS_BYTES = 1 << 40  # per-segment encodings: bounded by --cache-memory alone
TIPS_ENTRIES = 4  # sets of visible tips (binary ids), by ref state and hideRefs
TIP_BYTES = 90  # one id in such a set: the bytes object and its slot


class RefCache:
    """Cross-request ref state of one repository (shared by threads).

    Everything it holds counts against --cache-memory: the caches below as ByteLRUs, and
    the last packed-refs parse (which the next version of the file is diffed against, so
    it is not evicted while the repository is kept) by a charge of its size."""

    def __init__(self, parent: MemoryBudget | None = MEMORY) -> None:
        # (packed-refs inode, git dir listing key) -> parsed packed-refs (the same object
        # as ``last_packed``: counted there)
        self.packed: ByteLRU[_PackedRefs] = ByteLRU("packed_refs", PACKED_ENTRIES,
                                                    unit="entries", parent=parent)
        # state key (every listing read) -> snapshot
        self.snapshots: ByteLRU[RefSnapshot] = ByteLRU("ref_snapshots", SNAPSHOT_ENTRIES,
                                                       unit="entries", parent=parent)
        # (kind, ref state, config key) -> the answer's 32 KiB chunks (small answers only)
        self.encoded: ByteLRU[list[bytes]] = ByteLRU("advertisements", ENCODED_ENTRIES,
                                                     unit="entries", parent=parent)
        # (packed segment, loose refs in its range) -> the segments of both merged
        self.merged: ByteLRU[tuple[RefSegment, ...]] = ByteLRU(
            "merged_segments", MERGED_ENTRIES, unit="entries", parent=parent)
        # (segment, what the encoding depends on) -> the segment's encoded pkt-lines
        self.encodings: ByteLRU[bytes] = ByteLRU("ref_encodings", ENCODINGS_BYTES,
                                                 parent=parent)
        # (ref state, hideRefs) -> the binary ids of the visible refs and HEAD
        self.tips: ByteLRU[frozenset[bytes]] = ByteLRU("ref_tips", TIPS_ENTRIES,
                                                       unit="entries", parent=parent)
        # the same key -> those tips the object store was seen to hold (filled by the want
        # check, core/fetch.py): a ref protects its object from pruning, so under this ref
        # state they are there still, and a mirror clone's thousands of wants skip their
        # index lookups
        self.present: ByteLRU[set[bytes]] = ByteLRU("ref_tips_present", TIPS_ENTRIES,
                                                    unit="entries", parent=parent)
        self._parent = parent
        self._lock = threading.Lock()
        self._charged = 0
        self.last_packed: _LastPacked | None = None
        # prefixes -> the read of them in progress (see shared_read); gone when it ends
        self._reads: dict[tuple[bytes, ...], _SharedRead] = {}
        # prefixes -> when the newest finished read of them started, and a weak reference
        # to its snapshot (alive while a request or the snapshots cache holds it)
        self._last: dict[tuple[bytes, ...], tuple[int, weakref.ref[RefSnapshot]]] = {}

    def shared_read(self, prefixes: tuple[bytes, ...], arrived: int,
                    read: Callable[[], RefSnapshot]) -> RefSnapshot:
        """``read()``, or the result of a read of the same prefixes, or of every ref, that
        another request started after ``arrived`` (this request's start,
        ``time.monotonic_ns()``).

        A read that started after the request did sees every ref change the request could
        have been told of, just as its own would: the answer is as fresh. So concurrent
        requests share reads. One that finds a read in progress that began before it
        arrived waits for it to end, and then joins, or starts, the next one. A storm of
        clones then reads the refs (1,626 directories stat'ed in a mirror of dulwich with
        loose refs) a few times, not twice per clone: an ls-refs with prefixes also takes
        a fetch's read of every ref. A request that waited in the pool's queue (which runs
        a few jobs of one repository at a time) while a read began takes its snapshot if
        that is still alive: finished reads are held by weak reference only. It may wait:
        call it from the pool, as every ref read is, never from the event loop."""
        for key in ((), prefixes) if prefixes else ((),):
            snap = self._fresh(key, arrived)
            if snap is not None:
                return snap
        mine: _SharedRead | None = None
        for _ in range(_SHARED_ROUNDS):
            with self._lock:
                cur = self._reads.get(prefixes)
                if cur is None:
                    mine = self._reads[prefixes] = _SharedRead(time.monotonic_ns())
                    break
            if not cur.done.wait(_SHARED_WAIT):
                break
            if cur.started >= arrived and cur.snap is not None:
                return cur.snap
        if mine is None:
            return read()
        try:
            mine.snap = read()
            return mine.snap
        finally:
            with self._lock:
                del self._reads[prefixes]
                if mine.snap is not None:
                    self._remember(prefixes, mine.started, mine.snap)
            mine.done.set()

    def _fresh(self, key: tuple[bytes, ...], arrived: int) -> RefSnapshot | None:
        """The snapshot of a read of ``key`` begun after ``arrived``: finished and still
        alive, or in progress (waited for); None when there is none."""
        with self._lock:
            last = self._last.get(key)
            cur = self._reads.get(key)
        if last is not None and last[0] >= arrived:
            snap = last[1]()
            if snap is not None:
                return snap
        if cur is not None and cur.started >= arrived and cur.done.wait(_SHARED_WAIT):
            return cur.snap
        return None

    def _remember(self, prefixes: tuple[bytes, ...], started: int, snap: RefSnapshot) -> None:
        """Note a finished read (under the lock), keeping a few keys."""
        last = self._last.get(prefixes)
        if last is None or last[0] < started:
            self._last[prefixes] = (started, weakref.ref(snap))
        if len(self._last) > _SHARED_KEYS:
            for key, (_, ref) in list(self._last.items()):
                if ref() is None:
                    del self._last[key]
            while len(self._last) > _SHARED_KEYS:
                del self._last[min(self._last, key=lambda k: self._last[k][0])]

    def keep_packed(self, last: _LastPacked | None) -> None:
        """Hold ``last`` as the parse to diff against, counted in the budget."""
        size = 0 if last is None else last.parsed.nbytes
        with self._lock:
            self.last_packed = last
            delta, self._charged = size - self._charged, size
        if self._parent is not None and delta:
            self._parent.charge(delta)

    def __del__(self) -> None:
        parent: MemoryBudget | None = getattr(self, "_parent", None)
        charged: int = getattr(self, "_charged", 0)
        if parent is not None and charged:
            parent._gone.append(charged)  # as ByteLRU.__del__: no lock here


_SHARED_ROUNDS = 3  # reads waited for before a request reads on its own
_SHARED_WAIT = 30.0  # seconds one wait may take (a read of 1M refs on slow NFS)
_SHARED_KEYS = 16  # prefix sets whose last read is remembered (ls-refs of clones, fetches)


class _SharedRead:
    """A ref read in progress that later requests may wait for (RefCache.shared_read)."""

    __slots__ = ("started", "done", "snap")

    def __init__(self, started: int) -> None:
        self.started = started
        self.done = threading.Event()
        self.snap: RefSnapshot | None = None


@dataclass(frozen=True, slots=True)
class _LastPacked:
    hex_len: int
    parsed: _PackedRefs
    key: tuple[object, ...]  # of the packed cache


@dataclass(frozen=True)
class RefSnapshot:
    """HEAD plus every ref (sorted bytewise, symrefs resolved) at one moment.

    ``state`` identifies what it was read from; equal states mean equal snapshots. The refs
    are held in ``segments`` (:class:`RefSegment`, shared with the snapshots before it
    where nothing changed); ``refs`` makes Ref objects of all of them when asked for.
    """

    head: HeadInfo
    segments: tuple[RefSegment, ...]
    hex_len: int
    state: tuple[object, ...] = ()
    complete: bool = True  # False when only some ref prefixes were read
    cacheable: bool = False  # every listing it came from was trusted (not racy)
    # With prefixes, the segments may hold refs outside them too (whole packed segments
    # are shared): ``refs`` leaves those out, and so must whoever reads ``segments``.
    prefixes: tuple[bytes, ...] = ()

    @property
    def refs(self) -> tuple[Ref, ...]:
        """Every ref as a Ref (made now, not kept: at 1M refs, seconds and 200 MB)."""
        return tuple(self.select(self.prefixes))

    def select(self, prefixes: Sequence[bytes]) -> list[Ref]:
        """The refs under ``prefixes`` (all when empty), decoding only the segments
        whose name ranges can hold them."""
        out: list[Ref] = []
        for seg in self.segments:
            if prefixes and not any(_may_hold(seg, p) for p in prefixes):
                continue
            refs = seg.refs()
            if prefixes:
                refs = [r for r in refs if ref_matches_prefixes(r.name, prefixes)]
            out.extend(refs)
        if self.prefixes and prefixes != self.prefixes:
            out = [r for r in out if ref_matches_prefixes(r.name, self.prefixes)]
        return out

    def get(self, name: bytes) -> Ref | None:
        """The ref called ``name``, or None."""
        if self.prefixes and not ref_matches_prefixes(name, self.prefixes):
            return None
        for seg in self.segments:
            if seg.first <= name <= seg.last and seg.get(name) is not None:
                return next(r for r in seg.refs() if r.name == name)
        return None

    def visible(self, hide: Iterable[bytes]) -> tuple[HeadInfo | None, list[Ref]]:
        """HEAD (None when hidden) and the refs hideRefs leaves visible."""
        patterns = list(hide)
        if not patterns:
            return self.head, list(self.refs)
        head = None if ref_is_hidden(b"HEAD", patterns) else self.head
        return head, [r for r in self.refs if not ref_is_hidden(r.name, patterns)]

    def visible_oids(self, hide: Iterable[bytes]) -> set[bytes]:
        """The distinct hex ids of the refs hideRefs leaves visible (HEAD not included),
        without making Ref objects where nothing is hidden (many refs share an id: 100k
        branches of a mirror may name a few hundred commits)."""
        patterns = list(hide)
        if patterns or self.prefixes:
            return {r.oid for r in self.visible(patterns)[1]}
        out: set[bytes] = set()
        for seg in self.segments:
            out.update(seg.oids())
        return out


def _may_hold(seg: RefSegment, prefix: bytes) -> bool:
    """Can a name starting with ``prefix`` lie in the segment's name range?"""
    return seg.first[:len(prefix)] <= prefix <= seg.last[:len(prefix)]


def _header_end(data: bytes) -> tuple[int, bool, bool]:
    """Where the entries of packed-refs start (after its ``#`` header line), whether the
    header declares the file fully peeled, and whether it declares it sorted."""
    if not data.startswith(b"#"):
        return 0, False, False
    nl = data.find(b"\n")
    end = len(data) if nl < 0 else nl + 1
    line = data[:end]
    traits = line.split(b":", 1)[1].rstrip(b"\n") + b" " \
        if line.startswith(b"# pack-refs with:") else b""
    return end, b" fully-peeled " in traits, b" sorted " in traits


def _read_header(f: _File | _Bytes) -> tuple[bytes, bool, bool]:
    head = f.read(0, min(f.size, 4096))
    end, fully, is_sorted = _header_end(head)
    if f.size and f.read(f.size - 1, 1) != b"\n":
        raise PackedRefsError("packed-refs: unterminated line")
    return head[:end], fully, is_sorted


def _parse_packed_refs(data: bytes | _File, hex_len: int, peel: Peeler) -> _PackedRefs:
    if isinstance(data, bytes):
        header_end, fully, is_sorted = _header_end(data)
        if data and not data.endswith(b"\n"):
            raise PackedRefsError("packed-refs: unterminated line")
        header = data[:header_end]
        segs = _cut(data, header_end, len(data), hex_len)
    else:
        header, fully, is_sorted = _read_header(data)
        segs = _cut_file(data, len(header), data.size, hex_len)
    if fully and (is_sorted and _in_order(segs) or _sorted_refs(segs)):
        return _PackedRefs(header, fully, segs)
    # Not as git writes it (hand-edited, not fully peeled, or from a very old git): sort
    # by name, keep the last of duplicate names, peel what the file does not, and diff
    # nothing against it.
    by_name: dict[bytes, Ref] = {}
    for seg in segs:
        for r in seg.refs():
            by_name[r.name] = r
    refs = [by_name[n] for n in sorted(by_name)]
    if not fully:
        refs = [r if r.peeled is not None else Ref(r.name, r.oid, peel(r.oid)) for r in refs]
    return _PackedRefs(header, fully, list(_chunked(refs, hex_len)), diffable=False)


def _in_order(segs: Sequence[RefSegment]) -> bool:
    """Segments follow each other by name (their insides are as the file says: sorted)."""
    return all(a.last < b.first for a, b in zip(segs, segs[1:], strict=False))


def _sorted_refs(segs: Sequence[RefSegment]) -> bool:
    names = [r.name for s in segs for r in s.refs()]
    return all(a < b for a, b in zip(names, names[1:], strict=False))


def _reparse_packed_refs(old: _PackedRefs, data: bytes | _File, hex_len: int,
                         peel: Peeler) -> _PackedRefs:
    """The parse of ``data``, a new version of the packed-refs ``old`` was parsed from.

    Old segments found unchanged at the start of the new file, one after the other, and
    at its end, are reused (the same objects, with their encodings); the bytes between
    are parsed again. A rewrite by ``git pack-refs`` or a deletion costs a memcmp of the
    file against the old segments (read a block at a time) and the parse of those around
    the change, not a parse of every line; the old file is not kept for this, only its
    segments, and the new one is not read whole."""
    f = _File.of(data)
    if not old.diffable or f.size < len(old.header) or \
            f.read(0, len(old.header)) != old.header or \
            _header_end(f.read(0, min(f.size, len(old.header) + 1)))[0] != len(old.header):
        return _parse_packed_refs(data, hex_len, peel)
    if f.size and f.read(f.size - 1, 1) != b"\n":
        raise PackedRefsError("packed-refs: unterminated line")
    segs = old.segments
    # The common start: segments equal to the next bytes, from a block.
    pos, i = len(old.header), 0
    lo, block = pos, b""
    while i < len(segs):
        raw = segs[i].raw
        if pos + len(raw) > f.size:
            break
        if pos + len(raw) > lo + len(block):
            lo, block = pos, f.read(pos, min(f.size - pos, max(BLOCK, len(raw))))
        if not block.startswith(raw, pos - lo):
            break
        pos += len(raw)
        i += 1
    if i == len(segs) and pos == f.size:
        return old
    # The common end, from blocks ending where the last reused segment starts.
    end, j = f.size, len(segs)
    lo, block = end, b""
    while j > i:
        raw = segs[j - 1].raw
        start = end - len(raw)
        if start < pos:
            break
        # A reused segment starts at a line of the new file: at ``pos``, or after a
        # newline (else the bytes before it end in the middle of a line).
        first = start - 1 if start > pos else start
        if first < lo:
            lo = max(pos, min(first, end - BLOCK))
            block = f.read(lo, end - lo)
        if not block.endswith(raw, 0, end - lo) or \
                (start > pos and block[start - 1 - lo] != 0x0A):
            break
        end = start
        j -= 1
    del block
    middle = _cut_file(f, pos, end, hex_len)
    out = segs[:i] + middle + segs[j:]
    k0, k1 = max(0, i - 1), min(len(out), i + len(middle) + 1)
    if not _in_order(out[k0:k1]):
        return _parse_packed_refs(data, hex_len, peel)
    return _PackedRefs(old.header, old.fully_peeled, out)


def _valid_component(name: str) -> bool:
    return bool(name) and not name.startswith(".") and not name.endswith(".lock")


@dataclass
class _Reader:
    gitdir: str
    fs: FsOps
    dirs: DirCache
    cache: RefCache
    hex_len: int
    state: list[tuple[str, object]] = field(default_factory=list)
    trusted: bool = True  # every listing in ``state`` was trusted (not racy)

    def saw(self, prefix: str, listing: Listing) -> None:
        """Add a listing the snapshot depends on to its state key."""
        self.state.append((prefix, listing.key))
        self.trusted = self.trusted and listing.trusted

    def packed(self, top: Listing, peel: Peeler) -> _PackedRefs:
        entry = top.names().get("packed-refs")
        if entry is None and top.trusted:
            return _NO_PACKED
        # An untrusted (racy) listing may be the one this request took before it walked
        # the loose refs (fs.racy): packed-refs is then opened by path all the same, after
        # them, and compared by content with the last parse (never taken from the cache,
        # whose keys are trusted listings).
        key = (entry[1] if entry is not None else None, top.key)
        cached = self.cache.packed.get(key) if self.dirs.enabled and top.trusted else None
        if cached is not None:
            return cached
        # Not through the small-file cache: the parse keeps these bytes (the next version
        # is diffed against them), and that cache would keep a second copy of every
        # version of a file of 60 MB at 1M refs.
        self.dirs.check_links(self.fs, self.gitdir, top, ("packed-refs",))
        fd = self.fs.open_or_none(os.path.join(self.gitdir, "packed-refs"))
        if fd is None:
            return _NO_PACKED
        last = self.cache.last_packed if self.dirs.enabled else None
        try:
            f = _File(fd, self.fs)
            # A small file in one read; a large one by blocks (see _File).
            data: bytes | _File = f.read(0, f.size) if f.size <= BLOCK else f
            if last is not None and last.hex_len == self.hex_len:
                # Validated by content: whatever the listing's stat says (racy or not),
                # the file is compared with the last parse's segments.
                parsed = _reparse_packed_refs(last.parsed, data, self.hex_len, peel)
            else:
                parsed = _parse_packed_refs(data, self.hex_len, peel)
        finally:
            os.close(fd)
        if self.dirs.enabled:
            if last is not None and last.key != key:
                # One parse held at a time: the trusted entry of an older version would
                # keep its segments (60 MB at 1M refs) until the next trusted listing.
                self.cache.packed.pop(last.key)
            # Counted in --cache-memory as the last parse; the packed entry is the same
            # object and costs its key.
            self.cache.keep_packed(_LastPacked(self.hex_len, parsed, key))
            if top.trusted:
                self.cache.packed.put(key, parsed, nbytes=200)
        return parsed

    def _wanted(self, dirname: str, prefixes: Sequence[bytes]) -> bool:
        """Can refs under ``dirname/`` match one of the prefixes (or contain a prefix)?"""
        if not prefixes:
            return True
        d = dirname.encode("utf-8", "surrogateescape") + b"/"
        return any(p.startswith(d) or d.startswith(p) for p in prefixes)

    def loose(self, prefixes: Sequence[bytes]) -> dict[bytes, bytes]:
        """Raw contents of the loose ref files under ``refs/`` whose names start with one of
        ``prefixes`` (all of them when there are none), by ref name.

        Directories are walked when a prefix can reach into them; files are kept only when
        their whole name matches, since a prefix need not end at a ``/`` (``refs/heads/ma``
        matches ``refs/heads/main`` but not ``refs/heads/next``)."""
        out: dict[bytes, bytes] = {}
        stack = ["refs"]
        while stack:
            prefix = stack.pop()
            path = os.path.join(self.gitdir, prefix)
            listing = self.dirs.listing(self.fs, path)
            if listing is None:
                continue
            self.saw(prefix, listing)
            if self._whole(prefix, prefixes):
                # Every ref below matches: this directory's refs as the last request read
                # them, while its listing holds (the same validity as DirCache.file's).
                known = self._directory(prefix, path, listing)
                if known is not None:
                    subdirs, refs = known
                    stack.extend(subdirs)
                    out.update(refs)
                    continue
            for name, _ino, is_dir in listing.entries:
                if not _valid_component(name):
                    continue
                full = prefix + "/" + name
                if is_dir:
                    if self._wanted(full, prefixes):
                        stack.append(full)
                    continue
                ref = full.encode("utf-8", "surrogateescape")
                if not ref_matches_prefixes(ref, prefixes):
                    continue
                data = self.dirs.file(self.fs, os.path.join(self.gitdir, full), listing)
                if data is not None:
                    out[ref] = data.strip()
        return out

    @staticmethod
    def _whole(dirname: str, prefixes: Sequence[bytes]) -> bool:
        """Does every ref under ``dirname/`` match one of the prefixes?"""
        if not prefixes:
            return True
        d = dirname.encode("utf-8", "surrogateescape") + b"/"
        return any(d.startswith(p) for p in prefixes)

    def _directory(self, prefix: str, path: str, listing: Listing
                   ) -> tuple[tuple[str, ...], tuple[tuple[bytes, bytes], ...]] | None:
        """The subdirectories and the loose refs (name, stripped content) of one directory,
        all of them, kept on its listing while that holds. None when they cannot be kept:
        a racy listing, a symlink among the entries (the guard looks at it every time), a
        file gone since the listing, or the caches off."""
        if not (listing.trusted and self.dirs.enabled) or listing.links:
            return None
        known = listing.derived.get("loose-refs")
        if known is None:
            subdirs: list[str] = []
            refs: list[tuple[bytes, bytes]] = []
            for name, _ino, is_dir in listing.entries:
                if not _valid_component(name):
                    continue
                full = prefix + "/" + name
                if is_dir:
                    subdirs.append(full)
                    continue
                data = self.dirs.file(self.fs, os.path.join(path, name), listing)
                if data is None:
                    return None
                refs.append((full.encode("utf-8", "surrogateescape"), data.strip()))
            known = listing.derived["loose-refs"] = (tuple(subdirs), tuple(refs))
        return known  # type: ignore[return-value]

    def symref_targets(self, starts: Iterable[bytes], loose: dict[bytes, bytes],
                       prefixes: Sequence[bytes]) -> dict[bytes, bytes]:
        """Loose refs that symrefs point to outside ``prefixes``, followed to the end.

        A prefix-limited walk does not read them, yet a symref it did read (``HEAD``,
        ``refs/remotes/origin/HEAD``) must resolve to the loose value, which wins over a
        packed one. Only the directories on the way to each target are listed (and join the
        state key), so this costs nothing when every target is under the prefixes."""
        found: dict[bytes, bytes] = {}
        pending = [t for t in starts if not ref_matches_prefixes(t, prefixes)]
        for _ in range(_MAX_SYMREF_DEPTH):
            pending = [t for t in dict.fromkeys(pending) if t not in found and t not in loose]
            if not pending:
                break
            read = self.loose(pending)
            nxt: list[bytes] = []
            for target in pending:
                content = read.get(target)
                if content is None:
                    continue
                found[target] = content
                if content.startswith(b"ref:"):
                    nxt.append(content[4:].strip())
            pending = [t for t in nxt if not ref_matches_prefixes(t, prefixes)]
        return found


def _resolve(
    name: bytes, loose: dict[bytes, bytes], packed: _PackedRefs, hex_len: int
) -> tuple[bytes | None, bytes | None]:
    """Follow symrefs: (object id or None when unborn/broken, immediate symref target)."""
    target: bytes | None = None
    current = name
    for depth in range(_MAX_SYMREF_DEPTH):
        content = loose.get(current)
        if content is None:
            return packed.get(current), target
        if content.startswith(b"ref:"):
            current = content[4:].strip()
            if depth == 0:
                target = current
            continue
        return (content if len(content) == hex_len else None), target
    return None, target


def _read_head(raw: bytes, loose: dict[bytes, bytes], packed: _PackedRefs, hex_len: int) -> HeadInfo:
    if raw.startswith(b"ref:"):
        target = raw[4:].strip()
        oid, _ = _resolve(target, loose, packed, hex_len)
        return HeadInfo(target, oid)
    if len(raw) == hex_len:
        return HeadInfo(None, raw)
    return HeadInfo(None, None)


def _loose_refs(loose: dict[bytes, bytes], every: dict[bytes, bytes], packed: _PackedRefs,
                hex_len: int, peel: Peeler) -> dict[bytes, Ref | None]:
    """Each loose ref resolved (None: it hides nothing and shows nothing, as a broken or
    dangling one does; a packed value of the same name is shadowed all the same)."""
    out: dict[bytes, Ref | None] = {}
    for name in loose:
        oid, target = _resolve(name, every, packed, hex_len)
        out[name] = None if oid is None else Ref(name, oid, peel(oid), target)
    return out


def _chunked(refs: Sequence[Ref], hex_len: int) -> tuple[RefSegment, ...]:
    if len(refs) <= 2 * SEGMENT_REFS:
        return (_segment_of_refs(refs, hex_len),)
    return tuple(_segment_of_refs(refs[i:i + SEGMENT_REFS], hex_len)
                 for i in range(0, len(refs), SEGMENT_REFS))


def _merge(base: Sequence[Ref], loose: Sequence[tuple[bytes, Ref | None]]) -> list[Ref]:
    """Packed refs with the loose ones of their range: loose names win, sorted by name."""
    shadowed = {name for name, _ in loose}
    out = [r for r in base if r.name not in shadowed]
    out.extend(r for _, r in loose if r is not None)
    out.sort(key=lambda r: r.name)
    return out


def _covering(packed: _PackedRefs, prefixes: Sequence[bytes]) -> set[int] | None:
    """The segments whose name ranges hold names starting with one of ``prefixes`` (a
    prefix's names are one interval: from it to it followed by 0xff, which no ref name
    holds since they are UTF-8)."""
    if not packed.segments:
        return None
    out: set[int] = set()
    for p in prefixes:
        out.update(range(packed.segment_of(p), packed.segment_of(p + b"\xff") + 1))
    return out


def _segments_of(packed: _PackedRefs, loose: dict[bytes, Ref | None], cache: RefCache | None,
                 only: set[int] | None = None, hex_len: int = 40) -> tuple[RefSegment, ...]:
    """Every ref, in segments: the packed ones as they are, those with loose refs in
    their name range merged once per distinct set of loose refs (and then reused).
    With ``only``, just those segments (loose refs must all fall in them)."""
    bases = list(packed.segments) or [_EMPTY_SEGMENT]
    if only is not None:
        bases = [b if k in only else _EMPTY_SEGMENT for k, b in enumerate(bases)]
    if not loose:
        return tuple(b for b in bases if b.raw)
    by_seg: dict[int, list[tuple[bytes, Ref | None]]] = {}
    for name in sorted(loose):
        by_seg.setdefault(packed.segment_of(name) if packed.segments else 0, []).append(
            (name, loose[name]))
    out: list[RefSegment] = []
    for k, base in enumerate(bases):
        mine = by_seg.get(k)
        if mine is None:
            if base.raw:
                out.append(base)
            continue
        key = (base, tuple(mine))
        merged = cache.merged.get(key) if cache is not None else None
        if merged is None:
            merged = _chunked(_merge(base.refs(), mine), hex_len)
            if cache is not None:
                # For --cache-memory: what the merged segments hold (an entry is ~500 refs).
                cache.merged.put(key, merged, nbytes=sum(seg.nbytes for seg in merged))
        out.extend(merged)
    return tuple(out)


def _build(head_raw: bytes, loose: dict[bytes, bytes], packed: _PackedRefs, hex_len: int,
           peel: Peeler, prefixes: Sequence[bytes], targets: dict[bytes, bytes],
           cache: RefCache | None) -> tuple[HeadInfo, tuple[RefSegment, ...]]:
    """HEAD and the refs under ``prefixes``; ``targets`` holds loose symref targets read
    outside the prefixes: they resolve symrefs but are not listed themselves."""
    every = {**targets, **loose} if targets else loose
    head = _read_head(head_raw, every, packed, hex_len)
    resolved = _loose_refs(loose, every, packed, hex_len, peel)
    return head, _segments_of(packed, resolved, cache,
                              _covering(packed, prefixes) if prefixes else None, hex_len)


def read_ref_snapshot(
    gitdir: str, fs: FsOps, dirs: DirCache, cache: RefCache, hex_len: int, peel: Peeler,
    prefixes: Sequence[bytes] = (),
) -> RefSnapshot:
    """Read HEAD, packed-refs and loose refs once. With ``prefixes`` only refs whose names
    start with one of them (plus HEAD, and the loose targets of symrefs among them) are
    read, and only those are in the answer, which is then marked incomplete."""
    # Loose refs first, then packed-refs, as refs/files-backend.c does: `git pack-refs`
    # writes the new packed-refs before it deletes the loose files, so a ref that moves
    # from one to the other is seen in at least one of them, never lost or rolled back.
    reader = _Reader(gitdir, fs, dirs, cache, hex_len)
    loose = reader.loose(prefixes)
    top = _top(fs, dirs, gitdir)
    head_raw = (dirs.file(fs, os.path.join(gitdir, "HEAD"), top) or b"").strip() \
        if "HEAD" in top.names() else b""
    targets: dict[bytes, bytes] = {}
    if prefixes:
        starts = [v[4:].strip() for v in loose.values() if v.startswith(b"ref:")]
        if head_raw.startswith(b"ref:") and ref_matches_prefixes(b"HEAD", prefixes):
            starts.append(head_raw[4:].strip())
        walked = len(reader.state)
        targets = reader.symref_targets(starts, loose, prefixes)
        if len(reader.state) > walked:
            # More loose refs were read: list the git directory again, so that
            # packed-refs is still read after every loose ref (see above). HEAD stays
            # the one whose target was just read.
            top = _top(fs, dirs, gitdir)
    reader.saw("", top)
    packed = reader.packed(top, peel)
    state = tuple(reader.state) + (tuple(prefixes),)
    hit = cache.snapshots.get(state) if dirs.enabled else None
    if hit is not None:
        return hit
    head, segments = _build(head_raw, loose, packed, hex_len, peel, prefixes, targets,
                            cache if dirs.enabled else None)
    trusted = dirs.enabled and reader.trusted
    snap = RefSnapshot(head, segments, hex_len, state, complete=not prefixes, cacheable=trusted,
                       prefixes=tuple(prefixes))
    if trusted:
        # What it holds beyond the packed parse's segments (counted there): merged ones
        # (counted in merged_segments too, but they may leave it first).
        base = {id(s) for s in packed.segments}
        cache.snapshots.put(state, snap, nbytes=200 + 8 * len(segments) + sum(
            s.nbytes for s in segments if id(s) not in base))
    return snap


def _top(fs: FsOps, dirs: DirCache, gitdir: str) -> Listing:
    top = dirs.listing(fs, gitdir)
    if top is None:
        raise FileNotFoundError(gitdir)
    return top

