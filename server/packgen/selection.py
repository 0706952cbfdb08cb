"""The objects of an outgoing pack, grouped by the pack that holds each: for every source
pack, the entries it gives (ranks in pack order), and the objects written whole.

A :class:`Selection` is kept across requests (keyed by the pack order and the frozen pack
list, ``choose.py``); :meth:`Selection.fresh` makes the copy one request sends from.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..store.odb import ObjectSnapshot, PackedLocation
from ..store.packs import PackFile
from .layoutrecord import Layout

__all__ = ["SelectedPack", "Selection", "select_objects", "ThinCheck"]


@dataclass
class SelectedPack:
    """Entries sent from one source pack: ranks (pack order) ascending, and a flag array.

    While copying, ``runs`` records (first rank, last rank + 1, output offset) of entries
    copied byte for byte and ``single`` the output offsets of entries written one by one.
    """

    pack: PackFile
    order: list[int]
    selected: bytearray
    runs: list[tuple[int, int, int]] = field(default_factory=list)
    single: dict[int, int] = field(default_factory=dict)
    bases: Any = None  # the pack's base ranks, as many as this needs (base_ranks_for)
    layout: Layout | None = None  # when copied by layout (layout.py), from output ``layout_at``
    layout_at: int = 0

    @classmethod
    def from_ranks(cls, pack: PackFile, ranks: list[int]) -> SelectedPack:
        selected = bytearray(pack.count)
        for r in ranks:
            selected[r] = 1
        return cls(pack, ranks, selected)

    def out_offset(self, rank: int) -> int | None:
        """Where the entry of ``rank`` went in the output, if it was written already."""
        if self.layout is not None:
            rel = self.layout.out_offset(rank)
            return None if rel is None else self.layout_at + rel
        at = self.single.get(rank)
        if at is not None:
            return at
        k = bisect_right(self.runs, (rank, 1 << 62, 0)) - 1
        if k >= 0:
            first, stop, out_at = self.runs[k]
            if first <= rank < stop:
                offs = self.pack.sorted_offsets
                return out_at + offs[rank] - offs[first]
        return None

    def rank_of(self, oid: bytes) -> int:
        pos = self.pack.find(oid)
        return -1 if pos < 0 else self.pack.rank_of_index_pos(pos)


@dataclass
class Selection:
    """The objects of an outgoing pack: the entries of each source pack, then the objects
    written whole."""

    parts: list[SelectedPack]
    loose: list[bytes]

    @property
    def count(self) -> int:
        return sum(len(p.order) for p in self.parts) + len(self.loose)

    def fresh(self, packs: Iterable[PackFile] = ()) -> Selection:
        """A copy safe to send from (parts record output offsets while copying), reading
        from ``packs`` (the request's leased packs, by key) rather than from the objects a
        cached selection was made with, which may be closed since (store/registry.py)."""
        now = {p.key: p for p in packs}
        return Selection([SelectedPack(now.get(p.pack.key, p.pack), p.order, p.selected)
                          for p in self.parts], list(self.loose))


def select_objects(odb: ObjectSnapshot, oids: Iterable[bytes],
                   base: dict[int, list[int]] | None = None,
                   packs: dict[int, PackFile] | None = None) -> Selection:
    """Group objects by the pack that holds them (ranks in pack order)."""
    ranks: dict[int, list[int]] = base if base is not None else {}
    by_id: dict[int, PackFile] = packs if packs is not None else {}
    loose: list[bytes] = []
    grown: set[int] = set()  # the ranks given in ``base`` are ascending and distinct already
    for oid in oids:
        loc = odb.locate(oid, needed=True)
        if not isinstance(loc, PackedLocation):
            loose.append(oid)
            continue
        by_id[id(loc.pack)] = loc.pack
        grown.add(id(loc.pack))
        ranks.setdefault(id(loc.pack), []).append(loc.pack.rank_of_index_pos(loc.pos))
    parts = []
    for key, pack in by_id.items():
        order = ranks.get(key, [])
        if key in grown or base is None:
            order = sorted(set(order))
        parts.append(SelectedPack.from_ranks(pack, order))
    return Selection(parts, loose)


ThinCheck = Callable[[PackFile | None, int, bytes], bool]
"""(pack or None, rank or -1, oid) of a delta base -> True when the client has it."""
