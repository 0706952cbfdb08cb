"""Where each copied entry of one pack goes in the output, computed in one pass.

When every delta among the entries sent from a pack has its base sent too (a filtered
clone: blob:none keeps trees and commits, whose deltas are against trees and commits), the
whole output for that pack is known before a byte is written: entries are copied as they
are, and an OFS_DELTA whose base moved closer (the entries between them were left out) has
its distance rewritten, as git's ``write_reused_pack_one`` does. The result is a list of
segments, each a few literal bytes (a rewritten header) and a range of the pack, emitted
from large reads with a few Python steps per segment instead of per entry
(docs/ARCHITECTURE.md I5).

A layout depends only on the pack and the entries chosen, never on the request, so it is
kept across requests (``pack_layouts``, counted in --cache-memory): a second identical
filtered clone only reads and sends.
"""

from __future__ import annotations

import hashlib
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from ..store.lru import ByteLRU
from ..store.objformat import OFS_DELTA, REF_DELTA
from ..store.packs import PackFile

__all__ = ["Layout", "layout_for", "LAYOUTS_BUDGET"]

LAYOUTS_BUDGET = 64 << 20  # docs/ARCHITECTURE.md, "Caches"
WINDOW = 4 << 20  # pack bytes read at once while laying out or copying
_HEADER_MAX = 32  # type/size varint (at most 10 bytes) + OFS varint (at most 10)

_LAYOUTS = ByteLRU["Layout"]("pack_layouts", LAYOUTS_BUDGET)


@dataclass(slots=True)
class Layout:
    """Entries ``ranks`` of one pack, laid out: ``out_rel[k]`` is where entry ``ranks[k]``
    starts, relative to where the first one goes. Segment ``i`` writes
    ``literals[lit_at[i]:lit_at[i + 1]]``, then the pack's bytes ``[starts[i], stops[i])``."""

    ranks: array
    out_rel: array
    literals: bytes
    lit_at: array
    starts: array
    stops: array
    size: int
    deltas: int
    rewritten: int

    def out_offset(self, rank: int) -> int | None:
        """Relative output offset of entry ``rank``, or None when it is not in the layout."""
        k = bisect_left(self.ranks, rank)
        if k < len(self.ranks) and self.ranks[k] == rank:
            return self.out_rel[k]  # type: ignore[no-any-return]
        return None

    def cost(self) -> int:
        return (len(self.literals) + 8 * len(self.lit_at) + 8 * len(self.starts)
                + 8 * len(self.stops) + 12 * len(self.ranks) + 200)

    def segments_between(self, first: int, last: int) -> range:
        """Indexes of the segments that start at or after pack offset ``first`` and
        before ``last``."""
        return range(bisect_left(self.starts, first), bisect_right(self.starts, last - 1))


def _encode_ofs(dist: int) -> bytes:
    """The OFS_DELTA distance varint (pack-format: base-128, each continuation adds one)."""
    out = bytearray([dist & 0x7F])
    dist >>= 7
    while dist:
        dist -= 1
        out.append(0x80 | (dist & 0x7F))
        dist >>= 7
    out.reverse()
    return bytes(out)


def layout_for(pack: PackFile, ranks: Sequence[int]) -> Layout | None:
    """The layout of ``ranks`` (ascending) from ``pack``, cached; None when an entry cannot
    be copied this way (a REF_DELTA, or a delta whose base is not among ``ranks``)."""
    if not ranks:
        return None
    order = array("I", ranks)
    key = (pack.key, hashlib.sha1(order.tobytes()).digest())
    hit = _LAYOUTS.get(key)
    if hit is not None:
        return hit
    try:
        layout = _compute(pack, order)
    except IndexError:  # an entry header past what the file holds
        raise pack.corrupt("truncated entry header") from None
    if layout is not None:
        _LAYOUTS.put(key, layout, layout.cost())
    return layout


def _compute(pack: PackFile, order: array) -> Layout | None:
    offs = pack.sorted_offsets
    count = pack.count
    selected = bytearray(count)
    for r in order:
        selected[r] = 1
    shift_at = array("q", bytes(8 * count))  # per entry: source offset - output offset
    out_rel = array("Q")
    lits: list[bytes] = []
    starts = array("Q")
    stops = array("Q")
    shift = offs[order[0]]  # the first entry goes to relative offset 0
    seg_stop = -1
    deltas = rewritten = 0
    win, win_at, win_end = b"", 0, 0
    end_all = offs[count]
    for r in order:
        start = offs[r]
        stop = offs[r + 1]
        if start == seg_stop:
            stops[-1] = stop
        else:  # a gap: the entries left out move everything after it closer
            if seg_stop >= 0:
                shift += start - seg_stop
            lits.append(b"")
            starts.append(start)
            stops.append(stop)
        seg_stop = stop
        shift_at[r] = shift
        out_rel.append(start - shift)
        if start + _HEADER_MAX > win_end and win_end < end_all:
            win_at = start
            win = pack.read_raw(start, min(end_all, start + WINDOW))
            win_end = win_at + len(win)
        i = start - win_at
        c = win[i]
        kind = (c >> 4) & 7
        if kind < OFS_DELTA:
            continue
        if kind == REF_DELTA:
            return None
        deltas += 1
        i += 1
        while c & 0x80:
            c = win[i]
            i += 1
        ofs_at = i
        c = win[i]
        i += 1
        dist = c & 0x7F
        while c & 0x80:
            c = win[i]
            i += 1
            dist = ((dist + 1) << 7) | (c & 0x7F)
        base = bisect_left(offs, start - dist, 0, r)
        if base >= r or offs[base] != start - dist or not selected[base]:
            return None
        moved = shift - shift_at[base]
        if not moved:
            continue
        # The distance shrank by what was left out between the base and this entry: the
        # literal is the entry's own type/size header and the new varint; the copied
        # range starts at its data.
        new = _encode_ofs(dist - moved)
        rewritten += 1
        literal = win[start - win_at : ofs_at] + new
        if starts[-1] == start:  # the segment begins with this entry
            lits[-1] = literal
            starts[-1] = win_at + i
        else:
            stops[-1] = start
            lits.append(literal)
            starts.append(win_at + i)
            stops.append(stop)
        shift += (i - ofs_at) - len(new)
    lit_at = array("Q", [0])
    total = 0
    for lit in lits:
        total += len(lit)
        lit_at.append(total)
    size = sum(stops) - sum(starts) + total
    return Layout(order, out_rel, b"".join(lits), lit_at, starts, stops, size, deltas, rewritten)
