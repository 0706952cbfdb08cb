"""Regressions for server bugs the raw-HTTP suite found."""

from __future__ import annotations

import gzip
import threading
import time

import pytest
from rawhttp import (
    assert_serving,
    build_request,
    exchange,
    get_info_refs,
    pkt,
    post_upload_pack,
    request,
)


def test_head_info_refs_sends_no_body_on_keepalive(server):
    """A HEAD answer must not carry the advertisement: the next response on the same
    connection would be corrupted."""
    first = build_request("HEAD", "/basic.git/info/refs?service=git-upload-pack", close=False)
    second = build_request("GET", "/nope.git/info/refs?service=git-upload-pack")
    resp = exchange(server.port, first + second)
    assert resp.status == 200
    assert b"# service=" not in resp.raw
    assert b"HTTP/1.1 404" in resp.raw


@pytest.mark.parametrize("path", [
    "//basic.git/info/refs?service=git-upload-pack",
    "/basic.git//info/refs?service=git-upload-pack",
    "/team//app/info/refs?service=git-upload-pack",
    "/team%2fapp/info/refs?service=git-upload-pack",
    "/team%2Fapp/info/refs?service=git-upload-pack",
])
def test_non_canonical_paths_are_not_found(server, path):
    assert request(server.port, "GET", path).status == 404


def test_405_names_allowed_methods(server):
    resp = request(server.port, "PUT", "/basic.git/git-upload-pack")
    assert resp.status == 405
    assert resp.header("Allow") == "POST"
    resp = request(server.port, "POST", "/basic.git/info/refs?service=git-upload-pack")
    assert resp.status == 405
    assert resp.header("Allow") == "GET, HEAD"


def test_many_tiny_pkt_lines_do_not_stall_other_clients(server):
    """Parsing runs in the thread pool, and a body of more than a million pkt-lines is
    refused, so one hostile request cannot block the event loop for everybody."""
    body = gzip.compress(pkt("command=ls-refs\n") + b"0001" + b"0005a" * 1_200_000 + b"0000")
    result: dict[str, object] = {}

    def hostile() -> None:
        result["status"] = post_upload_pack(
            server.port, body, version=2, headers={"Content-Encoding": "gzip"}).status

    t = threading.Thread(target=hostile)
    t.start()
    time.sleep(0.2)
    start = time.monotonic()
    assert get_info_refs(server.port).status == 200
    assert time.monotonic() - start < 2.0
    t.join(60)
    assert result["status"] == 413
    assert_serving(server.port)
