"""A recording HTTP proxy on 127.0.0.1: what each client asked and what each server sent.

Every client reaches a server through one of these, so the same measure applies to
gitspout and to git-http-backend: the packs in the upload-pack responses (objects sent,
duplicates, entry order) and the request bodies (to tell when two servers got the same
request). Bodies go through unchanged (a gzip request body stays gzip); the whole response
is read before it is passed on, which is fine for test-sized packs.
"""

from __future__ import annotations

import asyncio
import gzip
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
from aiohttp import web

HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host",
       "proxy-connection", "te", "trailer", "upgrade"}
TIMEOUT = 120.0


@dataclass(frozen=True)
class Exchange:
    """One request through the proxy and the answer it got."""

    method: str
    path: str
    request_headers: dict[str, str]
    request_body: bytes
    status: int
    body: bytes

    @property
    def is_upload_pack(self) -> bool:
        return self.method == "POST" and self.path.endswith("/git-upload-pack")

    def request_payload(self) -> bytes:
        """The request body as the server read it (gzip undone)."""
        if self.request_headers.get("content-encoding", "").lower() in ("gzip", "x-gzip"):
            return gzip.decompress(self.request_body)
        return self.request_body

    def pack(self) -> bytes | None:
        """The pack data of an upload-pack answer (side-band or raw), or None."""
        return pack_of(self.body) if self.is_upload_pack and self.status == 200 else None


def _pkts(body: bytes) -> Iterator[tuple[int, bytes | None]]:
    """(position, payload) of each pkt-line; payload None for flush/delim/end; stops at a
    position that is no pkt-line (where a raw pack starts)."""
    pos = 0
    while pos + 4 <= len(body):
        try:
            n = int(body[pos : pos + 4], 16)
        except ValueError:
            yield pos, b""  # not a length: the caller looks at what is there
            return
        if n < 4:
            yield pos, None
            pos += 4
            continue
        yield pos, body[pos + 4 : pos + n]
        pos += n


def pack_of(body: bytes) -> bytes | None:
    """The pack in an upload-pack response body (v0 or v2; side-band, side-band-64k or
    none), or None when it has none. Raises on an ``ERR`` line or a band-3 message."""
    data = bytearray()
    in_band = False
    for pos, payload in _pkts(body):
        if payload == b"" and body[pos : pos + 4] == b"PACK":
            return body[pos:]  # no side-band: the pack follows the last pkt-line raw
        if payload is None:
            continue
        if payload.startswith(b"ERR "):
            raise AssertionError(payload.decode(errors="replace"))
        if not in_band:
            in_band = payload.startswith(b"\x01PACK")
        if not in_band:
            continue
        if payload[:1] == b"\x01":
            data += payload[1:]
        elif payload[:1] == b"\x03":
            raise AssertionError("band 3: " + payload[1:].decode(errors="replace"))
    return bytes(data) if in_band else None


class RecordingProxy:
    """``http://127.0.0.1:PORT`` forwarding everything to ``upstream`` and keeping a record."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[Exchange] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RecordingProxy:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("proxy did not start")
        return self

    def take(self) -> list[Exchange]:
        """The exchanges recorded since the last call."""
        out, self.exchanges = self.exchanges, []
        return out

    def stop(self) -> None:
        fut = asyncio.run_coroutine_threadsafe(self._close(), self._loop)
        fut.result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._open())
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _open(self) -> None:
        self._session = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=TIMEOUT))
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None, auto_decompress=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _close(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _forward(self, request: web.Request) -> web.Response:
        assert self._session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        async with self._session.request(request.method, self.upstream + request.path_qs,
                                         headers=headers, data=body,
                                         allow_redirects=False) as resp:
            data = await resp.read()
            out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP}
            status = resp.status
        self.exchanges.append(Exchange(request.method, request.path,
                                       {k.lower(): v for k, v in request.headers.items()},
                                       body, status, data))
        return web.Response(status=status, body=data, headers=out_headers)
