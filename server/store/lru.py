"""A small thread-safe LRU cache bounded by the total size of its values, and the one byte
budget over every cross-request cache (``--cache-memory``, docs/ARCHITECTURE.md "Caches").

Each :class:`ByteLRU` has a budget of its own, and every cache shared across requests also
counts against a :class:`MemoryBudget` (the process-wide :data:`MEMORY` unless told
otherwise). When the caches together hold more than that budget, the least recently used
cache gives up its least recently used values until they fit: a cache of a repository
nobody asked for lately goes first, the cache every request uses last.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["ByteLRU", "MemoryBudget", "MEMORY", "DEFAULT_CACHE_MEMORY"]

V = TypeVar("V")

DEFAULT_CACHE_MEMORY = 256 << 20

_ticks = itertools.count()  # next() is atomic under the GIL: a clock of cache uses


class MemoryBudget:
    """One limit in bytes over many :class:`ByteLRU` caches."""

    def __init__(self, limit: int = DEFAULT_CACHE_MEMORY) -> None:
        self.limit = limit
        self.total = 0
        self.evictions = 0
        self._caches: weakref.WeakSet[ByteLRU[object]] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._settling = False
        self._gone: deque[int] = deque()  # bytes of caches collected (see ByteLRU.__del__)

    def join(self, cache: ByteLRU[V]) -> None:
        with self._lock:
            self._caches.add(cache)  # type: ignore[arg-type]

    def leave(self, cache: ByteLRU[V]) -> None:
        with self._lock:
            self._caches.discard(cache)  # type: ignore[arg-type]

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
            while self.total > self.limit:
                with self._lock:
                    held = [c for c in self._caches if c.size > 0]
                if not held:
                    break
                victim = min(held, key=lambda c: c.last_use)
                self.evictions += victim.shed(self.total - self.limit)
        finally:
            with self._lock:
                self._settling = False


MEMORY = MemoryBudget()
"""The process-wide budget; the server sets its ``limit`` from ``--cache-memory``."""


class ByteLRU(Generic[V]):
    """Keeps at most ``budget`` bytes of values; each value's cost is given on ``put``.

    ``parent``: the budget shared with other caches (:data:`MEMORY` by default; None for a
    cache that lives within one request). ``name`` labels it in metrics. ``on_evict`` is
    called with (key, value) of each value evicted, outside the lock.
    """

    def __init__(self, budget: int, name: str = "", parent: MemoryBudget | None = MEMORY,
                 on_evict: Callable[[Hashable, V], None] | None = None) -> None:
        self.budget = budget
        self.name = name
        self._data: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self._parent = parent
        self._on_evict = on_evict
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.last_use = next(_ticks)
        if parent is not None:
            parent.join(self)

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            item = self._data.get(key)
            if item is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            self.last_use = next(_ticks)
            return item[0]

    def put(self, key: Hashable, value: V, cost: int) -> bool:
        """Keep ``value``; False when it costs more than an eighth of the budget (one large
        value must not flush everything else) and is not kept."""
        if cost > self.budget // 8 or (self._parent is not None and cost > self._parent.limit // 8):
            return False
        evicted: list[tuple[Hashable, V]] = []
        with self._lock:
            before = self._size
            old = self._data.pop(key, None)
            if old is not None:
                self._size -= old[1]
            self._data[key] = (value, cost)
            self._size += cost
            while self._size > self.budget and self._data:
                k, (v, c) = self._data.popitem(last=False)
                self._size -= c
                self.evictions += 1
                evicted.append((k, v))
            self.last_use = next(_ticks)
            delta = self._size - before
        self._evicted(evicted)
        if self._parent is not None and delta:
            self._parent.charge(delta)
        return True

    def shed(self, nbytes: int) -> int:
        """Evict least recently used values until ``nbytes`` are freed or none is left
        (asked by the shared budget); returns how many values went."""
        evicted: list[tuple[Hashable, V]] = []
        freed = 0
        with self._lock:
            while freed < nbytes and self._data:
                k, (v, c) = self._data.popitem(last=False)
                self._size -= c
                freed += c
                evicted.append((k, v))
            self.evictions += len(evicted)
        self._evicted(evicted)
        if self._parent is not None and freed:
            self._parent.charge(-freed)
        return len(evicted)

    def _evicted(self, items: list[tuple[Hashable, V]]) -> None:
        if self._on_evict is not None:
            for k, v in items:
                self._on_evict(k, v)

    def pop(self, key: Hashable) -> V | None:
        """Forget ``key`` (not an eviction: the caller knows it is stale)."""
        with self._lock:
            old = self._data.pop(key, None)
            if old is None:
                return None
            self._size -= old[1]
        if self._parent is not None:
            self._parent.charge(-old[1])
        return old[0]

    def drop_where(self, stale: Callable[[Hashable], bool]) -> int:
        """Forget every key ``stale`` accepts (a pack that is gone): not an eviction."""
        with self._lock:
            keys = [k for k in self._data if stale(k)]
            freed = 0
            for k in keys:
                freed += self._data.pop(k)[1]
            self._size -= freed
        if self._parent is not None and freed:
            self._parent.charge(-freed)
        return len(keys)

    def clear(self) -> None:
        with self._lock:
            freed, self._size = self._size, 0
            self._data.clear()
        if self._parent is not None and freed:
            self._parent.charge(-freed)

    def __del__(self) -> None:
        # No lock here: the collector may run inside a locked section of this thread.
        if self._parent is not None and self._size:
            self._parent._gone.append(self._size)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    @property
    def size(self) -> int:
        return self._size
