"""Cross-request ref state of one repository, and reads of it shared between concurrent
requests (docs/ARCHITECTURE.md, "Caches")."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from .lru import ByteLRU, MemoryBudget
from .packedrefs import PackedRefs, RefSegment
from .refsnapshot import RefSnapshot
from .reftable import Table

__all__ = ["RefCache", "LastPacked", "TIP_BYTES"]


# Budgets, per repository, of the caches below (docs/ARCHITECTURE.md, "Caches").
PACKED_ENTRIES = 1  # the packed-refs file as it is now
SNAPSHOT_ENTRIES = 8  # ref states (all refs, or those under some prefixes)
ENCODED_ENTRIES = 8  # encoded answers: advertisements and ls-refs, by kind and ref state
MERGED_ENTRIES = 1024  # segments of packed refs with loose refs in their range
ENCODINGS_BYTES = 1 << 40  # per-segment encodings: bounded by --cache-memory alone
TIPS_ENTRIES = 4  # sets of visible tips (binary ids), by ref state and hideRefs
TIP_BYTES = 90  # one id in such a set: the bytes object and its slot
TABLES_BYTES = 1 << 40  # parsed reftable tables: bounded by --cache-memory alone


class RefCache:
    """Cross-request ref state of one repository (shared by threads).

    Everything it holds counts against --cache-memory: the caches below as ByteLRUs, and
    the last packed-refs parse (which the next version of the file is diffed against, so
    it is not evicted while the repository is kept) by a charge of its size."""

    def __init__(self, parent: MemoryBudget | None = None) -> None:
        # (packed-refs inode, git dir listing key) -> parsed packed-refs (the same object
        # as ``last_packed``: counted there)
        self.packed: ByteLRU[PackedRefs] = ByteLRU("packed_refs", PACKED_ENTRIES,
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
        # (reftable table name, inode) -> the parsed table (store/reftable.py)
        self.tables: ByteLRU[Table] = ByteLRU("reftables", TABLES_BYTES, parent=parent)
        self._parent = parent
        self._lock = threading.Lock()
        self._charged = 0
        self.last_packed: LastPacked | None = None
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

    def keep_packed(self, last: LastPacked | None) -> None:
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
class LastPacked:
    hex_len: int
    parsed: PackedRefs
    key: tuple[object, ...]  # of the packed cache

