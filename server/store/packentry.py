"""Pack entry headers (Documentation/gitformat-pack "Packed object data"): decoding one
as read, encoding one for an outgoing pack, and the error a malformed pack raises."""

from __future__ import annotations

from typing import NamedTuple

from .errors import StorageError
from .objformat import OFS_DELTA, REF_DELTA, TYPE_NAMES

__all__ = ["PackFormatError", "EntryHeader", "parse_entry_header", "encode_entry_header",
           "encode_ofs_distance"]


class PackFormatError(StorageError):
    """A pack or index file is not in a format we can read."""

    what = "corrupt pack"
    kind = "pack"


class EntryHeader(NamedTuple):
    """A pack entry's header: ``type_num`` (1-4, 6 or 7), inflated ``size`` (of the delta
    for deltas), ``data_offset`` where the zlib stream starts, and the delta base as an
    absolute pack offset (OFS_DELTA) or a binary object id (REF_DELTA). A tuple: one is
    made per entry read."""

    type_num: int
    size: int
    data_offset: int
    base_offset: int | None = None
    base_oid: bytes | None = None


def parse_entry_header(buf: bytes | memoryview, offset: int, hash_len: int) -> EntryHeader:
    """Decode the entry header at the start of ``buf`` (read from pack ``offset``)."""
    c = buf[0]
    type_num = (c >> 4) & 7
    size = c & 15
    i = 1
    if c & 0x80:
        shift = 4
        while True:
            c = buf[i]
            i += 1
            size |= (c & 0x7F) << shift
            if not c & 0x80:
                break
            shift += 7
    if type_num == OFS_DELTA:
        c = buf[i]
        i += 1
        rel = c & 0x7F
        while c & 0x80:
            c = buf[i]
            i += 1
            rel = ((rel + 1) << 7) | (c & 0x7F)
        return EntryHeader(type_num, size, offset + i, offset - rel, None)
    if type_num == REF_DELTA:
        return EntryHeader(type_num, size, offset + i + hash_len, None, bytes(buf[i : i + hash_len]))
    if type_num not in TYPE_NAMES:
        raise PackFormatError(f"bad object type {type_num} at offset {offset}")
    return EntryHeader(type_num, size, offset + i, None, None)


def encode_ofs_distance(dist: int) -> bytes:
    """The OFS_DELTA distance varint (pack-format: base-128, each continuation adds one)."""
    out = bytearray([dist & 0x7F])
    dist >>= 7
    while dist:
        dist -= 1
        out.append(0x80 | (dist & 0x7F))
        dist >>= 7
    out.reverse()
    return bytes(out)


def encode_entry_header(type_num: int, size: int, base: int | bytes | None = None) -> bytes:
    """Encode an entry header; ``base`` is the relative distance for OFS_DELTA (positive)
    or the binary base id for REF_DELTA."""
    out = bytearray()
    c = (type_num << 4) | (size & 15)
    size >>= 4
    while size:
        out.append(c | 0x80)
        c = size & 0x7F
        size >>= 7
    out.append(c)
    if type_num == OFS_DELTA:
        assert isinstance(base, int) and base > 0
        out += encode_ofs_distance(base)
    elif type_num == REF_DELTA:
        assert isinstance(base, bytes)
        out += base
    return bytes(out)
