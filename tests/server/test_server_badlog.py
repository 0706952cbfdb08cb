"""A request aiohttp cannot parse is answered 400 and logged as one line, not as a
traceback into aiohttp's parser (scanners send such requests all day)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import LiveServer, start_server
from rawhttp import assert_serving, exchange, parse_response, v2_command


@pytest.fixture(scope="module")
def logged_server(fixture_root: Path) -> Iterator[tuple[LiveServer, list[str]]]:
    """A server whose every output line (stdout and stderr) is kept."""
    lines: list[str] = []
    srv = start_server(fixture_root, output=lines)
    yield srv, lines
    srv.stop()


BAD_REQUESTS = {
    # a request line with too many parts
    "request-line": b"GET /zz-marker-1 and more words HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    # a header line without a colon, after a good request line
    "header": b"GET /basic.git/info/refs HTTP/1.1\r\nHost: 127.0.0.1\r\nzz-marker-2 no colon\r\n\r\n",
}


@pytest.mark.parametrize("kind", sorted(BAD_REQUESTS))
def test_malformed_request_logs_one_line(logged_server: tuple[LiveServer, list[str]],
                                         kind: str) -> None:
    srv, lines = logged_server
    marker = "zz-marker-1" if kind == "request-line" else "zz-marker-2"
    seen = len(lines)
    resp = parse_response(exchange_raw(srv.port, BAD_REQUESTS[kind]))
    assert resp.status == 400
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(marker in line for line in lines[seen:]):
        time.sleep(0.05)
    time.sleep(0.5)  # a traceback would follow within the same write; give it time anyway
    assert_serving(srv.port)
    new = lines[seen:]
    assert not any("Traceback" in line for line in new), new
    assert not any(line.startswith("  File ") for line in new), new
    mentions = [line for line in new if marker in line]
    assert len(mentions) == 1, new
    assert "bad HTTP request from 127.0.0.1" in mentions[0], mentions


def exchange_raw(port: int, data: bytes) -> bytes:
    """``data`` sent as is; the whole answer until the server closes."""
    return exchange(port, data).raw


@pytest.mark.parametrize("mode", ["half-close", "reset"])
def test_client_gone_before_its_refusal_logs_no_traceback(
        logged_server: tuple[LiveServer, list[str]], mode: str) -> None:
    """A want the server refuses in-protocol (``ERR not our ref``), from a client that
    leaves before the refusal is written: logged quietly as 499, as any other
    disconnection, not as aiohttp's "Error handling request" with a traceback."""
    import socket
    import struct

    srv, lines = logged_server
    body = v2_command("fetch", args=("want " + "1" * 40, "done"))
    seen = len(lines)
    for _ in range(5):
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        sock.sendall(b"POST /basic.git/git-upload-pack HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/x-git-upload-pack-request\r\n"
                     b"Git-Protocol: version=2\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        if mode == "half-close":
            sock.shutdown(socket.SHUT_WR)
            time.sleep(0.2)
        else:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    time.sleep(1.0)
    new = "\n".join(lines[seen:])
    assert "Traceback" not in new and "Error handling request" not in new, new[-2000:]
    assert_serving(srv.port)
