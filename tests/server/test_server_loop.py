"""Heavy request work stays off the event loop: while gzip bombs (within the caps) are
inflated, a tiny ls-refs on another repository is still answered.

The p50/p99 latency figures belong to bench/loopstall.py. Here the check is relative, so
that a slow or busy machine cannot make it flaky: every ls-refs sent while the bombs run
must complete, and the typical one must take a small fraction of a bomb's own time. With
inflation on the loop an ls-refs waits behind whole inflations and the two are alike.
"""

from __future__ import annotations

import gzip
import statistics
import threading
import time

from gitutil import LiveServer
from rawhttp import parse_pkts, post_upload_pack, v2_command

BOMBERS = 4
BOMBS_EACH = 3
# Inflates to just under the session server's 64 MiB cap, as one repeated byte: ~64 KB
# sent. The inflated body is not pkt-lines, so each bomb ends in a 400 after inflation.
BOMB = gzip.compress(b"z" * (60 << 20), 9)


def _bomb(port: int) -> int:
    return post_upload_pack(port, BOMB, version=2, headers={"Content-Encoding": "gzip"},
                            timeout=120).status


def _tiny(port: int) -> bytes:
    resp = post_upload_pack(port, v2_command("ls-refs"), repo="plain.git", version=2,
                            timeout=120)
    assert resp.status == 200, resp.status
    return resp.body


def test_tiny_ls_refs_answered_while_gzip_bombs_inflate(server: LiveServer) -> None:
    port = server.port
    expected = _tiny(port)
    assert b"refs/heads/main" in b"".join(p for p in parse_pkts(expected) if p)
    assert _bomb(port) == 400  # the repository resolved, the pool warm
    bombs: list[tuple[float, float]] = []
    statuses: list[int] = []
    lock = threading.Lock()

    def bomber() -> None:
        for _ in range(BOMBS_EACH):
            start = time.monotonic()
            status = _bomb(port)
            with lock:
                bombs.append((start, time.monotonic()))
                statuses.append(status)

    threads = [threading.Thread(target=bomber, daemon=True) for _ in range(BOMBERS)]
    for t in threads:
        t.start()
    tinies: list[tuple[float, float]] = []
    deadline = time.monotonic() + 120
    time.sleep(0.05)  # the bombs' bodies are on their way
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        start = time.monotonic()
        assert _tiny(port) == expected
        tinies.append((start, time.monotonic()))
    for t in threads:
        t.join(timeout=max(1.0, deadline - time.monotonic()))
    assert statuses == [400] * (BOMBERS * BOMBS_EACH), statuses
    first_bomb_start = min(s for s, _ in bombs)
    last_bomb_end = max(e for _, e in bombs)
    during = [e - s for s, e in tinies if s >= first_bomb_start and e <= last_bomb_end]
    bomb_time = statistics.median(e - s for s, e in bombs)
    assert len(during) >= 5, f"{len(during)} ls-refs completed while {len(bombs)} bombs ran"
    typical = statistics.median(during)
    assert typical < bomb_time / 5, (
        f"ls-refs took {typical * 1000:.0f} ms (median of {len(during)}) while a bomb took "
        f"{bomb_time * 1000:.0f} ms: the event loop is inflating")
