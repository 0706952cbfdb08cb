"""Where each copied entry of one pack goes in the output, computed in one pass.

When every delta among the entries sent from a pack has its base sent too (a filtered
clone: blob:none keeps trees and commits, whose deltas are against trees and commits), the
whole output for that pack is known before a byte is written: entries are copied as they
are, and an OFS_DELTA whose base moved closer (the entries between them were left out) has
its distance rewritten, as git's ``write_reused_pack_one`` does. The result is a list of
segments (packgen/layoutrecord.py), each a few literal bytes (a rewritten header) and a
range of the pack, emitted from large reads with a few Python steps per segment instead of
per entry (docs/ARCHITECTURE.md I5).

A layout depends only on the pack and the entries chosen, never on the request, so it is
kept across requests (``pack_layouts``, counted in --cache-memory): a second identical
filtered clone only reads and sends.
"""

from __future__ import annotations

import hashlib
import zlib
from array import array
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..store.closurestore import ClosureStore
from ..store.lru import ByteLRU
from ..store.objformat import OFS_DELTA, REF_DELTA
from ..store.packentry import encode_entry_header, encode_ofs_distance
from ..store.packs import PackFile
from ..store.packscan import HEAD_BYTES, scan_headers
from ..store.revindex import as_array
from .layoutrecord import DISK_LAYOUT_ENTRIES, Layout, disk_key, encode_layout, load_layout

__all__ = ["Layout", "layout_for"]

WINDOW = 4 << 20  # pack bytes read at once while laying out or copying
_HEADER_MAX = 32  # type/size varint (at most 10 bytes) + OFS varint (at most 10)

Resolve = Callable[[bytes], tuple[int, bytes]]
"""Reads an object by id: (type number, data)."""

_NONE = Layout(array("I"), array("Q"), b"", array("Q", [0]), array("Q"), array("Q"), 0, 0, 0)
"""Cached for a selection that cannot be laid out, so it is not tried again."""


def layout_for(pack: PackFile, ranks: Sequence[int], resolve: Resolve | None = None,
               compression: int = zlib.Z_DEFAULT_COMPRESSION,
               cache: ByteLRU[Layout] | None = None,
               disk: ClosureStore | None = None) -> Layout | None:
    """The layout of ``ranks`` (ascending) from ``pack``, kept in ``cache`` (packs never
    change, so the key is exact); None when an entry cannot
    be copied this way: a REF_DELTA, or a delta whose base is not among ``ranks`` unless
    ``resolve`` is given, in which case that entry is written whole (its object read and
    compressed once, kept in the layout: git's blob:limit keeps a small blob stored as a
    delta against a large one it drops). A large one is also kept in ``disk`` for the
    next process (store/closurestore.py): git/git's blob:none layout costs 0.3 s."""
    if not ranks:
        return None
    order = array("I", ranks)
    if _every_entry(pack, order):
        return _whole_layout(pack, order)
    digest = hashlib.sha1(order.tobytes()).digest()
    key = (pack.key, digest, resolve is not None)
    hit = cache.get(key) if cache is not None else None
    if hit is not None:
        return None if hit is _NONE else hit
    stored = disk if disk is not None and len(order) >= DISK_LAYOUT_ENTRIES else None
    where = disk_key(pack, digest, resolve is not None, compression)
    layout = load_layout(stored, where, order) if stored is not None else None
    if layout is None:
        try:
            layout = _vector_layout(pack, order, resolve is not None)
            if layout is _SLOW:
                layout = _compute(pack, order, resolve, compression)
        except IndexError:  # an entry header past what the file holds
            raise pack.corrupt("truncated entry header") from None
        # One larger than the store takes a record (a quarter of it) is not even encoded:
        # encoding copies it, for a file that would be dropped.
        if stored is not None and layout is not None and layout.cost() <= stored.max_bytes // 4:
            stored.save(*where, encode_layout(layout))
    if cache is not None:
        cache.put(key, _NONE if layout is None else layout,
                  200 if layout is None else layout.cost())
    return layout


def _every_entry(pack: PackFile, order: array) -> bool:
    """True when ``order`` (ascending, distinct) is every entry of ``pack``, none of them a
    REF_DELTA: the whole body goes out as it is, every OFS_DELTA after its base."""
    n = pack.count
    return (len(order) == n and order[0] == 0 and order[-1] == n - 1
            and np.array_equal(np.frombuffer(order, dtype=np.uint32), np.arange(n))
            and not pack.has_ref_deltas())


def _whole_layout(pack: PackFile, order: array) -> Layout:
    """The layout of every entry: one segment, the pack's body from its first entry to its
    trailer, nothing rewritten. After a push, a clone is the bitmapped pack whole plus the
    loose objects: this spares it the header scan of a computed layout (0.35 s and 100 MB
    on git/git's pack). It is neither cached nor stored, as it costs less than either;
    the bitmapped pack's delta facts are (``PackFile.delta_facts``)."""
    offs = pack.sorted_offsets
    n = pack.count
    first, end = offs[0], offs[n]
    return _WholeLayout(order, array("Q"), b"", array("Q", [0, 0]), array("Q", [first]),
                        array("Q", [end]), end - first, pack.delta_facts()[1], 0, offs=offs)


@dataclass(slots=True)
class _WholeLayout(Layout):
    """Every entry of a pack as one segment: an entry's output offset is read off the
    pack's own offsets (``offs``, its reverse index), not kept in a copy of them (8 bytes
    an entry: 6.7 MB for git/git). Its ``out_rel`` is empty: it is never cached, nor
    encoded for the disk (``cost`` and ``encode_layout`` would be wrong for it)."""

    offs: array = field(kw_only=True, repr=False, compare=False)

    def out_offset(self, rank: int) -> int | None:
        if 0 <= rank < len(self.ranks):
            return self.offs[rank] - self.offs[0]  # type: ignore[no-any-return]
        return None


_SLOW = Layout(array("I"), array("Q"), b"", array("Q", [0]), array("Q"), array("Q"), 0, 0, 0)
"""Returned by :func:`_vector_layout` for a selection it leaves to :func:`_compute`."""

# Where an OFS_DELTA distance varint needs one more byte (each continuation adds one).
_VARINT_STEPS = np.cumsum([1 << (7 * k) for k in range(1, 9)], dtype=np.int64)
_FIXED_POINT_ROUNDS = 16


def _ofs_varint_bytes(dist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The OFS_DELTA distance varints of ``dist`` (as :func:`encode_ofs_distance`): a
    (len, 10) matrix whose row ``k`` holds its bytes right-aligned, and their lengths."""
    lengths = 1 + np.searchsorted(_VARINT_STEPS, dist, "right")
    out = np.zeros((len(dist), 10), dtype=np.uint8)
    v = dist.copy()
    out[:, 9] = v & 0x7F
    v >>= 7
    for col in range(8, -1, -1):
        more = v > 0
        if not more.any():
            break
        v[more] -= 1
        out[more, col] = 0x80 | (v[more] & 0x7F)
        v >>= 7
    return out, lengths


def _vector_layout(pack: PackFile, order: array, whole_allowed: bool) -> Layout | None:
    """:func:`_compute` for the common case, with numpy over all entries at once: every
    delta among ``order`` is an OFS_DELTA whose base is selected too. Returns None when
    the selection cannot be laid out (a REF_DELTA, a base that is no entry boundary, a
    base left out and no ``resolve``), :data:`_SLOW` when :func:`_compute` must do it (a
    base left out, to be written whole).

    An entry's shift (source offset minus output offset) is what was left out before it
    plus what the rewritten distances before it shrank by; a distance shrinks by the
    difference of its entry's and its base's shifts. The sizes of the new varints depend
    on shifts that depend on earlier varints, so the shifts are computed again from the
    shrinkage found until it no longer changes: each entry depends only on those before
    it, so this settles, in two or three rounds in practice (else the loop does it)."""
    ranks = np.frombuffer(order, dtype=np.uint32).astype(np.int64)
    n = len(ranks)
    offs = np.frombuffer(pack.sorted_offsets, dtype=np.uint64)
    starts = offs[ranks].astype(np.int64)
    stops = offs[ranks + 1].astype(np.int64)
    scan = scan_headers(pack, ranks, heads=True)
    if (scan.kinds == REF_DELTA).any():
        return None
    d = np.flatnonzero(scan.kinds == OFS_DELTA)  # entry indexes of the deltas
    base_off = scan.base_off[d]
    kb = np.searchsorted(starts, base_off, "left")  # the base's index among the selected
    found = np.minimum(kb, n - 1)
    selected_base = (kb < d) & (starts[found] == base_off)
    if not selected_base.all():
        all_offs = offs[: pack.count].astype(np.int64)
        base_rank = np.searchsorted(all_offs, base_off[~selected_base], "left")
        at = np.minimum(base_rank, pack.count - 1)
        if not ((base_rank < ranks[d[~selected_base]])
                & (all_offs[at] == base_off[~selected_base])).all():
            return None  # not an entry boundary: the copying path reports the damage
        return _SLOW if whole_allowed else None
    gaps = np.empty(n, dtype=np.int64)
    gaps[0] = starts[0]
    gaps[1:] = starts[1:] - stops[:-1]
    left_out = np.cumsum(gaps)  # the shift before any distance is rewritten
    old_len = scan.data_at[d] - scan.ofs_at[d]
    dist = starts[d] - base_off
    shrink = np.zeros(n, dtype=np.int64)
    for _ in range(_FIXED_POINT_ROUNDS):
        shift = left_out.copy()
        shift[1:] += np.cumsum(shrink)[:-1]
        moved = shift[d] - shift[kb]
        new_dist = dist - moved
        varint, new_len = _ofs_varint_bytes(new_dist)
        now = np.zeros(n, dtype=np.int64)
        now[d] = np.where(moved != 0, old_len - new_len, 0)
        if np.array_equal(now, shrink):
            break
        shrink = now
    else:
        return _SLOW
    rewritten = moved != 0
    rw = d[rewritten]  # entry indexes rewritten
    head_len = scan.ofs_at[rw] - starts[rw]
    assert scan.heads is not None
    heads = scan.heads[rewritten]
    # A rewritten entry's literal: its own type/size header, then its new distance.
    mask = np.concatenate([np.arange(HEAD_BYTES) < head_len[:, None],
                           np.arange(10) >= 10 - new_len[rewritten][:, None]], axis=1)
    literals = np.concatenate([heads, varint[rewritten]], axis=1)[mask].tobytes()
    lit_len = np.zeros(n, dtype=np.int64)
    lit_len[rw] = head_len + new_len[rewritten]
    opens = np.zeros(n, dtype=bool)  # a segment opens with this entry
    opens[0] = True
    opens[1:] = gaps[1:] != 0
    opens[rw] = True
    seg = np.flatnonzero(opens)
    # A segment a rewritten entry opens copies from after its old distance.
    seg_starts = np.where(lit_len[seg] > 0, scan.data_at[seg], starts[seg])
    seg_stops = np.empty(len(seg), dtype=np.int64)
    seg_stops[:-1] = stops[seg[1:] - 1]
    seg_stops[-1] = stops[-1]
    lit_at = np.zeros(len(seg) + 1, dtype=np.int64)
    np.cumsum(lit_len[seg], out=lit_at[1:])
    total = int(lit_at[-1])
    size = int(seg_stops.sum() - seg_starts.sum()) + total
    return Layout(order, as_array("Q", starts - shift), literals, as_array("Q", lit_at),
                  as_array("Q", seg_starts), as_array("Q", seg_stops), size, len(d), len(rw))


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
