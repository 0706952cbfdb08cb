"""Reachability bitmaps (Documentation/technical/bitmap-format): read once per pack,
decoded lazily, kept as Python integers used as bitsets.

Bit *i* of a bitmap stands for the *i*-th object of the pack in offset order (the reverse
index), so a bitmap ANDs, ORs and counts at C speed without one Python step per object.
"""

from __future__ import annotations

import struct
import sys
from array import array

import numpy as np

from .errors import StorageError
from .faults import report_unusable
from .fsops import nonblocking
from .lru import ByteLRU
from .objformat import trailer_matches
from .packs import PackFile

__all__ = ["PackBitmaps", "BitmapFormatError", "decode_ewah", "iter_set_bits", "load_bitmaps"]

_MAGIC = b"BITM"
_LITTLE = sys.byteorder == "little"
DECODED_BITMAPS = 64  # per pack (docs/ARCHITECTURE.md, "Caches"), or DECODED_BYTES of them:
DECODED_BYTES = 8 << 20  # a walk ORing most of a small pack's bitmaps (each XORed against
# others) must not decode them again and again


class BitmapFormatError(StorageError):
    """The .bitmap file is not one we can use; callers fall back to a walk."""

    kind = "bitmap"
    what = "corrupt bitmap"


def _max_words(nbits: int) -> int:
    """Words an EWAH bitmap over ``nbits`` objects may decode to: git serializes the
    words it allocated, up to twice those needed; more is garbage (a run length read from
    a damaged file would otherwise expand to 32 GB)."""
    return 4 * ((nbits + 63) // 64) + 64


def decode_ewah(data: bytes | memoryview, pos: int,
                nbits: int = 1 << 32) -> tuple[int, int, int]:
    """Decode one EWAH bitmap at ``pos`` over at most ``nbits`` objects: (bits as an int,
    bit count, position after it). Raises BitmapFormatError when it does not fit."""
    try:
        bit_size, word_count = struct.unpack_from(">II", data, pos)
    except struct.error:
        raise BitmapFormatError("truncated EWAH header") from None
    pos += 8
    end = pos + 8 * word_count
    if end + 4 > len(data):
        raise BitmapFormatError("truncated EWAH bitmap")
    limit = _max_words(nbits)
    if word_count > limit or bit_size > 64 * limit:
        raise BitmapFormatError("EWAH bitmap larger than its pack")
    words = array("Q")
    words.frombytes(bytes(data[pos:end]))
    if _LITTLE:
        words.byteswap()
    out = array("Q")
    i, n = 0, len(words)
    zero, ones = array("Q", [0]), array("Q", [0xFFFFFFFFFFFFFFFF])
    while i < n:
        rlw = words[i]
        i += 1
        run = (rlw >> 1) & 0xFFFFFFFF
        literals = rlw >> 33
        if len(out) + run + literals > limit or i + literals > n:
            raise BitmapFormatError("EWAH run past the end of the bitmap")
        if run:
            out.extend((ones if rlw & 1 else zero) * run)
        if literals:
            out.extend(words[i : i + literals])
            i += literals
    if not _LITTLE:
        out.byteswap()
    return int.from_bytes(out.tobytes(), "little"), bit_size, end + 4


def iter_set_bits(value: int, limit: int) -> list[int]:
    """Positions of set bits below ``limit``, ascending (numpy: a clone of git/git has
    841k positions, and a fetch scans as many bits for a few)."""
    if value <= 0:
        return []
    raw = np.frombuffer(value.to_bytes((limit + 7) // 8 or 1, "little"), dtype=np.uint8)
    bits = np.unpackbits(raw, bitorder="little")[:limit]
    positions: list[int] = np.flatnonzero(bits).tolist()
    return positions


class PackBitmaps:
    """The bitmaps of one pack: type bitmaps and per-commit reachability bitmaps."""

    def __init__(self, pack: PackFile, data: bytes) -> None:
        # No reference to ``pack`` is kept: the bitmaps outlive a pack closed to stay within
        # --max-open-packs (they are found again by the pack's key, registry.pack_data).
        self._data = data
        h = pack.hash_len
        if data[:4] != _MAGIC or len(data) < 12 + 2 * h:
            raise BitmapFormatError("bad bitmap magic")
        version, _flags, count = struct.unpack_from(">HHI", data, 4)
        if version != 1:
            raise BitmapFormatError(f"bitmap version {version} is not supported")
        if data[12 : 12 + h] != pack.pack_checksum():
            raise BitmapFormatError("bitmap does not belong to this pack")
        # The file ends with a checksum of what precedes it: it is read whole anyway, so
        # checking it is cheap, and a damaged bitmap means a walk, not a wrong pack.
        if not trailer_matches(data, h):
            raise BitmapFormatError("bitmap checksum does not match its contents")
        self._nbits = pack.count
        pos = 12 + h
        self.commits, _, pos = decode_ewah(data, pos, pack.count)
        self.trees, _, pos = decode_ewah(data, pos, pack.count)
        self.blobs, _, pos = decode_ewah(data, pos, pack.count)
        self.tags, _, pos = decode_ewah(data, pos, pack.count)
        # Keyed by the commit's position in the .idx, as the file lists them: finding a
        # commit's bitmap needs no reverse index (a fetch of a few commits on a large pack
        # may never build one, store/packs.py rank_of_index_pos).
        self._entries: dict[int, tuple[int, int, int]] = {}  # idx position -> (pos, xor, index)
        self._order: list[int] = []  # entry index -> idx position
        # idx position -> decoded bitmap: DECODED_BITMAPS of them (~100 KB each for a million
        # objects), counted in bytes
        self._bitmap_bytes = (pack.count + 7) // 8 or 1
        self._decoded = ByteLRU[int]("bitmaps", max(DECODED_BITMAPS * self._bitmap_bytes,
                                                    DECODED_BYTES), parent=pack.memory)
        self._read_entries(pack, pos, count)

    def _read_entries(self, pack: PackFile, pos: int, count: int) -> None:
        data = self._data
        for k in range(count):
            try:
                idx_pos, xor, _flags = struct.unpack_from(">IBB", data, pos)
                _, words = struct.unpack_from(">II", data, pos + 6)
            except struct.error:
                raise BitmapFormatError("truncated bitmap entry") from None
            if xor > k or idx_pos >= pack.count:
                raise BitmapFormatError("bad bitmap entry")
            self._entries[idx_pos] = (pos + 6, xor, k)
            self._order.append(idx_pos)
            pos += 6 + 8 + 8 * words + 4

    def bitmap_at(self, idx_pos: int) -> int | None:
        """The reachability bitmap (bits in pack order) of the commit at position
        ``idx_pos`` of the pack's .idx, or None."""
        entry = self._entries.get(idx_pos)
        if entry is None:
            return None
        hit = self._decoded.get(idx_pos)
        if hit is not None:
            return hit
        pos, xor, k = entry
        value, _, _ = decode_ewah(self._data, pos, self._nbits)
        if xor:
            base = self.bitmap_at(self._order[k - xor])
            assert base is not None
            value ^= base
        self._decoded.put(idx_pos, value, self._bitmap_bytes)
        return value


def load_bitmaps(pack: PackFile) -> PackBitmaps | None:
    """The pack's bitmaps, read once and kept with the pack's other derived data (within
    --cache-memory); None without a usable file."""
    def compute() -> tuple[PackBitmaps | None, int]:
        try:
            with open(pack.base + ".bitmap", "rb", opener=nonblocking) as fh:
                data = fh.read()
            # The file and its entry table (decoded bitmaps are a cache of their own).
            bitmaps = PackBitmaps(pack, data)
            return bitmaps, len(data) + 100 * len(bitmaps._order)
        except FileNotFoundError:
            return None, 0
        except (OSError, BitmapFormatError, struct.error) as exc:
            report_unusable(pack.faults, "bitmap", pack.base + ".bitmap", pack.key, exc,
                            "walking history instead")
            return None, 0

    result: PackBitmaps | None = pack.derived("bitmaps", compute)
    return result
