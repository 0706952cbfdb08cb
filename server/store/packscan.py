"""The entry headers of many pack entries at once, parsed with numpy.

Two cold paths need a header per entry for a large part of a pack: the layout of a filtered
clone (``packgen/layout.py``: which entries are deltas, and against what) and the base rank
of every entry (``PackFile.base_ranks``). A Python step per entry costs about 1.5 µs, a
second for git/git's 841k entries. Here the pack is read in large windows and each
window's headers are decoded together: a varint is a few vector steps over every entry
whose varint is that long still (docs/ARCHITECTURE.md, "Cold path").
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .objformat import OBJ_BLOB, OFS_DELTA, REF_DELTA, TYPE_NAMES

__all__ = ["EntryScan", "scan_headers", "HEAD_BYTES", "large_whole_blobs"]

SCAN_WINDOW = 4 << 20  # pack bytes read at once, at most
SCAN_GAP = 64 << 10  # a gap between two headers this large is skipped, not read
_SLACK = 32  # read past the last header start in a window: a type/size + OFS varint fit
HEAD_BYTES = 10  # the longest type/size varint kept per entry (``heads``)
_VALID = np.zeros(8, dtype=bool)
_VALID[[*TYPE_NAMES, OFS_DELTA, REF_DELTA]] = True


class PackFile(Protocol):
    """What is read of a ``packs.PackFile`` (which uses this module: no import back)."""

    count: int
    hash_len: int

    @property
    def sorted_offsets(self) -> array: ...

    def read_into(self, view: memoryview, offset: int) -> int: ...

    def corrupt(self, detail: str) -> Exception: ...


@dataclass(slots=True)
class EntryScan:
    """Per entry asked for (ascending ranks): ``kinds`` the type number (6 OFS_DELTA, 7
    REF_DELTA); ``ofs_at`` the absolute offset just past the type/size varint;
    ``data_at`` where the zlib stream starts; ``base_off`` the absolute offset of an
    OFS_DELTA's base (-1 for other kinds); ``heads`` (when asked) the first
    :data:`HEAD_BYTES` bytes of each OFS_DELTA entry, in the order of those entries."""

    kinds: np.ndarray
    ofs_at: np.ndarray
    data_at: np.ndarray
    base_off: np.ndarray
    heads: np.ndarray | None


def _varint_ends(buf: np.ndarray, first: np.ndarray, at: np.ndarray) -> None:
    """Advance ``at`` past the rest of each type/size varint whose first byte is
    ``first`` (in place). Raises IndexError past the buffer or for a varint over 10
    bytes (both: a corrupt pack)."""
    todo = np.flatnonzero(first & 0x80)
    steps = 0
    while todo.size:
        steps += 1
        if steps >= HEAD_BYTES:  # a varint of 10 bytes is the longest
            raise IndexError("entry size varint too long")
        c = buf[at[todo]]
        at[todo] += 1
        todo = todo[(c & 0x80) != 0]


def _ofs_distances(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Decode the OFS_DELTA distance varints starting at ``at`` (advanced past them, in
    place): base-128, each continuation adding one (pack-format)."""
    c = buf[at]
    at += 1
    dist = (c & 0x7F).astype(np.int64)
    todo = np.flatnonzero(c & 0x80)
    steps = 0
    while todo.size:
        steps += 1
        if steps > 8:  # 9 bytes already exceed any pack offset
            raise IndexError("delta distance varint too long")
        c = buf[at[todo]]
        at[todo] += 1
        dist[todo] = ((dist[todo] + 1) << 7) | (c & 0x7F)
        todo = todo[(c & 0x80) != 0]
    return dist


def scan_headers(pack: PackFile, ranks: np.ndarray, heads: bool = False) -> EntryScan:
    """Parse the headers of entries ``ranks`` (ascending pack-order ranks) of ``pack``.

    A read covers the entries from the first one not read yet up to :data:`SCAN_WINDOW`
    bytes further, or up to a gap of :data:`SCAN_GAP` bytes between two headers (what
    a filter left out, a large blob), and ends just past the last header: the bytes of
    entries in between are read, not those of large ones (git/git's blob:none clone reads
    230 of the pack's 490 MB). Reads go into one buffer, reused. A header that is
    malformed or runs past the pack raises ``pack.corrupt(...)``."""
    offs = np.frombuffer(pack.sorted_offsets, dtype=np.uint64)
    starts = offs[ranks].astype(np.int64)
    n = len(starts)
    end_all = int(offs[pack.count])
    kinds = np.empty(n, dtype=np.uint8)
    ofs_at = np.empty(n, dtype=np.int64)
    data_at = np.empty(n, dtype=np.int64)
    base_off = np.full(n, -1, dtype=np.int64)
    head_parts: list[np.ndarray] = []
    breaks = np.flatnonzero(np.diff(starts) > SCAN_GAP) + 1  # a read starts at each
    room = bytearray(min(SCAN_WINDOW + _SLACK, max(end_all - int(starts[0]), 0) if n else 0))
    view = memoryview(room)
    i = 0
    try:
        while i < n:
            w0 = int(starts[i])
            j = int(np.searchsorted(starts, w0 + SCAN_WINDOW - _SLACK, "left"))
            k = int(np.searchsorted(breaks, i, "right"))
            if k < len(breaks):
                j = min(j, int(breaks[k]))
            j = max(j, i + 1)
            w1 = min(end_all, int(starts[j - 1]) + _SLACK)
            got = pack.read_into(view[: w1 - w0], w0)
            buf = np.frombuffer(room, dtype=np.uint8, count=got)
            rel = starts[i:j] - w0
            first = buf[rel]
            kind = (first >> 4) & 7
            if not _VALID[kind].all():
                bad = int(kind[~_VALID[kind]][0])
                raise pack.corrupt(f"bad object type {bad} in an entry header")
            at = rel + 1
            _varint_ends(buf, first, at)
            kinds[i:j] = kind
            ofs_at[i:j] = at + w0
            ofs = np.flatnonzero(kind == OFS_DELTA)
            if heads and ofs.size:
                cols = rel[ofs, None] + np.arange(HEAD_BYTES)
                head_parts.append(buf[np.minimum(cols, got - 1)])
            if ofs.size:
                q = at[ofs]
                dist = _ofs_distances(buf, q)
                at[ofs] = q
                base_off[i + ofs] = starts[i + ofs] - dist
            at[kind == REF_DELTA] += pack.hash_len
            data_at[i:j] = at + w0
            i = j
    except IndexError:
        raise pack.corrupt("truncated entry header") from None
    finally:
        view.release()
    joined = None
    if heads:
        joined = (np.concatenate(head_parts) if head_parts
                  else np.empty((0, HEAD_BYTES), dtype=np.uint8))
    return EntryScan(kinds, ofs_at, data_at, base_off, joined)


def base_ranks_of(pack: PackFile) -> np.ndarray:
    """Per pack-order rank: the rank itself for whole objects, the rank its base's offset
    falls at for OFS_DELTA (searched below the entry, as ``bisect_left``), -1 for
    REF_DELTA (int32)."""
    n = pack.count
    ranks = np.arange(n, dtype=np.int64)
    scan = scan_headers(pack, ranks)
    offs = np.frombuffer(pack.sorted_offsets, dtype=np.uint64)[:n].astype(np.int64)
    out = ranks.copy()
    ofs = np.flatnonzero(scan.kinds == OFS_DELTA)
    found = np.searchsorted(offs, scan.base_off[ofs], "left")
    out[ofs] = np.minimum(found, ofs)
    out[scan.kinds == REF_DELTA] = -1
    return out.astype(np.int32)


def large_whole_blobs(pack: PackFile, limit: int) -> list[tuple[int, int]]:
    """(rank, size) of every blob stored whole (not as a delta) in ``pack`` whose size is
    ``limit`` or more, in pack order. One vector pass over the headers: a size varint of
    ``L`` bytes holds less than ``2**(7L - 3)``, so only blobs whose varint is long enough
    have their header read again for the exact size."""
    n = pack.count
    if n == 0:
        return []
    scan = scan_headers(pack, np.arange(n, dtype=np.int64))
    starts = np.frombuffer(pack.sorted_offsets, dtype=np.uint64)[:n].astype(np.int64)
    lengths = scan.ofs_at - starts  # bytes of each type/size varint
    top = np.minimum(7 * lengths - 3, 62)  # log2 of the size such a varint cannot reach
    blobs = np.flatnonzero((scan.kinds == OBJ_BLOB) & ((np.int64(1) << top) > limit))
    out = []
    for rank in blobs.tolist():
        size = _header_size(pack, int(starts[rank]))
        if size >= limit:
            out.append((rank, size))
    return out


def _header_size(pack: PackFile, offset: int) -> int:
    buf = bytearray(HEAD_BYTES)
    got = pack.read_into(memoryview(buf), offset)
    size, shift = buf[0] & 0x0F, 4
    i = 0
    while buf[i] & 0x80 and i + 1 < got:
        i += 1
        size |= (buf[i] & 0x7F) << shift
        shift += 7
    return size
