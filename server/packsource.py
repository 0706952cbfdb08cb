"""PackSource: where the bytes of an outgoing pack come from (DESIGN.md invariant 5).

Fastest first:

* :class:`WholePackSource` sends one pack file verbatim when the object set is exactly its
  contents: header, entries and trailer as they are on disk.
* :class:`ReusePackSource` copies each entry's compressed bytes from the packs, keeping
  stored deltas whose base is sent too (or, for thin packs, that the client has), and
  rewrites OFS_DELTA distances for the new layout. Only objects it cannot reuse (loose
  objects, deltas against bases nobody will have) are inflated and compressed again.

Sources are plain iterators of ``bytes`` (pack data) and :class:`Progress` items, run in the
server's thread pool and pulled by the stream writer, so backpressure and cancellation come
for free: nothing is produced until the writer asks for it.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from .odb import ObjectSnapshot, PackedLocation
from .packs import OFS_DELTA, REF_DELTA, PackFile, encode_entry_header, parse_entry_header

__all__ = [
    "PackSource",
    "Progress",
    "PackStats",
    "WholePackSource",
    "ReusePackSource",
    "PackPlan",
    "Selection",
    "select_objects",
]

CHUNK = 1 << 20  # pack bytes handed to the writer per step
READ_WINDOW = 4 << 20  # bytes read from a pack file per pread when copying runs of entries


@dataclass(frozen=True, slots=True)
class Progress:
    """A progress line for side-band channel 2 (already formatted, with \\r or \\n)."""

    text: bytes


@dataclass
class PackStats:
    """What a source sent, by kind (for the Total line, logs and metrics)."""

    objects: int = 0
    deltas: int = 0
    reused: int = 0
    reused_deltas: int = 0
    generated: int = 0
    verbatim: int = 0
    bytes: int = 0
    pack_reused: int = 0
    kind: str = ""
    extra: dict[str, int] = field(default_factory=dict)

    def total_line(self) -> bytes:
        return (
            b"Total %d (delta %d), reused %d (delta %d), pack-reused %d\n"
            % (self.objects, self.deltas, self.reused, self.reused_deltas, self.pack_reused)
        )


class PackSource(Protocol):
    """An outgoing pack: its object count, then its bytes as an iterator."""

    stats: PackStats

    def chunks(self) -> Iterator[bytes | Progress]: ...


def _hash_new(hash_len: int) -> hashlib._Hash:
    return hashlib.sha1() if hash_len == 20 else hashlib.sha256()


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
                raise OSError(f"{self.pack.name}: pack file shrank while being sent")
            pos += len(data)
            self.stats.bytes += len(data)
            yield data
        yield Progress(self.stats.total_line())


class _Out:
    """Accumulates pack bytes, hashes them, and hands out chunks of about CHUNK bytes."""

    def __init__(self, hash_len: int) -> None:
        self.buf = bytearray()
        self.hash = _hash_new(hash_len)
        self.offset = 0

    def write(self, data: bytes | memoryview) -> None:
        self.buf += data
        self.offset += len(data)

    def take(self, force: bool = False) -> bytes | None:
        if self.buf and (force or len(self.buf) >= CHUNK):
            data = bytes(self.buf)
            self.buf.clear()
            self.hash.update(data)
            return data
        return None


@dataclass
class PackPlan:
    """Entries sent from one source pack: ranks (pack order) ascending, and a flag array."""

    pack: PackFile
    order: list[int]
    selected: bytearray
    new_at: array | None = None  # output offset per rank, filled while copying

    @classmethod
    def from_ranks(cls, pack: PackFile, ranks: list[int]) -> PackPlan:
        selected = bytearray(pack.count)
        for r in ranks:
            selected[r] = 1
        return cls(pack, ranks, selected)

    def written_at(self, oid: bytes) -> int | None:
        """Output offset of ``oid`` if this plan already wrote it."""
        pos = self.pack.find(oid)
        if pos < 0 or self.new_at is None:
            return None
        rank = self.pack.rank_of_index_pos(pos)
        return self.new_at[rank] if self.selected[rank] else None


@dataclass
class Selection:
    """The objects of an outgoing pack: per source pack plans, then objects written whole."""

    plans: list[PackPlan]
    loose: list[bytes]

    @property
    def count(self) -> int:
        return sum(len(p.order) for p in self.plans) + len(self.loose)


def select_objects(odb: ObjectSnapshot, oids: Iterable[bytes],
                   base: dict[int, list[int]] | None = None,
                   packs: dict[int, PackFile] | None = None) -> Selection:
    """Group objects by the pack that holds them (ranks in pack order)."""
    ranks: dict[int, list[int]] = base if base is not None else {}
    by_id: dict[int, PackFile] = packs if packs is not None else {}
    loose: list[bytes] = []
    for oid in oids:
        loc = odb.locate(oid, needed=True)
        if not isinstance(loc, PackedLocation):
            loose.append(oid)
            continue
        by_id[id(loc.pack)] = loc.pack
        ranks.setdefault(id(loc.pack), []).append(loc.pack.rank_of_index_pos(loc.pos))
    plans = []
    for key, pack in by_id.items():
        order = sorted(set(ranks.get(key, [])))
        plans.append(PackPlan.from_ranks(pack, order))
    return Selection(plans, loose)


ThinCheck = Callable[[PackFile, int, bytes], bool]
"""(pack, rank, oid) of a delta base -> True when the client has it (thin packs)."""


class ReusePackSource:
    """Copy reusable entries from the packs; generate the rest."""

    def __init__(
        self,
        odb: ObjectSnapshot,
        selection: Selection,
        *,
        ofs_delta: bool,
        thin: ThinCheck | None = None,
        compression: int = zlib.Z_DEFAULT_COMPRESSION,
    ) -> None:
        self.odb = odb
        self.selection = selection
        self.ofs_delta = ofs_delta
        self.thin = thin
        self.compression = compression
        self.stats = PackStats(objects=selection.count, kind="reuse")
        self._written: dict[bytes, int] = {}  # objects written whole, by id
        self._done: list[PackPlan] = []

    def chunks(self) -> Iterator[bytes | Progress]:
        out = _Out(self.odb.hash_len)
        out.write(b"PACK" + struct.pack(">II", 2, self.selection.count))
        for plan in self.selection.plans:
            yield from self._copy_pack(plan, out)
            self._done.append(plan)
        for oid in self.selection.loose:
            self._write_whole(oid, out)
            chunk = out.take()
            if chunk:
                yield chunk
        last = out.take(force=True)
        if last:
            yield last
        trailer = out.hash.digest()
        self.stats.bytes = out.offset + len(trailer)
        yield trailer
        yield Progress(self.stats.total_line())

    def _copy_pack(self, plan: PackPlan, out: _Out) -> Iterator[bytes]:
        pack = plan.pack
        offs = pack.sorted_offsets
        plan.new_at = array("Q", bytes(8 * pack.count))
        window = b""
        win_start = 0
        for rank in plan.order:
            start, end = offs[rank], offs[rank + 1]
            if start < win_start or end > win_start + len(window):
                win_start = start
                window = pack.read_raw(start, max(end, min(start + READ_WINDOW, offs[-1])))
            raw = memoryview(window)[start - win_start : end - win_start]
            plan.new_at[rank] = out.offset
            self._copy_entry(plan, rank, raw, start, out)
            chunk = out.take()
            if chunk:
                yield chunk

    def _copy_entry(self, plan: PackPlan, rank: int, raw: memoryview, start: int, out: _Out) -> None:
        pack = plan.pack
        hdr = parse_entry_header(bytes(raw[:64]), start, pack.hash_len)
        if hdr.type_num == OFS_DELTA:
            assert hdr.base_offset is not None
            base_rank = bisect_left(pack.sorted_offsets, hdr.base_offset)
            base_oid = pack.oid_at(pack.pack_order[base_rank])
            if plan.selected[base_rank]:  # an OFS base precedes its delta: already written
                assert plan.new_at is not None
                body = raw[hdr.data_offset - start :]
                self._emit_delta(out, hdr.size, plan.new_at[base_rank], base_oid, body)
                return
        elif hdr.type_num == REF_DELTA:
            assert hdr.base_oid is not None
            base_oid = hdr.base_oid
            base_rank = -1
        else:
            out.write(raw)
            self.stats.reused += 1
            return
        body = raw[hdr.data_offset - start :]
        base_at = self._written_before(base_oid)
        if base_at is not None:
            self._emit_delta(out, hdr.size, base_at, base_oid, body)
        elif self._later_in_plan(plan, base_oid, rank) or (
            self.thin is not None and self.thin(pack, base_rank, base_oid)
        ):
            # A base this pack sends further on (index-pack --fix-thin appends bases), or
            # one the client has (thin pack): REF_DELTA, which can never form a cycle.
            out.write(encode_entry_header(REF_DELTA, hdr.size, base_oid))
            out.write(body)
            self._count_delta()
        else:
            self._write_whole(pack.oid_at(pack.pack_order[rank]), out)

    def _written_before(self, oid: bytes) -> int | None:
        at = self._written.get(oid)
        if at is not None:
            return at
        for plan in self._done:
            at = plan.written_at(oid)
            if at is not None:
                return at
        return None

    @staticmethod
    def _later_in_plan(plan: PackPlan, oid: bytes, rank: int) -> bool:
        pos = plan.pack.find(oid)
        if pos < 0:
            return False
        base_rank = plan.pack.rank_of_index_pos(pos)
        return base_rank > rank and bool(plan.selected[base_rank])

    def _emit_delta(self, out: _Out, size: int, base_at: int, base_oid: bytes,
                    body: memoryview) -> None:
        if self.ofs_delta:
            out.write(encode_entry_header(OFS_DELTA, size, out.offset - base_at))
        else:
            out.write(encode_entry_header(REF_DELTA, size, base_oid))
        out.write(body)
        self._count_delta()

    def _count_delta(self) -> None:
        self.stats.reused += 1
        self.stats.reused_deltas += 1
        self.stats.deltas += 1

    def _write_whole(self, oid: bytes, out: _Out) -> None:
        type_num, data = self.odb.read(oid)
        self._written[oid] = out.offset
        out.write(encode_entry_header(type_num, len(data)))
        out.write(zlib.compress(data, self.compression))
        self.stats.generated += 1
