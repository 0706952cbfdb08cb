"""Admission control (docs/ARCHITECTURE.md "Admission control"): past the limits on packs
generated at once, a fetch waits in a bounded queue for a bounded time, and is answered
503 with Retry-After before any pack byte; git shows the 503, and a pack is never cut."""

from __future__ import annotations

import re
import socket
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
from gitutil import Git, LiveServer, copy_repo, fsck, git_env, poll, start_server
from rawhttp import FLUSH, UPLOAD_CT, Response, build_request, connect, pkt_lines, post_upload_pack, request

TIMEOUT = 60


@pytest.fixture(scope="module")
def two_repos(tmp_path_factory: pytest.TempPathFactory, big_root: tuple[Path, str],
              fixture_root: Path) -> Path:
    root = tmp_path_factory.mktemp("admission")
    copy_repo(big_root[0] / "big.git", root / "big.git")
    copy_repo(fixture_root / "basic.git", root / "basic.git")
    return root


@contextmanager
def serving(root: Path, *args: str) -> Iterator[LiveServer]:
    srv = start_server(root, extra_args=list(args))
    try:
        yield srv
    finally:
        srv.stop()


@contextmanager
def stalled_pack(port: int, commit: str) -> Iterator[socket.socket]:
    """A fetch of big.git whose client stops reading after the headers: it holds its slot
    until the socket closes."""
    sock = connect(port, 10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    body = pkt_lines(f"want {commit} side-band-64k") + FLUSH + pkt_lines("done")
    sock.sendall(build_request("POST", "/big.git/git-upload-pack", {"Content-Type": UPLOAD_CT},
                               body, close=False))
    try:
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        yield sock
    finally:
        sock.close()


def _clone(git: Git, url: str, dest: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-c", "protocol.version=2", "clone", "-q", "--mirror", url,
                           str(dest)], env=git_env(git.home), capture_output=True,
                          timeout=TIMEOUT)


def _fetch_big(port: int, commit: str) -> Response:
    body = pkt_lines(f"want {commit} side-band-64k") + FLUSH + pkt_lines("done")
    return post_upload_pack(port, body, repo="big.git")


def _metric(port: int, name: str) -> float:
    body = request(port, "GET", "/metrics").body.decode()
    m = re.search(rf"^{re.escape(name)} (\S+)$", body, re.M)
    assert m, name
    return float(m.group(1))


def test_git_shows_503_past_the_limit(two_repos: Path, big_root: tuple[Path, str], git: Git,
                                      tmp_path: Path) -> None:
    with serving(two_repos, "--max-packs", "1", "--pack-queue", "0", "--retry-after", "7") as srv:
        with stalled_pack(srv.port, big_root[1]):
            resp = _fetch_big(srv.port, big_root[1])
            assert resp.status == 503
            assert resp.header("retry-after") == "7"
            assert b"PACK" not in resp.body
            done = _clone(git, f"{srv.url}/basic.git", tmp_path / "refused.git")
            assert done.returncode != 0
            assert b"503" in done.stderr, done.stderr
            assert _metric(srv.port, "gitspout_admission_in_progress") == 1
            assert _metric(srv.port, 'gitspout_admission_rejected_total{reason="queue_full"}') == 2
        # The slot is free again once the stalled client is gone.
        poll(lambda: _metric(srv.port, "gitspout_admission_in_progress") == 0, 10,
             "the stalled client's slot to be given back")
        done = _clone(git, f"{srv.url}/basic.git", tmp_path / "served.git")
        assert done.returncode == 0, done.stderr
        fsck(git, tmp_path / "served.git")


def test_queue_waits_then_times_out_or_is_full(two_repos: Path,
                                               big_root: tuple[Path, str]) -> None:
    with serving(two_repos, "--max-packs", "1", "--pack-queue", "1",
                 "--pack-queue-wait", "1.5") as srv:
        with stalled_pack(srv.port, big_root[1]):
            with ThreadPoolExecutor(1) as pool:
                waiting = pool.submit(_fetch_big, srv.port, big_root[1])
                poll(lambda: _metric(srv.port, "gitspout_admission_queued") == 1, 10,
                     "a fetch in the queue")
                full = _fetch_big(srv.port, big_root[1])
                assert full.status == 503
                # Its wait runs out (--pack-queue-wait) while the slot is still held: the
                # wait_timeout count below, not a time, says which 503 this is.
                timed_out = waiting.result(timeout=TIMEOUT)
                assert timed_out.status == 503
        rejected = 'gitspout_admission_rejected_total{reason="%s"}'
        assert _metric(srv.port, rejected % "queue_full") == 1
        assert _metric(srv.port, rejected % "wait_timeout") == 1
        assert _metric(srv.port, "gitspout_admission_wait_seconds_count") >= 2


def test_a_queued_clone_is_served_when_a_slot_frees(two_repos: Path, big_root: tuple[Path, str],
                                                    git: Git, tmp_path: Path) -> None:
    with serving(two_repos, "--max-packs", "1", "--pack-queue", "4") as srv:
        with ThreadPoolExecutor(1) as pool:
            with stalled_pack(srv.port, big_root[1]):
                queued = pool.submit(_clone, git, f"{srv.url}/basic.git", tmp_path / "q.git")
                poll(lambda: _metric(srv.port, "gitspout_admission_queued") == 1, 10,
                     "the clone in the queue")
                assert not queued.done()
            done = queued.result(timeout=TIMEOUT)
        assert done.returncode == 0, done.stderr
        fsck(git, tmp_path / "q.git")


def test_per_repository_limit(two_repos: Path, big_root: tuple[Path, str], git: Git,
                              tmp_path: Path) -> None:
    with serving(two_repos, "--max-packs", "4", "--max-packs-per-repo", "1",
                 "--pack-queue", "0") as srv:
        with stalled_pack(srv.port, big_root[1]):
            assert _fetch_big(srv.port, big_root[1]).status == 503
            done = _clone(git, f"{srv.url}/basic.git", tmp_path / "other.git")
            assert done.returncode == 0, done.stderr  # another repository is not held back


def test_concurrent_clones_are_served_whole_or_refused(two_repos: Path, git: Git,
                                                       tmp_path: Path) -> None:
    with serving(two_repos, "--max-packs", "1", "--pack-queue", "0") as srv:
        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(
                lambda i: _clone(git, f"{srv.url}/big.git", tmp_path / f"c{i}.git"), range(6)))
    served = [i for i, r in enumerate(results) if r.returncode == 0]
    refused = [r for r in results if r.returncode != 0]
    assert served, "no clone got through"
    for r in refused:
        assert b"503" in r.stderr, r.stderr  # refused before the pack, never cut in it
    for i in served:
        fsck(git, tmp_path / f"c{i}.git")


def test_a_client_gone_from_the_queue_leaves_it(two_repos: Path,
                                                big_root: tuple[Path, str]) -> None:
    """Three fetches queue behind a stalled one and hang up: their places are given back
    at once (the handler of a client that went away is cancelled), so a fourth queues and
    is not refused as if the queue were full of them."""
    import struct

    with serving(two_repos, "--max-packs", "1", "--pack-queue", "3", "--pack-cache-size",
                 "0") as srv, ThreadPoolExecutor(1) as pool:
        with stalled_pack(srv.port, big_root[1]):
            body = pkt_lines(f"want {big_root[1]} side-band-64k") + FLUSH + pkt_lines("done")
            gone = []
            for _ in range(3):
                sock = connect(srv.port, 10)
                sock.sendall(build_request("POST", "/big.git/git-upload-pack",
                                           {"Content-Type": UPLOAD_CT}, body, close=False))
                gone.append(sock)
            poll(lambda: _metric(srv.port, "gitspout_admission_queued") == 3, 10,
                 "the three fetches in the queue")
            for sock in gone:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()  # a reset: gone
            poll(lambda: _metric(srv.port, "gitspout_admission_queued") == 0
                 and _metric(srv.port, "gitspout_requests_in_flight") == 1, 10,  # the stalled one
                 "the queue to empty of the clients that left")
            queued = pool.submit(_fetch_big, srv.port, big_root[1])
            poll(lambda: _metric(srv.port, "gitspout_admission_queued") == 1, 10,
                 "the fourth fetch in the queue")
            assert not queued.done()  # waiting, not refused
        assert queued.result(timeout=TIMEOUT).status == 200  # served once the slot is free
