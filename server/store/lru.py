"""A small thread-safe LRU cache bounded by the total size of its values."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["ByteLRU"]

V = TypeVar("V")


class ByteLRU(Generic[V]):
    """Keeps at most ``budget`` bytes of values; each value's cost is given on ``put``."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._data: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            item = self._data.get(key)
            if item is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return item[0]

    def put(self, key: Hashable, value: V, cost: int) -> None:
        if cost > self.budget // 8:
            return
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._size -= old[1]
            self._data[key] = (value, cost)
            self._size += cost
            while self._size > self.budget and self._data:
                _, (_, c) = self._data.popitem(last=False)
                self._size -= c

    def drop_where(self, stale: Callable[[Hashable], bool]) -> int:
        """Forget every key ``stale`` accepts (a pack that is gone): not an eviction."""
        with self._lock:
            keys = [k for k in self._data if stale(k)]
            for k in keys:
                self._size -= self._data.pop(k)[1]
        return len(keys)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._size = 0

    def __len__(self) -> int:
        return len(self._data)

    @property
    def size(self) -> int:
        return self._size
