"""Sending part of a response straight into its socket: file regions by ``os.sendfile``
(from the page cache to the socket, no Python step per packet), and the few small byte
strings between them (docs/ARCHITECTURE.md "Pack cache").

aiohttp writes through its transport, which buffers what the socket does not take. Here,
once that buffer is empty (the headers and what came before them are in the kernel), a
duplicate of the connection's descriptor is written directly (uvloop refuses a watcher on
a descriptor its transport owns: the duplicate is watched for writability instead), and
nothing is written through the transport again until :meth:`SocketSender.finish` has sent
everything. In a chunked response each region is one HTTP chunk, its size line sent with
``MSG_MORE`` so that it leaves in one segment with the file's first bytes.

What is sent here counts as aiohttp's: the writer's ``output_size`` grows by every byte
the kernel took, so the send watch (sendwatch.py) sees a client that stops reading and
cuts it as it cuts any response, and the drain (drain.py) waits for these bytes in the
socket's send queue like for any others. A cut aborts the transport, which cancels the
handler (aiohttp's handler cancellation) where it waits here; a wait also looks at the
transport every :data:`CHECK` seconds, for a server that does not cancel its handlers.

The files of gitspout's own (bundles, blob packs: filesend.py) go out by the same sender,
one region each, under the same rules: the send watch judges their client, and a file
that fails mid-region cuts the connection.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Any

from aiohttp import web
from aiohttp.http_writer import StreamWriter

from .metrics import RequestRecord

__all__ = ["SocketSender", "PIECE"]

log = logging.getLogger("gitspout")

# Bytes per sendfile call: a client that takes everything at once (a large socket buffer)
# still gives the loop back between calls, every YIELD_EVERY bytes.
PIECE = 4 << 20
YIELD_EVERY = 8 << 20
CHECK = 1.0  # seconds between two looks at the transport while waiting for the socket


class SocketSender:
    """Regions of files and small byte strings sent into one response's socket, in order,
    framed as the response's transfer coding wants (chunked or not)."""

    def __init__(self, request: web.BaseRequest, record: RequestRecord | None = None) -> None:
        """Every byte the kernel takes counts in the writer's ``output_size`` (what the
        send watch measures progress by); a file that fails or ends early mid-region cuts
        the connection."""
        self._request = request
        self._transport: Any = request.transport
        self._writer: Any = request.writer
        self._record = record
        self._chunked = bool(getattr(request.writer, "chunked", False))
        self._pending = bytearray()
        self._sock: socket.socket | None = None
        self._since_yield = 0
        self.sent = 0  # bytes the kernel took from this sender

    @staticmethod
    def usable(request: web.BaseRequest | None) -> bool:
        """Can this response be written here? A plain socket under aiohttp's own writer,
        open. (With a Content-Length the caller sends exactly that many bytes.)"""
        if request is None:
            return False
        transport, writer = request.transport, request.writer
        return (transport is not None and not transport.is_closing()
                and transport.get_extra_info("socket") is not None
                and isinstance(writer, StreamWriter)
                and transport.get_extra_info("sslcontext") is None)

    async def start(self, first: bytes = b"") -> None:
        """Headers out, the transport's buffer empty, the socket ours until :meth:`finish`;
        ``first`` (bytes a writer still held) goes before anything else."""
        self._check_open()
        self._writer.send_headers()
        transport = self._transport
        # Nearly always empty already: uvloop writes at once what the socket takes. A
        # socket full since before the pack: wait for the transport to get it out (a
        # client that never reads is cut by the send watch meanwhile).
        self._check_open()
        sock = transport.get_extra_info("socket")
        # Family and type given: no syscall to find them out. The descriptor shares the
        # connection's O_NONBLOCK: a send the socket cannot take raises BlockingIOError.
        self._sock = socket.socket(sock.family, sock.type, 0, os.dup(sock.fileno()))
        while transport.get_write_buffer_size():
            # Woken when the socket takes more (not polled), then the transport's own
            # writer gets its turn to write its buffer out.
            await self._writable()
            await asyncio.sleep(0)
        self.add(first)

    def add(self, data: bytes) -> None:
        """``data`` goes out before the next region, or at :meth:`finish`."""
        if not data:
            return
        if self._record is not None:
            self._record.bytes += len(data)  # the body's bytes, as the client decodes them
        if self._chunked:
            self._pending += b"%x\r\n" % len(data)
            self._pending += data
            self._pending += b"\r\n"
        else:
            self._pending += data

    async def sendfile(self, fd: int, offset: int, count: int) -> None:
        """``count`` bytes of the file ``fd`` from ``offset``, after what is pending."""
        if count <= 0:
            return
        if self._chunked:
            self._pending += b"%x\r\n" % count
        await self._flush(more=True)
        assert self._sock is not None
        out = self._sock.fileno()
        while count:
            try:
                sent = os.sendfile(out, fd, offset, min(count, PIECE))
            except BlockingIOError:
                await self._writable()
                continue
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise ConnectionResetError(str(exc)) from None
            except OSError as exc:  # reading the file failed: the region can never end
                raise self._cut(f"cannot send a file: {exc}") from exc
            if sent == 0:
                raise self._cut(f"a file ended {count} bytes early")
            self._count(sent)
            if self._record is not None:
                self._record.bytes += sent
            offset += sent
            count -= sent
            self._since_yield += sent
            if self._since_yield >= YIELD_EVERY and count:
                self._since_yield = 0
                await asyncio.sleep(0)
        if self._chunked:
            self._pending += b"\r\n"

    async def finish(self) -> None:
        """Send what is pending: from then on the transport may be written again."""
        await self._flush(more=False)

    def close(self) -> None:
        """Let go of the duplicate (the connection stays aiohttp's)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    # -- internals ------------------------------------------------------------------

    async def _flush(self, more: bool) -> None:
        if not self._pending:
            return
        data = bytes(self._pending)
        self._pending.clear()
        assert self._sock is not None
        flags = socket.MSG_MORE if more else 0
        view = memoryview(data)
        while view:
            try:
                n = self._sock.send(view, flags)
            except BlockingIOError:
                await self._writable()
                continue
            except OSError as exc:  # any error of the socket: the connection is gone
                self._transport.abort()
                raise ConnectionResetError(str(exc)) from None
            self._count(n)
            view = view[n:]

    def _count(self, n: int) -> None:
        """``n`` bytes (framing included) the kernel took in one call."""
        self.sent += n
        self._writer.output_size += n  # what the send watch measures progress by
        if self._record is not None:
            self._record.writes += 1

    def _cut(self, why: str) -> ConnectionResetError:
        """A region announced and not sent whole: no in-band message can follow it, the
        connection is cut (the client sees a truncated response, never a wrong one)."""
        log.warning("%s; connection cut", why)
        self._transport.abort()
        return ConnectionResetError(why)

    def _check_open(self) -> None:
        if self._transport is None or self._transport.is_closing():
            raise ConnectionResetError("connection lost")

    async def _writable(self) -> None:
        """Until the socket takes more (or the connection is cut: the transport is looked
        at every :data:`CHECK` seconds). A bare future and one timer: a download waits
        here once per socket buffer it empties, and ``asyncio.wait_for`` (a task each
        time) was most of a bundle GET's Python time."""
        self._check_open()
        assert self._sock is not None
        fd = self._sock.fileno()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        timer: asyncio.TimerHandle | None = None

        def ready() -> None:
            if not fut.done():
                fut.set_result(None)

        def look() -> None:
            nonlocal timer
            if self._transport.is_closing():
                ready()
            else:
                timer = loop.call_later(CHECK, look)

        timer = loop.call_later(CHECK, look)
        loop.add_writer(fd, ready)
        try:
            await fut
        finally:
            loop.remove_writer(fd)
            if timer is not None:
                timer.cancel()
        self._check_open()
