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
import zlib
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..store.lru import ByteLRU
from ..store.objformat import OFS_DELTA, REF_DELTA
from ..store.packs import PackFile, encode_entry_header, encode_ofs_distance

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
    generated: int = 0

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


Resolve = Callable[[bytes], tuple[int, bytes]]
"""Reads an object by id: (type number, data)."""

_NONE = Layout(array("I"), array("Q"), b"", array("Q", [0]), array("Q"), array("Q"), 0, 0, 0)
"""Cached for a selection that cannot be laid out, so it is not tried again."""


def layout_for(pack: PackFile, ranks: Sequence[int], resolve: Resolve | None = None,
               compression: int = zlib.Z_DEFAULT_COMPRESSION) -> Layout | None:
    """The layout of ``ranks`` (ascending) from ``pack``, cached; None when an entry cannot
    be copied this way: a REF_DELTA, or a delta whose base is not among ``ranks`` unless
    ``resolve`` is given, in which case that entry is written whole (its object read and
    compressed once, kept in the layout: git's blob:limit keeps a small blob stored as a
    delta against a large one it drops)."""
    if not ranks:
        return None
    order = array("I", ranks)
    key = (pack.key, hashlib.sha1(order.tobytes()).digest(), resolve is not None)
    hit = _LAYOUTS.get(key)
    if hit is not None:
        return None if hit is _NONE else hit
    try:
        layout = _compute(pack, order, resolve, compression)
    except IndexError:  # an entry header past what the file holds
        raise pack.corrupt("truncated entry header") from None
    _LAYOUTS.put(key, _NONE if layout is None else layout,
                 200 if layout is None else layout.cost())
    return layout


def _whole(pack: PackFile, rank: int, resolve: Resolve, compression: int) -> bytes:
    type_num, data = resolve(pack.oid_at(pack.pack_order[rank]))
    return encode_entry_header(type_num, len(data)) + zlib.compress(data, compression)


def _compute(pack: PackFile, order: array, resolve: Resolve | None,
             compression: int) -> Layout | None:
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
    deltas = rewritten = generated = 0
    win, win_at, win_end = b"", 0, 0
    end_all = offs[count]
    for r in order:
        start = offs[r]
        stop = offs[r + 1]
        fresh = start != seg_stop  # a segment opens with this entry
        if not fresh:
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
        if base >= r or offs[base] != start - dist:
            return None  # not an entry boundary: the copying path reports the damage
        if selected[base]:
            moved = shift - shift_at[base]
            if not moved:
                deltas += 1
                continue
            # The distance shrank by what was left out between the base and this entry:
            # the literal is the entry's own type/size header and the new varint, and the
            # copied range starts at its data.
            deltas += 1
            literal = win[start - win_at : ofs_at] + encode_ofs_distance(dist - moved)
            data_at = win_at + i
        elif resolve is None:
            return None
        else:  # whole, in the literal; nothing copied
            literal = _whole(pack, r, resolve, compression)
            data_at = stop
            generated += 1
        rewritten += 1
        if fresh:  # its literal is this entry's
            lits[-1] = literal
            starts[-1] = data_at
        else:
            stops[-1] = start
            lits.append(literal)
            starts.append(data_at)
            stops.append(stop)
        shift += (data_at - start) - len(literal)
    lit_at = array("Q", [0])
    total = 0
    for lit in lits:
        total += len(lit)
        lit_at.append(total)
    size = sum(stops) - sum(starts) + total
    return Layout(order, out_rel, b"".join(lits), lit_at, starts, stops, size, deltas, rewritten,
                  generated)
