"""Stalled readers are cut (issue 24, item 3; server/app/sendwatch.py).

32 connections that ask for a large pack and never read held every --max-packs slot for
as long as they stayed connected, and every other fetch waited --pack-queue-wait for a
503. A response that makes no progress for --send-timeout is now cut and its slot given
back; one under --send-min-rate over its recent waiting is cut too; a slow but live
reader is not.
"""

from __future__ import annotations

import random
import socket
import subprocess
from pathlib import Path

import pytest
from gitutil import Committer, Git, fsck, git_env, start_server, wait_until
from netnskit import SlowProxy
from rawhttp import FLUSH, UPLOAD_CT, build_request, metric, pkt_lines

BIG = 8 << 20  # incompressible: more than a stalled client's socket buffers absorb
ATTACKERS = 32  # --max-packs, default: 16 (--max-packs-per-repo) on each of two repositories
SEND_TIMEOUT = 2.0
QUEUE_WAIT = 30  # a fetch left waiting this long is answered 503


@pytest.fixture(scope="module")
def stall_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    root = tmp_path_factory.mktemp("stallroot")
    for name, data in (("big", random.Random(3).randbytes(BIG)), ("small", b"small\n")):
        work = root.parent / f"{root.name}-{name}"
        git.run("init", "-q", "-b", "main", str(work))
        Committer(git, work).commit({"data.bin": data}, name)
        git.run("clone", "-q", "--bare", "--no-local", str(work), str(root / f"{name}.git"))
    git.run("clone", "-q", "--bare", "--no-local", str(root / "big.git"), str(root / "big2.git"))
    return root


def _never_reading_fetch(port: int, repo: str, want: str) -> socket.socket:
    """A v0 fetch of ``want`` whose client then never reads (and reads little at all: a
    4 KiB receive buffer)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    body = pkt_lines(f"want {want} side-band-64k ofs-delta") + FLUSH + pkt_lines("done")
    sock.sendall(build_request("POST", f"/{repo}/git-upload-pack",
                               {"Content-Type": UPLOAD_CT}, body))
    return sock


def _timeouts(port: int, kind: str) -> float:
    return metric(port, f'gitspout_connection_timeouts_total{{kind="{kind}"}}', 0.0)


def test_32_never_reading_clients_do_not_lock_out_a_small_fetch(
        stall_root: Path, git: Git, tmp_path: Path) -> None:
    """Before: the 32 held every slot; the small clone waited --pack-queue-wait and got
    503 (the slots were still held long after)."""
    srv = start_server(stall_root, extra_args=[
        "--send-timeout", str(SEND_TIMEOUT), "--pack-queue-wait", str(QUEUE_WAIT),
        "--pack-cache-size", "0"])
    socks: list[socket.socket] = []
    try:
        want = git.out("rev-parse", "main", cwd=stall_root / "big.git").strip()
        socks = [_never_reading_fetch(srv.port, ("big.git", "big2.git")[i % 2], want)
                 for i in range(ATTACKERS)]
        assert wait_until(
            lambda: metric(srv.port, "gitspout_admission_in_progress") == ATTACKERS, 30)
        dest = tmp_path / "small"
        git.run("clone", "-q", "--bare", f"{srv.url}/small.git", str(dest),
                timeout=QUEUE_WAIT + 30)
        fsck(git, dest)
        # Every stalled response is cut, and its slot given back.
        assert wait_until(lambda: _timeouts(srv.port, "send") == ATTACKERS, 30)
        assert wait_until(lambda: metric(srv.port, "gitspout_admission_in_progress") == 0, 10)
        # The small clone got a slot given back, not one freed as its wait ran out: no
        # fetch waited --pack-queue-wait (counted, where it was once timed).
        assert metric(srv.port, 'gitspout_admission_rejected_total{reason="wait_timeout"}') == 0
    finally:
        for sock in socks:
            sock.close()
        srv.stop()


def _clone_through(port: int, rate: int, git: Git, dest: Path
                   ) -> tuple[subprocess.Popen[bytes], SlowProxy]:
    proxy = SlowProxy("127.0.0.1", port, rate, rcvbuf=16 << 10)
    clone = subprocess.Popen(["git", "clone", "-q", "--bare",
                              f"http://127.0.0.1:{proxy.port}/big.git", str(dest)],
                             env=git_env(git.home), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    return clone, proxy


def _live_clone(port: int, git: Git, dest: Path) -> None:
    """A clone read at 2 MiB/s: whole, fsck-clean, never cut."""
    live, proxy = _clone_through(port, 2 << 20, git, dest)
    _out, err = live.communicate(timeout=120)
    proxy.close()
    assert live.returncode == 0, err.decode(errors="replace")
    fsck(git, dest)
    assert proxy.relayed > BIG
    assert _timeouts(port, "send_rate") == 0 and _timeouts(port, "send") == 0


def test_a_slow_live_reader_is_kept_and_a_crawling_one_cut(
        stall_root: Path, git: Git, tmp_path: Path) -> None:
    """The rate rule, on a scale of seconds: over its last --send-timeout seconds of
    waiting a client must take --send-min-rate bytes/s. 2 MiB/s passes a 256 KiB/s
    minimum over a clone of many windows; 64 KiB/s is cut once a window has passed."""
    srv = start_server(stall_root, extra_args=[
        "--send-timeout", "0.5", "--send-min-rate", str(256 << 10), "--pack-cache-size", "0"])
    try:
        _live_clone(srv.port, git, tmp_path / "live")
        crawl, proxy = _clone_through(srv.port, 64 << 10, git, tmp_path / "crawl")
        try:
            assert wait_until(lambda: _timeouts(srv.port, "send_rate") == 1, 30)
            assert _timeouts(srv.port, "send") == 0
            assert proxy.relayed < BIG  # cut long before its end
        finally:
            crawl.kill()  # what the kernels still hold would trickle on for a minute
            crawl.wait(timeout=30)
            proxy.close()
    finally:
        srv.stop()


def test_a_slow_live_reader_of_a_cache_hit_is_kept(
        stall_root: Path, git: Git, tmp_path: Path) -> None:
    """The same live reader (2 MiB/s against a 256 KiB/s minimum, --send-timeout 0.5) of a
    pack the cache already holds, sent by ``sendfile`` (sendregion.py), is kept: the
    socket takes more only once a third of its megabytes of buffer are free, more than
    0.5 s of this client, so a bound on one wait for the socket (as bundle downloads had
    until this round) would cut it; the send watch's rules do not."""
    srv = start_server(stall_root, extra_args=[
        "--send-timeout", "0.5", "--send-min-rate", str(256 << 10)])
    try:
        git.run("clone", "-q", "--bare", f"{srv.url}/big.git", str(tmp_path / "warm"))
        hits = metric(srv.port, 'gitspout_pack_cache_lookups_total{result="hit"}', 0.0)
        _live_clone(srv.port, git, tmp_path / "live")
        assert metric(srv.port, 'gitspout_pack_cache_lookups_total{result="hit"}') == hits + 1
    finally:
        srv.stop()
