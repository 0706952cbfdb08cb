"""A pack's layout for some of its entries (packgen/layout.py computes it) and the form in
which the closure store keeps a large one for the next process (store/closurestore.py).

A layout is a list of segments, each a few literal bytes (a rewritten entry header) and a
range of the pack, with where each entry lands in the output. It depends only on the pack
and the entries chosen, so it is stored by the pack's checksum and the entries' digest,
and its arrays are kept as they are in memory (this machine's byte order is part of the
record's identity).
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from ..store.closurestore import ClosureStore
from ..store.packs import PackFile

__all__ = ["Layout", "DISK_LAYOUT_ENTRIES", "disk_key", "encode_layout", "decode_layout",
           "load_layout"]


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


DISK_LAYOUT_ENTRIES = 4096  # smaller layouts cost less to compute than a file
_LAYOUT_HEAD = struct.Struct("<10Q")
_ARRAYS = ("ranks", "out_rel", "lit_at", "starts", "stops")


def disk_key(pack: PackFile, digest: bytes, resolve: bool, level: int) -> tuple[str, str, bytes]:
    """(scope, name, identity) of a layout: the pack's checksum and size, the ranks,
    whether entries may be written whole and at what compression, and this machine's
    byte order (the arrays are kept as they are in memory)."""
    scope = hashlib.sha256(os.path.dirname(pack.base).encode() + b"\0layouts").hexdigest()[:20]
    name = f"{pack.checksum.hex()[:16]}-layout{int(resolve)}-{digest.hex()}"
    identity = b"|".join((pack.checksum, str(pack.count).encode(), digest,
                          b"%d,%d,%s" % (resolve, level, sys.byteorder.encode())))
    return scope, name, identity


def encode_layout(layout: Layout) -> bytes:
    """A layout as the closure store keeps it: sizes, then the arrays and the literals."""
    arrays = [getattr(layout, name) for name in _ARRAYS]
    head = _LAYOUT_HEAD.pack(*(len(a) for a in arrays), len(layout.literals), layout.size,
                             layout.deltas, layout.rewritten, layout.generated)
    return b"".join([head, *(a.tobytes() for a in arrays), layout.literals])


def decode_layout(data: bytes, order: array) -> Layout | None:
    """The layout :func:`encode_layout` wrote for the entries ``order``; None when
    ``data`` is not one."""
    if len(data) < _LAYOUT_HEAD.size:
        return None
    *counts, n_lit, size, deltas, rewritten, generated = _LAYOUT_HEAD.unpack_from(data)
    at = _LAYOUT_HEAD.size
    arrays = []
    for code, n in zip("IQQQQ", counts, strict=True):
        a = array(code)
        end = at + n * a.itemsize
        if end > len(data):
            return None
        a.frombytes(data[at:end])
        arrays.append(a)
        at = end
    if at + n_lit != len(data) or arrays[0] != order:
        return None
    ranks, out_rel, lit_at, starts, stops = arrays
    return Layout(ranks, out_rel, data[at:], lit_at, starts, stops, size, deltas, rewritten,
                  generated)


def load_layout(disk: ClosureStore, where: tuple[str, str, bytes], order: array
                ) -> Layout | None:
    """The layout of ``order`` kept in ``disk`` under ``where`` (:func:`disk_key`), or
    None."""
    data = disk.load(*where, count_hit=False)
    if data is None:
        return None
    layout = decode_layout(data, order)
    if layout is None:
        disk.refuse(*where[:2])
    else:
        disk.accept(*where[:2])
    return layout
