"""gitspout processes for the git test-suite runner, started when a test script's Apache asks.

A test script creates its trash directory (and the Apache ``www`` directory in it) only
once it runs, and gitspout refuses a ``--root`` that does not exist; so gitspout cannot be
started before the script. The ``LIB_HTTPD_PATH`` wrapper (gitsuite_apache.py) asks for one
on ``-k start`` through files in a rendezvous directory, and :class:`SpoutKeeper` answers:
it starts ``gitspout serve --root <www> --port 0``, reads the port from its log and writes
it back. All of a script's gitspouts are stopped when the script ends.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from gitsuite_apache import NAMESPACES_ARG

__all__ = ["SpoutKeeper", "SpoutError"]

_SERVING = re.compile(r"serving .* at http://127\.0\.0\.1:(\d+)/")


class SpoutError(Exception):
    """A gitspout did not start."""


class SpoutKeeper:
    """Answers a rendezvous directory's start requests with gitspouts, for one script."""

    def __init__(self, rendezvous: Path, log: Path, cache_dir: Path,
                 extra_args: Sequence[str] = (), start_timeout: float = 30.0) -> None:
        self.rendezvous = rendezvous
        self.log = log
        self.cache_dir = cache_dir
        self.extra_args = tuple(extra_args)
        self.start_timeout = start_timeout
        self.started: list[tuple[str, int]] = []  # (www, port) of each gitspout started
        self._procs: list[subprocess.Popen[bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gitsuite-spouts", daemon=True)

    def __enter__(self) -> SpoutKeeper:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=self.start_timeout + 10)
        for proc in self._procs:
            _terminate(proc)

    def _loop(self) -> None:
        while not self._stop.is_set():
            for req in sorted(self.rendezvous.glob("req.*")):
                self._answer(req)
            self._stop.wait(0.05)

    def _answer(self, req: Path) -> None:
        ident = req.name.split(".", 1)[1]
        www = req.read_text().strip()
        req.rename(self.rendezvous / f"done.{ident}")
        try:
            port = self._start(www)
        except (SpoutError, OSError) as e:
            _write_whole(self.rendezvous / f"fail.{ident}", f"gitspout: {e}\n")
            return
        self.started.append((www, port))
        _write_whole(self.rendezvous / f"port.{ident}", f"{port}\n")

    def _start(self, www: str) -> int:
        cmd = [sys.executable, "-m", "gitspout.server.app.cli", "serve", "--root", www,
               "--host", "127.0.0.1", "--port", "0", "--pack-cache-dir", str(self.cache_dir),
               "--drain-timeout", "2", "--log-format", "json", *NAMESPACES_ARG,
               *self.extra_args]
        # Settings come from the command line only, never from the runner's environment.
        env = {k: v for k, v in os.environ.items() if not k.startswith("GITSPOUT_")}
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as f:
            f.write(f"== {time.strftime('%H:%M:%S')} gitspout --root {www}\n".encode())
            offset = f.tell()
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self._procs.append(proc)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            with self.log.open("rb") as f:
                f.seek(offset)
                m = _SERVING.search(f.read().decode(errors="replace"))
            if m:
                return int(m[1])
            if proc.poll() is not None:
                raise SpoutError(f"exited with {proc.returncode} (see {self.log})")
            time.sleep(0.05)
        raise SpoutError(f"did not say where it listens within {self.start_timeout:.0f}s")


def _write_whole(path: Path, text: str) -> None:
    """Write ``path`` so that a reader polling for it never sees it half-written."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    tmp.rename(path)


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (gitspout drains, then exits), SIGKILL if it has not after 10 s."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
