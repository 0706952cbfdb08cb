"""Request bodies: gzip (valid, broken, bombs), size caps, chunked transfer, probes, and
bodies cut short (ARCHITECTURE.md P4: read the whole request, with a cap, before answering)."""

from __future__ import annotations

import gzip
import socket
import zlib
from pathlib import Path

import pytest
from gitspout.server.app.httpreq import INLINE_GZIP, INLINE_INFLATED
from gitutil import LiveServer, poll, start_server
from rawhttp import (
    FLUSH,
    RESULT_CT,
    SMALL_MAX_BODY,
    SMALL_MAX_INFLATED,
    UPLOAD_CT,
    assert_not_5xx,
    assert_serving,
    build_request,
    connect,
    exchange,
    metric,
    parse_pkts,
    parse_response,
    pkt_lines,
    post_upload_pack,
    read_head,
    read_until_close,
    request,
    v2_command,
)

LS_REFS = v2_command("ls-refs", args=("ref-prefix refs/heads/",))


def _fetch_v0(oid: str) -> bytes:
    return pkt_lines(f"want {oid} side-band-64k ofs-delta") + FLUSH + pkt_lines("done")


def _assert_refs(body: bytes, oids: dict[str, str]) -> None:
    assert f"{oids['basic_main']} refs/heads/main\n".encode() in body
    assert f"{oids['basic_feature']} refs/heads/feature\n".encode() in body
    assert body.endswith(FLUSH)


def _assert_pack(body: bytes) -> None:
    pkts = parse_pkts(body)
    assert pkts[0] == b"NAK\n"
    data = b"".join(p[1:] for p in pkts if p and p[:1] == b"\x01")
    assert data.startswith(b"PACK\x00\x00\x00\x02")
    assert pkts[-1] is None


def _gzip_bomb(inflated: int, chunk: int = 1 << 20) -> bytes:
    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = b"0" * chunk
    parts = [comp.compress(zeros) for _ in range(inflated // chunk)]
    return b"".join(parts) + comp.flush()


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


# ------------------------------------------------------------------ gzip

@pytest.mark.parametrize("encoding", ["gzip", "x-gzip", "GZIP", " gzip "])
def test_gzip_v2_ls_refs(server: LiveServer, oids: dict[str, str], encoding: str) -> None:
    resp = post_upload_pack(server.port, gzip.compress(LS_REFS), version=2,
                            headers={"Content-Encoding": encoding})
    assert resp.status == 200, resp.body[:200]
    assert resp.header("content-type") == RESULT_CT
    _assert_refs(resp.body, oids)


def test_gzip_v0_fetch(server: LiveServer, oids: dict[str, str]) -> None:
    resp = post_upload_pack(server.port, gzip.compress(_fetch_v0(oids["basic_main"])),
                            headers={"Content-Encoding": "gzip"})
    assert resp.status == 200
    _assert_pack(resp.body)


def test_small_gzip_inflating_past_the_inline_cap(server: LiveServer,
                                                  oids: dict[str, str]) -> None:
    """A gzip body small enough to be inflated on the event loop (httpreq.py INLINE_GZIP)
    that inflates past INLINE_INFLATED is handed whole to the pool and answered as the same
    body sent plain: 20,000 repeated haves, about 1 MB out of a few KB in."""
    main = oids["basic_main"]
    plain = (pkt_lines(f"want {main} side-band-64k ofs-delta") + FLUSH
             + pkt_lines(*[f"have {main}"] * 20_000) + pkt_lines("done"))
    packed = gzip.compress(plain)
    assert len(packed) <= INLINE_GZIP and len(plain) > INLINE_INFLATED
    resp = post_upload_pack(server.port, packed, headers={"Content-Encoding": "gzip"})
    same = post_upload_pack(server.port, plain)
    assert resp.status == same.status == 200
    assert resp.body == same.body


@pytest.mark.parametrize("encoding", ["", "identity"])
def test_identity_encoding(server: LiveServer, oids: dict[str, str], encoding: str) -> None:
    resp = post_upload_pack(server.port, LS_REFS, version=2,
                            headers={"Content-Encoding": encoding})
    assert resp.status == 200
    _assert_refs(resp.body, oids)


@pytest.mark.parametrize("body", [
    b"\x1f\x8bnot gzip at all",
    b"plain text, not gzip",
    LS_REFS,
    b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03" + b"\xff" * 64,  # header ok, deflate garbage
    gzip.compress(LS_REFS)[:10] + b"\x00" * 40,
], ids=["bad-magic", "text", "pkt-lines", "bad-deflate", "zero-deflate"])
def test_invalid_gzip_is_400(server: LiveServer, body: bytes) -> None:
    resp = post_upload_pack(server.port, body, version=2, headers={"Content-Encoding": "gzip"})
    assert resp.status == 400, (resp.status, resp.body[:200])
    assert resp.header("content-type").startswith("text/plain")


@pytest.mark.parametrize("cut", [1, 4, 8, 12, 20])
def test_truncated_gzip_is_400(server: LiveServer, cut: int) -> None:
    full = gzip.compress(LS_REFS)
    resp = post_upload_pack(server.port, full[:-cut], version=2,
                            headers={"Content-Encoding": "gzip"})
    assert resp.status == 400, (cut, resp.status, resp.body[:200])


def test_gzip_with_bad_crc_is_400(server: LiveServer) -> None:
    full = bytearray(gzip.compress(LS_REFS))
    full[-8] ^= 0xFF  # CRC32 of the trailer
    resp = post_upload_pack(server.port, bytes(full), version=2,
                            headers={"Content-Encoding": "gzip"})
    assert resp.status == 400


def test_empty_gzip_body_is_400(server: LiveServer) -> None:
    resp = post_upload_pack(server.port, b"", headers={"Content-Encoding": "gzip"})
    assert resp.status == 400


@pytest.mark.parametrize("encoding", ["br", "deflate", "compress", "zstd", "gzip, gzip",
                                      "gzip, br", "chunked", "bogus"])
def test_unsupported_content_encoding_is_415(server: LiveServer, encoding: str) -> None:
    resp = post_upload_pack(server.port, gzip.compress(LS_REFS), version=2,
                            headers={"Content-Encoding": encoding})
    assert resp.status == 415, (encoding, resp.status)
    assert b"Content-Encoding" in resp.body


def test_gzip_bomb_hits_inflate_cap(small_server: LiveServer) -> None:
    bomb = _gzip_bomb(8 << 20)
    assert len(bomb) < SMALL_MAX_BODY  # under the raw cap: only the inflate cap can stop it
    for version in (0, 2):
        resp = post_upload_pack(small_server.port, bomb, version=version,
                                headers={"Content-Encoding": "gzip"})
        assert resp.status == 413, (resp.status, resp.body[:200])
        assert b"inflate" in resp.body
    assert small_server.alive()
    assert_serving(small_server.port)


def test_gzip_just_over_inflate_cap_is_413(small_server: LiveServer) -> None:
    over = gzip.compress(FLUSH * (SMALL_MAX_INFLATED // 4 + 1))
    resp = post_upload_pack(small_server.port, over, headers={"Content-Encoding": "gzip"})
    assert resp.status == 413
    at_cap = gzip.compress(FLUSH * (SMALL_MAX_INFLATED // 4))
    resp = post_upload_pack(small_server.port, at_cap, headers={"Content-Encoding": "gzip"})
    assert resp.status == 200  # a lone leading flush: the probe


def test_big_gzip_bomb_on_default_caps(server: LiveServer) -> None:
    """256 MiB of zeros in ~256 KiB: stopped at the 64 MiB inflate cap, memory stays bounded."""
    bomb = _gzip_bomb(256 << 20)
    before = _rss_kib(server.proc.pid)
    resp = post_upload_pack(server.port, bomb, version=2, headers={"Content-Encoding": "gzip"},
                            timeout=60)
    assert resp.status == 413
    grown_mib = (_rss_kib(server.proc.pid) - before) / 1024
    assert grown_mib < 200, f"RSS grew by {grown_mib:.0f} MiB"


def test_body_over_max_body_is_413(small_server: LiveServer) -> None:
    body = FLUSH * (SMALL_MAX_BODY // 4 + 64)
    for chunked in (False, True):
        resp = post_upload_pack(small_server.port, body, chunked=chunked)
        assert resp.status == 413, (chunked, resp.status)
    resp = post_upload_pack(small_server.port, gzip.compress(body) + b"\x00" * SMALL_MAX_BODY,
                            headers={"Content-Encoding": "gzip"})
    assert resp.status == 413
    assert_serving(small_server.port)


def test_body_at_max_body_is_read(small_server: LiveServer) -> None:
    resp = post_upload_pack(small_server.port, FLUSH * (SMALL_MAX_BODY // 4))
    assert resp.status == 200


def test_huge_declared_content_length_is_413(small_server: LiveServer) -> None:
    # Declares far more than the cap but sends only a little, then waits: the server must
    # not wait for 1 GiB it would refuse anyway... or, if it reads on, must refuse at the cap.
    sock = connect(small_server.port, 10)
    try:
        head = build_request("POST", "/basic.git/git-upload-pack",
                             {"Content-Type": UPLOAD_CT, "Content-Length": str(1 << 30)})
        sock.sendall(head)
        sock.sendall(FLUSH * (SMALL_MAX_BODY // 4 + 16))
        data = read_head(sock, 10)
    finally:
        sock.close()
    assert data.startswith(b"HTTP/1.1 413"), data[:100]
    assert_serving(small_server.port)


# ------------------------------------------------------------------ chunked

def test_chunked_v0_fetch(server: LiveServer, oids: dict[str, str]) -> None:
    resp = post_upload_pack(server.port, _fetch_v0(oids["basic_main"]), chunked=True)
    assert resp.status == 200
    _assert_pack(resp.body)


def test_chunked_gzip_v0_fetch(server: LiveServer, oids: dict[str, str]) -> None:
    # What git does for large negotiation bodies: gzip, sent with chunked transfer.
    body = _fetch_v0(oids["basic_main"])
    resp = post_upload_pack(server.port, gzip.compress(body), chunked=True,
                            headers={"Content-Encoding": "gzip"})
    assert resp.status == 200
    _assert_pack(resp.body)


def test_gzip_sent_a_byte_a_chunk(server: LiveServer, oids: dict[str, str]) -> None:
    """A small gzip body sent as one-byte chunks, each in its own segment (many parts, as
    the server reads them): inflated whole (its parts joined first), answered as the same
    body sent plain."""
    plain = _fetch_v0(oids["basic_main"])
    head = build_request("POST", "/basic.git/git-upload-pack",
                         {"Content-Type": UPLOAD_CT, "Content-Encoding": "gzip",
                          "Transfer-Encoding": "chunked"})
    sock = connect(server.port)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(head)
        for byte in gzip.compress(plain):
            sock.sendall(b"1\r\n" + bytes([byte]) + b"\r\n")
        sock.sendall(b"0\r\n\r\n")
        data, _ = read_until_close(sock, 30)
    finally:
        sock.close()
    resp = parse_response(data)
    assert resp.status == 200
    assert resp.body == post_upload_pack(server.port, plain).body


def test_chunked_v2_ls_refs(server: LiveServer, oids: dict[str, str]) -> None:
    resp = post_upload_pack(server.port, LS_REFS, version=2, chunked=True)
    assert resp.status == 200
    _assert_refs(resp.body, oids)


@pytest.mark.parametrize("chunked", [False, True])
def test_probe_post_is_200(server: LiveServer, chunked: bool) -> None:
    resp = post_upload_pack(server.port, FLUSH, chunked=chunked)
    assert resp.status == 200
    assert resp.header("content-type") == RESULT_CT
    assert resp.body == b""


def test_chunk_extensions_and_trailers(server: LiveServer) -> None:
    raw = build_request("POST", "/basic.git/git-upload-pack",
                        {"Content-Type": UPLOAD_CT, "Transfer-Encoding": "chunked"})
    raw += b"4;ext=1\r\n0000\r\n0\r\nX-Trailer: y\r\n\r\n"
    resp = exchange(server.port, raw)
    assert resp.status == 200


@pytest.mark.parametrize("chunks", [
    b"zz\r\n0000\r\n0\r\n\r\n",
    b"-4\r\n0000\r\n0\r\n\r\n",
    b"ffffffffffffffffffff\r\n0000\r\n0\r\n\r\n",
    b"4\r\n0000XX0\r\n\r\n",
    b"4 4\r\n0000\r\n0\r\n\r\n",
    b"\r\n\r\n",
], ids=["non-hex", "negative", "overflow", "no-crlf", "space", "empty-size"])
def test_malformed_chunked_is_400(server: LiveServer, chunks: bytes) -> None:
    raw = build_request("POST", "/basic.git/git-upload-pack",
                        {"Content-Type": UPLOAD_CT, "Transfer-Encoding": "chunked"})
    resp = exchange(server.port, raw + chunks, timeout=10)
    assert resp.status == 400, (resp.status, resp.raw[:200])


@pytest.mark.parametrize("headers", [
    {"Transfer-Encoding": "chunked", "Content-Length": "4"},
    {"Content-Length": "-1"},
    {"Content-Length": "abc"},
    {"Content-Length": "4, 5"},
])
def test_conflicting_or_bad_framing_is_400(server: LiveServer, headers: dict[str, str]) -> None:
    raw = build_request("POST", "/basic.git/git-upload-pack", {"Content-Type": UPLOAD_CT,
                                                               **headers})
    resp = exchange(server.port, raw + b"4\r\n0000\r\n0\r\n\r\n", timeout=10)
    assert resp.status == 400, (headers, resp.status)


def test_duplicate_content_length_is_400(server: LiveServer) -> None:
    raw = (b"POST /basic.git/git-upload-pack HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
           b"Content-Type: " + UPLOAD_CT.encode() + b"\r\n"
           b"Content-Length: 4\r\nContent-Length: 5\r\n\r\n0000")
    resp = exchange(server.port, raw, timeout=10)
    assert resp.status == 400


# ------------------------------------------------------------------ cut-short bodies

@pytest.mark.parametrize("tail", [
    b"Content-Length: 100\r\n\r\n0000",
    b"Content-Length: 100\r\nContent-Encoding: gzip\r\n\r\n\x1f\x8b",
    b"Transfer-Encoding: chunked\r\n\r\n5\r\n0000",
    b"Transfer-Encoding: chunked\r\n\r\n4\r\n0000\r\n",
    b"Content-Length: 100\r\n\r\n",
    b"Content-Length: 10",
], ids=["cl-short", "gzip-short", "chunk-short", "no-last-chunk", "no-body", "head-cut"])
def test_client_gives_up_mid_request(server: LiveServer, tail: bytes) -> None:
    """The client stops sending and goes away; the server must drop the request quietly."""
    head = (b"POST /basic.git/git-upload-pack HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: " + UPLOAD_CT.encode() + b"\r\n")
    for _ in range(3):
        sock = connect(server.port, 5)
        try:
            sock.sendall(head + tail)
            sock.settimeout(0.3)
            try:
                early = sock.recv(4096)
            except TimeoutError:
                early = b""
        finally:
            sock.close()
        assert not early.startswith(b"HTTP/1.1 5"), early[:100]
    # Every abandoned request has ended (or never began): the server noticed each client go.
    poll(lambda: metric(server.port, "gitspout_requests_in_flight") == 0, 10,
         "the abandoned requests to end")
    assert server.alive()
    assert_serving(server.port)


def test_many_abandoned_requests_do_not_block_others(server: LiveServer) -> None:
    socks = []
    try:
        for _ in range(30):
            sock = connect(server.port, 5)
            sock.sendall(b"POST /basic.git/git-upload-pack HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: " + UPLOAD_CT.encode() + b"\r\n"
                         b"Content-Length: 1000\r\n\r\n0000")
            socks.append(sock)
        # 30 requests wait for body bytes that never come; others are still served: the
        # new one is answered while all 30 are still in flight, unanswered (an order, not
        # a time: they end only at --body-timeout, 30 s).
        poll(lambda: metric(server.port, "gitspout_requests_in_flight") == 30, 10,
             "the 30 requests in flight")
        assert_serving(server.port)
        assert metric(server.port, "gitspout_requests_in_flight") == 30
        for sock in socks:
            sock.setblocking(False)
            try:
                early = sock.recv(1)
            except BlockingIOError:
                early = None
            assert early is None, "an abandoned request was answered"
    finally:
        for sock in socks:
            sock.close()


def test_pipelined_requests_on_one_connection(server: LiveServer, oids: dict[str, str]) -> None:
    first = build_request("POST", "/basic.git/git-upload-pack",
                          {"Content-Type": UPLOAD_CT, "Git-Protocol": "version=2"}, LS_REFS,
                          close=False)
    second = build_request("POST", "/basic.git/git-upload-pack",
                           {"Content-Type": UPLOAD_CT}, FLUSH, close=True)
    sock = connect(server.port, 10)
    try:
        sock.sendall(first + second)
        data, closed = read_until_close(sock, 10)
    finally:
        sock.close()
    assert closed
    assert data.count(b"HTTP/1.1 200 OK") == 2
    assert f"{oids['basic_main']} refs/heads/main\n".encode() in data


def test_non_utf8_and_binary_bodies_are_4xx(server: LiveServer) -> None:
    for body in (bytes(range(256)), b"\xff" * 1000, b"\x00" * 64):
        for version in (0, 2):
            resp = post_upload_pack(server.port, body, version=version)
            assert_not_5xx(resp)
            assert resp.status == 400, (body[:8], version, resp.status)


@pytest.mark.parametrize("expect", [True, False])
def test_declared_length_over_the_cap_is_413_from_the_head(small_server: LiveServer,
                                                          expect: bool) -> None:
    """A Content-Length over --max-body is answered 413 at once: no ``100 Continue``
    inviting the client to send it, no wait for a body that would be refused (it got 408
    after --body-timeout), and the connection ends without reading it."""
    head = ("POST /basic.git/git-upload-pack HTTP/1.1\r\nHost: x\r\n"
            "Content-Type: application/x-git-upload-pack-request\r\n"
            f"Content-Length: {SMALL_MAX_BODY * 50}\r\n"
            + ("Expect: 100-continue\r\n" if expect else "") + "\r\n").encode()
    with connect(small_server.port, 10) as sock:
        sock.sendall(head)
        # 413 for the head alone: a server waiting for the body (never sent) would answer
        # 408 at --body-timeout (30 s), past this read's 10 s.
        data = read_head(sock, 10)
    assert data.startswith(b"HTTP/1.1 413"), data[:100]
    assert_serving(small_server.port)


def test_bodies_over_body_memory_get_503(fixture_root: Path) -> None:
    """--body-memory caps the request bodies held at once over all requests: a second
    body that would pass it is refused with 503 and Retry-After (the connection then
    ends), and once the first is gone requests are served again."""
    cap = 512 << 10
    srv = start_server(fixture_root, ["--max-body", str(cap), "--max-inflated-body", str(cap),
                                      "--body-memory", str(cap), "--retry-after", "3"])
    head = ("POST /basic.git/git-upload-pack HTTP/1.1\r\nHost: x\r\n"
            "Content-Type: application/x-git-upload-pack-request\r\n"
            f"Content-Length: {cap - 1000}\r\n\r\n").encode()
    try:
        first = connect(srv.port, 10)
        first.sendall(head + b"0" * 400_000)  # held while the rest does not come
        # Charged (but for its first few KiB, free): with the second, past the cap.
        poll(lambda: metric(srv.port, "gitspout_admission_body_bytes") >= 300_000, 10,
             "the first body held")
        with connect(srv.port, 10) as second:
            second.sendall(head + b"0" * 300_000)  # past the cap, first 64 KiB of each free
            data, _ = read_until_close(second, 10)  # the connection ends after the 503
        assert data.startswith(b"HTTP/1.1 503"), data[:200]
        assert b"Retry-After: 3" in data and b"too many request bodies held" in data
        first.close()
        poll(lambda: metric(srv.port, "gitspout_admission_body_bytes") == 0, 10,
             "the first body given back")
        assert_serving(srv.port)
        metrics = request(srv.port, "GET", "/metrics").body.decode()
        assert 'gitspout_admission_rejected_total{reason="body_memory"} 1.0' in metrics
    finally:
        srv.stop()
