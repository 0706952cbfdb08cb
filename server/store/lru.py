"""The one LRU of gitspout: every cache, process-wide or per request, is a :class:`ByteLRU`.

Each cache has a name and a budget, in bytes (each ``put`` gives the value's cost) or in
entries (each value costs 1).

Every cache of the server belongs to one :class:`MemoryBudget` (``--cache-memory``, built
once by ``app/budgets.py`` and handed down), which keeps two things. Lookups and evictions,
per name, over every instance of that name (each repository's ref snapshots, each
request's trees...): ``app/metrics.py`` exports them. And the bytes every cache shared
across requests holds: a cache counted in entries tells what each entry holds (``nbytes``
on ``put``, else ``entry_bytes``). When all of them together hold more than the budget,
the least recently used cache gives up its least recently used values until they fit
(with room to spare: down to 7/8 of the budget): a cache of a repository nobody asked for
lately goes first, the cache every request uses last. A cache made without a budget
(tests, tools) counts for itself alone.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from contextlib import nullcontext
from typing import Generic, Literal, TypeVar

__all__ = ["ByteLRU", "CacheStats", "MemoryBudget", "DEFAULT_CACHE_MEMORY"]

V = TypeVar("V")
Unit = Literal["bytes", "entries"]


class CacheStats:
    """Hits, misses and evictions of every cache of one name.

    Counted without a lock of their own: each instance counts under its lock (or in the one
    thread that uses it), so two instances of one name counting at the same instant may
    lose one increment to the other. That is the price of keeping lookups cheap."""

    __slots__ = ("name", "unit", "hits", "misses", "evictions")

    def __init__(self, name: str, unit: Unit) -> None:
        self.name = name
        self.unit = unit
        self.hits = 0
        self.misses = 0
        self.evictions = 0


DEFAULT_CACHE_MEMORY = 256 << 20

_ticks = itertools.count()  # next() is atomic under the GIL: a clock of cache uses


class MemoryBudget:
    """One limit in bytes over many :class:`ByteLRU` caches (``--cache-memory``), and the
    statistics of every cache name that belongs to it."""

    def __init__(self, limit: int = DEFAULT_CACHE_MEMORY) -> None:
        self.limit = limit
        self.total = 0
        self.evictions = 0
        self._caches: weakref.WeakSet[ByteLRU[object]] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._settling = False
        self._gone: deque[int] = deque()  # bytes of caches collected (see ByteLRU.__del__)
        self._stats: dict[str, CacheStats] = {}

    def stats_for(self, name: str, unit: Unit) -> CacheStats:
        """The statistics every cache called ``name`` counts in."""
        stats = self._stats.get(name)
        if stats is None:
            with self._lock:
                stats = self._stats.setdefault(name, CacheStats(name, unit))
        if stats.unit != unit:
            raise ValueError(f"cache {name!r} is counted in {stats.unit}, not {unit}")
        return stats

    def all_stats(self) -> list[CacheStats]:
        """The statistics of every cache name of this budget so far."""
        with self._lock:
            return list(self._stats.values())

    def join(self, cache: ByteLRU[V]) -> None:
        with self._lock:
            self._caches.add(cache)  # type: ignore[arg-type]

    def caches(self) -> list[ByteLRU[object]]:
        with self._lock:
            return list(self._caches)

    def charge(self, delta: int) -> None:
        """``delta`` bytes more (or fewer) are held; over the limit, evict. Called by a
        cache after it released its own lock: eviction takes one cache lock at a time."""
        with self._lock:
            while self._gone:
                self.total -= self._gone.popleft()
            self.total += delta
            if self.total <= self.limit or self._settling or delta <= 0:
                return
            self._settling = True  # one thread evicts; others go on meanwhile
        try:
            # Down to 7/8 of the limit, so that a full budget is not settled again at each
            # put; the caches ordered once per settling (there may be thousands: each
            # repository's, each pack's decoded bitmaps).
            target = self.limit - self.limit // 8
            with self._lock:
                held = sorted((c for c in self._caches if c.held > 0), key=lambda c: c.last_use)
            for victim in held:
                if self.total <= target:
                    break
                self.evictions += victim.shed(self.total - target)
        finally:
            with self._lock:
                self._settling = False


class ByteLRU(Generic[V]):
    """Least recently used values up to ``budget`` (``unit``: bytes or entries).

    A value costing more than an eighth of the budget is not kept: one large answer must
    not flush everything else. ``shared`` caches are used by several threads and take a
    lock; a request's own cache (``shared=False``) is used by one thread at a time.

    A shared cache counts its bytes against ``parent``; a request's own cache
    (``shared=False``) only its lookups. ``on_evict`` is called with (key, value) of each
    value evicted, outside the lock.
    """

    __slots__ = ("name", "budget", "stats", "_data", "_size", "_max_cost", "_lock", "_parent",
                 "_on_evict", "_bytes", "held", "entry_bytes", "last_use", "__weakref__")

    def __init__(self, name: str, budget: int, *, unit: Unit = "bytes", shared: bool = True,
                 parent: MemoryBudget | None = None, entry_bytes: int = 256,
                 on_evict: Callable[[Hashable, V], None] | None = None) -> None:
        self.name = name
        self.budget = budget
        self.stats = parent.stats_for(name, unit) if parent is not None \
            else CacheStats(name, unit)
        # key -> (value, cost in the cache's unit); in ``_bytes``, what it holds in bytes
        self._data: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._size = 0
        self._max_cost = max(1, budget // 8)
        self._lock = threading.Lock() if shared else None
        self._parent = parent if shared else None
        self._on_evict = on_evict
        self._bytes: dict[Hashable, int] | None = {} if unit == "entries" else None
        self.held = 0  # bytes, as the shared budget counts them
        self.entry_bytes = entry_bytes
        self.last_use = next(_ticks)
        if self._parent is not None:
            self._parent.join(self)

    # Hot paths (a walk asks for each commit several times, a cold closure puts thousands
    # of trees): no helper calls but on eviction, and the lock taken only by shared caches.

    def get(self, key: Hashable, valid: Callable[[V], bool] | None = None) -> V | None:
        """The value of ``key``, or None. A value ``valid`` rejects (it was derived from a
        state that has changed since) counts as a miss; the next ``put`` replaces it."""
        lock = self._lock
        if lock is not None:
            lock.acquire()
        try:
            item = self._data.get(key)
            if item is None or (valid is not None and not valid(item[0])):
                self.stats.misses += 1
                return None
            self._data.move_to_end(key)
            self.stats.hits += 1
            if lock is not None:  # last_use orders the shared caches only
                self.last_use = next(_ticks)
            return item[0]
        finally:
            if lock is not None:
                lock.release()

    def put(self, key: Hashable, value: V, cost: int = 1, nbytes: int | None = None) -> bool:
        """Keep ``value`` (``cost`` bytes; leave it at 1 in a cache counted in entries, and
        give ``nbytes``, what it holds, unless ``entry_bytes`` says it well enough),
        evicting the least recently used values beyond the budget. False when the value
        costs more than an eighth of the budget (or of the shared one) and is not kept."""
        parent = self._parent
        sizes = self._bytes
        size = cost if sizes is None else (self.entry_bytes if nbytes is None else nbytes)
        if cost > self._max_cost or (parent is not None and size > parent.limit // 8):
            return False
        evicted: list[tuple[Hashable, V]] = []
        lock = self._lock
        if lock is not None:
            lock.acquire()
        try:
            data = self._data
            before = self.held
            old = data.pop(key, None)
            if old is not None:
                self._size -= old[1]
                self.held -= old[1] if sizes is None else sizes.pop(key, 0)
            data[key] = (value, cost)
            self._size += cost
            self.held += size
            if sizes is not None:
                sizes[key] = size
            if self._size > self.budget:
                evicted = self._over_budget()
            if lock is not None:  # last_use orders the shared caches only
                self.last_use = next(_ticks)
            delta = self.held - before
        finally:
            if lock is not None:
                lock.release()
        if evicted and self._on_evict is not None:
            self._evicted(evicted)
        if parent is not None and delta:
            parent.charge(delta)
        return True

    def _over_budget(self) -> list[tuple[Hashable, V]]:
        """Evict the least recently used values until the budget holds (under the lock)."""
        data, sizes = self._data, self._bytes
        evicted: list[tuple[Hashable, V]] = []
        while self._size > self.budget:
            k, (v, c) = data.popitem(last=False)
            self._size -= c
            self.held -= c if sizes is None else sizes.pop(k, 0)
            self.stats.evictions += 1
            evicted.append((k, v))
        return evicted

    def shed(self, nbytes: int) -> int:
        """Evict least recently used values until ``nbytes`` bytes are freed or none is
        left (asked by the shared budget); how many values went."""
        evicted: list[tuple[Hashable, V]] = []
        with self._lock or nullcontext():
            data, sizes = self._data, self._bytes
            before = self.held
            while self.held > before - nbytes and data:
                k, (v, c) = data.popitem(last=False)
                self._size -= c
                self.held -= c if sizes is None else sizes.pop(k, 0)
                evicted.append((k, v))
            self.stats.evictions += len(evicted)
            freed = before - self.held
        self._evicted(evicted)
        if self._parent is not None and freed:
            self._parent.charge(-freed)
        return len(evicted)

    def _evicted(self, items: list[tuple[Hashable, V]]) -> None:
        if self._on_evict is not None:
            for k, v in items:
                self._on_evict(k, v)

    def pop(self, key: Hashable) -> None:
        """Forget ``key`` (not counted as an eviction: the caller knows it is stale)."""
        with self._lock or nullcontext():
            old = self._data.pop(key, None)
            freed = 0
            if old is not None:
                self._size -= old[1]
                freed = old[1] if self._bytes is None else self._bytes.pop(key, 0)
                self.held -= freed
        if self._parent is not None and freed:
            self._parent.charge(-freed)

    def drop_where(self, stale: Callable[[Hashable], bool]) -> int:
        """Forget every key ``stale`` accepts (a pack that is gone): not an eviction."""
        with self._lock or nullcontext():
            keys = [k for k in self._data if stale(k)]
            before = self.held
            for k in keys:
                c = self._data.pop(k)[1]
                self._size -= c
                self.held -= c if self._bytes is None else self._bytes.pop(k, 0)
            freed = before - self.held
        if self._parent is not None and freed:
            self._parent.charge(-freed)
        return len(keys)

    def clear(self) -> None:
        with self._lock or nullcontext():
            freed, self.held, self._size = self.held, 0, 0
            self._data.clear()
            if self._bytes is not None:
                self._bytes.clear()
        if self._parent is not None and freed:
            self._parent.charge(-freed)

    def __del__(self) -> None:
        # No lock here: the collector may run inside a locked section of this thread.
        parent = getattr(self, "_parent", None)
        if parent is not None and self.held:
            parent._gone.append(self.held)

    def __contains__(self, key: Hashable) -> bool:
        """Is ``key`` kept? (Not a lookup: neither counted nor made recent.)"""
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    @property
    def size(self) -> int:
        """What the kept values cost, in the cache's unit."""
        return self._size
