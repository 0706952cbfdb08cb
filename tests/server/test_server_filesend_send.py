"""filesend.send_file by sendregion's SocketSender, on uvloop with a real socket: the
whole file, a range, HEAD; and what it has always done at the edges, the send watch
aside (a plain aiohttp server here): a client that stops reading is cut after its own
``timeout``, a file that shrinks mid-send is an OSError for the caller (no cut), the
file's bytes are not counted in ``output_size``, and no descriptor outlives the
request, whichever way it ends."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import uvloop
from aiohttp import web
from gitspout.server.app.filesend import send_file

SIZE = 48 << 20  # more than loopback's socket buffers take at once


def _fds() -> set[tuple[str, str]]:
    """This process's descriptors, each with what it names: one opened since and left
    open shows as a pair not there before (even where a number was reused)."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
        except FileNotFoundError:
            pass  # listdir's own
    return out


async def _serve(path: Path, timeout: float,
                 client: Callable[[int, dict[str, Any]], Awaitable[None]]) -> dict[str, Any]:
    """``client(port, seen)`` against a server whose one route is ``send_file(path)``;
    ``seen``: what the handler met (``error``, ``fds_before``/``fds_after``,
    ``output_size``), ``done`` set once it ended."""
    seen: dict[str, Any] = {"done": asyncio.Event(), "started": asyncio.Event()}

    async def handler(request: web.Request) -> web.StreamResponse:
        seen["fds_before"] = _fds()
        seen["started"].set()
        try:
            resp = await send_file(request, str(path), timeout)
            seen["output_size"] = request.writer.output_size
            return resp
        except BaseException as exc:
            seen["error"] = exc
            raise
        finally:
            seen["fds_after"] = _fds()
            seen["done"].set()

    app = web.Application()
    app.router.add_route("*", "/f", handler)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        await asyncio.wait_for(client(port, seen), 30)
        await asyncio.wait_for(seen["done"].wait(), 30)
    finally:
        await runner.cleanup()
    return seen


def _run(path: Path, timeout: float,
         client: Callable[[int, dict[str, Any]], Awaitable[None]]) -> dict[str, Any]:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_serve(path, timeout, client))


async def _request(port: int, head: str) -> socket.socket:
    """A raw connection that asked ``head`` (a small receive buffer), and nothing read."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, head.encode() + b"\r\n\r\n")
    return sock


async def _read_all(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    got = bytearray()
    while data := await loop.sock_recv(sock, 1 << 20):
        got += data
    return bytes(got)


@pytest.fixture
def big(tmp_path: Path) -> Path:
    path = tmp_path / "big"
    with open(path, "wb") as f:
        f.write(os.urandom(1 << 16) * (SIZE >> 16))
    return path


def _body(raw: bytes) -> tuple[str, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return head.decode(), body


def test_whole_file_range_and_head(big: Path) -> None:
    want = big.read_bytes()
    results: dict[str, bytes] = {}

    async def client(port: int, seen: dict[str, Any]) -> None:
        for name, head in [
            ("whole", "GET /f HTTP/1.1\r\nHost: h\r\nConnection: close"),
            ("range", "GET /f HTTP/1.1\r\nHost: h\r\nRange: bytes=100-199\r\nConnection: close"),
        ]:
            seen["done"].clear()
            sock = await _request(port, head)
            with sock:
                results[name] = await _read_all(sock)
            await seen["done"].wait()
            assert seen["fds_after"] <= seen["fds_before"]
            assert "error" not in seen
        seen["done"].clear()
        sock = await _request(port, "HEAD /f HTTP/1.1\r\nHost: h\r\nConnection: close")
        with sock:
            results["head"] = await _read_all(sock)

    seen = _run(big, 5.0, client)
    head, body = _body(results["whole"])
    assert head.startswith("HTTP/1.1 200") and body == want
    head, body = _body(results["range"])
    assert head.startswith("HTTP/1.1 206") and "bytes 100-199/" in head and body == want[100:200]
    head, body = _body(results["head"])
    assert head.startswith("HTTP/1.1 200") and f"Content-Length: {SIZE}" in head and body == b""
    # The file's bytes are not counted as aiohttp's (the headers are): as before.
    assert 0 < seen["output_size"] < 1000


def test_a_client_that_stops_reading_is_cut_after_the_timeout(big: Path) -> None:
    async def client(port: int, seen: dict[str, Any]) -> None:
        sock = await _request(port, "GET /f HTTP/1.1\r\nHost: h")
        with sock:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await seen["done"].wait()  # never reading
            seen["waited"] = loop.time() - t0

    seen = _run(big, 0.5, client)
    assert isinstance(seen["error"], ConnectionResetError)
    assert 0.4 < seen["waited"] < 5
    assert seen["fds_after"] <= seen["fds_before"]


def test_a_file_that_shrinks_mid_send_is_an_os_error(big: Path) -> None:
    async def client(port: int, seen: dict[str, Any]) -> None:
        sock = await _request(port, "GET /f HTTP/1.1\r\nHost: h\r\nConnection: close")
        with sock:
            await seen["started"].wait()
            await asyncio.sleep(0.3)  # the server waits for the socket: the file shrinks
            os.truncate(big, 1 << 20)
            await _read_all(sock)

    seen = _run(big, 10.0, client)
    error = seen["error"]
    assert isinstance(error, OSError) and not isinstance(error, ConnectionError)
    assert seen["fds_after"] <= seen["fds_before"]


def test_a_client_gone_mid_send_and_a_cancelled_handler_close_everything(big: Path) -> None:
    async def gone(port: int, seen: dict[str, Any]) -> None:
        sock = await _request(port, "GET /f HTTP/1.1\r\nHost: h")
        await seen["started"].wait()
        await asyncio.sleep(0.2)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
        sock.close()  # a reset: the next sendfile fails

    seen = _run(big, 0.0, gone)
    assert isinstance(seen["error"], ConnectionError | asyncio.CancelledError)
    assert seen["fds_after"] <= seen["fds_before"]

    async def cancelled(port: int, seen: dict[str, Any]) -> None:
        sock = await _request(port, "GET /f HTTP/1.1\r\nHost: h")
        with sock:
            await seen["started"].wait()
            await asyncio.sleep(0.2)
            for task in asyncio.all_tasks():
                if "handle_request" in repr(task.get_coro()):
                    task.cancel()
            await seen["done"].wait()

    seen = _run(big, 0.0, cancelled)
    assert isinstance(seen["error"], asyncio.CancelledError)
    assert seen["fds_after"] <= seen["fds_before"]
