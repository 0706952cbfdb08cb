"""One byte budget over every cross-request cache (store/lru.py; --cache-memory)."""

from __future__ import annotations

import gc

import pytest
from gitspout.server.app.config import ConfigError, load_config, parse_size
from gitspout.server.store.lru import ByteLRU, MemoryBudget


def test_budget_evicts_from_the_least_recently_used_cache() -> None:
    budget = MemoryBudget(1000)
    a = ByteLRU[bytes]("a", 10_000, parent=budget)
    b = ByteLRU[bytes]("b", 10_000, parent=budget)
    for i in range(4):
        a.put(i, b"x", 100)
    for i in range(4):
        b.put(i, b"y", 100)
    assert budget.total == 800
    b.get(0)  # b is the most recently used cache: a gives way when the budget is full
    for i in range(4, 7):
        b.put(i, b"z", 100)
    assert budget.total <= 1000 and a.size + b.size == budget.total
    assert len(b) == 7 and len(a) == 1 and budget.evictions == 3  # down to 7/8 of the limit
    assert 0 not in a and 3 in a  # within a cache, least recently used first


def test_budget_prefers_idle_caches() -> None:
    budget = MemoryBudget(1000)
    idle = ByteLRU[bytes]("idle", 10_000, parent=budget)
    busy = ByteLRU[bytes]("busy", 10_000, parent=budget)
    for i in range(5):
        idle.put(i, b"x", 100)
    for i in range(10):
        busy.put(i, b"y", 100)
        busy.get(i)
    assert budget.total <= 1000
    assert len(idle) == 0 and len(busy) >= 8 and 9 in busy  # idle went first, entirely


def test_on_evict_and_refusal_of_large_values() -> None:
    budget = MemoryBudget(800)
    gone: list[object] = []
    c = ByteLRU[bytes]("c", 10_000, parent=budget, on_evict=lambda k, v: gone.append(k))
    assert not c.put("big", b"", 101)  # more than an eighth of the shared budget
    for i in range(10):
        assert c.put(i, b"", 100)
    assert budget.total == 800 and gone == [0, 1]
    c.drop_where(lambda k: k == 5)
    c.pop(6)
    assert budget.total == 600 == c.size


def test_a_collected_cache_gives_its_bytes_back() -> None:
    budget = MemoryBudget(10_000)
    c = ByteLRU[bytes]("tmp", 10_000, parent=budget)
    c.put(1, b"", 500)
    del c
    gc.collect()
    ByteLRU[bytes]("other", 10_000, parent=budget).put(1, b"", 1)
    assert budget.total == 1


@pytest.mark.parametrize("text,value", [("8MiB", 8 << 20), ("256M", 256 << 20), ("1g", 1 << 30),
                                        ("4096", 4096), ("512KiB", 512 << 10)])
def test_sizes(text: str, value: int) -> None:
    assert parse_size(text) == value


def test_cache_memory_setting(tmp_path: object) -> None:
    cfg = load_config({"cache_memory": "8MiB", "max_open_packs": "8", "root": "."}, env={})
    assert cfg.cache_memory == 8 << 20 and cfg.max_open_packs == 8
    with pytest.raises(ConfigError):
        load_config({"cache_memory": "lots", "root": "."}, env={})
    with pytest.raises(ConfigError):
        load_config({"max_open_packs": "1", "root": "."}, env={})
