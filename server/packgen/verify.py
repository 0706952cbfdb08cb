"""A check of a pack as it is written, for the packs kept to be served again (bundles).

A pack is made of data copied as stored in the repository's packs. A damaged copy there
(a flipped bit on a disk or a server) goes out as it is: a fetch's pack then fails in the
client, as C git's would, and the next fetch of the repeated repository is whole. A kept
pack would go on failing after the repository's repair, for as long as it is kept.
:class:`PackCheck` follows the stream and inflates every entry (gitformat-pack): each must
inflate whole to the size its header gives, and the trailer must be the checksum of what
came before. Deltas are not applied: a damaged byte fails zlib's own check (Adler-32) or
the size, wherever it is.
"""

from __future__ import annotations

import hashlib
import zlib

__all__ = ["PackCheck"]

_OFS_DELTA = 6
_REF_DELTA = 7
_PIECE = 1 << 20  # bytes inflated at a time: a small entry may inflate to a large one
_FIRST_STEP = 256  # bytes of an entry's data fed to zlib first (see PackCheck._inflate)


class PackCheck:
    """Feed it a pack's bytes in order (:meth:`feed`), then ask :meth:`fault`."""

    def __init__(self, hash_len: int = 20) -> None:
        self.hash_len = hash_len
        self.digest = hashlib.sha1() if hash_len == 20 else hashlib.sha256()
        self.tail = b""  # the last hash_len bytes fed: the trailer, at the end
        self.buf = bytearray()  # bytes not parsed yet (a header, the trailer)
        self.left: int | None = None  # entries still to come, once the header is read
        self.inflater: zlib._Decompress | None = None  # the entry being inflated
        self.size = 0  # what the entry's header says it inflates to
        self.got = 0  # what it inflated to so far
        self.done = 0  # entries checked
        self.after = 0  # bytes after the last entry
        self.step = _FIRST_STEP
        self.error: str | None = None

    def feed(self, data: bytes | memoryview) -> None:
        if self.error is not None:
            return
        data = bytes(data)
        held = self.tail + data  # everything but the last hash_len bytes is checksummed
        cut = max(0, len(held) - self.hash_len)
        self.digest.update(held[:cut])
        self.tail = held[cut:]
        if self.left == 0:
            self.after += len(data)
            return
        self.buf += data
        try:
            self._parse()
        except zlib.error as exc:
            self.error = f"entry {self.done} does not inflate ({exc})"
        except ValueError as exc:
            self.error = f"entry {self.done}: {exc}"

    def fault(self) -> str | None:
        """What is wrong with the pack fed, or None when it is whole."""
        if self.error is not None:
            return self.error
        if self.left is None or self.left > 0 or self.inflater is not None:
            return f"ends after {self.done} entries"
        if self.after != self.hash_len or self.tail != self.digest.digest():
            return "its trailer is not its checksum"
        return None

    def _parse(self) -> None:
        if self.left is None:
            if len(self.buf) < 12:
                return
            head = bytes(self.buf[:12])
            del self.buf[:12]
            if head[:4] != b"PACK" or int.from_bytes(head[4:8], "big") not in (2, 3):
                raise ValueError("no pack header")
            self.left = int.from_bytes(head[8:12], "big")
        buf = bytes(self.buf)
        self.buf.clear()
        pos = 0
        while self.left > 0 and pos < len(buf):
            if self.inflater is None:
                pos = self._entry_header(buf, pos)
                if self.inflater is None:
                    break  # a header cut short: the rest comes with the next piece
            pos = self._inflate(buf, pos)
        if self.left == 0:
            self.after += len(buf) - pos
        else:
            self.buf += buf[pos:]

    def _entry_header(self, buf: bytes, pos: int) -> int:
        """Parse the entry's header at ``pos`` if ``buf`` holds it all (the inflater is
        set then); where its data starts, or ``pos`` if the header is cut short."""
        i = pos
        c = buf[i]
        kind = (c >> 4) & 7
        size = c & 0x0F
        shift = 4
        while c & 0x80:
            i += 1
            if i >= len(buf):
                return pos
            c = buf[i]
            size |= (c & 0x7F) << shift
            shift += 7
        i += 1
        if kind == _OFS_DELTA:
            while True:
                if i >= len(buf):
                    return pos
                c = buf[i]
                i += 1
                if not c & 0x80:
                    break
        elif kind == _REF_DELTA:
            i += self.hash_len
            if i > len(buf):
                return pos
        elif kind not in (1, 2, 3, 4):
            raise ValueError(f"an entry of type {kind}")
        self.size, self.got = size, 0
        self.inflater = zlib.decompressobj()
        self.step = _FIRST_STEP
        return i

    def _inflate(self, buf: bytes, pos: int) -> int:
        """Inflate the entry's data from ``pos``; where it ended, or ``len(buf)``. Fed in
        pieces that double from a small one, so that what zlib hands back past an
        entry's end (a copy) stays within twice the entry: a pack of small entries is
        not copied once per entry."""
        d = self.inflater
        assert d is not None
        view = memoryview(buf)
        while pos < len(buf):
            piece = view[pos:pos + self.step]
            pos += len(piece)
            self.step = min(self.step * 2, _PIECE)
            self.got += len(d.decompress(piece, _PIECE))
            while d.unconsumed_tail and not d.eof:
                self.got += len(d.decompress(d.unconsumed_tail, _PIECE))
            if d.eof:
                pos -= len(d.unused_data)
                if self.got != self.size:
                    raise ValueError(f"inflates to {self.got} bytes, not {self.size}")
                self.inflater = None
                self.left = (self.left or 0) - 1
                self.done += 1
                break
        return pos
