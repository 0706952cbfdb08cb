"""Stalled bodies are cut (issue 24, item 4; app/httpreq.py, app/admission.py).

Bodies that fill --body-memory and then trickle a byte now and then held it for hours
(the rate deadline credited the bytes already received: 32 MiB bought 9 hours), and every
POST got 503 meanwhile. Now the rate is measured over the body's last --body-timeout
seconds, so a trickle is cut and gives its charge back, and a small body (a ref listing)
is never refused for memory while large ones fill the budget.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from gitspout.server.app import admission
from gitutil import Git, start_server, wait_until
from rawhttp import UPLOAD_CT, build_request, connect, metric, read_until_close

CAP = 1 << 20  # --max-body and --max-inflated-body
BUDGET = 2 << 20  # --body-memory: two bodies of CAP fill it
# The trickles are cut about BODY_TIMEOUT after their bulk: the ls-remote and the refused
# large body must come before, so this is ample for a busy machine (they take ~0.1 s).
BODY_TIMEOUT = 4.0
TRICKLE_EVERY = 3.0  # under --body-timeout: the stall rule alone never cuts it
FREE_BODY = getattr(admission, "FREE_BODY", 0)  # not charged (0 where it does not exist)


def _head(length: int, close: bool = False) -> bytes:
    return build_request("POST", "/basic.git/git-upload-pack",
                         {"Content-Type": UPLOAD_CT, "Content-Length": str(length)},
                         close=close)


def _trickler(port: int, stop: threading.Event) -> tuple[socket.socket, threading.Thread]:
    """A body of CAP bytes, all but 16 sent at once, then a byte every TRICKLE_EVERY s."""
    sock = connect(port, 30)
    sock.sendall(_head(CAP) + b"0" * (CAP - 16))

    def trickle() -> None:
        for _ in range(15):
            if stop.wait(TRICKLE_EVERY):
                return
            try:
                sock.send(b"0")
            except OSError:
                return

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    return sock, thread


def _read_bytes(pid: int) -> int:
    """What process ``pid`` has read so far (``rchar``: sockets included)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise LookupError("rchar")


def _large_body_refused(port: int) -> bool:
    """True when a body of 200 KB gets 503 for --body-memory (the budget is full)."""
    with connect(port, 10) as sock:
        sock.sendall(_head(200_000, close=True) + b"0" * 200_000)
        data, _ = read_until_close(sock, 10)
    return data.startswith(b"HTTP/1.1 503") and b"too many request bodies held" in data


def test_ls_refs_answered_during_a_trickle_and_the_trickle_cut(
        fixture_root: Path, git: Git, tmp_path: Path) -> None:
    """Before: `git ls-remote` got HTTP 503 for as long as the trickle went on."""
    srv = start_server(fixture_root, [
        "--max-body", str(CAP), "--max-inflated-body", str(CAP), "--body-memory", str(BUDGET),
        "--body-timeout", str(BODY_TIMEOUT), "--body-min-rate", "1024"])
    stop = threading.Event()
    held = []
    try:
        before = _read_bytes(srv.proc.pid)
        held = [_trickler(srv.port, stop) for _ in range(2)]
        # The server has read both bodies (all but their last 16 bytes): --body-memory is
        # full, so that a large body is refused; a small one is not.
        sent = 2 * (CAP - 16)
        assert wait_until(lambda: _read_bytes(srv.proc.pid) - before >= sent, 10)
        assert wait_until(lambda: metric(srv.port, "gitspout_admission_body_bytes",
                                         float(sent)) >= sent - 2 * FREE_BODY, 10)
        out = git.out("-c", "protocol.version=2", "ls-remote", f"{srv.url}/basic.git",
                      timeout=30)
        assert "refs/heads/main" in out
        # Answered while the trickles still held the budget (not once they were cut), and
        # they still hold it: a large body is refused.
        assert metric(srv.port, 'gitspout_connection_timeouts_total{kind="body"}', 0.0) == 0
        assert _large_body_refused(srv.port)
        # Both trickles are cut (408) within a window of their slowing down, while they
        # still send, and their charge comes back: large bodies are served again.
        assert wait_until(lambda: metric(
            srv.port, 'gitspout_connection_timeouts_total{kind="body"}', 0.0) == 2,
            4 * BODY_TIMEOUT)
        assert any(t.is_alive() for _, t in held), "the trickle ended before it was cut"
        assert wait_until(lambda: metric(srv.port, "gitspout_admission_body_bytes") == 0, 5)
        assert not _large_body_refused(srv.port)
        git.run("-c", "protocol.version=2", "clone", "-q", "--bare", f"{srv.url}/basic.git",
                str(tmp_path / "clone"), timeout=60)
    finally:
        stop.set()
        for sock, thread in held:
            sock.close()
            thread.join(timeout=5)
        srv.stop()
