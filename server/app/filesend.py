"""A file over HTTP with ``Range`` (RFC 9110 14) and the kernel's ``sendfile``.

aiohttp's FileResponse does both on asyncio's own loop, but uvloop has no
``loop.sendfile``: there it falls back to reading 256 KiB pieces in the default executor
and writing them through the transport, a Python round trip per piece. Here the bytes go
from the page cache to the socket by ``os.sendfile`` on a duplicate of the connection's
descriptor, once aiohttp has written the headers: the one region of a
:class:`~.sendregion.SocketSender` (sendregion.py), the pack cache's sender.
"""

from __future__ import annotations

import os
import re

from aiohttp import web

from .sendregion import SocketSender

__all__ = ["send_file", "parse_range"]

# At most 19 digits: more is no file size, and int() refuses over 4,300 digits (a 500).
_RANGE = re.compile(r"bytes=([0-9]{0,19})-([0-9]{0,19})$")


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


async def send_file(request: web.Request, path: str,
                    content_type: str = "application/octet-stream") -> web.StreamResponse:
    """The file at ``path``, whole or the range asked for. A client that stops reading,
    or reads too slowly, is cut by the send watch (``--send-timeout``,
    ``--send-min-rate``), as for any response."""
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
            await _send(request, fd, start, stop - start)
        await resp.write_eof()
        return resp
    finally:
        os.close(fd)


async def _send(request: web.Request, fd: int, offset: int, count: int) -> None:
    """``count`` bytes of ``fd`` from ``offset`` after the headers. The bytes count in the
    writer's ``output_size``: the send watch sees a slow download progress (a download
    used to be cut once one wait for the socket outlasted ``--send-timeout``, which a
    client slower than a socket buffer per timeout always met). A file that fails or
    shrinks mid-send cuts the connection: the client sees a short body, never a wrong
    one."""
    sender = SocketSender(request)
    try:
        await sender.start()
        await sender.sendfile(fd, offset, count)
        await sender.finish()
    finally:
        sender.close()
