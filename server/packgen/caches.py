"""What the pack producer keeps across requests, one cache per type of value, all within
--cache-memory. Entries naming a pack go with it (``store/registry.py`` keyed_by_packs)."""

from __future__ import annotations

from dataclasses import dataclass

from ..graph.bitmapwalk import Reach
from ..graph.closures import ClosureCaches
from ..graph.enumeration import Enumeration
from ..store.lru import ByteLRU
from ..store.registry import PackRegistry
from .layoutrecord import Layout
from .selection import Selection

__all__ = ["PackCaches", "WALKS_BUDGET", "SELECTIONS_BUDGET", "FILTERED_BUDGET", "LAYOUTS_BUDGET"]

# Bytes each may hold (docs/ARCHITECTURE.md "Caches"); --cache-memory bounds them together.
WALKS_BUDGET = 64 << 20
SELECTIONS_BUDGET = 64 << 20
FILTERED_BUDGET = 64 << 20
LAYOUTS_BUDGET = 64 << 20


@dataclass(frozen=True)
class PackCaches:
    """The caches of the pack producer (keys: ``choose.py``, ``layout.py``)."""

    closures: ClosureCaches  # closures of tips (graph/closures.py), shared with the want check
    walks: ByteLRU[Enumeration]  # order key -> the objects a walk lists
    selections: ByteLRU[Selection]  # (order key, pack keys) -> those objects by pack
    filtered: ByteLRU[Reach]  # (bitmapped pack key, order key) -> closure minus the filter
    layouts: ByteLRU[Layout]  # (pack key, digest of ranks, resolve) -> the layout

    @classmethod
    def create(cls, registry: PackRegistry, closures: ClosureCaches | None = None) -> PackCaches:
        memory, by_pack = registry.memory, registry.keyed_by_packs
        return cls(
            closures if closures is not None else ClosureCaches.create(registry),
            ByteLRU[Enumeration]("object_walks", WALKS_BUDGET, parent=memory),
            by_pack(ByteLRU[Selection]("pack_selections", SELECTIONS_BUDGET, parent=memory)),
            by_pack(ByteLRU[Reach]("filtered_sets", FILTERED_BUDGET, parent=memory)),
            by_pack(ByteLRU[Layout]("pack_layouts", LAYOUTS_BUDGET, parent=memory)),
        )
