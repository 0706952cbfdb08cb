"""/readyz on a hung mount (docs/ARCHITECTURE.md "Drain and health"): with the latencyfs
daemon stopped (SIGSTOP), every stat of the root blocks, as on a dead NFS server. /readyz
must answer 503 within its check timeout instead of hanging, /healthz must keep answering,
and readiness must come back once the mount does.

Not hanging is bounded by the probe's own timeout (10 s, 20x the check timeout); that the
hung check is not started again is counted (the server's threads), not timed."""

from __future__ import annotations

import http.client
import os
import signal
from pathlib import Path

from gitutil import poll, start_server
from mount import MountFactory


def _get(port: int, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_readyz_fails_fast_on_a_hung_mount(latency_mount: MountFactory, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "some.git").mkdir(parents=True)
    mount = latency_mount(src, delay_ms=0.1)
    srv = start_server(mount.path, extra_args=["--ready-check-interval", "0",
                                               "--ready-check-timeout", "0.5"])
    pid = mount.pid
    assert pid is not None
    try:
        assert _get(srv.port, "/readyz")[0] == 200
        os.kill(pid, signal.SIGSTOP)
        try:
            threads = []
            for _ in range(3):  # the hung check is not started again, nor waited for again
                status, body = _get(srv.port, "/readyz")
                assert status == 503, body
                assert b"has not returned" in body
                threads.append(_threads(srv.proc.pid))
            # One check thread blocked on the mount, not one more per probe.
            assert threads[1] == threads[2] == threads[0], threads
            assert _get(srv.port, "/healthz")[0] == 200
        finally:
            os.kill(pid, signal.SIGCONT)
        poll(lambda: _get(srv.port, "/readyz")[0] == 200, 10, "/readyz to answer 200 again")
    finally:
        srv.stop()
