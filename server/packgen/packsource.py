"""PackSource: where the bytes of an outgoing pack come from (ARCHITECTURE.md I5).

Fastest first:

* :class:`WholePackSource` sends one pack file verbatim when the object set is exactly its
  contents: header, entries and trailer as they are on disk.
* :class:`ReusePackSource` copies entries from the packs they live in. Runs of consecutive
  entries go out byte for byte; an entry is rewritten only when its bytes must change (an
  OFS_DELTA whose base moved, a REF_DELTA). Stored deltas are kept when their base is sent
  too or, for thin packs, when the client has it. Only objects nothing can be reused for
  (loose objects, deltas against bases nobody will have) are inflated and compressed.

Sources are plain iterators of ``bytes`` (pack data) and :class:`Progress` items, run in the
server's thread pool and pulled by the stream writer, so backpressure and cancellation come
for free: nothing is produced until the writer asks for it.
"""

from __future__ import annotations

import heapq
import os
import struct
import tempfile
import time
import zlib
from bisect import bisect_right
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..core.stats import PackStats, Progress
from ..store.bigobjects import INFLATE, LARGE_OBJECT, PIECE, iter_loose
from ..store.objformat import OBJ_TREE, OFS_DELTA, REF_DELTA, new_hash
from ..store.odb import ObjectSnapshot, PackedLocation
from ..store.packs import PackFile, encode_entry_header
from .delta import line_delta
from .layout import Layout, layout_for

__all__ = [
    "PackSource",
    "Progress",
    "PackStats",
    "WholePackSource",
    "ReusePackSource",
    "PackPlan",
    "Selection",
    "select_objects",
    "ThinCheck",
]

# Pack bytes handed to the writer per step, and read from a pack file per pread: what one
# request holds between steps is a few of these, whatever the object sizes
# (docs/ARCHITECTURE.md "Memory caps"). Under the fixed mmap threshold (app/memory.py,
# 128 KiB), so that each piece comes from the heap: 256 KiB pieces each got a map of their
# own, and streaming 27 MB cost 14 ms more in page faults. The writer pulls many per pool
# round trip (app/stream.py pull_items).
CHUNK = 64 << 10
READ_WINDOW = CHUNK
NEW_DELTA_SECONDS = 0.05  # CPU a pack may spend making new deltas (ReusePackSource),
NEW_DELTA_SECONDS_PER_OBJECT = 0.002  # plus this much for each object it holds
HINT_CHAIN = 4  # delta hints followed for a new delta's base (_new_delta_base)


class _EntryBody:
    """The compressed bytes of one pack entry, copied out a window at a time."""

    def __init__(self, pack: PackFile, start: int, end: int) -> None:
        self.pack, self.start, self.end = pack, start, end

    def copy(self, out: _Out) -> Iterator[None]:
        pos = self.start
        while pos < self.end:
            data = self.pack.read_raw(pos, min(self.end, pos + READ_WINDOW))
            if not data:
                raise self.pack.corrupt("file ended early")
            out.write(data)
            pos += len(data)
            if out.ready:
                yield None


class PackSource(Protocol):
    """An outgoing pack: its statistics, then its bytes as an iterator."""

    stats: PackStats

    def chunks(self) -> Iterator[bytes | Progress]: ...


class WholePackSource:
    """One pack file, sent as it is on disk (its own trailer included)."""

    def __init__(self, pack: PackFile) -> None:
        self.pack = pack
        self.stats = PackStats(objects=pack.count, verbatim=pack.count, kind="verbatim",
                               pack_reused=pack.count, reused=pack.count)

    def chunks(self) -> Iterator[bytes | Progress]:
        pos, end, fd = 0, self.pack.pack_size, self.pack.fd
        while pos < end:
            data = os.pread(fd, min(CHUNK, end - pos), pos)
            if not data:
                raise self.pack.corrupt("file shrank while being sent")
            pos += len(data)
            self.stats.size += len(data)
            self.stats.reused_bytes += len(data)
            yield data
        yield Progress(self.stats.total_line())


class _Out:
    """Pack bytes on their way out: small writes are gathered, large runs pass through;
    everything is hashed once for the trailer."""

    def __init__(self, hash_len: int) -> None:
        self.buf = bytearray()
        self.ready: list[bytes] = []
        self.hash = new_hash(hash_len)
        self.offset = 0

    def write(self, data: bytes | memoryview) -> None:
        self.buf += data
        self.offset += len(data)
        if len(self.buf) >= CHUNK:
            self._flush()

    def write_large(self, data: bytes) -> None:
        self._flush()
        self.hash.update(data)
        self.ready.append(data)
        self.offset += len(data)

    def _flush(self) -> None:
        if self.buf:
            data = bytes(self.buf)
            self.buf.clear()
            self.hash.update(data)
            self.ready.append(data)

    def drain(self, force: bool = False) -> list[bytes]:
        if force:
            self._flush()
        ready, self.ready = self.ready, []
        return ready


@dataclass
class PackPlan:
    """Entries sent from one source pack: ranks (pack order) ascending, and a flag array.

    While copying, ``runs`` records (first rank, last rank + 1, output offset) of entries
    copied byte for byte and ``single`` the output offsets of entries written one by one.
    """

    pack: PackFile
    order: list[int]
    selected: bytearray
    runs: list[tuple[int, int, int]] = field(default_factory=list)
    single: dict[int, int] = field(default_factory=dict)
    bases: Any = None  # the pack's base ranks, as many as this plan needs (base_ranks_for)
    layout: Layout | None = None  # when copied by layout (layout.py), from output ``layout_at``
    layout_at: int = 0

    @classmethod
    def from_ranks(cls, pack: PackFile, ranks: list[int]) -> PackPlan:
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
    """The objects of an outgoing pack: per source pack plans, then objects written whole."""

    plans: list[PackPlan]
    loose: list[bytes]

    @property
    def count(self) -> int:
        return sum(len(p.order) for p in self.plans) + len(self.loose)

    def fresh(self, packs: Iterable[PackFile] = ()) -> Selection:
        """A copy safe to send from (plans record output offsets while copying), reading
        from ``packs`` (the request's leased packs, by key) rather than from the objects a
        cached selection was made with, which may be closed since (store/registry.py)."""
        now = {p.key: p for p in packs}
        return Selection([PackPlan(now.get(p.pack.key, p.pack), p.order, p.selected)
                          for p in self.plans], list(self.loose))


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
    plans = []
    for key, pack in by_id.items():
        order = ranks.get(key, [])
        if key in grown or base is None:
            order = sorted(set(order))
        plans.append(PackPlan.from_ranks(pack, order))
    return Selection(plans, loose)


_STORED, _NEW = 0, 1  # what waits for its base: a stored delta, or a new delta to make

ThinCheck = Callable[[PackFile | None, int, bytes], bool]
"""(pack or None, rank or -1, oid) of a delta base -> True when the client has it."""


class ReusePackSource:
    """Copy reusable entries from the packs; generate the rest."""

    def __init__(
        self,
        odb: ObjectSnapshot,
        selection: Selection,
        *,
        ofs_delta: bool,
        thin: ThinCheck | None = None,
        delta_hints: dict[bytes, bytes] | None = None,
        compression: int = zlib.Z_DEFAULT_COMPRESSION,
        listed_only: bool = False,
    ) -> None:
        self.odb = odb
        self.selection = selection
        self.ofs_delta = ofs_delta
        self.thin = thin
        self.hints = delta_hints or {}
        self.compression = compression
        # Every object is listed, none planned (no pack's reverse index is needed): a
        # stored delta is kept when its base is known (see _write_listed).
        self.listed_only = listed_only
        # CPU seconds this pack may spend making new deltas (packgen/delta.py: about a
        # millisecond for a 69 KB file, plus reading the base); past the budget objects go
        # whole.
        self._delta_budget = NEW_DELTA_SECONDS + NEW_DELTA_SECONDS_PER_OBJECT * selection.count
        self.stats = PackStats(objects=selection.count, kind="reuse")
        self._written: dict[bytes, int] = {}  # objects written whole, by id
        self._done: list[PackPlan] = []
        # Entries of the pack being copied that were written here instead of reused (their
        # stored base is not sent): rank -> rank of the base they were deltified against in
        # that same pack, or None (whole, or a base outside it). With the stored bases of
        # the other entries, this is the output's delta graph, checked for cycles.
        self._regen: dict[int, int | None] = {}
        # Entries of the pack being copied that wait for their delta base, a later (or
        # itself waiting) entry of the same pack: base rank -> [(rank, kind)]. They are
        # written right after their base, so that every delta follows its base in the
        # output, as pack-objects writes them (DESIGN.md invariant 11): libgit2's and
        # isomorphic-git's indexers resolve deltas in pack order. ``_due`` holds the
        # waited-for ranks, so that a run copied byte for byte releases those in it.
        self._wait: dict[int, list[tuple[int, int]]] = {}
        self._due: list[int] = []

    def chunks(self) -> Iterator[bytes | Progress]:
        out = _Out(self.odb.hash_len)
        out.write(b"PACK" + struct.pack(">II", 2, self.selection.count))
        for plan in self.selection.plans:
            self._regen, self._wait, self._due = {}, {}, []
            for _ in self._copy_pack(plan, out):
                yield from out.drain()
            for _ in self._write_stranded(plan, out):
                yield from out.drain()
            self._done.append(plan)
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

    def _copy_pack(self, plan: PackPlan, out: _Out) -> Iterator[None]:
        """Copy each run of consecutive selected entries; yield after each run and after
        every :data:`READ_WINDOW` bytes of one. When every delta's base comes along, by
        the plan's precomputed layout instead."""
        thin_hints = self.thin is not None and bool(self.hints)
        if self.ofs_delta and not thin_hints:
            # Entries whose base is not sent are written whole by the layout only when no
            # better base exists: a thin pack refers to the client's, hints give new deltas.
            resolve = self.odb.read if self.thin is None and not self.hints else None
            layout = layout_for(plan.pack, plan.order, resolve, self.compression)
            if layout is not None:
                yield from self._copy_layout(plan, layout, out)
                return
        bases = plan.bases = plan.pack.base_ranks_for(len(plan.order))
        order = plan.order
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
                    if not (thin_hints and self._thin_hinted(plan, rank)):
                        continue  # a whole object
                elif base >= sub and self.ofs_delta:
                    continue  # a delta against an entry of this run
                # Without ofs-delta, a stored OFS_DELTA goes out as a REF_DELTA (_copy_one).
                yield from self._copy_run(plan, sub, rank, out)
                yield from self._release_run(plan, sub, rank, out)
                if (yield from self._copy_one(plan, rank, out)):
                    yield from self._release(plan, [rank], out)
                sub = rank + 1
            yield from self._copy_run(plan, sub, stop, out)
            yield from self._release_run(plan, sub, stop, out)
            yield None

    def _copy_layout(self, plan: PackPlan, layout: Layout, out: _Out) -> Iterator[None]:
        """Emit a layout: one read per window, its segments joined in one step."""
        plan.layout, plan.layout_at = layout, out.offset
        pack = plan.pack
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
    def _copy_range(pack: PackFile, pos: int, end: int, out: _Out) -> Iterator[None]:
        """One large entry, a window at a time (docs/ARCHITECTURE.md "Memory caps")."""
        while pos < end:
            data = pack.read_raw(pos, min(end, pos + READ_WINDOW))
            if not data:
                raise pack.corrupt("file ended early")
            out.write_large(data)
            pos += len(data)
            if out.ready:
                yield None

    def _copy_run(self, plan: PackPlan, first: int, stop: int, out: _Out) -> Iterator[None]:
        if first >= stop:
            return
        pack = plan.pack
        offs = pack.sorted_offsets
        bases = plan.bases if plan.bases is not None else pack.base_ranks()
        plan.runs.append((first, stop, out.offset))
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

    def _copy_one(self, plan: PackPlan, rank: int, out: _Out,
                  may_defer: bool = True) -> Generator[None, None, bool]:
        """An entry whose bytes change: a moved OFS_DELTA base, or a REF_DELTA. Returns
        False when it waits for its base instead (see ``_wait``)."""
        pack = plan.pack
        offs = pack.sorted_offsets
        start = offs[rank]
        hdr = pack.parse_header(pack.read_raw(start, min(start + 64, offs[rank + 1])), start)
        if hdr.type_num not in (OFS_DELTA, REF_DELTA):
            yield from self._delta_or_copy(plan, rank, out)
            return True
        body = _EntryBody(pack, hdr.data_offset, offs[rank + 1])
        if hdr.type_num == OFS_DELTA:
            base_rank = (plan.bases if plan.bases is not None else pack.base_ranks())[rank]
            base_oid = pack.oid_at(pack.pack_order[base_rank])
        else:
            if hdr.base_oid is None:
                raise pack.corrupt(f"entry at {start} is no delta")
            base_oid = hdr.base_oid
            base_rank = plan.rank_of(base_oid)
        base_at = self._written_before(plan, base_rank, base_oid)
        before = out.offset
        if base_at is not None:
            plan.single[rank] = before
            self._emit_delta(out, hdr.size, base_at, base_oid)
            yield from body.copy(out)
            self.stats.reused_bytes += out.offset - before
        elif may_defer and self._may_wait(plan, base_rank, rank):
            # A base this pack sends further on (a REF_DELTA that index-pack --fix-thin
            # left before the bases it appended, or a base that waits itself): the stored
            # delta goes out right after it.
            self._defer(base_rank, rank, _STORED)
            return False
        elif self.thin is not None and self.thin(pack, base_rank, base_oid):
            # One the client has (thin pack): REF_DELTA, which can never form a cycle.
            plan.single[rank] = before
            out.write(encode_entry_header(REF_DELTA, hdr.size, base_oid))
            yield from body.copy(out)
            self._count_delta()
            self.stats.reused_bytes += out.offset - before
        else:
            return (yield from self._write_whole(pack.oid_at(pack.pack_order[rank]), out, plan,
                                                 rank, may_defer=may_defer))
        return True

    def _delta_or_copy(self, plan: PackPlan, rank: int, out: _Out) -> Iterator[None]:
        """An entry stored whole (:meth:`_thin_hinted`): a new delta against its hint when
        one comes out small enough, else the stored bytes as they are."""
        pack = plan.pack
        oid = pack.oid_at(pack.pack_order[rank])
        start = out.offset
        loc = self.odb.locate(oid, needed=True)
        size = self.odb.packed_size(loc.pack, loc.offset)[1] \
            if isinstance(loc, PackedLocation) else LARGE_OBJECT + 1
        if size <= LARGE_OBJECT:
            type_num, data = self.odb.read(oid)
            if self._write_new_delta(oid, type_num, data, out, plan, rank):
                self._written[oid] = start
                self.stats.generated += 1
                self.stats.generated_bytes += out.offset - start
                return
        yield from self._copy_run(plan, rank, rank + 1, out)

    def _thin_hinted(self, plan: PackPlan, rank: int) -> bool:
        """A thin pack's entry stored whole with a delta base at hand: a hint (the same
        path in the tree the walk diffed against) that the client has or that went out
        already. It goes out as a new delta, as pack-objects --thin finds them among its
        preferred bases: most of what C git sends for a fetch or a deepen is such deltas."""
        if self._delta_budget <= 0:
            return False
        oid = plan.pack.oid_at(plan.pack.pack_order[rank])
        return oid in self.hints and self._new_delta_base(oid, plan, rank) is not None

    # -- deltas after their bases ----------------------------------------------

    def _may_wait(self, plan: PackPlan, base_rank: int, rank: int) -> bool:
        """Entry ``rank`` can wait for ``base_rank``: an entry this pack sends and has not
        written yet, whose delta chain in the output does not lead back to ``rank``."""
        return (0 <= base_rank != rank and bool(plan.selected[base_rank])
                and self._chain_avoids(plan, base_rank, rank))

    def _defer(self, base_rank: int, rank: int, kind: int) -> None:
        self._regen[rank] = base_rank
        self._wait.setdefault(base_rank, []).append((rank, kind))
        heapq.heappush(self._due, base_rank)

    def _release_run(self, plan: PackPlan, first: int, stop: int, out: _Out) -> Iterator[None]:
        """Write what waited for entries ``first`` to ``stop`` - 1, just copied as a run."""
        ready = []
        while self._due and self._due[0] < stop:
            base = heapq.heappop(self._due)
            if base >= first and base in self._wait:
                ready.append(base)
        if ready:
            yield from self._release(plan, ready, out)

    def _release(self, plan: PackPlan, written: list[int], out: _Out) -> Iterator[None]:
        """Write the entries that waited for ``written``, then those that waited for them,
        and so on (a stack, not recursion: a file's versions can chain thousands deep)."""
        stack = list(written)
        while stack:
            for rank, kind in self._wait.pop(stack.pop(), ()):
                if kind == _STORED:
                    yield from self._copy_one(plan, rank, out, may_defer=False)
                else:
                    oid = plan.pack.oid_at(plan.pack.pack_order[rank])
                    yield from self._write_whole(oid, out, plan, rank, may_defer=False)
                stack.append(rank)

    def _write_stranded(self, plan: PackPlan, out: _Out) -> Iterator[None]:
        """Entries still waiting once their pack is copied (none, unless the bases they
        waited for were never written): whole, or against a base written meanwhile."""
        while self._wait:
            base = next(iter(self._wait))
            for rank, _ in self._wait.pop(base):
                self._regen[rank] = None
                oid = plan.pack.oid_at(plan.pack.pack_order[rank])
                yield from self._write_whole(oid, out, plan, rank, may_defer=False)
                yield from self._release(plan, [rank], out)

    def _written_before(self, plan: PackPlan, base_rank: int, oid: bytes) -> int | None:
        """Where the base went in the output, if it was written already."""
        if 0 <= base_rank and plan.selected[base_rank]:
            at = plan.out_offset(base_rank)
            if at is not None:
                return at
            # The base was written here, but whole or as a new delta (its own stored base
            # was not sent): it is still in the output, so deltas against it stay reusable.
            # Giving up here made every delta below such a base be regenerated in turn.
        return self._find_written(oid)

    def _emit_delta(self, out: _Out, size: int, base_at: int, base_oid: bytes) -> None:
        """The header of a reused delta (its body follows)."""
        if self.ofs_delta:
            out.write(encode_entry_header(OFS_DELTA, size, out.offset - base_at))
        else:
            out.write(encode_entry_header(REF_DELTA, size, base_oid))
        self._count_delta()

    def _count_delta(self) -> None:
        self.stats.reused += 1
        self.stats.reused_deltas += 1
        self.stats.deltas += 1

    def _write_whole(self, oid: bytes, out: _Out, plan: PackPlan | None = None,
                     rank: int = -1, loc: PackedLocation | str | None = None,
                     may_defer: bool = False) -> Generator[None, None, bool]:
        """Write an object nothing could be reused for: as a new delta against the object
        at the same path in the parent commit when that base is sent too or the client has
        it (a thin pack), else whole. ``plan``/``rank`` say where it sits when it is an
        entry of the pack being copied. Objects over :data:`LARGE_OBJECT` go whole and in
        pieces: a loose one inflated and deflated as it is read, a packed delta resolved
        under the ``--inflate-memory`` budget and deflated to a temporary file that is then
        copied out (so nothing of it waits in memory for a slow client).

        With ``may_defer``, an entry whose delta hint is an entry of the same pack not yet
        written waits for it instead (returns False): it goes out right after its base."""
        if may_defer and plan is not None and self._delta_budget > 0:
            hint = self.hints.get(oid)
            base_rank = plan.rank_of(hint) if hint is not None else -1
            if (base_rank >= 0 and plan.selected[base_rank] and hint not in self._written
                    and plan.out_offset(base_rank) is None
                    and self._may_wait(plan, base_rank, rank)):
                self._defer(base_rank, rank, _NEW)
                return False
        start = self._written[oid] = out.offset
        self.stats.generated += 1
        if plan is not None:
            self._regen[rank] = None
        if loc is None:  # not located by the caller
            loc = self.odb.locate(oid, needed=True)
        type_num, data = 0, None
        size = self.odb.packed_size(loc.pack, loc.offset)[1] \
            if isinstance(loc, PackedLocation) else 0
        if isinstance(loc, str):
            type_num, data = yield from self._write_loose(oid, loc, out)
        elif size > LARGE_OBJECT:
            yield from self._write_spilled(oid, size, out)
        else:
            type_num, data = self.odb.read(oid)
        if data is not None and not self._write_new_delta(oid, type_num, data, out, plan, rank):
            out.write(encode_entry_header(type_num, len(data)))
            out.write(zlib.compress(data, self.compression))
        self.stats.generated_bytes += out.offset - start
        return True

    def _write_listed(self, oid: bytes, out: _Out) -> Iterator[None]:
        """An object outside any plan: loose, or (``listed_only``) any object."""
        loc = None
        if self.listed_only:
            loc = self.odb.locate(oid, needed=True)
            if isinstance(loc, PackedLocation) and self._keep_stored_delta(oid, loc, out):
                return
        yield from self._write_whole(oid, out, loc=loc)

    def _keep_stored_delta(self, oid: bytes, loc: PackedLocation, out: _Out) -> bool:
        """With ``listed_only``: send a stored delta as it is (inflated and deflated again,
        since the entry's end is not known without the reverse index) when its base went
        out earlier in this pack or the client has it. Without the reverse index, the base
        of an OFS_DELTA is known only when it is the object's delta hint (the object at the
        same path in the parent commit); a REF_DELTA names its base."""
        pack = loc.pack
        hdr = pack.read_header(loc.offset)
        if hdr.type_num == REF_DELTA:
            base = hdr.base_oid
        elif hdr.type_num == OFS_DELTA:
            base = self.hints.get(oid)
            pos = pack.find(base) if base is not None else -1
            if pos < 0 or pack.offset_at(pos) != hdr.base_offset:
                return False
        else:
            return False
        assert base is not None
        at = self._written.get(base)
        if hdr.size > LARGE_OBJECT or (
                at is None and (self.thin is None or not self.thin(None, -1, base))):
            return False
        start = self._written[oid] = out.offset
        if at is not None and self.ofs_delta:
            out.write(encode_entry_header(OFS_DELTA, hdr.size, start - at))
        else:
            out.write(encode_entry_header(REF_DELTA, hdr.size, base))
        out.write(zlib.compress(pack.inflate(hdr), self.compression))
        self._count_delta()  # a stored delta reused, though deflated again
        self.stats.reused_bytes += out.offset - start
        return True

    def _write_loose(self, oid: bytes, path: str,
                     out: _Out) -> Generator[None, None, tuple[int, bytes | None]]:
        """A loose object: returns (type, content) when small, to be written as any other
        object; a large one is written here, deflated piece by piece as it is inflated,
        and None comes back as its content."""
        hit = self.odb.cached_loose(oid)
        if hit is not None:
            return hit
        pieces = iter_loose(self.odb.fs, path, oid)
        try:
            type_num, size = next(pieces)  # type: ignore[misc]
        except FileNotFoundError:  # packed away meanwhile: read it from where it is now
            return self.odb.read(oid)
        if size <= LARGE_OBJECT:
            data = b"".join(pieces)  # type: ignore[arg-type]
            self.odb.keep_loose(oid, type_num, data)
            return type_num, data
        out.write(encode_entry_header(type_num, size))
        z = zlib.compressobj(self.compression)
        for piece in pieces:
            out.write(z.compress(piece))  # type: ignore[arg-type]
            if out.ready:
                yield None
        out.write(z.flush())
        return type_num, None

    def _write_spilled(self, oid: bytes, size: int, out: _Out) -> Iterator[None]:
        """A large packed delta resolved whole (within the budget), deflated to a
        temporary file; the budget is free again before the first piece goes out."""
        with tempfile.TemporaryFile(prefix="gitspout-") as spill:
            with INFLATE.hold(2 * size):  # the object and its delta base
                type_num, data = self.odb.read(oid)
                z = zlib.compressobj(self.compression)
                view = memoryview(data)
                for at in range(0, len(view), PIECE):
                    spill.write(z.compress(view[at:at + PIECE]))
                spill.write(z.flush())
                length = len(data)
                del data, view
            out.write(encode_entry_header(type_num, length))
            spill.seek(0)
            while piece := spill.read(CHUNK):
                out.write_large(piece)
                yield None

    def _write_new_delta(self, oid: bytes, type_num: int, data: bytes, out: _Out,
                         plan: PackPlan | None, rank: int) -> bool:
        if len(data) < 64 or self._delta_budget <= 0:
            return False
        found = self._new_delta_base(oid, plan, rank)
        if found is None:
            return False
        base, base_at, base_rank = found
        in_plan = base_rank >= 0
        base_type, base_data = self.odb.read(base)
        if base_type != type_num:
            return False
        started = time.process_time()
        delta = line_delta(base_data, data, len(data) // 2, b"\0" if type_num == OBJ_TREE else b"\n")
        self._delta_budget -= time.process_time() - started
        if delta is None:
            return False
        if base_at is not None and self.ofs_delta:
            out.write(encode_entry_header(OFS_DELTA, len(delta), out.offset - base_at))
        else:
            out.write(encode_entry_header(REF_DELTA, len(delta), base))
        out.write(zlib.compress(delta, self.compression))
        self.stats.deltas += 1
        if in_plan:
            self._regen[rank] = base_rank
        return True

    def _new_delta_base(self, oid: bytes, plan: PackPlan | None,
                        rank: int) -> tuple[bytes, int | None, int] | None:
        """A base for a new delta of ``oid``: its delta hint (the object at the same path
        in the tree the walk diffed against), or that one's hint, and so on
        (:data:`HINT_CHAIN` steps), the first that is written already or that the client
        has (a thin pack). (base, its output offset or None, its rank in ``plan`` or -1).

        The chain matters for a deepen: a file's older version is usually stored as a
        delta of the newer one, which is sent too, so the older one cannot take the newer
        as its base (a cycle) but can take the version before that, or the client's."""
        base = self.hints.get(oid)
        for _ in range(HINT_CHAIN):
            if base is None:
                return None
            base_rank = plan.rank_of(base) if plan is not None else -1
            if plan is not None and base_rank >= 0 and plan.selected[base_rank]:
                # An entry of the pack being copied, written before this one (an entry
                # whose base comes later waited for it: _write_whole), unless the base's
                # own chain in the output leads back here.
                base_at = plan.out_offset(base_rank)
                if base_at is None:
                    base_at = self._written.get(base)
                if base_at is not None and self._chain_avoids(plan, base_rank, rank):
                    return base, base_at, base_rank
            else:
                base_at = self._find_written(base)
                if base_at is not None or (self.thin is not None and self.thin(None, -1, base)):
                    return base, base_at, -1
            base = self.hints.get(base)
        return None

    def _chain_avoids(self, plan: PackPlan, start: int, target: int) -> bool:
        """True when the delta chain of entry ``start`` in the output cannot reach entry
        ``target``, so that ``target`` may be deltified against ``start``.

        Every entry keeps its stored base when that base is sent (copied or rewritten, the
        base stays); entries written here follow the base recorded in ``_regen``. An entry
        still to be written whose stored base is not sent will choose its base later with
        this same check, which sees the edge added now, so it cannot close a cycle either.
        """
        bases = plan.bases if plan.bases is not None else plan.pack.base_ranks()
        r = start
        for _ in range(plan.pack.count + 1):
            if r == target:
                return False
            if r in self._regen:
                nxt = self._regen[r]
                if nxt is None:
                    return True
                r = nxt
                continue
            b = bases[r]
            if b < 0:
                return False  # a stored REF_DELTA: its base is not looked up here
            if b == r or not plan.selected[b]:
                # Whole, or written against something outside this pack (thin base), or
                # to be decided later (see above).
                return True
            r = b
        return False

    def _find_written(self, oid: bytes) -> int | None:
        at = self._written.get(oid)
        if at is not None:
            return at
        for done in self._done:
            r = done.rank_of(oid)
            if r >= 0 and done.selected[r]:
                return done.out_offset(r)
        return None
