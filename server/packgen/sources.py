"""Pack sources: where the bytes of an outgoing pack come from (ARCHITECTURE.md I5).

Fastest first:

* :class:`WholePackSource` sends one pack file verbatim when the object set is exactly its
  contents: header, entries and trailer as they are on disk.
* :class:`~.reuse.ReusePackSource` copies entries from the packs they live in, and writes
  what cannot be reused (:mod:`.writer`).

Sources are plain iterators of ``bytes`` (pack data) and :class:`~.stats.Progress` items,
run in the server's thread pool and pulled by the stream writer, so backpressure and
cancellation come for free: nothing is produced until the writer asks for it. This module
also holds what every source writes with: :class:`PackOut`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Protocol

from ..store.objformat import new_hash
from ..store.packs import PackFile
from .stats import PackStats, Progress

__all__ = ["PackSource", "WholePackSource", "PackOut", "CHUNK"]

# Pack bytes handed to the writer per step, and read from a pack file per pread: what one
# request holds between steps is a few of these, whatever the object sizes
# (docs/ARCHITECTURE.md "Memory caps"). Under the fixed mmap threshold (app/memory.py,
# 128 KiB), so that each piece comes from the heap: 256 KiB pieces each got a map of their
# own, and streaming 27 MB cost 14 ms more in page faults. The writer pulls many per pool
# round trip (app/stream.py pull_items).
CHUNK = 64 << 10


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


class PackOut:
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
