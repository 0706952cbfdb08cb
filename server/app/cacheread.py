"""Reading one pack-cache entry to one client (docs/ARCHITECTURE.md "Pack cache").

A cache file holds the pack already framed as side-band-64k band-1 pkt-lines, every packet
full but the last (packcache.py frames it as the producer writes); the progress lines are
kept beside it, each at the file offset it came at. A client that asked for side-band-64k
(every v2 fetch, and v0/v1 with ``side-band-64k``) gets the file as it is by ``sendfile``
(sendregion.py): a complete entry in one region after its progress lines, an entry still
being written region by region as the producer appends, keepalives while it waits. Any
other client (side-band's 1000-byte packets, no side-band), or a response with no socket
to send from, gets the payloads unframed here and framed again for it by its writer: a
Python step per packet, the rare case.

Either way the reader ends as :func:`read_entry` says: sent (or failed in-band), the entry
turned out to name a whole pack (nothing sent), or the producer could not write the file:
then the caller generates the rest itself (packcache.py ``_After``) from the pack bytes
this client already has, read back from the file by :class:`FilePayloads`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

from aiohttp import web
from gitspout.protocol.fetch_request import Sideband
from gitspout.protocol.sideband import (
    BAND_DATA,
    BAND_PROGRESS,
    SIDEBAND_64K_MAX_DATA,
    encode_band,
    encode_band_error,
    encode_keepalive,
    split_band_packets,
)

from .cachestore import CacheEntry, PackCacheStats
from .metrics import RequestRecord
from .sendregion import SocketSender
from .stream import PktWriter

__all__ = ["read_entry", "send_complete", "FilePayloads", "pack_bytes_before", "WHOLE",
           "READ_CHUNK"]

WHOLE = -1  # what read_entry returns for an entry naming a pack to send whole
READ_CHUNK = 256 * 1024  # one read per step of the Python path: four full packets
# The Python path lets other tasks run after this many bytes: a reader whose client keeps
# taking data never waits in ``write`` (the sendfile path yields in sendregion.py).
YIELD_EVERY = 256 * 1024
# A sendfile reader following the producer sends a region once this much more is written
# (or the entry ends): not one per producer step (256 KiB), each region a chunk header, a
# sendfile and a wake-up of its own, for every reader.
FOLLOW_BYTES = 1 << 20


async def read_entry(entry: CacheEntry, fd: int, writer: PktWriter, keepalive: float,
                     no_progress: bool, stats: PackCacheStats) -> int | None:
    """Send ``entry`` from its file ``fd`` to one client as it grows. Returns None when
    it is sent (or failed, in-band), :data:`WHOLE` when the entry names a pack to send
    whole (nothing was sent here), or the number of pack bytes sent when the producer
    could not write the file: the caller goes on from there and owns ``fd``, which is
    closed here in every other case."""
    keep = False
    try:
        if writer.sideband is Sideband.LARGE and SocketSender.usable(writer.request):
            assert writer.request is not None
            sender = SocketSender(writer.request, writer.record)
            try:
                got = await _by_sendfile(entry, fd, writer, sender, keepalive, no_progress,
                                         stats)
            finally:
                sender.close()
        else:
            got = await _by_python(entry, fd, writer, keepalive, no_progress, stats)
        keep = got is not None and got >= 0
        return got
    finally:
        if not keep:
            os.close(fd)
        entry.readers -= 1
        if entry.readers == 0 and not entry.done:
            entry.wake()  # the producer notices at its next step and stops


async def send_complete(entry: CacheEntry, fd: int, request: web.BaseRequest,
                        record: RequestRecord, head: bytes, after: bytes, no_progress: bool,
                        stats: PackCacheStats,
                        start: Callable[[int], Awaitable[web.StreamResponse]],
                        ) -> web.StreamResponse:
    """A complete entry to a client of side-band-64k (:meth:`SocketSender.usable`
    ``request``) as one response of known length (``start`` makes it): ``head`` (the lines
    before the pack) with the headers in one write, the file by sendfile with its progress
    lines between regions, ``after`` in one last write. No chunk framing, no keepalive
    (nothing is waited for). Closes ``fd``."""
    try:
        progress = [] if no_progress else [
            (at, encode_band(BAND_PROGRESS, text, SIDEBAND_64K_MAX_DATA))
            for at, text in entry.progress]
        length = len(head) + sum(len(p) for _, p in progress) + entry.size + len(after)
        resp = await start(length)
        first = head + b"".join(p for at, p in progress if at <= 0)
        await resp.write(first)  # with the headers, in one write
        record.writes += 1
        record.bytes += len(first)
        sender = SocketSender(request, record)
        try:
            await sender.start()
            pos = 0
            for at, framed in [*(p for p in progress if p[0] > 0), (entry.size, after)]:
                await sender.sendfile(fd, pos, at - pos)
                stats.served_bytes["sendfile"] += at - pos
                pos = at
                sender.add(framed)
            await sender.finish()
        finally:
            sender.close()
        return resp
    finally:
        os.close(fd)
        entry.readers -= 1


async def _by_sendfile(entry: CacheEntry, fd: int, writer: PktWriter, sender: SocketSender,
                       keepalive: float, no_progress: bool,
                       stats: PackCacheStats) -> int | None:
    """The file's own bytes by sendfile, progress lines and keepalives between regions."""
    await sender.start(writer.buf.take())  # what the writer held goes first
    pos = shown = 0
    while True:
        if entry.verbatim is not None:  # decided before any byte of the file was written
            await sender.finish()
            return WHOLE
        progress = entry.progress
        while shown < len(progress) and progress[shown][0] <= pos:
            if not no_progress:
                sender.add(encode_band(BAND_PROGRESS, progress[shown][1],
                                       SIDEBAND_64K_MAX_DATA))
            shown += 1
        end = entry.size if shown == len(progress) else min(entry.size, progress[shown][0])
        if pos < end:
            await sender.sendfile(fd, pos, end - pos)
            stats.served_bytes["sendfile"] += end - pos
            pos = end
        elif entry.failed is not None and entry.resumable:
            await sender.finish()
            return pack_bytes_before(fd, pos)
        elif entry.failed is not None:
            sender.add(encode_band_error(entry.failed, SIDEBAND_64K_MAX_DATA))
            await sender.finish()
            return None
        elif entry.done and shown == len(progress):
            await sender.finish()
            return None
        elif not entry.done:
            await sender.finish()  # nothing held back while the producer works
            if not await entry.grown(pos, FOLLOW_BYTES, keepalive):
                sender.add(encode_keepalive())


async def _by_python(entry: CacheEntry, fd: int, writer: PktWriter, keepalive: float,
                     no_progress: bool, stats: PackCacheStats) -> int | None:
    """The file read on the loop (local disk written moments ago: the page cache) and
    framed for this client by its writer."""
    pos = shown = since_yield = pack = 0
    while True:
        if entry.verbatim is not None:
            return WHOLE
        progress = entry.progress
        while shown < len(progress) and progress[shown][0] <= pos:
            if not no_progress:
                await writer.progress(progress[shown][1])
                await writer.drain()
            shown += 1
        end = entry.size if shown == len(progress) else min(entry.size, progress[shown][0])
        if pos < end:
            data = os.pread(fd, min(READ_CHUNK, end - pos), pos)
            payloads, used = _payloads(data, entry.path)
            if writer.sideband is Sideband.LARGE:
                await writer.framed(data[:used])  # framed as this client wants already
            else:
                await writer.pack_data(b"".join(payloads))
            pos += used
            pack += sum(map(len, payloads))
            stats.served_bytes["python"] += used
            since_yield += used
            if since_yield >= YIELD_EVERY:
                since_yield = 0
                await asyncio.sleep(0)
        elif entry.failed is not None and entry.resumable:
            return pack
        elif entry.failed is not None:
            await writer.error(entry.failed, in_band=True)
            return None
        elif entry.done and shown == len(progress):
            return None
        elif not entry.done and not await entry.changed(keepalive):
            await writer.keepalive()


def _payloads(data: bytes, path: str) -> tuple[list[memoryview], int]:
    """The band-1 payloads of whole packets at the start of ``data`` (what a read at a
    packet boundary got) and the bytes they take. OSError when there is none: the file
    shrank, or it is not what the producer wrote."""
    if not data:
        raise OSError(f"pack cache file {path} shrank")
    try:
        payloads, bands, used = split_band_packets(data)
    except ValueError as exc:
        raise OSError(f"pack cache file {path} is damaged: {exc}") from None
    if not used or any(b != BAND_DATA for b in bands):
        raise OSError(f"pack cache file {path} is damaged")
    return payloads, used


def pack_bytes_before(fd: int, end: int) -> int:
    """The pack bytes in the first ``end`` bytes (whole packets) of a cache file: its
    packets' lengths added up, one 4-byte read each (for the rare resumed reader)."""
    pos = pack = 0
    while pos < end:
        head = os.pread(fd, 4, pos)
        if len(head) < 4:
            raise OSError("pack cache file shrank")
        try:
            length = int(head, 16)
        except ValueError:
            length = 0  # not a packet length: damaged, as below
        if length < 5:
            raise OSError("pack cache file is damaged")
        pack += length - 5
        pos += length
    return pack


class FilePayloads:
    """The pack bytes of a cache file (its packets' payloads), read in order."""

    def __init__(self, fd: int, path: str = "") -> None:
        self.fd = fd
        self.path = path
        self.pos = 0  # in the file
        self.held = b""  # payload bytes read and not yet taken

    def read(self, n: int) -> bytes:
        """The next ``n`` pack bytes (fewer only where the file ends)."""
        out = [self.held]
        have = len(self.held)
        while have < n:
            data = os.pread(self.fd, READ_CHUNK, self.pos)
            if not data:
                break
            payloads, used = _payloads(data, self.path)
            self.pos += used
            out.extend(bytes(p) for p in payloads)
            have += sum(map(len, payloads))
        joined = b"".join(out)
        self.held = joined[n:]
        return joined[:n]
