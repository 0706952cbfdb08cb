"""Launch and stop long-running server processes, and wait for readiness.

:class:`ServerProcess` starts a command in its own session/process group,
optionally inside a :class:`bench.cgroup.Cgroup` from birth, with stdout and
stderr going to a log file.  ``stop()`` terminates the whole process group
(SIGTERM, then SIGKILL after a bounded grace period).

The ``wait_for_*`` helpers poll with a hard timeout and fail fast (with the
log tail) if a watched process dies while we wait.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from bench.cgroup import Cgroup

LOOPBACK = "127.0.0.1"


class ServerError(RuntimeError):
    """A server failed to start, died, or did not become ready in time."""


def process_cpu_ns(pid: int) -> int:
    """CPU time (user + system, ns) of every live thread of process *pid*, from
    ``/proc/<pid>/task/*/schedstat`` (nanoseconds; ``/proc/<pid>/stat`` counts 10 ms
    ticks). A thread that exited meanwhile takes its time with it: measure servers
    whose threads live as long as they do (gitspout's pool threads are never stopped)."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        raise ServerError(f"process {pid} is gone") from None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                total += int(fh.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # it exited between the listing and the read
    return total


def exit_on_sigterm() -> None:
    """Turn SIGTERM/SIGHUP into ``SystemExit`` so ``with`` blocks still clean up
    (kill servers, remove cgroups) when a benchmark is terminated."""
    def handler(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port that is currently free on *host* (loopback only)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def ensure_port_free(port: int, host: str = LOOPBACK) -> None:
    """Raise :class:`ServerError` if something already listens on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise ServerError(f"{host}:{port} is already in use: {e}") from e


class ServerProcess:
    """A background process (and its process group), optionally in a cgroup."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        cgroup: Cgroup | None = None,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.cgroup = cgroup
        self.cwd = cwd
        self.env = dict(env) if env is not None else None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """PID of the launched process (== its process group id)."""
        if self.proc is None:
            raise ServerError(f"{self.name} not started")
        return self.proc.pid

    def start(self) -> ServerProcess:
        """Spawn the process in a new session; it joins the cgroup before exec."""
        argv = self.cgroup.wrap_argv(self.argv) if self.cgroup else self.argv
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            try:
                self.proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    cwd=self.cwd, env=self.env, start_new_session=True,
                )
            except OSError as e:
                raise ServerError(f"{self.name}: cannot run {self.argv[0]!r}: {e}") from e
        return self

    def alive(self) -> bool:
        """True while the launched (top-level) process has not exited."""
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        """Raise :class:`ServerError` with the log tail if the process exited."""
        if self.proc is None:
            raise ServerError(f"{self.name} not started")
        rc = self.proc.poll()
        if rc is not None:
            raise ServerError(f"{self.name} exited with status {rc}; log tail:\n"
                              + self.log_tail())

    def log_tail(self, lines: int = 30) -> str:
        """Last *lines* lines of the process log (empty string if none)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> int | None:
        """Terminate the process group: SIGTERM, then SIGKILL after *timeout* s."""
        if self.proc is None:
            return None
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            _killpg(self.proc.pid, sig)
            try:
                return self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        raise ServerError(f"{self.name} (pid {self.proc.pid}) did not die")


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _check_all(procs: Iterable[ServerProcess]) -> None:
    for p in procs:
        p.check_alive()


def wait_for_port(
    port: int, *, host: str = LOOPBACK, timeout: float = 30.0,
    procs: Iterable[ServerProcess] = (),
) -> float:
    """Poll until ``host:port`` accepts a TCP connection; return seconds waited."""
    procs = list(procs)
    start = time.monotonic()
    while True:
        _check_all(procs)
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return time.monotonic() - start
        except OSError as e:
            if time.monotonic() - start > timeout:
                raise ServerError(f"{host}:{port} not accepting after {timeout}s: {e}") from e
        time.sleep(0.05)


def http_get(port: int, path: str, *, host: str = LOOPBACK,
             timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """One HTTP GET to the loopback server; returns (status, headers, body)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"User-Agent": "gitspout-bench/1"})
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body
    finally:
        conn.close()


def wait_for_http(
    port: int, path: str, *, host: str = LOOPBACK, timeout: float = 30.0,
    procs: Iterable[ServerProcess] = (), expect_content_type: str | None = None,
) -> float:
    """Poll ``GET path`` until it answers 200 (and the content type); return seconds."""
    procs = list(procs)
    start = time.monotonic()
    last = "no answer"
    while time.monotonic() - start <= timeout:
        _check_all(procs)
        try:
            status, headers, body = http_get(port, path, host=host, timeout=5.0)
            ctype = headers.get("content-type", "")
            if status == 200 and (expect_content_type is None or ctype == expect_content_type):
                return time.monotonic() - start
            last = f"HTTP {status} {ctype!r}: {body[:200]!r}"
        except (OSError, http.client.HTTPException) as e:
            last = repr(e)
        time.sleep(0.1)
    raise ServerError(f"GET http://{host}:{port}{path} not ready after {timeout}s: {last}")


def link_import_root(dest: Path, packages: Sequence[str] = ("server", "protocol"),
                     source: Path | None = None) -> None:
    """Make the ``server/`` and ``protocol/`` folders of *source* (default: *dest* itself)
    importable as ``gitspout.server`` and ``gitspout.protocol`` through ``PYTHONPATH=dest``
    (the names the installed distribution gives them: pyproject.toml ``package-dir``)."""
    ns = dest / "gitspout"
    ns.mkdir(parents=True, exist_ok=True)
    for pkg in packages:
        link = ns / pkg
        if not link.exists():
            link.symlink_to(source / pkg if source is not None else Path("..") / pkg)


def gitspout_command(tree: Path, scratch: Path) -> tuple[list[str], dict[str, str]]:
    """The argv prefix (up to ``serve``) and extra environment that run the gitspout code of
    the source tree *tree*: since the move to one import root that is
    ``python -m gitspout.server.app.cli`` with a ``PYTHONPATH`` made in *scratch*; older
    trees ran as ``python -m server.cli`` from their own folder (pass ``cwd=tree``)."""
    import sys

    if (tree / "server" / "app" / "cli.py").exists():
        link_import_root(scratch, source=tree.resolve())
        return [sys.executable, "-m", "gitspout.server.app.cli", "serve"], {"PYTHONPATH": str(scratch)}
    return [sys.executable, "-m", "server.cli", "serve"], {}
