"""A request aiohttp cannot parse is answered 400 and logged as one line, not as a
traceback into aiohttp's parser (scanners send such requests all day)."""

from __future__ import annotations

import base64
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
# Requests whose fault aiohttp's message quotes with a secret: valid Basic credentials
# (alice:zz-secret-3, in base64) followed by a control byte, or by a bare CR; a query
# token in a request line over aiohttp's 8190 bytes; a password over that limit.
_CREDS = base64.b64encode(b"alice:zz-secret-3")
_PATH = b"/basic.git/info/refs?service=git-upload-pack"
SECRET_REQUESTS = {
    "control-byte": b"GET " + _PATH + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Basic "
                    + _CREDS + b"\x01\r\nConnection: close\r\n\r\n",
    "bare-cr": b"GET " + _PATH + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Basic " + _CREDS
               + b"\rX\r\nConnection: close\r\n\r\n",
    "long-query": b"GET " + _PATH + b"&access_token=zz-secret-4" + b"A" * 9000
                  + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    "long-password": b"GET " + _PATH + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Basic "
                     + base64.b64encode(b"alice:zz-secret-5" + b"p" * 7000)
                     + b"\r\nConnection: close\r\n\r\n",
}
SECRETS = ("zz-marker", "zz-secret", _CREDS.decode(),
           base64.b64encode(b"alice:zz-secret-5").decode()[:12])


@pytest.mark.parametrize("kind", sorted(BAD_REQUESTS) + sorted(SECRET_REQUESTS))
def test_malformed_request_logs_one_line(logged_server: tuple[LiveServer, list[str]],
                                         kind: str) -> None:
    """One warning line, no traceback; and none of the request's bytes: aiohttp's message
    quotes them, and they may hold credentials or a token (before, the line carried
    ``Authorization: Basic <alice's password>`` and ``?access_token=...``)."""
    srv, lines = logged_server
    seen = len(lines)
    data = {**BAD_REQUESTS, **SECRET_REQUESTS}[kind]
    resp = parse_response(exchange_raw(srv.port, data))
    assert 400 <= resp.status < 500
    poll(lambda: any("bad HTTP request from" in line for line in lines[seen:]), 10,
         "a bad-request log line")
    _logged_so_far(srv, lines)  # a traceback would have followed it by now
    assert_serving(srv.port)
    new = lines[seen:]
    assert not any("Traceback" in line for line in new), new
    assert not any(line.startswith("  File ") for line in new), new
    mentions = [line for line in new if "bad HTTP request from" in line]
    assert len(mentions) == 1, new
    assert "bad HTTP request from 127.0.0.1" in mentions[0], mentions
    assert not [s for s in SECRETS if any(s in line for line in new)], new


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
