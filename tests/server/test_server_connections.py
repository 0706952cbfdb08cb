"""Connection deadlines and the connection cap, against live servers with short settings.

Clients that send nothing, or send a head or a body a byte at a time, must not keep a
connection (and a descriptor) for good; a client that is slow to *receive* must never be
cut; past ``--max-connections`` the longest-waiting idle connection makes room, or the new
one gets a 503 when all are busy; a real clone works beside 1,100 idle sockets.
"""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import REPO_ROOT, Git, LiveServer, poll, start_server
from rawhttp import (
    FLUSH,
    INFO_REFS,
    UPLOAD_CT,
    abort,
    accept_queue,
    build_request,
    connect,
    decode_chunked,
    get_info_refs,
    parse_pkts,
    pkt_lines,
    read_head,
    request,
)

HEADER_TIMEOUT = 2.0
IDLE_TIMEOUT = 2.0
BODY_TIMEOUT = 2.0
SHORT = ["--header-timeout", str(HEADER_TIMEOUT), "--idle-timeout", str(IDLE_TIMEOUT),
         "--body-timeout", str(BODY_TIMEOUT)]
# How long a test waits for a close that (before these settings existed) never came: a
# hang guard, 10x the deadlines. A close is asserted to come, for the right reason (the
# timeouts metric), and not before its deadline (a lower bound, measured from before the
# client's last act, that load cannot break); how soon after it comes is
# ``python -m bench.slowclients``'s figure.
SLACK = 20.0


@pytest.fixture(scope="module")
def short_server(fixture_root: Path) -> Iterator[LiveServer]:
    """The fixture root with 2-second header, idle and body timeouts."""
    srv = start_server(fixture_root, extra_args=SHORT)
    yield srv
    srv.stop()


def _metric(port: int, sample: str) -> float:
    """One sample of the server's /metrics, e.g. ``gitspout_connections_open``."""
    resp = request(port, "GET", "/metrics")
    assert resp.status == 200
    for line in resp.text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    raise LookupError(f"{sample} not in /metrics")


def _timeouts(port: int, kind: str) -> float:
    """Connections closed for a ``kind`` timeout so far (0 while the series is absent)."""
    try:
        return _metric(port, f'gitspout_connection_timeouts_total{{kind="{kind}"}}')
    except LookupError:
        return 0.0


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closes ``sock`` (reading and dropping anything it sends),
    or None if it is still open after ``seconds``."""
    start = time.monotonic()
    deadline = start + seconds
    while time.monotonic() < deadline:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            if not sock.recv(1 << 16):
                return time.monotonic() - start
        except TimeoutError:
            return None
        except ConnectionResetError:
            return time.monotonic() - start
    return None


def _read_response(sock: socket.socket, timeout: float = 10.0) -> tuple[bytes, bytes]:
    """One complete chunked or Content-Length response on a kept-alive connection:
    (head, body)."""
    deadline = time.monotonic() + timeout
    data = read_head(sock, timeout)
    head, sep, body = data.partition(b"\r\n\r\n")
    assert sep, data[:200]
    length = None
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-length":
            length = int(value)

    def complete() -> bool:
        return len(body) >= length if length is not None else decode_chunked(body)[1]

    while not complete() and time.monotonic() < deadline:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        more = sock.recv(1 << 16)
        assert more, "closed mid-response"
        body += more
    assert complete(), "response did not complete"
    return head, body


# ------------------------------------------------------------------ reading deadlines

def test_slow_header_is_cut_after_header_timeout(short_server: LiveServer) -> None:
    """A head sent one byte every 0.5 s (it would take 40 s) ends at the header timeout."""
    port = short_server.port
    before = _timeouts(port, "header")
    head = build_request("GET", f"/basic.git{INFO_REFS}")
    start = time.monotonic()  # before the connection: its deadline starts after this
    sock = connect(port)
    closed_after = None
    try:
        for byte in head:
            try:
                sock.send(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - start
                break
            closed_after = _closed_within(sock, 0.5)  # the scenario: a byte every 0.5 s
            if closed_after is not None:
                closed_after = time.monotonic() - start
                break
            if time.monotonic() - start > HEADER_TIMEOUT + SLACK:
                break
    finally:
        sock.close()
    assert closed_after is not None, "a head dribbled at 2 bytes/s kept its connection"
    assert closed_after >= HEADER_TIMEOUT - 0.2, closed_after
    assert _timeouts(port, "header") == before + 1


def test_silent_connection_is_closed(short_server: LiveServer) -> None:
    """A connection that never sends a byte is closed at the header timeout."""
    before = _timeouts(short_server.port, "header")
    start = time.monotonic()  # before the connection: its deadline starts after this
    sock = connect(short_server.port)
    try:
        closed = _closed_within(sock, HEADER_TIMEOUT + SLACK) is not None
    finally:
        sock.close()
    assert closed, "a silent connection stayed open"
    assert time.monotonic() - start >= HEADER_TIMEOUT - 0.2
    assert _timeouts(short_server.port, "header") == before + 1


@pytest.mark.parametrize("trickle", [False, True], ids=["stalled", "trickling"])
def test_slow_body_gets_408_and_is_closed(short_server: LiveServer, trickle: bool) -> None:
    """A body that stops, or comes a byte every 0.25 s (under --body-min-rate), is answered
    408 and the connection closed, without lingering over the rest of it."""
    port = short_server.port
    before = _timeouts(port, "body")
    head = build_request("POST", "/basic.git/git-upload-pack",
                         {"Content-Type": UPLOAD_CT, "Content-Length": "1000"}, close=False)
    sock = connect(port)
    start = time.monotonic()  # before the head: the body's deadline starts after this
    data = b""
    try:
        sock.sendall(head)
        while time.monotonic() - start < BODY_TIMEOUT + SLACK:
            if trickle:  # the scenario: a byte every 0.25 s (the recv's timeout below)
                try:
                    sock.send(b"0")
                except (BrokenPipeError, ConnectionResetError):
                    break
            sock.settimeout(0.25)
            try:
                more = sock.recv(1 << 16)
            except TimeoutError:
                continue
            except ConnectionResetError:
                break
            if not more:
                break
            data += more
        elapsed = time.monotonic() - start
    finally:
        sock.close()
    assert data.startswith(b"HTTP/1.1 408 "), data[:200]
    assert (b"too slow" if trickle else b"stalled") in data
    assert elapsed >= BODY_TIMEOUT - 0.2, elapsed
    assert _timeouts(port, "body") == before + 1


def test_idle_keepalive_is_closed_and_reusable_before(short_server: LiveServer) -> None:
    """A kept-alive connection serves a second request 1 s after the first (so no deadline
    counts from the connection's opening), then is closed once idle for --idle-timeout."""
    port = short_server.port
    before = _timeouts(port, "idle")
    req = build_request("GET", f"/basic.git{INFO_REFS}", close=False)
    sock = connect(port)
    try:
        sock.sendall(req)
        head, _ = _read_response(sock)
        assert head.startswith(b"HTTP/1.1 200 "), head
        time.sleep(IDLE_TIMEOUT / 2)  # the scenario: the next request comes 1 s later
        start = time.monotonic()  # before the second request: its idle time starts after
        sock.sendall(req)
        head, body = _read_response(sock)
        assert head.startswith(b"HTTP/1.1 200 "), head
        assert parse_pkts(decode_chunked(body)[0])[0] == b"# service=git-upload-pack\n"
        # Opened 1 s + two requests ago: past HEADER_TIMEOUT/2, well before any deadline.
        closed = _closed_within(sock, IDLE_TIMEOUT + SLACK) is not None
    finally:
        sock.close()
    assert closed, "an idle kept-alive connection stayed open"
    # Not closed by a deadline counted from the connection's opening (1 s earlier).
    assert time.monotonic() - start >= IDLE_TIMEOUT - 0.2
    assert _timeouts(port, "idle") == before + 1


def test_slow_reader_of_a_big_pack_is_never_cut(big_root: tuple[Path, str]) -> None:
    """Deadlines time only what the client sends: a 16 MiB pack read slowly, for longer
    than every timeout together, arrives whole."""
    srv = start_server(big_root[0], extra_args=["--header-timeout", "1", "--idle-timeout", "1",
                                                "--body-timeout", "1"])
    try:
        body = pkt_lines(f"want {big_root[1]} side-band-64k ofs-delta") + FLUSH + \
            pkt_lines("done")
        req = build_request("POST", "/big.git/git-upload-pack", {"Content-Type": UPLOAD_CT},
                            body)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        sock.settimeout(30)
        sock.connect(("127.0.0.1", srv.port))
        start = time.monotonic()
        got = bytearray()
        try:
            sock.sendall(req)
            while time.monotonic() - start < 120:
                more = sock.recv(16384)
                if not more:
                    break
                got += more
                time.sleep(0.004)  # the scenario, a slow reader: at most ~4 MB/s, 4 s or more
        finally:
            sock.close()
        elapsed = time.monotonic() - start
        head, _, rest = bytes(got).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), head[:100]
        data, complete = decode_chunked(rest)
        assert complete, f"cut after {elapsed:.1f} s and {len(got)} bytes"
        assert elapsed > 3, "the read was not slow enough to prove anything"
        assert data.endswith(b"0000") and b"PACK" in data[:200]
        assert len(data) > 16 << 20
    finally:
        srv.stop()


# ------------------------------------------------------------------ the connection cap

def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def capped_server(fixture_root: Path) -> Iterator[tuple[LiveServer, int]]:
    """Three connections at most, long timeouts (the cap, not a deadline, acts here); and
    the port of its /metrics, which a scrape can reach without taking one of the three."""
    metrics_port = _free_port()
    srv = start_server(fixture_root, extra_args=[
        "--max-connections", "3", "--header-timeout", "60", "--body-timeout", "60",
        "--metrics-port", str(metrics_port)])
    yield srv, metrics_port
    srv.stop()


def _accepted(port: int) -> None:
    """Wait until the server has accepted every connection made to ``port`` so far."""
    poll(lambda: accept_queue(port) == 0, 10, "the server to accept the connections")


def _in_flight(metrics_port: int, n: int) -> None:
    """Wait until ``n`` requests are being handled (their heads read, their bodies due)."""
    poll(lambda: _metric(metrics_port, "gitspout_requests_in_flight") == n, 10,
         f"{n} requests in flight")


def test_cap_evicts_the_longest_waiting_idle_connection(
        capped_server: tuple[LiveServer, int]) -> None:
    port = capped_server[0].port
    idle = [connect(port) for _ in range(3)]
    try:
        _accepted(port)  # all three accepted and waiting, oldest first
        assert get_info_refs(port).status == 200  # a fourth: the oldest idle one makes room
        assert _closed_within(idle[0], 5) is not None, "the oldest idle connection was kept"
        assert _closed_within(idle[1], 0.3) is None and _closed_within(idle[2], 0.3) is None
        assert _metric(port, "gitspout_connections_evicted_total") >= 1
        assert _metric(port, "gitspout_connections_rejected_total") == 0
    finally:
        for sock in idle:
            sock.close()


def test_cap_refuses_with_503_when_every_connection_is_busy(
        capped_server: tuple[LiveServer, int]) -> None:
    port, metrics_port = capped_server[0].port, capped_server[1]
    head = build_request("POST", "/basic.git/git-upload-pack",
                         {"Content-Type": UPLOAD_CT, "Content-Length": "100"}, close=False)
    busy = [connect(port) for _ in range(3)]
    try:
        for sock in busy:
            sock.sendall(head)  # a head and no body: each handler waits for the body
        _in_flight(metrics_port, 3)
        resp = get_info_refs(port)
        assert resp.status == 503, (resp.status, resp.body[:100])
        assert resp.header("connection") == "close"
        # The liveness and readiness probes still get their answer: slow clients holding
        # every connection must not get a healthy pod restarted.
        for probe, body in (("/healthz", b"ok\n"), ("/readyz", b"ready\n")):
            answer = request(port, "GET", probe)
            assert (answer.status, answer.body) == (200, body)
        for sock in busy:
            assert _closed_within(sock, 0.2) is None, "a busy connection was closed"
    finally:
        for sock in busy:
            abort(sock)
    _in_flight(metrics_port, 0)  # the aborted ones are gone
    assert get_info_refs(port).status == 200
    assert _metric(port, "gitspout_connections_rejected_total") >= 1


IDLE_SOCKETS = 1100  # the reproduction: more than the server has descriptors
SERVER_NOFILE = 1024  # the common default `ulimit -n`


def test_clone_works_beside_1100_idle_sockets(tmp_path: Path, git: Git,
                                              fixture_root: Path) -> None:
    """1,100 connections that never send a byte against a server limited to 1,024
    descriptors: without a cap the descriptors run out and every clone fails ("Empty reply
    from server"). With the
    default cap (512) the idle ones are evicted as needed and a real clone goes through.
    Timeouts are long here, so that it is the cap that is tested."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = IDLE_SOCKETS + 200
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is under {need}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    srv = start_server(fixture_root, extra_args=["--header-timeout", "120"],
                       nofile=SERVER_NOFILE)
    socks: list[socket.socket] = []
    try:
        for _ in range(IDLE_SOCKETS):
            socks.append(socket.create_connection(("127.0.0.1", srv.port), timeout=10))
        _accepted(srv.port)  # the server took them all (and evicted as it went)
        for version in ("2", "0"):
            dest = tmp_path / f"clone-v{version}"
            git.run("-c", f"protocol.version={version}", "clone", "-q",
                    f"{srv.url}/basic.git", str(dest), timeout=60)
            assert git.out("rev-parse", "HEAD", cwd=dest).strip()
        assert _metric(srv.port, "gitspout_connections_open") <= 512
        assert _metric(srv.port, "gitspout_connections_evicted_total") >= IDLE_SOCKETS - 512
        assert srv.alive()
    finally:
        for sock in socks:
            sock.close()
        srv.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# ------------------------------------------------------------------ settings

@pytest.mark.parametrize("flag", ["--header-timeout", "--body-timeout", "--idle-timeout",
                                  "--body-min-rate", "--max-connections"])
def test_negative_settings_are_refused(fixture_root: Path, flag: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gitspout.server.app.cli", "serve", "--root", str(fixture_root), "--port",
         "0", flag, "-1"], cwd=REPO_ROOT, capture_output=True, timeout=30)
    assert proc.returncode == 2
    assert b"must be" in proc.stderr and b"0 or more" in proc.stderr, proc.stderr


def test_env_setting_is_validated_too(fixture_root: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gitspout.server.app.cli", "serve", "--root", str(fixture_root),
         "--port", "0"],
        cwd=REPO_ROOT, capture_output=True, timeout=30,
        env={"PATH": "/usr/bin:/bin", "GITSPOUT_HEADER_TIMEOUT": "nan"})
    assert proc.returncode == 2
    assert b"header_timeout" in proc.stderr, proc.stderr


def test_metrics_port_is_not_capped_by_the_serving_port(fixture_root: Path) -> None:
    """With the serving port at its cap (every connection busy), /metrics on
    --metrics-port still answers, and shows the refusal."""
    metrics_port = _free_port()
    srv = start_server(fixture_root, extra_args=[
        "--max-connections", "1", "--body-timeout", "60", "--metrics-port", str(metrics_port)])
    busy = connect(srv.port)
    try:
        busy.sendall(build_request("POST", "/basic.git/git-upload-pack",
                                   {"Content-Type": UPLOAD_CT, "Content-Length": "100"},
                                   close=False))
        _in_flight(metrics_port, 1)
        assert get_info_refs(srv.port).status == 503
        assert _metric(metrics_port, "gitspout_connections_rejected_total") == 1
        assert _metric(metrics_port, "gitspout_connections_open") == 2  # busy + this scrape
    finally:
        abort(busy)
        srv.stop()


def test_cap_counts_no_connection_that_went_away_mid_request(
        capped_server: tuple[LiveServer, int]) -> None:
    """Clients that vanish while their request is handled leave nothing behind: at the cap,
    the next newcomer still closes a real idle connection, and the count stays at the cap."""
    port, metrics_port = capped_server[0].port, capped_server[1]
    head = build_request("POST", "/basic.git/git-upload-pack",
                         {"Content-Type": UPLOAD_CT, "Content-Length": "100"}, close=False)
    for _ in range(3):
        gone = connect(port)
        gone.sendall(head)
        _in_flight(metrics_port, 1)  # its handler waits for the body...
        abort(gone)  # ...and the client vanishes
        _in_flight(metrics_port, 0)
    idle = [connect(port) for _ in range(3)]
    try:
        _accepted(port)
        assert get_info_refs(port).status == 200
        assert _closed_within(idle[0], 5) is not None, "the oldest idle connection was kept"
        assert _metric(port, "gitspout_connections_open") <= 3
    finally:
        for sock in idle:
            sock.close()
