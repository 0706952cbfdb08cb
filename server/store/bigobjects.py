"""Large objects without holding them whole (docs/ARCHITECTURE.md "Memory caps").

A loose object is inflated as it is read, in pieces of at most :data:`PIECE` bytes. An
object that must be held whole (a delta resolved so that it can be sent whole) counts
against one process-wide :class:`ByteBudget` (``--inflate-memory``, ``app/budgets.py``,
handed to the pack producer): a request that
would go over it waits in its pool thread until others are done; one object alone always
fits, so nothing waits forever. Nobody holds budget while waiting for a client.
"""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import ObjectStoreError, StorageError
from .fsops import READ_FLAGS, FsOps
from .objformat import TYPE_NUMS

__all__ = ["LARGE_OBJECT", "PIECE", "ByteBudget", "DEFAULT_INFLATE_MEMORY", "iter_loose"]

LARGE_OBJECT = 1 << 20  # above this, an object is streamed (and never deltified anew)
PIECE = 256 << 10  # bytes inflated, deflated or read per step
_READ = 64 << 10
DEFAULT_INFLATE_MEMORY = 128 << 20


class ByteBudget:
    """Bytes of large objects held whole at once, over all threads."""

    def __init__(self, limit: int = DEFAULT_INFLATE_MEMORY) -> None:
        self.limit = limit
        self.held = 0
        self.waits = 0  # times a thread had to wait
        self._cond = threading.Condition()

    @contextmanager
    def hold(self, n: int) -> Iterator[None]:
        with self._cond:
            if self.held and self.held + n > self.limit:
                self.waits += 1
                while self.held and self.held + n > self.limit:
                    self._cond.wait()
            self.held += n
        try:
            yield
        finally:
            with self._cond:
                self.held -= n
                self._cond.notify_all()


def iter_loose(fs: FsOps, path: str, oid: bytes) -> Iterator[tuple[int, int] | bytes]:
    """A loose object as read: first ``(type number, size)``, then its content in pieces
    of at most :data:`PIECE` bytes. Raises FileNotFoundError before the first item if the
    file is gone (packed away meanwhile), StorageError if it is corrupt."""
    fs.note("open")
    fs.note("read")  # counted once per file, as FsOps.read_file does
    fd = os.open(path, READ_FLAGS)
    try:
        d = zlib.decompressobj()
        head = b""
        pending = b""
        while b"\0" not in head:
            if not pending:
                pending = os.read(fd, _READ)
                if not pending:
                    raise _corrupt(oid, "truncated")
            head += _inflate(d, pending[:4096], 64, oid)
            pending = d.unconsumed_tail + pending[4096:]
            if len(head) > 64:
                raise _corrupt(oid, "no header")
        header, _, first = head.partition(b"\0")
        type_name, _, size_text = header.partition(b" ")
        type_num = TYPE_NUMS.get(type_name)
        if type_num is None or not size_text.isdigit():
            raise _corrupt(oid, "bad header")
        size = int(size_text)
        yield type_num, size
        got = len(first)
        if first:
            yield first
        while not d.eof:
            if not pending:
                pending = os.read(fd, _READ)
                if not pending:
                    raise _corrupt(oid, "truncated")
            piece = _inflate(d, pending, PIECE, oid)
            pending = d.unconsumed_tail
            got += len(piece)
            if got > size:
                raise _corrupt(oid, "longer than its header says")
            if piece:
                yield piece
        if got != size:
            raise _corrupt(oid, "shorter than its header says")
    finally:
        os.close(fd)


def _inflate(d: zlib._Decompress, data: bytes, limit: int, oid: bytes) -> bytes:
    try:
        return d.decompress(data, limit)
    except zlib.error as exc:
        raise _corrupt(oid, str(exc)) from None


def _corrupt(oid: bytes, detail: str) -> StorageError:
    return ObjectStoreError(f"corrupt loose object {oid.hex()}: {detail}")
