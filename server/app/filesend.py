"""A file over HTTP with ``Range`` (RFC 9110 14) and the kernel's ``sendfile``.

aiohttp's FileResponse does both on asyncio's own loop, but uvloop has no
``loop.sendfile``: there it falls back to reading 256 KiB pieces in the default executor
and writing them through the transport, a Python round trip per piece. Here the bytes go
from the page cache to the socket by ``os.sendfile`` on a duplicate of the connection's
descriptor (the loop watches the duplicate for writability: uvloop refuses a watcher on
a descriptor its transport owns), once aiohttp has written the headers.
"""

from __future__ import annotations

import asyncio
import os
import re

from aiohttp import web

__all__ = ["send_file", "parse_range"]

# At most 19 digits: more is no file size, and int() refuses over 4,300 digits (a 500).
_RANGE = re.compile(r"bytes=([0-9]{0,19})-([0-9]{0,19})$")
PIECE = 4 << 20  # bytes per sendfile call


def parse_range(header: str | None, size: int) -> tuple[int, int] | None | bool:
    """``(start, stop)`` of a single ``bytes=`` range; None for the whole file (no header,
    or one this does not serve ranges for: several ranges); False when unsatisfiable."""
    if not header:
        return None
    m = _RANGE.match(header.strip())
    if m is None:
        return None
    first, last = m.group(1), m.group(2)
    if not first:
        if not last or int(last) == 0:
            return False
        return max(0, size - int(last)), size
    start = int(first)
    stop = min(size, int(last) + 1) if last else size
    if start >= size or stop <= start:
        return False
    return start, stop


async def send_file(request: web.Request, path: str, timeout: float,
                    content_type: str = "application/octet-stream") -> web.StreamResponse:
    """The file at ``path``, whole or the range asked for. ``timeout``: longest wait for
    the client to take more bytes (0: none); a client that stops is cut."""
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        rng = parse_range(request.headers.get("Range"), st.st_size)
        headers = {"Accept-Ranges": "bytes", "Content-Type": content_type,
                   "ETag": f'"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"'}
        if rng is False:
            headers["Content-Range"] = f"bytes */{st.st_size}"
            return web.Response(status=416, headers=headers)
        start, stop = rng if isinstance(rng, tuple) else (0, st.st_size)
        resp = web.StreamResponse(status=206 if isinstance(rng, tuple) else 200,
                                  headers=headers)
        if isinstance(rng, tuple):
            resp.headers["Content-Range"] = f"bytes {start}-{stop - 1}/{st.st_size}"
        resp.content_length = stop - start
        await resp.prepare(request)
        if request.method != "HEAD" and stop > start:
            await _pump(request, fd, start, stop - start, timeout)
        await resp.write_eof()
        return resp
    finally:
        os.close(fd)


async def _pump(request: web.Request, fd: int, offset: int, count: int,
                timeout: float) -> None:
    writer, transport = request.writer, request.transport
    if transport is None or transport.is_closing():
        raise ConnectionResetError("connection lost")
    writer.send_headers()  # type: ignore[attr-defined]  # aiohttp >= 3.12 (pyproject)
    await writer.drain()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (timeout or 60.0)
    while transport.get_write_buffer_size():  # the headers, if the socket took not all
        if loop.time() > deadline:
            raise ConnectionResetError("client stopped reading the headers")
        await asyncio.sleep(0.001)
    sock = transport.get_extra_info("socket")
    out = os.dup(sock.fileno())
    try:
        while count > 0:
            try:
                sent = os.sendfile(out, fd, offset, min(count, PIECE))
            except BlockingIOError:
                await _wait_fd(loop, out, timeout)
                continue
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise ConnectionResetError(str(exc)) from None
            if sent == 0:
                raise OSError("file shrank while being sent")
            offset += sent
            count -= sent
    finally:
        os.close(out)


async def _wait_fd(loop: asyncio.AbstractEventLoop, fd: int, timeout: float) -> None:
    """Until ``fd`` takes more bytes, or ``timeout`` seconds pass (the client is cut). A
    bare future and a timer: a download waits here once per socket buffer it empties,
    and ``asyncio.wait_for`` (a task each time) was most of a bundle GET's Python time."""
    fut: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    def expire() -> None:
        if not fut.done():
            fut.set_exception(ConnectionResetError("client stopped reading the file"))

    loop.add_writer(fd, ready)
    timer = loop.call_later(timeout, expire) if timeout else None
    try:
        await fut
    finally:
        loop.remove_writer(fd)
        if timer is not None:
            timer.cancel()
