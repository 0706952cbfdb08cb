"""The one LRU of gitspout: every cache, process-wide or per request, is a :class:`ByteLRU`.

Each cache has a name and a budget, in bytes (each ``put`` gives the value's cost) or in
entries (each value costs 1). Lookups and evictions are counted per name, over every
instance of that name (each repository's ref snapshots, each request's trees...), in one
process-wide table that ``app/metrics.py`` exports (docs/ARCHITECTURE.md, "Caches").
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from contextlib import nullcontext
from typing import Generic, Literal, TypeVar

__all__ = ["ByteLRU", "CacheStats", "all_cache_stats"]

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


_STATS: dict[str, CacheStats] = {}
_STATS_LOCK = threading.Lock()


def _stats_for(name: str, unit: Unit) -> CacheStats:
    stats = _STATS.get(name)
    if stats is None:
        with _STATS_LOCK:
            stats = _STATS.setdefault(name, CacheStats(name, unit))
    if stats.unit != unit:
        raise ValueError(f"cache {name!r} is counted in {stats.unit}, not {unit}")
    return stats


def all_cache_stats() -> list[CacheStats]:
    """The statistics of every cache name created so far in this process."""
    with _STATS_LOCK:
        return list(_STATS.values())


class ByteLRU(Generic[V]):
    """Least recently used values up to ``budget`` (``unit``: bytes or entries).

    A value costing more than an eighth of the budget is not kept: one large answer must
    not flush everything else. ``shared`` caches are used by several threads and take a
    lock; a request's own cache (``shared=False``) is used by one thread at a time.
    """

    __slots__ = ("name", "budget", "stats", "_data", "_size", "_max_cost", "_lock")

    def __init__(self, name: str, budget: int, *, unit: Unit = "bytes", shared: bool = True) -> None:
        self.name = name
        self.budget = budget
        self.stats = _stats_for(name, unit)
        self._data: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._size = 0
        self._max_cost = max(1, budget // 8)
        self._lock = threading.Lock() if shared else None

    # Hot paths (a walk asks for each commit several times): no helper calls, and the
    # lock taken only by shared caches.

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
            return item[0]
        finally:
            if lock is not None:
                lock.release()

    def put(self, key: Hashable, value: V, cost: int = 1) -> None:
        """Keep ``value`` (``cost`` bytes; leave it at 1 in a cache counted in entries),
        evicting the least recently used values beyond the budget."""
        if cost > self._max_cost:
            return
        lock = self._lock
        if lock is not None:
            lock.acquire()
        try:
            data = self._data
            old = data.pop(key, None)
            if old is not None:
                self._size -= old[1]
            data[key] = (value, cost)
            self._size += cost
            while self._size > self.budget:
                _, (_, c) = data.popitem(last=False)
                self._size -= c
                self.stats.evictions += 1
        finally:
            if lock is not None:
                lock.release()

    def pop(self, key: Hashable) -> None:
        """Forget ``key`` (not counted as an eviction: the caller knows it is stale)."""
        with self._lock or nullcontext():
            old = self._data.pop(key, None)
            if old is not None:
                self._size -= old[1]

    def __contains__(self, key: Hashable) -> bool:
        """Is ``key`` kept? (Not a lookup: neither counted nor made recent.)"""
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    @property
    def size(self) -> int:
        """What the kept values cost, in the cache's unit."""
        return self._size
