"""Process-wide state of the object layer: every open pack, and the caches of immutable
facts (resolved objects, peeled tags, object sets, loose fan-out listings)."""

from __future__ import annotations

import threading

from .fsops import FsOps
from .lru import ByteLRU
from .packs import PackFile

__all__ = ["PackRegistry", "HitCounter"]


class HitCounter:
    """Hits and misses of a cache that keeps no statistics itself."""

    def __init__(self) -> None:
        self.hits = 0
        self.misses = 0


class PackRegistry:
    """Every :class:`PackFile` this process has opened, by (path, idx inode, pack inode)."""

    def __init__(self, cache_budget: int = 16 << 20) -> None:
        self._packs: dict[tuple[object, ...], PackFile] = {}
        self._lock = threading.Lock()
        self.objects = ByteLRU[tuple[int, bytes]](cache_budget)
        self.peeled: dict[bytes, bytes | None] = {}  # hex id -> hex peeled id (immutable facts)
        self.reach_cache: ByteLRU[object] = ByteLRU(64 << 20)  # object sets of wants
        self.fanout_ids: dict[tuple[str, str], tuple[object, frozenset[bytes]]] = {}
        # (objects dir, alternates file content) -> ((line, real path), ...)
        self.alternates: dict[tuple[str, bytes], tuple[tuple[str, str], ...]] = {}
        self.encoded_stats = HitCounter()  # encoded advertisement / ls-refs answers
        self.opened = 0

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
                self.opened += 1
        return pack

    def forget_missing(self, live: set[tuple[object, ...]], prefix: str) -> None:
        """Forget packs under ``prefix`` that are no longer listed (another process
        repacked). Requests still sending from one keep it open: a PackFile closes its
        descriptors when the last reference goes away."""
        with self._lock:
            for k in [k for k in self._packs if k[0] == prefix and k not in live]:
                del self._packs[k]

    def __len__(self) -> int:
        return len(self._packs)
