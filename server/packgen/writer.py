"""Writing the entries of an outgoing pack that cannot be copied as they are: objects
written whole (loose, or large ones in pieces), new deltas against the object at the same
path in the parent commit, and stored deltas kept though their entry is not copied. It
also keeps the output's delta graph (what each entry written here is a delta against)
and what waits for its base, so that every delta follows its base (DESIGN.md invariant
11). :class:`~.reuse.ReusePackSource` builds on it.
"""

from __future__ import annotations

import heapq
import tempfile
import time
import zlib
from collections.abc import Callable, Generator, Iterator

from ..store.bigobjects import LARGE_OBJECT, PIECE, ByteBudget, iter_loose
from ..store.closurestore import ClosureStore
from ..store.lru import ByteLRU
from ..store.objformat import OBJ_TREE, OFS_DELTA, REF_DELTA
from ..store.odb import ObjectSnapshot, PackedLocation
from ..store.packentry import encode_entry_header
from .delta import line_delta
from .layoutrecord import Layout
from .selection import SelectedPack, Selection, ThinCheck
from .sources import CHUNK, PackOut
from .stats import PackStats

__all__ = ["EntryWriter", "STORED", "NEW"]

NEW_DELTA_SECONDS = 0.05  # CPU a pack may spend making new deltas (ReusePackSource),
NEW_DELTA_SECONDS_PER_OBJECT = 0.002  # plus this much for each object it holds
STORED, NEW = 0, 1  # what waits for its base: a stored delta, or a new delta to make
HINT_CHAIN = 4  # delta hints followed for a new delta's base (_new_delta_base)


class EntryWriter:
    """The state of one outgoing pack's entries, and how entries nothing can be copied for
    are written."""

    def __init__(
        self,
        odb: ObjectSnapshot,
        selection: Selection,
        *,
        ofs_delta: bool,
        thin: ThinCheck | None = None,
        delta_hints: dict[bytes, bytes] | None = None,
        newer_hints: dict[bytes, bytes] | None = None,
        compression: int = zlib.Z_DEFAULT_COMPRESSION,
        listed_only: bool = False,
        inflate: ByteBudget | None = None,
        layouts: ByteLRU[Layout] | None = None,
        layout_disk: ClosureStore | None = None,
    ) -> None:
        self.odb = odb
        self.selection = selection
        self.ofs_delta = ofs_delta
        self.thin = thin
        self.hints = delta_hints or {}
        self.newer_hints = newer_hints or {}  # object -> the client's next version of it
        self.compression = compression
        # Every object is listed, none selected from a pack (no pack's reverse index is
        # needed): a stored delta is kept when its base is known (see _write_listed).
        self.listed_only = listed_only
        # Large objects held whole at once, over all requests (--inflate-memory).
        self.inflate = inflate if inflate is not None else ByteBudget()
        self.layouts = layouts  # kept across requests (caches.py); None: not kept
        self.layout_disk = layout_disk  # large layouts also kept for the next process
        # CPU seconds this pack may spend making new deltas (packgen/delta.py: about a
        # millisecond for a 69 KB file, plus reading the base); past the budget objects go
        # whole.
        self._delta_budget = NEW_DELTA_SECONDS + NEW_DELTA_SECONDS_PER_OBJECT * selection.count
        self.stats = PackStats(objects=selection.count, kind="reuse")
        self._written: dict[bytes, int] = {}  # objects written whole, by id
        self._newer: dict[bytes, bytes] | None = None  # _newer_versions, made when needed
        self._done: list[SelectedPack] = []
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

    def _may_wait(self, part: SelectedPack, base_rank: int, rank: int) -> bool:
        """Entry ``rank`` can wait for ``base_rank``: an entry this pack sends and has not
        written yet, whose delta chain in the output does not lead back to ``rank``."""
        return (0 <= base_rank != rank and bool(part.selected[base_rank])
                and self._chain_avoids(part, base_rank, rank))

    def _defer(self, base_rank: int, rank: int, kind: int) -> None:
        self._regen[rank] = base_rank
        self._wait.setdefault(base_rank, []).append((rank, kind))
        heapq.heappush(self._due, base_rank)

    def _count_delta(self) -> None:
        self.stats.reused += 1
        self.stats.reused_deltas += 1
        self.stats.deltas += 1

    def _write_whole(self, oid: bytes, out: PackOut, part: SelectedPack | None = None,
                     rank: int = -1, loc: PackedLocation | str | None = None,
                     may_defer: bool = False) -> Generator[None, None, bool]:
        """Write an object nothing could be reused for: as a new delta against the object
        at the same path in the parent commit when that base is sent too or the client has
        it (a thin pack), else whole. ``part``/``rank`` say where it sits when it is an
        entry of the pack being copied. Objects over :data:`LARGE_OBJECT` go whole and in
        pieces: a loose one inflated and deflated as it is read, a packed delta resolved
        under the ``--inflate-memory`` budget and deflated to a temporary file that is then
        copied out (so nothing of it waits in memory for a slow client).

        With ``may_defer``, an entry whose delta hint is an entry of the same pack not yet
        written waits for it instead (returns False): it goes out right after its base."""
        if may_defer and part is not None and self._delta_budget > 0:
            hint = self.hints.get(oid)
            base_rank = part.rank_of(hint) if hint is not None else -1
            if (base_rank >= 0 and part.selected[base_rank] and hint not in self._written
                    and part.out_offset(base_rank) is None
                    and self._may_wait(part, base_rank, rank)):
                self._defer(base_rank, rank, NEW)
                return False
        start = self._written[oid] = out.offset
        self.stats.generated += 1
        if part is not None:
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
        if data is not None and not self._write_new_delta(oid, type_num, data, out, part, rank):
            out.write(encode_entry_header(type_num, len(data)))
            out.write(zlib.compress(data, self.compression))
        self.stats.generated_bytes += out.offset - start
        return True

    def _write_listed(self, oid: bytes, out: PackOut) -> Iterator[None]:
        """An object outside any part: loose, or (``listed_only``) any object."""
        loc = None
        if self.listed_only:
            loc = self.odb.locate(oid, needed=True)
            if isinstance(loc, PackedLocation) and self._keep_stored_delta(oid, loc, out):
                return
        yield from self._write_whole(oid, out, loc=loc)

    def _keep_stored_delta(self, oid: bytes, loc: PackedLocation, out: PackOut) -> bool:
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
                     out: PackOut) -> Generator[None, None, tuple[int, bytes | None]]:
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

    def _write_spilled(self, oid: bytes, size: int, out: PackOut) -> Iterator[None]:
        """A large packed delta resolved whole (within the budget), deflated to a
        temporary file; the budget is free again before the first piece goes out."""
        with tempfile.TemporaryFile(prefix="gitspout-") as spill:
            with self.inflate.hold(2 * size):  # the object and its delta base
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

    def _write_new_delta(self, oid: bytes, type_num: int, data: bytes, out: PackOut,
                         part: SelectedPack | None, rank: int) -> bool:
        if len(data) < 64 or self._delta_budget <= 0:
            return False
        found = self._new_delta_base(oid, part, rank)
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

    def _new_delta_base(self, oid: bytes, part: SelectedPack | None,
                        rank: int) -> tuple[bytes, int | None, int] | None:
        """A base for a new delta of ``oid``: its delta hint (the object at the same path
        in the tree the walk diffed against), or that one's hint, and so on
        (:data:`HINT_CHAIN` steps), the first that is written already or that the client
        has (a thin pack): (base, its output offset or None, its rank in ``part`` or -1).
        In a thin pack, then the other way: the objects whose hint ``oid`` is (the next
        version of the same file), and theirs.

        The chain matters for a deepen: a file's older version is usually stored as a
        delta of the newer one, which is sent too, so the older one cannot take the newer
        as its base (a cycle) but can take the version before that, or the client's. A
        file that stayed the same over the commits sent has only older versions on its
        hint chain, each a delta of it; its newer versions lead to the client's (C git
        finds that one by its name among the preferred bases). An entry whose base comes
        later waited for it instead (_write_whole): a delta must follow its base for
        libgit2 and isomorphic-git."""
        found = self._base_along(self.hints.get, oid, part, rank)
        if found is None and self.thin is not None:
            found = self._base_along(self._newer_versions().get, oid, part, rank)
        return found

    def _newer_versions(self) -> dict[bytes, bytes]:
        """The delta hints turned around (an object -> one whose hint it is), and the
        client's versions the walk met in the commits above (``newer_hints``)."""
        if self._newer is None:
            self._newer = {base: oid for oid, base in self.hints.items()}
            self._newer.update(self.newer_hints)
        return self._newer

    def _base_along(self, step: Callable[[bytes], bytes | None], oid: bytes,
                    part: SelectedPack | None,
                    rank: int) -> tuple[bytes, int | None, int] | None:
        base = step(oid)
        for _ in range(HINT_CHAIN):
            if base is None or base == oid:  # a hint to itself, or a chain back to it
                return None
            base_rank = part.rank_of(base) if part is not None else -1
            if part is not None and base_rank >= 0 and part.selected[base_rank]:
                base_at = part.out_offset(base_rank)
                if base_at is None:
                    base_at = self._written.get(base)
                if base_at is not None and self._chain_avoids(part, base_rank, rank):
                    return base, base_at, base_rank
            else:
                base_at = self._find_written(base)
                if base_at is not None or (self.thin is not None and self.thin(None, -1, base)):
                    return base, base_at, -1
            base = step(base)
        return None

    def _chain_avoids(self, part: SelectedPack, start: int, target: int) -> bool:
        """True when the delta chain of entry ``start`` in the output cannot reach entry
        ``target``, so that ``target`` may be deltified against ``start``.

        Every entry keeps its stored base when that base is sent (copied or rewritten, the
        base stays); entries written here follow the base recorded in ``_regen``. An entry
        still to be written whose stored base is not sent will choose its base later with
        this same check, which sees the edge added now, so it cannot close a cycle either.
        """
        bases = part.bases if part.bases is not None else part.pack.base_ranks()
        r = start
        for _ in range(part.pack.count + 1):
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
            if b == r or not part.selected[b]:
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
