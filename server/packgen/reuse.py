"""Copy an outgoing pack's entries from the packs they live in (ARCHITECTURE.md I5).

Runs of consecutive entries go out byte for byte; an entry is rewritten only when its bytes
must change (an OFS_DELTA whose base moved, a REF_DELTA). Stored deltas are kept when their
base is sent too or, for thin packs, when the client has it. Only objects nothing can be
reused for (loose objects, deltas against bases nobody will have) are inflated and
compressed (:mod:`.writer`). When every delta's base comes along, a pack's entries are
copied by a precomputed layout (:mod:`.layout`).
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Generator, Iterator

from ..store.bigobjects import LARGE_OBJECT
from ..store.objformat import OFS_DELTA, REF_DELTA
from ..store.odb import PackedLocation
from ..store.packentry import encode_entry_header
from ..store.packs import PackFile
from .layout import layout_for
from .layoutrecord import Layout
from .selection import SelectedPack
from .sources import CHUNK, PackOut
from .stats import Progress
from .writer import STORED, EntryWriter

__all__ = ["ReusePackSource", "READ_WINDOW"]

READ_WINDOW = CHUNK  # pack bytes read at once while copying entries


class EntryBody:
    """The compressed bytes of one pack entry, copied out a window at a time."""

    def __init__(self, pack: PackFile, start: int, end: int) -> None:
        self.pack, self.start, self.end = pack, start, end

    def copy(self, out: PackOut) -> Iterator[None]:
        pos = self.start
        while pos < self.end:
            data = self.pack.read_raw(pos, min(self.end, pos + READ_WINDOW))
            if not data:
                raise self.pack.corrupt("file ended early")
            out.write(data)
            pos += len(data)
            if out.ready:
                yield None


class ReusePackSource(EntryWriter):
    """Copy reusable entries from the packs; generate the rest."""

    def chunks(self) -> Iterator[bytes | Progress]:
        out = PackOut(self.odb.hash_len)
        out.write(b"PACK" + struct.pack(">II", 2, self.selection.count))
        for part in self.selection.parts:
            self._regen, self._wait, self._due = {}, {}, []
            for _ in self._copy_pack(part, out):
                yield from out.drain()
            for _ in self._write_stranded(part, out):
                yield from out.drain()
            self._done.append(part)
        self._regen = {}
        for oid in self.selection.loose:
            for _ in self._write_listed(oid, out):
                yield from out.drain()
        yield from out.drain(force=True)
        trailer = out.hash.digest()
        self.stats.size = out.offset + len(trailer)
        yield trailer
        yield Progress(self.stats.total_line())

    # -- copying ---------------------------------------------------------------

    def _copy_pack(self, part: SelectedPack, out: PackOut) -> Iterator[None]:
        """Copy each run of consecutive selected entries; yield after each run and after
        every :data:`READ_WINDOW` bytes of one. When every delta's base comes along, by
        the part's precomputed layout instead."""
        thin_hints = self.thin is not None and bool(self.hints)
        if self.ofs_delta and not thin_hints:
            # Entries whose base is not sent are written whole by the layout only when no
            # better base exists: a thin pack refers to the client's, hints give new deltas.
            resolve = self.odb.read if self.thin is None and not self.hints else None
            layout = layout_for(part.pack, part.order, resolve, self.compression, self.layouts,
                                    self.layout_disk)
            if layout is not None:
                yield from self._copy_layout(part, layout, out)
                return
        bases = part.bases = part.pack.base_ranks_for(len(part.order))
        order = part.order
        k, n = 0, len(order)
        while k < n:
            first = order[k]
            stop = first + 1
            k += 1
            while k < n and order[k] == stop:
                stop += 1
                k += 1
            sub = first
            for rank in range(first, stop):
                base = bases[rank]
                if base == rank:
                    if not (thin_hints and self._thin_hinted(part, rank)):
                        continue  # a whole object
                elif base >= sub and self.ofs_delta:
                    continue  # a delta against an entry of this run
                # Without ofs-delta, a stored OFS_DELTA goes out as a REF_DELTA (_copy_one).
                yield from self._copy_run(part, sub, rank, out)
                yield from self._release_run(part, sub, rank, out)
                if (yield from self._copy_one(part, rank, out)):
                    yield from self._release(part, [rank], out)
                sub = rank + 1
            yield from self._copy_run(part, sub, stop, out)
            yield from self._release_run(part, sub, stop, out)
            yield None

    def _copy_layout(self, part: SelectedPack, layout: Layout, out: PackOut) -> Iterator[None]:
        """Emit a layout: one read per window, its segments joined in one step."""
        part.layout, part.layout_at = layout, out.offset
        pack = part.pack
        lits, lit_at, starts, stops = layout.literals, layout.lit_at, layout.starts, layout.stops
        n = len(starts)
        k = 0
        while k < n:
            first = starts[k]
            if stops[k] - first > READ_WINDOW:  # one large entry: in pieces
                if lit_at[k + 1] > lit_at[k]:
                    out.write(lits[lit_at[k] : lit_at[k + 1]])
                yield from self._copy_range(pack, first, stops[k], out)
                k += 1
                yield None
                continue
            end = min(first + READ_WINDOW, pack.pack_size)
            data = pack.read_raw(first, end)
            if len(data) < stops[k] - first:
                raise pack.corrupt("file ended early")
            end = first + len(data)
            view = memoryview(data)
            parts: list[bytes | memoryview] = []
            while k < n and stops[k] <= end:
                l0, l1 = lit_at[k], lit_at[k + 1]
                if l1 > l0:
                    parts.append(lits[l0:l1])
                parts.append(view[starts[k] - first : stops[k] - first])
                k += 1
            out.write_large(b"".join(parts))
            yield None
        stats = self.stats
        stats.reused += len(layout.ranks) - layout.generated
        stats.generated += layout.generated
        stats.reused_bytes += layout.size
        stats.reused_deltas += layout.deltas
        stats.deltas += layout.deltas

    @staticmethod
    def _copy_range(pack: PackFile, pos: int, end: int, out: PackOut) -> Iterator[None]:
        """One large entry, a window at a time (docs/ARCHITECTURE.md "Memory caps")."""
        while pos < end:
            data = pack.read_raw(pos, min(end, pos + READ_WINDOW))
            if not data:
                raise pack.corrupt("file ended early")
            out.write_large(data)
            pos += len(data)
            if out.ready:
                yield None

    def _copy_run(self, part: SelectedPack, first: int, stop: int, out: PackOut) -> Iterator[None]:
        if first >= stop:
            return
        pack = part.pack
        offs = pack.sorted_offsets
        bases = part.bases if part.bases is not None else pack.base_ranks()
        part.runs.append((first, stop, out.offset))
        deltas = sum(1 for r in range(first, stop) if bases[r] != r)
        self.stats.reused += stop - first
        self.stats.reused_bytes += offs[stop] - offs[first]
        self.stats.reused_deltas += deltas
        self.stats.deltas += deltas
        pos, end = offs[first], offs[stop]
        while pos < end:
            data = pack.read_raw(pos, min(end, pos + READ_WINDOW))
            if not data:
                raise pack.corrupt("file ended early")
            if len(data) >= CHUNK // 4:
                out.write_large(data)
            else:
                out.write(data)
            pos += len(data)
            if out.ready:
                yield None

    def _copy_one(self, part: SelectedPack, rank: int, out: PackOut,
                  may_defer: bool = True) -> Generator[None, None, bool]:
        """An entry whose bytes change: a moved OFS_DELTA base, or a REF_DELTA. Returns
        False when it waits for its base instead (see ``_wait``)."""
        pack = part.pack
        offs = pack.sorted_offsets
        start = offs[rank]
        hdr = pack.parse_header(pack.read_raw(start, min(start + 64, offs[rank + 1])), start)
        if hdr.type_num not in (OFS_DELTA, REF_DELTA):
            yield from self._delta_or_copy(part, rank, out)
            return True
        body = EntryBody(pack, hdr.data_offset, offs[rank + 1])
        if hdr.type_num == OFS_DELTA:
            base_rank = (part.bases if part.bases is not None else pack.base_ranks())[rank]
            base_oid = pack.oid_at(pack.pack_order[base_rank])
        else:
            if hdr.base_oid is None:
                raise pack.corrupt(f"entry at {start} is no delta")
            base_oid = hdr.base_oid
            base_rank = part.rank_of(base_oid)
        base_at = self._written_before(part, base_rank, base_oid)
        before = out.offset
        if base_at is not None:
            part.single[rank] = before
            self._emit_delta(out, hdr.size, base_at, base_oid)
            yield from body.copy(out)
            self.stats.reused_bytes += out.offset - before
        elif may_defer and self._may_wait(part, base_rank, rank):
            # A base this pack sends further on (a REF_DELTA that index-pack --fix-thin
            # left before the bases it appended, or a base that waits itself): the stored
            # delta goes out right after it.
            self._defer(base_rank, rank, STORED)
            return False
        elif self.thin is not None and self.thin(pack, base_rank, base_oid):
            # One the client has (thin pack): REF_DELTA, which can never form a cycle.
            part.single[rank] = before
            out.write(encode_entry_header(REF_DELTA, hdr.size, base_oid))
            yield from body.copy(out)
            self._count_delta()
            self.stats.reused_bytes += out.offset - before
        else:
            return (yield from self._write_whole(pack.oid_at(pack.pack_order[rank]), out, part,
                                                 rank, may_defer=may_defer))
        return True

    # -- deltas after their bases ----------------------------------------------

    def _thin_hinted(self, part: SelectedPack, rank: int) -> bool:
        """A thin pack's entry stored whole with a delta base at hand: a hint (the same
        path in the tree the walk diffed against) that the client has or that went out
        already. It goes out as a new delta, as pack-objects --thin finds them among its
        preferred bases: most of what C git sends for a fetch or a deepen is such deltas."""
        if self._delta_budget <= 0:
            return False
        oid = part.pack.oid_at(part.pack.pack_order[rank])
        if oid not in self.hints and oid not in self._newer_versions():
            return False
        return self._new_delta_base(oid, part, rank) is not None

    def _delta_or_copy(self, part: SelectedPack, rank: int, out: PackOut) -> Iterator[None]:
        """An entry stored whole (:meth:`_thin_hinted`): a new delta against its hint when
        one comes out small enough, else the stored bytes as they are."""
        pack = part.pack
        oid = pack.oid_at(pack.pack_order[rank])
        start = out.offset
        loc = self.odb.locate(oid, needed=True)
        size = self.odb.packed_size(loc.pack, loc.offset)[1] \
            if isinstance(loc, PackedLocation) else LARGE_OBJECT + 1
        if size <= LARGE_OBJECT:
            type_num, data = self.odb.read(oid)
            if self._write_new_delta(oid, type_num, data, out, part, rank):
                self._written[oid] = start
                self.stats.generated += 1
                self.stats.generated_bytes += out.offset - start
                return
        yield from self._copy_run(part, rank, rank + 1, out)

    def _release_run(self, part: SelectedPack, first: int, stop: int, out: PackOut) -> Iterator[None]:
        """Write what waited for entries ``first`` to ``stop`` - 1, just copied as a run."""
        ready = []
        while self._due and self._due[0] < stop:
            base = heapq.heappop(self._due)
            if base >= first and base in self._wait:
                ready.append(base)
        if ready:
            yield from self._release(part, ready, out)

    def _release(self, part: SelectedPack, written: list[int], out: PackOut) -> Iterator[None]:
        """Write the entries that waited for ``written``, then those that waited for them,
        and so on (a stack, not recursion: a file's versions can chain thousands deep)."""
        stack = list(written)
        while stack:
            for rank, kind in self._wait.pop(stack.pop(), ()):
                if kind == STORED:
                    yield from self._copy_one(part, rank, out, may_defer=False)
                else:
                    oid = part.pack.oid_at(part.pack.pack_order[rank])
                    yield from self._write_whole(oid, out, part, rank, may_defer=False)
                stack.append(rank)

    def _write_stranded(self, part: SelectedPack, out: PackOut) -> Iterator[None]:
        """Entries still waiting once their pack is copied (none, unless the bases they
        waited for were never written): whole, or against a base written meanwhile."""
        while self._wait:
            base = next(iter(self._wait))
            for rank, _ in self._wait.pop(base):
                self._regen[rank] = None
                oid = part.pack.oid_at(part.pack.pack_order[rank])
                yield from self._write_whole(oid, out, part, rank, may_defer=False)
                yield from self._release(part, [rank], out)

    def _written_before(self, part: SelectedPack, base_rank: int, oid: bytes) -> int | None:
        """Where the base went in the output, if it was written already."""
        if 0 <= base_rank and part.selected[base_rank]:
            at = part.out_offset(base_rank)
            if at is not None:
                return at
            # The base was written here, but whole or as a new delta (its own stored base
            # was not sent): it is still in the output, so deltas against it stay reusable.
            # Giving up here made every delta below such a base be regenerated in turn.
        return self._find_written(oid)

    def _emit_delta(self, out: PackOut, size: int, base_at: int, base_oid: bytes) -> None:
        """The header of a reused delta (its body follows)."""
        if self.ofs_delta:
            out.write(encode_entry_header(OFS_DELTA, size, out.offset - base_at))
        else:
            out.write(encode_entry_header(REF_DELTA, size, base_oid))
        self._count_delta()
