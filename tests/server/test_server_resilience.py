"""Clients that vanish mid-response, clients that stop reading, and many clients at once.
The server must survive, keep serving, not leak threads and not buffer whole packs."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from gitutil import Git, LiveServer, poll
from rawhttp import (
    FLUSH,
    UPLOAD_CT,
    abort,
    assert_serving,
    build_request,
    connect,
    get_info_refs,
    metric,
    parse_pkts,
    pkt_lines,
    post_upload_pack,
    read_head,
    read_until_close,
    server_side,
    thread_count,
    v2_command,
)

BIG_THREADS = 2  # --threads of the big_server fixture


def _proc_status(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise AssertionError(key)


def _v0_clone_body(oid: str) -> bytes:
    return pkt_lines(f"want {oid} multi_ack_detailed side-band-64k ofs-delta") + FLUSH + \
        pkt_lines("done")


def _v2_clone_body(oid: str) -> bytes:
    return v2_command("fetch", args=(f"want {oid}", "ofs-delta", "done"))


def _start_then_vanish(port: int, request: bytes, read: int, rst: bool) -> bytes:
    """Send ``request``, read about ``read`` bytes of the answer, then disappear."""
    sock = connect(port, 10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    got = b""
    try:
        sock.sendall(request)
        deadline = time.monotonic() + 10
        while len(got) < read and time.monotonic() < deadline:
            chunk = sock.recv(min(4096, read - len(got)))
            if not chunk:
                break
            got += chunk
    finally:
        if rst:
            abort(sock)
        else:
            sock.close()
    return got


def _no_request_in_flight(port: int) -> None:
    poll(lambda: metric(port, "gitspout_requests_in_flight") == 0, 10,
         "the requests of the vanished clients to end")


def _all_stalled(port: int, socks: list[socket.socket]) -> None:
    """Wait until the server is held up by every one of ``socks`` (clients that do not
    read): each response has bytes waiting in the kernel for its client, and the pool has
    stopped producing (no job running or queued), on three scrapes in a row, for a pack
    producer is idle for a moment between two steps."""
    idle = [0]

    def stalled() -> bool:
        if not all((s := server_side(port, sock)) is not None and s.tx_queue > 0
                   for sock in socks):
            return False
        quiet = (metric(port, "gitspout_requests_in_flight") == len(socks)
                 and metric(port, "gitspout_thread_pool_busy") == 0
                 and metric(port, "gitspout_thread_pool_queue_length") == 0)
        idle[0] = idle[0] + 1 if quiet else 0
        return idle[0] >= 3

    poll(stalled, 30, f"{len(socks)} responses stalled by their clients")


def _full_pack_bytes(port: int, body: bytes, repo: str, version: int = 0) -> int:
    resp = post_upload_pack(port, body, repo=repo, version=version, timeout=60)
    assert resp.status == 200
    assert resp.complete
    pack = b"".join(p[1:] for p in parse_pkts(resp.body) if p and p[:1] == b"\x01")
    assert pack.startswith(b"PACK")
    return len(pack)


# ------------------------------------------------------------------ vanishing clients

@pytest.mark.parametrize("version", [0, 2])
def test_disconnect_mid_pack_then_serve(big_server: LiveServer, big_root: tuple[Path, str],
                                        version: int) -> None:
    commit = big_root[1]
    body = _v2_clone_body(commit) if version == 2 else _v0_clone_body(commit)
    headers = {"Content-Type": UPLOAD_CT}
    if version == 2:
        headers["Git-Protocol"] = "version=2"
    request = build_request("POST", "/big.git/git-upload-pack", headers, body, close=False)
    for i in range(6):
        got = _start_then_vanish(big_server.port, request, read=2000 + 10_000 * i,
                                 rst=bool(i % 2))
        assert got.startswith(b"HTTP/1.1 200 OK"), got[:100]
    assert big_server.alive()
    assert_serving(big_server.port, "big.git")
    # The next full download is complete and correct.
    assert _full_pack_bytes(big_server.port, body, "big.git", version) > 16 << 20


def test_no_leaked_threads_after_disconnects(big_server: LiveServer,
                                            big_root: tuple[Path, str]) -> None:
    pid = big_server.proc.pid
    body = _v0_clone_body(big_root[1])
    _full_pack_bytes(big_server.port, body, "big.git")  # warm the pool up
    before = thread_count(pid)
    request = build_request("POST", "/big.git/git-upload-pack", {"Content-Type": UPLOAD_CT},
                            body, close=False)
    for i in range(10):
        _start_then_vanish(big_server.port, request, read=500, rst=bool(i % 2))
    _no_request_in_flight(big_server.port)
    # The pool is bounded (--threads 2): workers may appear, but never one per request.
    assert thread_count(pid) <= before + BIG_THREADS
    _full_pack_bytes(big_server.port, body, "big.git")
    assert thread_count(pid) <= before + BIG_THREADS


def test_stalled_readers_do_not_buffer_whole_packs(big_server: LiveServer,
                                                  big_root: tuple[Path, str]) -> None:
    """Six clients that never read a 16 MiB pack: memory must not grow by whole packs."""
    pid = big_server.proc.pid
    body = _v0_clone_body(big_root[1])
    request = build_request("POST", "/big.git/git-upload-pack", {"Content-Type": UPLOAD_CT},
                            body, close=False)
    before = _proc_status(pid, "RssAnon")
    socks = []
    try:
        for _ in range(6):
            sock = connect(big_server.port, 10)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(request)
            socks.append(sock)
        _all_stalled(big_server.port, socks)  # all the server will buffer, it has
        grown_mib = (_proc_status(pid, "RssAnon") - before) / 1024
        # Six whole packs would be 96 MiB or more.
        assert grown_mib < 48, f"RssAnon grew {grown_mib:.0f} MiB with 6 stalled readers"
        assert_serving(big_server.port, "big.git")  # stalled readers do not block others
    finally:
        for sock in socks:
            abort(sock)
    assert big_server.alive()


def test_parallel_big_downloads_on_small_pool(big_server: LiveServer,
                                             big_root: tuple[Path, str]) -> None:
    body = _v0_clone_body(big_root[1])
    with ThreadPoolExecutor(6) as pool:
        sizes = list(pool.map(lambda _: _full_pack_bytes(big_server.port, body, "big.git"),
                              range(6)))
    assert len(set(sizes)) == 1 and sizes[0] > 16 << 20


@pytest.mark.parametrize("version", [0, 2])
def test_disconnect_mid_advertisement(server: LiveServer, version: int) -> None:
    """manyrefs.git has 100,000 refs: megabytes of v0 advertisement or v2 ls-refs output
    to walk away from."""
    if version == 0:
        request = build_request("GET", "/manyrefs.git/info/refs?service=git-upload-pack",
                                close=False)
    else:
        request = build_request("POST", "/manyrefs.git/git-upload-pack",
                                {"Content-Type": UPLOAD_CT, "Git-Protocol": "version=2"},
                                v2_command("ls-refs"), close=False)
    for i in range(4):
        got = _start_then_vanish(server.port, request, read=3000, rst=bool(i % 2))
        assert got.startswith(b"HTTP/1.1 200 OK")
    assert server.alive()
    assert_serving(server.port, "manyrefs.git")


def test_disconnect_before_response(server: LiveServer, oids: dict[str, str]) -> None:
    """Full request sent, connection gone before a byte of the answer is read."""
    body = _v0_clone_body(oids["basic_main"])
    request = build_request("POST", "/manyrefs.git/git-upload-pack",
                            {"Content-Type": UPLOAD_CT}, body)
    for rst in (False, True, False, True):
        sock = connect(server.port, 5)
        sock.sendall(request)
        if rst:
            abort(sock)
        else:
            sock.close()
    _no_request_in_flight(server.port)
    assert server.alive()
    assert _full_pack_bytes(server.port, body, "basic.git") > 0


def test_keepalive_connection_reused_after_error(server: LiveServer) -> None:
    """A 4xx on a keep-alive connection leaves the connection usable for the next request."""
    bad = build_request("POST", "/basic.git/git-upload-pack", {"Content-Type": UPLOAD_CT},
                        b"zzzz", close=False)
    good = build_request("GET", "/basic.git/info/refs?service=git-upload-pack")
    sock = connect(server.port, 10)
    try:
        sock.sendall(bad)
        head = read_head(sock, 10)
        assert head.startswith(b"HTTP/1.1 400"), head[:100]
        sock.sendall(good)
        data, _ = read_until_close(sock, 10)
    finally:
        sock.close()
    assert b"HTTP/1.1 200 OK" in data
    assert b"001e# service=git-upload-pack\n0000" in data


# ------------------------------------------------------------------ many clients

def test_twenty_parallel_info_refs(server: LiveServer) -> None:
    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(lambda _: get_info_refs(server.port), range(20)))
    assert [r.status for r in results] == [200] * 20
    assert len({r.body for r in results}) == 1
    assert all(r.complete for r in results)


def test_parallel_mixed_requests(server: LiveServer, oids: dict[str, str]) -> None:
    def one(i: int) -> tuple[int, int]:
        kind = i % 5
        if kind == 0:
            r = get_info_refs(server.port, "basic.git", version=2)
            return r.status, 200
        if kind == 1:
            r = post_upload_pack(server.port, v2_command("ls-refs"), version=2)
            return r.status, 200
        if kind == 2:
            r = post_upload_pack(server.port, _v0_clone_body(oids["basic_main"]))
            return r.status, 200
        if kind == 3:
            r = post_upload_pack(server.port, b"zzzz")
            return r.status, 400
        r = get_info_refs(server.port, "nope.git")
        return r.status, 404

    with ThreadPoolExecutor(25) as pool:
        results = list(pool.map(one, range(50)))
    assert all(got == want for got, want in results), results


def test_parallel_manyrefs_advertisements(server: LiveServer) -> None:
    with ThreadPoolExecutor(5) as pool:
        results = list(pool.map(lambda _: get_info_refs(server.port, "manyrefs.git"), range(5)))
    assert [r.status for r in results] == [200] * 5
    assert len({len(r.body) for r in results}) == 1
    assert results[0].body.count(b"refs/heads/many/") == 100_000


def test_git_ls_remote_after_abuse(git: Git, server: LiveServer, fixture_root: Path) -> None:
    for version in ("0", "2"):
        ours = git.out("-c", f"protocol.version={version}", "ls-remote",
                       f"{server.url}/basic.git")
        theirs = git.out("ls-remote", f"file://{fixture_root / 'basic.git'}")
        assert ours == theirs
