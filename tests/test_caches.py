"""The one LRU every cache uses (server/store/lru.py) and its per-name statistics, as
/metrics exports them (docs/ARCHITECTURE.md, "Caches")."""

from __future__ import annotations

import itertools

from gitspout.server.app.metrics import Metrics
from gitspout.server.store.lru import ByteLRU, MemoryBudget

_names = itertools.count()


def _name() -> str:
    return f"test_cache_{next(_names)}"  # statistics are process-wide: one name per test


def test_entries_budget_evicts_least_recently_used() -> None:
    cache = ByteLRU[str](_name(), 2, unit="entries")
    cache.put("a", "A")
    cache.put("b", "B")
    assert cache.get("a") == "A"  # "a" is now the most recent
    cache.put("c", "C")
    assert "b" not in cache and cache.get("a") == "A" and cache.get("c") == "C"
    assert cache.get("b") is None
    assert (cache.stats.hits, cache.stats.misses, cache.stats.evictions) == (3, 1, 1)


def test_bytes_budget_and_large_values() -> None:
    cache = ByteLRU[bytes](_name(), 800)
    cache.put("big", b"x", 101)  # more than an eighth of the budget: not kept
    assert "big" not in cache
    for i in range(10):
        cache.put(i, b"v", 100)
    assert cache.size == 800 and len(cache) == 8 and cache.stats.evictions == 2
    cache.put(9, b"w", 50)  # replacing a value is not an eviction
    assert cache.size == 750 and cache.stats.evictions == 2 and cache.get(9) == b"w"
    cache.pop(9)
    assert cache.size == 700 and cache.stats.evictions == 2


def test_rejected_value_is_a_miss() -> None:
    cache = ByteLRU[tuple[int, str]](_name(), 10, unit="entries", shared=False)
    cache.put("dir", (1, "listing"))
    assert cache.get("dir", lambda v: v[0] == 2) is None
    assert cache.get("dir", lambda v: v[0] == 1) == (1, "listing")
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)


def test_statistics_are_per_name_over_instances() -> None:
    name = _name()
    budget = MemoryBudget()  # where the server's caches count their statistics
    one = ByteLRU[int](name, 1, unit="entries", parent=budget)
    two = ByteLRU[int](name, 1, unit="entries", parent=budget)
    for cache in (one, two):
        cache.put(1, 1)
        cache.put(2, 2)
        cache.get(2)
    assert one.stats is two.stats
    assert (one.stats.hits, one.stats.evictions) == (2, 2)
    assert [s.name for s in budget.all_stats()].count(name) == 1


def test_metrics_export_lookups_and_evictions_by_name() -> None:
    name = _name()
    budget = MemoryBudget()
    cache = ByteLRU[int](name, 1, unit="entries", parent=budget)
    cache.put(1, 1)
    cache.put(2, 2)
    cache.get(1)
    text = Metrics(memory=budget).scrape().decode()
    assert f'gitspout_cache_evictions_total{{cache="{name}"}} 1.0' in text
    assert f'gitspout_cache_lookups_total{{cache="{name}",result="miss"}} 1.0' in text
    assert f'gitspout_cache_lookups_total{{cache="{name}",result="hit"}} 0.0' in text


def test_racy_window_is_short_only_on_local_fine_grained_filesystems(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A listing is trusted 100 ms after its directory's mtime on a local filesystem with
    sub-second mtimes, 2 s anywhere else (NFS, FUSE, unknown, whole-second mtimes)."""
    import os
    import types

    from gitspout.server.store import fscache as F

    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"
        "40 22 0:51 / /srv/nfs rw - nfs4 server:/export rw,vers=4.2\n"
        "41 22 0:52 / /srv/fuse rw - fuse.latencyfs latencyfs rw\n")
    for dev, kind in ((os.makedev(8, 1), "ext4"), (os.makedev(0, 51), "nfs4"),
                      (os.makedev(0, 52), "fuse.latencyfs"), (os.makedev(9, 9), "")):
        F._FS_TYPES.pop(dev, None)
        assert F._fs_type(dev, str(info)) == kind
    try:
        def st(dev: int, mtime_ns: int) -> os.stat_result:
            return types.SimpleNamespace(st_dev=dev, st_mtime_ns=mtime_ns)  # type: ignore[return-value]

        assert F.racy_window(st(os.makedev(8, 1), 1_700_000_000_123_456_789)) == F.LOCAL_RACY_NS
        assert F.racy_window(st(os.makedev(8, 1), 1_700_000_000_000_000_000)) == F.RACY_NS
        for dev in (os.makedev(0, 51), os.makedev(0, 52), os.makedev(9, 9)):
            assert F.racy_window(st(dev, 1_700_000_000_123_456_789)) == F.RACY_NS
    finally:
        for dev in (os.makedev(8, 1), os.makedev(0, 51), os.makedev(0, 52), os.makedev(9, 9)):
            F._FS_TYPES.pop(dev, None)
