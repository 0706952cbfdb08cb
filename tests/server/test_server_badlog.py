"""A request aiohttp cannot parse is answered 400 and logged as one line, not as a
traceback into aiohttp's parser (scanners send such requests all day)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import LiveServer, poll, start_server
from rawhttp import INFO_REFS, assert_serving, exchange, metric, parse_response, request, v2_command

_BARRIERS = itertools.count()


@pytest.fixture(scope="module")
def logged_server(fixture_root: Path) -> Iterator[tuple[LiveServer, list[str]]]:
    """A server whose every output line (stdout and stderr) is kept."""
    lines: list[str] = []
    srv = start_server(fixture_root, output=lines)
    yield srv, lines
    srv.stop()


def _logged_so_far(srv: LiveServer, lines: list[str]) -> None:
    """Wait until everything the server logs for the requests made so far is in ``lines``:
    none of them is in flight any more, and a later request's access-log line (a
    barrier, written after theirs by the same process to the same stream) is there."""
    poll(lambda: metric(srv.port, "gitspout_requests_in_flight") == 0, 10,
         "the earlier requests to end")
    agent = f"zz-barrier-{next(_BARRIERS)}"
    assert request(srv.port, "GET", f"/basic.git{INFO_REFS}", {"User-Agent": agent}).status == 200
    poll(lambda: any(agent in line for line in lines), 10, "the barrier's log line")


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
    poll(lambda: any(marker in line for line in lines[seen:]), 10, f"a log line with {marker}")
    _logged_so_far(srv, lines)  # a traceback would have followed it by now
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
            # The scenario: half-closed for a moment, then gone. Whether the server reads
            # the EOF before the close or not, nothing may be logged as an error.
            time.sleep(0.2)
        else:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    _logged_so_far(srv, lines)
    new = "\n".join(lines[seen:])
    assert "Traceback" not in new and "Error handling request" not in new, new[-2000:]
    assert_serving(srv.port)
