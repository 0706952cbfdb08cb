"""Object sizes without inflating whole objects: a whole entry's header says it, a delta's
own header says its result's (git's ``packed_object_info``), and its type is its base's.

:class:`ObjectSizes` is a part of :class:`~.odb.ObjectSnapshot`.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

from .errors import MissingObject, ObjectStoreError
from .objformat import OFS_DELTA, REF_DELTA
from .packentry import EntryHeader
from .packs import PackedLocation, PackFile

__all__ = ["ObjectSizes", "MAX_CHAIN"]

MAX_CHAIN = 10_000  # delta chains longer than this are a damaged pack


class ObjectSizes:
    """The sizes part of a request's object snapshot."""

    if TYPE_CHECKING:
        def locate(self, oid: bytes, needed: bool = True) -> PackedLocation | str | None: ...
        def _read_loose(self, path: str, oid: bytes) -> tuple[int, bytes]: ...

    def object_size(self, oid: bytes) -> tuple[int, int] | None:
        """(type number, size) of ``oid`` without inflating whole deltas, or None.

        Every caller asks about an object the request needs (a want being peeled, a blob
        named by a tree), so a miss is a true one: a concurrent ``git gc`` may have packed
        the loose file into a pack listed after this request froze its list.
        """
        loc = self.locate(oid, needed=True)
        if loc is None:
            return None
        if isinstance(loc, str):
            type_num, data = self._read_loose(loc, oid)
            return type_num, len(data)
        return self.packed_size(loc.pack, loc.offset)

    def packed_size(self, pack: PackFile, offset: int) -> tuple[int, int]:
        hdr = pack.read_header(offset)
        if hdr.type_num not in (OFS_DELTA, REF_DELTA):
            return hdr.type_num, hdr.size
        return self._base_type(pack, hdr), self._delta_result_size(pack, hdr)

    def packed_object_size(self, pack: PackFile, offset: int) -> int:
        """The size of the object at ``offset``, as git's ``packed_object_info`` gives it:
        the header's size for a whole object, the delta header's result size for a delta
        (the start of the delta inflated, its base never read)."""
        hdr = pack.read_header(offset)
        if hdr.type_num not in (OFS_DELTA, REF_DELTA):
            return hdr.size
        return self._delta_result_size(pack, hdr)

    @staticmethod
    def _delta_result_size(pack: PackFile, hdr: EntryHeader) -> int:
        # The target size is the second varint of the delta; its type is the base's.
        d = zlib.decompressobj()
        head = b""
        pos = hdr.data_offset
        while len(head) < 20 and not d.eof:
            data = pack.read_raw(pos, pos + 256)
            if not data:
                raise pack.corrupt(f"truncated delta at {hdr.data_offset}")
            pos += len(data)
            try:
                head += d.decompress(data, 32 - len(head))
            except zlib.error as exc:
                raise pack.corrupt(f"bad zlib data in entry at {hdr.data_offset}: {exc}") from None
        try:
            _, at = _varint(head, 0)
            size, _ = _varint(head, at)
        except IndexError:
            raise pack.corrupt(f"truncated delta at {hdr.data_offset}") from None
        return size

    def _base_type(self, pack: PackFile, hdr: EntryHeader) -> int:
        for _ in range(MAX_CHAIN):
            if hdr.type_num == OFS_DELTA:
                assert hdr.base_offset is not None
                hdr = pack.read_header(hdr.base_offset)
            elif hdr.type_num == REF_DELTA:
                assert hdr.base_oid is not None
                loc = self.locate(hdr.base_oid, needed=True)
                if loc is None:
                    raise MissingObject(hdr.base_oid)
                if isinstance(loc, str):
                    return self._read_loose(loc, hdr.base_oid)[0]
                pack, hdr = loc.pack, loc.pack.read_header(loc.offset)
            else:
                return hdr.type_num
        raise ObjectStoreError("delta chain too long")



def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        c = buf[pos]
        pos += 1
        value |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return value, pos
