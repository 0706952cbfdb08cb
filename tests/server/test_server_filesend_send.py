"""filesend.send_file by sendregion's SocketSender, on uvloop with a real socket: the
whole file, a range, HEAD; and at the edges, the send watch aside (a plain aiohttp server
here): a file that shrinks mid-send cuts the connection (the client gets a short body),
the file's bytes count in ``output_size`` (what the send watch measures progress by: a
client that stops reading a bundle is cut by it, test_server_bundles.py), and no
descriptor outlives the request, whichever way it ends."""

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


async def _serve(path: Path,
                 client: Callable[[int, dict[str, Any]], Awaitable[None]]) -> dict[str, Any]:
    """``client(port, seen)`` against a server whose one route is ``send_file(path)``;
    ``seen``: what the handler met (``error``, ``fds_before``/``fds_after``,
    ``output_sizes``: each answer's), ``done`` set once it ended."""
    seen: dict[str, Any] = {"done": asyncio.Event(), "started": asyncio.Event()}

    async def handler(request: web.Request) -> web.StreamResponse:
        seen["fds_before"] = _fds()
        seen["started"].set()
        try:
            resp = await send_file(request, str(path))
            seen.setdefault("output_sizes", []).append(request.writer.output_size)
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


def _run(path: Path,
         client: Callable[[int, dict[str, Any]], Awaitable[None]]) -> dict[str, Any]:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_serve(path, client))


async def _request(port: int, head: str) -> socket.socket:
    """A raw connection that asked ``head`` (a small receive buffer), and nothing read."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, head.encode() + b"\r\n\r\n")
    return sock


async def _until_sending(sock: socket.socket) -> None:
    """Until the server's first bytes are in ``sock``'s receive queue (nothing read): its
    send has begun, and with a small receive buffer it soon waits for the socket. Woken
    by the loop when the socket turns readable, within 10 s."""
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()
    loop.add_reader(sock.fileno(), lambda: readable.done() or readable.set_result(None))
    try:
        await asyncio.wait_for(readable, 10)
    finally:
        loop.remove_reader(sock.fileno())


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

    seen = _run(big, client)
    head, body = _body(results["whole"])
    assert head.startswith("HTTP/1.1 200") and body == want
    head, body = _body(results["range"])
    assert head.startswith("HTTP/1.1 206") and "bytes 100-199/" in head and body == want[100:200]
    head, body = _body(results["head"])
    assert head.startswith("HTTP/1.1 200") and f"Content-Length: {SIZE}" in head and body == b""
    # The file's bytes count as the writer's output (the send watch reads progress there).
    whole, part, _ = seen["output_sizes"]
    assert SIZE < whole < SIZE + 1000 and 100 < part < 1100


def test_a_file_that_shrinks_mid_send_cuts_the_connection(big: Path) -> None:
    """Headers and a Content-Length are out: no status can tell the client any more, so the
    connection is cut and the client sees a body shorter than announced, never a wrong
    one."""
    got: dict[str, bytes] = {}

    async def client(port: int, seen: dict[str, Any]) -> None:
        sock = await _request(port, "GET /f HTTP/1.1\r\nHost: h\r\nConnection: close")
        with sock:
            await _until_sending(sock)
            os.truncate(big, 1 << 20)
            try:
                got["raw"] = await _read_all(sock)
            except ConnectionResetError:
                got["raw"] = b""

    seen = _run(big, client)
    assert isinstance(seen["error"], ConnectionResetError)
    _, body = _body(got["raw"])
    assert len(body) < SIZE
    assert seen["fds_after"] <= seen["fds_before"]


def test_a_client_gone_mid_send_and_a_cancelled_handler_close_everything(big: Path) -> None:
    async def gone(port: int, seen: dict[str, Any]) -> None:
        sock = await _request(port, "GET /f HTTP/1.1\r\nHost: h")
        await _until_sending(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
        sock.close()  # a reset: the next sendfile fails

    seen = _run(big, gone)
    assert isinstance(seen["error"], ConnectionError | asyncio.CancelledError)
    assert seen["fds_after"] <= seen["fds_before"]

    async def cancelled(port: int, seen: dict[str, Any]) -> None:
        sock = await _request(port, "GET /f HTTP/1.1\r\nHost: h")
        with sock:
            await _until_sending(sock)
            for task in asyncio.all_tasks():
                if "handle_request" in repr(task.get_coro()):
                    task.cancel()
            await seen["done"].wait()

    seen = _run(big, cancelled)
    assert isinstance(seen["error"], asyncio.CancelledError)
    assert seen["fds_after"] <= seen["fds_before"]
