"""Refs stored as a reftable stack (``git init --ref-format=reftable``), read as C git reads
them (git's Documentation/technical/reftable.adoc).

A reftable repository keeps its refs in immutable tables under ``$GIT_DIR/reftable``, listed
oldest first by ``tables.list``; ``refs/heads`` is a *file* there ("this repository uses the
reftable format") and ``HEAD`` says ``ref: refs/heads/.invalid``: the real HEAD is a record
of the stack. A later table's record of a name wins over an earlier one's, and a deletion
record removes the name.

Tables never change, so each is parsed once per (name, inode) and kept (``RefCache.tables``).
The oldest table, which compaction makes the largest, is held in segments as packed-refs
is (``PackedRefs``); the records of the tables above it are merged into the segments of
their name range, as loose refs are into packed ones (store/refs.py): a transaction that
appends a table costs its own records, not the whole stack. Only ref, not log, blocks are
read: the ref section is a run of ``r`` blocks from the header on.
"""

from __future__ import annotations

import struct
import zlib
from binascii import hexlify
from collections.abc import Sequence
from dataclasses import dataclass

from gitspout.protocol.refs import HeadInfo, Ref

from .errors import StorageError
from .packedrefs import SEGMENT_BYTES, PackedRefs, Peeler, RefSegment, cut_segments

__all__ = ["ReftableError", "Table", "parse_table", "merge_stack", "REFTABLE_NOTICE"]

REFTABLE_NOTICE = b"this repository uses the reftable format"
_HEADER = {1: 24, 2: 28}
_FOOTER = {1: 68, 2: 72}
_HASH_IDS = {20: b"sha1", 32: b"s256"}
_DELETION, _ONE, _PEELED, _SYMREF = 0, 1, 2, 3
_MAX_SYMREF_DEPTH = 5


class ReftableError(StorageError):
    """A table that is not a reftable git writes (C git refuses to read it too)."""

    what = "corrupt reftable"
    kind = "reftable"


@dataclass(frozen=True, slots=True)
class Record:
    """One ref record: ``value`` is a hex id (kinds 1, 2) or a symref target (kind 3)."""

    name: bytes
    kind: int
    value: bytes = b""
    peeled: bytes | None = None


@dataclass(frozen=True, slots=True)
class Table:
    """One parsed table: its plain refs under ``refs/`` as packed-refs segments, and every
    other record (symrefs, deletions, HEAD and other names outside ``refs/``)."""

    packed: PackedRefs
    special: tuple[Record, ...]
    nbytes: int

    def records(self) -> list[Record]:
        """Every record, for a table merged over an older one."""
        out = list(self.special)
        for seg in self.packed.segments:
            out.extend(Record(r.name, _PEELED if r.peeled else _ONE, r.oid, r.peeled)
                       for r in seg.refs())
        return out


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The ofs-delta varint at ``pos`` (gitformat-pack), and the position after it."""
    c = data[pos]
    val = c & 0x7F
    while c & 0x80:
        pos += 1
        c = data[pos]
        val = ((val + 1) << 7) | (c & 0x7F)
    return val, pos + 1


def _footer(data: bytes, version: int, hash_len: int) -> tuple[int, int]:
    """Check the header and footer; the ref section's end (where the first non-ref section
    or the footer starts) and the file's block size."""
    head_len, foot_len = _HEADER[version], _FOOTER[version]
    if len(data) < head_len + foot_len:
        raise ReftableError("reftable: file too short")
    if version == 2 and data[24:28] != _HASH_IDS.get(hash_len):
        raise ReftableError(f"reftable: hash {data[24:28]!r} is not the repository's")
    foot = data[len(data) - foot_len:]
    if foot[:head_len] != data[:head_len]:
        raise ReftableError("reftable: footer does not repeat the header")
    if zlib.crc32(foot[:-4]) != int.from_bytes(foot[-4:], "big"):
        raise ReftableError("reftable: footer checksum mismatch")
    positions = struct.unpack(">5Q", foot[head_len:head_len + 40])
    ref_index, obj, obj_index, log, log_index = positions
    ends = [p for p in (ref_index, obj >> 5, obj_index, log, log_index) if p]
    end = min([*ends, len(data) - foot_len])
    return end, int.from_bytes(data[5:8], "big")


def _block(data: bytes, pos: int, stop: int, hash_len: int, name: bytes,
           out: bytearray, special: list[Record]) -> bytes:
    """The ref records of one block, ``data[pos:stop]`` (before its restart table): plain
    refs under ``refs/`` appended to *out* as packed-refs lines, every other record to
    *special*. *name* is the record before (names must ascend); returns the last one.

    One loop step per record, so the step is kept short (a 1M-ref table is 1M steps):
    one-byte varints, the usual case, are read inline, and a plain ref goes straight
    to its line, with no record object in between."""
    while pos < stop:
        prefix = data[pos]
        if prefix & 0x80:
            prefix, pos = _varint(data, pos)
        else:
            pos += 1
        packed_len = data[pos]
        if packed_len & 0x80:
            packed_len, pos = _varint(data, pos)
        else:
            pos += 1
        end = pos + (packed_len >> 3)
        if prefix > len(name) or end > stop:
            raise ReftableError("reftable: bad record name")
        new = name[:prefix] + data[pos:end]
        if new <= name:
            raise ReftableError("reftable: records out of order")
        name = new
        if data[end] & 0x80:  # update_index_delta
            _, pos = _varint(data, end)
        else:
            pos = end + 1
        kind = packed_len & 7
        if kind == _ONE and name.startswith(b"refs/"):
            out += hexlify(data[pos:pos + hash_len])
            out += b" "
            out += name
            out += b"\n"
            pos += hash_len
        else:
            pos = _other(data, pos, kind, name, hash_len, out, special)
        if pos > stop:
            raise ReftableError("reftable: record runs past its block")
    return name


def _other(data: bytes, pos: int, kind: int, name: bytes, hash_len: int, out: bytearray,
           special: list[Record]) -> int:
    """A record that is no plain ``refs/`` ref (see :func:`_block`); the position after
    its value."""
    if kind == _DELETION:
        rec = Record(name, kind)
    elif kind == _ONE:
        rec = Record(name, kind, hexlify(data[pos:pos + hash_len]))
        pos += hash_len
    elif kind == _PEELED:
        oid = hexlify(data[pos:pos + hash_len])
        peeled = hexlify(data[pos + hash_len:pos + 2 * hash_len])
        pos += 2 * hash_len
        if name.startswith(b"refs/"):
            out += b"%s %s\n^%s\n" % (oid, name, peeled)
            return pos
        rec = Record(name, kind, oid, peeled)
    elif kind == _SYMREF:
        length, pos = _varint(data, pos)
        rec = Record(name, kind, data[pos:pos + length])
        pos += length
    else:
        raise ReftableError(f"reftable: unknown value type {kind}")
    special.append(rec)
    return pos


def _read_refs(data: bytes, hash_len: int) -> tuple[list[RefSegment], list[Record]]:
    """Every ref record of a table, in name order: the plain ``refs/`` ones as packed-refs
    segments (cut as the blocks are read, so that the table's lines are never held whole
    beside their segments), the others as records."""
    if data[:4] != b"REFT" or len(data) < 8 or data[4] not in _HEADER:
        raise ReftableError("reftable: not a reftable file (bad magic or version)")
    version = data[4]
    end, block_size = _footer(data, version, hash_len)
    segments: list[RefSegment] = []
    special: list[Record] = []
    out = bytearray()
    name = b""
    start, pos = 0, _HEADER[version]  # the first block holds the file header
    try:
        while pos < end and data[pos] == ord("r"):
            block_end = start + int.from_bytes(data[pos + 1:pos + 4], "big")
            count = int.from_bytes(data[block_end - 2:block_end], "big")
            restarts = block_end - 2 - 3 * count
            if block_end > end or count == 0 or restarts < pos + 4:
                raise ReftableError("reftable: bad ref block")
            name = _block(data, pos + 4, restarts, hash_len, name, out, special)
            if len(out) >= SEGMENT_BYTES:
                segments.extend(cut_segments(bytes(out), 2 * hash_len))
                out.clear()
            # Aligned blocks are padded with NULs up to the block size; a writer may leave
            # the padding out, and then the next block starts at once (reftable/block.c).
            padded = block_size and block_end < start + block_size and \
                (block_end >= end or data[block_end] == 0)
            start = pos = start + block_size if padded else block_end
    except IndexError:
        raise ReftableError("reftable: truncated block") from None
    if out:
        segments.extend(cut_segments(bytes(out), 2 * hash_len))
    return segments, special


def parse_table(data: bytes, hash_len: int) -> Table:
    """One table file's refs (raises :class:`ReftableError` on anything git would not
    have written)."""
    segments, special = _read_refs(data, hash_len)
    packed = PackedRefs(b"", True, segments, diffable=False)
    nbytes = sum(len(seg.raw) for seg in segments)
    return Table(packed, tuple(special), nbytes + 200 * len(special) + 400)


def merge_stack(tables: Sequence[Table], peel: Peeler
                ) -> tuple[HeadInfo, PackedRefs, dict[bytes, Ref | None]]:
    """HEAD, the oldest table's plain refs, and every other name the stack decides as a
    ref (None: deleted, or a symref that leads nowhere), for store/refs.py to merge into
    the segments as it merges loose refs."""
    if not tables:
        return HeadInfo(None, None), PackedRefs(b"", True, []), {}
    base = tables[0].packed
    top: dict[bytes, Record] = {rec.name: rec for rec in tables[0].special}
    for table in tables[1:]:
        for rec in table.records():
            top[rec.name] = rec
    out: dict[bytes, Ref | None] = {}
    for name, rec in top.items():
        if not name.startswith(b"refs/"):
            continue
        oid, peeled, target = _resolve(name, top, base)
        if oid is None:
            out[name] = None
        else:
            out[name] = Ref(name, oid, peeled if peeled is not None or rec.kind != _SYMREF
                            else peel(oid), target)
    head = _head(top, base)
    return head, base, out


def _resolve(name: bytes, top: dict[bytes, Record], base: PackedRefs
             ) -> tuple[bytes | None, bytes | None, bytes | None]:
    """(hex id, peeled, first symref target) of ``name`` in the stack."""
    target: bytes | None = None
    for depth in range(_MAX_SYMREF_DEPTH):
        rec = top.get(name)
        if rec is None:
            return base.get(name), _peeled_in(base, name), target
        if rec.kind == _DELETION:
            return None, None, target
        if rec.kind != _SYMREF:
            return rec.value, rec.peeled, target
        name = rec.value
        if depth == 0:
            target = name
    return None, None, target


def _peeled_in(base: PackedRefs, name: bytes) -> bytes | None:
    if not base.segments:
        return None
    seg: RefSegment = base.segments[base.segment_of(name)]
    ref = next((r for r in seg.refs() if r.name == name), None) if seg.get(name) else None
    return ref.peeled if ref is not None else None


def _head(top: dict[bytes, Record], base: PackedRefs) -> HeadInfo:
    rec = top.get(b"HEAD")
    if rec is None:
        return HeadInfo(None, None)
    if rec.kind == _SYMREF:
        oid, _, _ = _resolve(rec.value, top, base)
        return HeadInfo(rec.value, oid)
    return HeadInfo(None, rec.value if rec.kind != _DELETION else None)
