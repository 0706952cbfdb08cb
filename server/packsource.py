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
from collections.abc import Iterator, Sequence
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
class _PackPlan:
    """Selected entries of one source pack, in pack order."""

    pack: PackFile
    order: list[int]  # pack-order positions, ascending
    selected: bytearray  # per pack-order position: 1 when sent from this pack


class ReusePackSource:
    """Copy reusable entries from the packs; generate the rest."""

    def __init__(
        self,
        odb: ObjectSnapshot,
        objects: Sequence[tuple[bytes, int]],
        *,
        ofs_delta: bool,
        thin_bases: set[bytes] | frozenset[bytes] = frozenset(),
        compression: int = zlib.Z_DEFAULT_COMPRESSION,
    ) -> None:
        self.odb = odb
        self.objects = objects
        self.ofs_delta = ofs_delta
        self.thin_bases = thin_bases
        self.compression = compression
        self.stats = PackStats(objects=len(objects), kind="reuse")
        self._sending = {oid for oid, _ in objects}

    def _plan(self) -> tuple[list[_PackPlan], list[bytes]]:
        by_pack: dict[int, _PackPlan] = {}
        loose: list[bytes] = []
        for oid, _ in self.objects:
            loc = self.odb.locate(oid, needed=True)
            if not isinstance(loc, PackedLocation):
                loose.append(oid)
                continue
            plan = by_pack.get(id(loc.pack))
            if plan is None:
                plan = _PackPlan(loc.pack, [], bytearray(loc.pack.count))
                by_pack[id(loc.pack)] = plan
            rank = bisect_left(loc.pack.sorted_offsets, loc.offset)
            if not plan.selected[rank]:
                plan.selected[rank] = 1
                plan.order.append(rank)
        plans = list(by_pack.values())
        for plan in plans:
            plan.order.sort()
        return plans, loose

    def chunks(self) -> Iterator[bytes | Progress]:
        plans, loose = self._plan()
        out = _Out(self.odb.hash_len)
        out.write(b"PACK" + struct.pack(">II", 2, len(self.objects)))
        written: dict[bytes, int] = {}
        for plan in plans:
            yield from self._copy_pack(plan, out, written)
        for oid in loose:
            self._write_whole(oid, out, written)
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

    def _copy_pack(self, plan: _PackPlan, out: _Out, written: dict[bytes, int]) -> Iterator[bytes]:
        pack = plan.pack
        offs = pack.sorted_offsets
        new_at = array("Q", bytes(8 * pack.count))  # output offset per pack-order rank
        window = b""
        win_start = 0
        for rank in plan.order:
            start, end = offs[rank], offs[rank + 1]
            if start < win_start or end > win_start + len(window):
                win_start = start
                window = pack.read_raw(start, max(end, min(start + READ_WINDOW, offs[-1])))
            raw = memoryview(window)[start - win_start : end - win_start]
            new_at[rank] = out.offset
            self._copy_entry(plan, rank, raw, start, out, new_at, written)
            chunk = out.take()
            if chunk:
                yield chunk

    def _copy_entry(
        self, plan: _PackPlan, rank: int, raw: memoryview, start: int, out: _Out,
        new_at: array, written: dict[bytes, int],
    ) -> None:
        pack = plan.pack
        hdr = parse_entry_header(bytes(raw[:64]), start, pack.hash_len)
        body = raw[hdr.data_offset - start :]
        oid = pack.oid_at(pack.pack_order[rank])
        written[oid] = out.offset
        if hdr.type_num == OFS_DELTA:
            base_rank = bisect_left(pack.sorted_offsets, hdr.base_offset)
            base_oid = pack.oid_at(pack.pack_order[base_rank])
            if plan.selected[base_rank]:  # an OFS base precedes its delta: already written
                self._emit_delta(out, hdr.size, new_at[base_rank], base_oid, body)
                return
        elif hdr.type_num == REF_DELTA:
            assert hdr.base_oid is not None
            base_oid = hdr.base_oid
        else:
            out.write(raw)
            self.stats.reused += 1
            return
        if base_oid in written:
            self._emit_delta(out, hdr.size, written[base_oid], base_oid, body)
        elif base_oid in self.thin_bases or self._later_in_same_pack(plan, base_oid):
            # A base the client has (thin pack), or one this pack sends further on
            # (index-pack --fix-thin appends bases): REF_DELTA, never a cycle.
            out.write(encode_entry_header(REF_DELTA, hdr.size, base_oid))
            out.write(body)
            self._count_delta()
        else:
            del written[oid]
            self._write_whole(oid, out, written)

    def _later_in_same_pack(self, plan: _PackPlan, base_oid: bytes) -> bool:
        if base_oid not in self._sending:
            return False
        loc = self.odb.locate(base_oid, needed=False)
        return isinstance(loc, PackedLocation) and loc.pack is plan.pack

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

    def _write_whole(self, oid: bytes, out: _Out, written: dict[bytes, int]) -> None:
        type_num, data = self.odb.read(oid)
        written[oid] = out.offset
        out.write(encode_entry_header(type_num, len(data)))
        out.write(zlib.compress(data, self.compression))
        self.stats.generated += 1
