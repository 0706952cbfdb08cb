"""Writing a response: 32 KiB buffered pkt-lines, side-band framing, progress, keepalive,
backpressure and cancellation (docs/ARCHITECTURE.md I3).

Every write to the transport goes through :meth:`PktWriter._send`, which is where write
calls per response are counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from concurrent.futures import Executor
from typing import Any

from aiohttp import web
from gitspout.protocol.fetch_request import Sideband
from gitspout.protocol.fetch_response import Mark
from gitspout.protocol.pktline import DELIM_PKT, FLUSH_PKT, PktBuffer, encode_pkt
from gitspout.protocol.sideband import (
    BAND_DATA,
    BAND_PROGRESS,
    band_payload,
    encode_band,
    encode_band_error,
    encode_err_pkt,
    encode_keepalive,
    max_band_payload,
)

from ..packgen import Progress
from .metrics import RequestRecord

__all__ = ["PktWriter", "pump_pack", "pull_items", "cap_output", "frame_items", "PULL_END"]

PULL_END = object()  # what pull_items ends with when the iterator is exhausted
# PktWriter.chunks lets other tasks run after this many bytes: a socket that keeps taking
# data never makes a write wait, and 29 MB of ACK lines would otherwise go out in one go.
YIELD_EVERY = 1 << 20
# Pack items are pulled from the pool this many bytes at a time (pull_items).
PULL_BYTES = 256 << 10
# Pack data is framed and written in slices of at most this many bytes, so that a large
# item from the producer never sits in the transport whole (docs/ARCHITECTURE.md
# "Memory caps").
WRITE_SLICE = 64 << 10


class PktWriter:
    """Buffers pkt-lines into chunks of at least 32 KiB before writing them. ``request``
    (the response's) lets a pack-cache reader send file regions into its socket
    (cacheread.py)."""

    def __init__(
        self,
        response: web.StreamResponse,
        sideband: Sideband = Sideband.NONE,
        sideband_all: bool = False,
        chunk_size: int = 32 * 1024,
        record: RequestRecord | None = None,
        request: web.BaseRequest | None = None,
    ) -> None:
        self.response = response
        self.request = request
        self.record = record
        self.sideband = sideband
        self.sideband_all = sideband_all
        self.buf = PktBuffer(chunk_size)
        self._band_max = max_band_payload(sideband is Sideband.LARGE)

    async def _send(self, data: bytes) -> None:
        if not data:
            return
        if self.record is not None:
            self.record.writes += 1
            self.record.bytes += len(data)
        await self.response.write(data)

    async def _maybe(self, chunk: bytes | None) -> None:
        if chunk is not None:
            await self._send(chunk)

    async def pkt(self, payload: bytes) -> None:
        """One data pkt-line (band 1 under sideband-all)."""
        if self.sideband_all:
            payload = band_payload(BAND_DATA, payload)
        await self._maybe(self.buf.add(payload))

    async def pkts(self, payloads: Iterable[bytes]) -> None:
        for payload in payloads:
            await self.pkt(payload)

    async def chunks(self, chunks: Iterable[bytes]) -> None:
        """Already-framed chunks (each of 32 KiB or more but the last), one write each,
        letting other tasks run every :data:`YIELD_EVERY` bytes."""
        await self.drain()
        since_yield = 0
        for chunk in chunks:
            await self._send(chunk)
            since_yield += len(chunk)
            if since_yield >= YIELD_EVERY:
                since_yield = 0
                await asyncio.sleep(0)

    async def end_with(self, chunks: list[bytes]) -> None:
        """Already-framed chunks, then the end of the response: the last chunk goes with
        the end, so that a small answer is one write (headers, body and the end of a
        chunked body together)."""
        await self.chunks(chunks[:-1])
        last = chunks[-1] if chunks else b""
        if self.record is not None and last:
            self.record.writes += 1
            self.record.bytes += len(last)
        await self.response.write_eof(last)

    async def framed(self, data: bytes) -> None:
        """Bytes framed already (side-band packets as this client wants them), written
        after what is buffered."""
        await self.drain()
        await self._send(data)

    async def flush_pkt(self) -> None:
        await self._maybe(self.buf.add_raw(FLUSH_PKT))

    async def items(self, items: Iterable[bytes | Mark]) -> None:
        """Data pkt-lines, flushes and delims laid out by protocol/fetch_response.py (what
        follows a pack: that has no second pack)."""
        for item in items:
            if isinstance(item, bytes):
                await self.pkt(item)
            elif item is Mark.FLUSH:
                await self.flush_pkt()
            elif item is Mark.DELIM:
                await self.delim_pkt()
            else:
                raise ValueError(f"{item} where no pack can go")

    async def delim_pkt(self) -> None:
        await self._maybe(self.buf.add_raw(DELIM_PKT))

    async def drain(self) -> None:
        """Write whatever is buffered."""
        await self._send(self.buf.take())

    async def band(self, band: int, data: bytes) -> None:
        """Data on a side-band channel; without side-band, pack data goes raw and the rest
        is dropped (there is no room for it in the protocol)."""
        if self.sideband is Sideband.NONE:
            if band == BAND_DATA:
                await self._maybe(self.buf.add_raw(data))
            return
        await self._maybe(self.buf.add_raw(encode_band(band, data, self._band_max)))

    async def pack_data(self, data: bytes) -> None:
        """Pack bytes on band 1, framed and written a slice at a time."""
        await self.drain()
        view = memoryview(data)
        for at in range(0, len(view), WRITE_SLICE):
            await self.band(BAND_DATA, view[at:at + WRITE_SLICE])  # type: ignore[arg-type]
            await self.drain()

    async def progress(self, text: bytes) -> None:
        if self.sideband is not Sideband.NONE:
            await self.band(BAND_PROGRESS, text)

    async def error(self, message: str, in_band: bool) -> None:
        """Report a fatal error after the headers went out: band 3, or an ERR line."""
        if in_band and self.sideband is not Sideband.NONE:
            framed = encode_band_error(message, self._band_max)
        else:
            framed = encode_err_pkt(message)
        await self._maybe(self.buf.add_raw(framed))
        await self.drain()

    async def keepalive(self) -> None:
        if self.sideband is not Sideband.NONE:
            await self._maybe(self.buf.add_raw(encode_keepalive()))
            await self.drain()


def frame_items(items: Iterable[bytes | Mark], sideband_all: bool = False) -> bytes:
    """What :meth:`PktWriter.items` writes for ``items``, as bytes."""
    out: list[bytes] = []
    for item in items:
        if isinstance(item, bytes):
            out.append(encode_pkt(band_payload(BAND_DATA, item) if sideband_all else item))
        elif item is Mark.FLUSH:
            out.append(FLUSH_PKT)
        elif item is Mark.DELIM:
            out.append(DELIM_PKT)
        else:
            raise ValueError(f"{item} where no pack can go")
    return b"".join(out)


def cap_output(transport: asyncio.BaseTransport | None, limit: int) -> None:
    """At most about ``limit`` bytes queued for one connection's socket: past it aiohttp's
    ``write`` waits until the client has taken most of them (it drains while the transport
    is paused). The per-connection output cap, and the backpressure that keeps the pack
    producer from running ahead of a slow reader (I3, "Memory caps")."""
    if isinstance(transport, asyncio.WriteTransport) and limit > 0:
        transport.set_write_buffer_limits(high=limit)


async def pump_pack(
    writer: PktWriter,
    executor: Executor,
    it: Iterator[Any],
    keepalive: float,
    no_progress: bool,
) -> None:
    """Pull items (pack ``bytes``, :class:`~..packgen.Progress`) from a blocking iterator
    in ``executor`` and write them as they come.

    One batch is prefetched while the previous one is written. Silence longer than
    ``keepalive`` seconds sends a keepalive. Once done, or if the client goes away (the
    write raises or the task is cancelled), the iterator is closed after its current step.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[list[object]] = loop.run_in_executor(executor, pull_items, it)
    try:
        while True:
            try:
                items = await asyncio.wait_for(asyncio.shield(fut), keepalive)
            except TimeoutError:
                await writer.keepalive()
                continue
            if items[-1] is not PULL_END:
                fut = loop.run_in_executor(executor, pull_items, it)
            for item in items:
                if isinstance(item, Progress):
                    if not no_progress:
                        await writer.progress(item.text)
                        await writer.drain()
                elif isinstance(item, bytes):
                    await writer.pack_data(item)
            if items[-1] is PULL_END:
                break
    finally:
        _close_when_done(fut, it, executor, loop)


def pull_items(it: Iterator[Any], limit: int = PULL_BYTES) -> list[Any]:
    """In the pool: the iterator's next items, until ``limit`` bytes of them, a progress
    line, or the end (then ``PULL_END`` is the last item). A pool round trip costs 100-250 us
    of CPU here (thread wake-ups, futures), so items (64 KiB pieces) come a batch at a
    time; a batch is what a slow reader holds, plus the one prefetched (docs/ARCHITECTURE.md
    "Memory caps")."""
    items: list[Any] = []
    size = 0
    while size < limit:
        item: Any = next(it, PULL_END)
        items.append(item)
        if item is PULL_END or isinstance(item, Progress):
            break
        size += len(item)
    return items


def _close_when_done(fut: asyncio.Future[Any], it: Iterator[Any], executor: Executor,
                     loop: asyncio.AbstractEventLoop) -> None:
    close = getattr(it, "close", None)
    if close is None:
        return

    def _after(_: object) -> None:
        if loop.is_closed():
            return
        try:
            loop.run_in_executor(executor, close)
        except RuntimeError:  # the pool is shut down (a request cut at --drain-timeout)
            close()

    if fut.done():
        _after(fut)
    else:
        fut.add_done_callback(_after)
