"""Process-wide state of the object layer: every open pack, and the caches of immutable
facts (resolved objects, peeled tags, object sets, loose fan-out listings, alternates)."""

from __future__ import annotations

import threading

from .fsops import FsOps
from .lru import ByteLRU
from .packs import PackFile

__all__ = ["PackRegistry"]

# Budgets of the caches below (docs/ARCHITECTURE.md, "Caches").
OBJECTS_BUDGET = 16 << 20  # bytes of inflated commits, trees, tags and delta results
PEELED_BUDGET = 64 << 20  # bytes, at PEELED_COST a tag
PEELED_COST = 256  # a hex id, its hex target and the LRU's own bookkeeping
OBJECT_SETS_BUDGET = 64 << 20  # bytes of object sets and pack selections
LOOSE_IDS_BUDGET = 64 << 20  # bytes of loose object ids, at LOOSE_ID_COST an id
LOOSE_ID_COST = 64
ALTERNATES_ENTRIES = 10_000  # alternates files


class PackRegistry:
    """Every :class:`PackFile` this process has opened, by (path, idx inode, pack inode).

    The packs themselves are not a cache: a PackFile holds descriptors and the reverse
    index and bitmaps computed from them, and is dropped when its pack is gone
    (:meth:`forget_missing`), never to make room."""

    def __init__(self, cache_budget: int = OBJECTS_BUDGET) -> None:
        self._packs: dict[tuple[object, ...], PackFile] = {}
        self._lock = threading.Lock()
        # (pack key, offset) or ("loose", id) -> (type, content)
        self.objects = ByteLRU[tuple[int, bytes]]("objects", cache_budget)
        # hex id -> hex id it peels to, b"" when it is not a tag (immutable facts)
        self.peeled = ByteLRU[bytes]("peeled", PEELED_BUDGET)
        self.reach_cache = ByteLRU[object]("object_sets", OBJECT_SETS_BUDGET)  # of wants
        # (objects dir, fan-out name) -> (listing key, ids)
        self.fanout_ids = ByteLRU[tuple[object, frozenset[bytes]]]("loose_ids", LOOSE_IDS_BUDGET)
        # (objects dir, alternates file content) -> ((line, real path), ...)
        self.alternates = ByteLRU[tuple[tuple[str, str], ...]]("alternates", ALTERNATES_ENTRIES,
                                                              unit="entries")

    def get(self, base: str, hash_len: int, key: tuple[object, ...], fs: FsOps) -> PackFile:
        pack = self._packs.get(key)
        if pack is not None:
            return pack
        with self._lock:
            pack = self._packs.get(key)
            if pack is None:
                fs.note("open", 2)
                pack = PackFile(base, hash_len, key)
                self._packs[key] = pack
        return pack

    def forget_missing(self, live: set[tuple[object, ...]], prefix: str) -> None:
        """Forget packs under ``prefix`` that are no longer listed (another process
        repacked). Requests still sending from one keep it open: a PackFile closes its
        descriptors when the last reference goes away."""
        with self._lock:
            for k in [k for k in self._packs if k[0] == prefix and k not in live]:
                del self._packs[k]
