"""Liveness and readiness (docs/ARCHITECTURE.md "Drain and health").

``/healthz`` answers 200 while the event loop runs: it touches no file. ``/readyz`` answers
503 while the server drains (after SIGTERM), while the repository root cannot be read and,
in a worker (``--workers``), once its master is gone; 200 otherwise. With ``--workers`` a
probe reaches one worker, as any connection does: a worker that cannot answer is one whose
connections fail, and the master restarts it. Neither is counted as a git request in the metrics.

The root check runs in a thread of its own, never on the event loop nor in the work pool:
a stat of a hung NFS mount can block for minutes, and such a thread would be lost to
serving. At most one check runs at a time; its result is kept ``--ready-check-interval``
seconds; a probe waits for a running check at most until ``--ready-check-timeout`` after
it started, and answers 503 past that. A check that hangs stays the only one until it
returns, so a dead mount costs one blocked thread, not one per probe.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from aiohttp import web

from .httpreq import NO_CACHE

__all__ = ["Health", "RootCheck", "PROBE_PATHS"]

log = logging.getLogger("gitspout")

PROBE_PATHS = ("/healthz", "/readyz")


class RootCheck:
    """Is the repository root readable? A stat and one directory read, timed and cached."""

    def __init__(self, root: str, interval: float, timeout: float) -> None:
        self.root = root
        self.interval = interval
        self.timeout = timeout
        self._done_at = -1e9  # monotonic time of the last finished check
        self._error: str | None = "not checked yet"
        self._running: Future[None] | None = None
        self._started = 0.0
        self._lock = threading.Lock()

    async def verdict(self) -> str | None:
        """None when the root is readable, else why not (for the 503 body and the log)."""
        now = time.monotonic()
        with self._lock:
            if now - self._done_at < self.interval:
                return self._error
            running = self._running
            if running is None:
                running = self._running = Future()
                self._started = now
                threading.Thread(target=self._probe, args=(running,), name="gitspout-readyz",
                                 daemon=True).start()
            started = self._started
        remaining = started + self.timeout - now
        if remaining > 0:
            try:
                # shield: a timed-out wait must not cancel the check (wrap_future would)
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(running)), remaining)
            except TimeoutError:
                pass
        if not running.done():
            return f"repository root check has not returned for {time.monotonic() - started:.1f} s"
        return self._error

    def _probe(self, fut: Future[None]) -> None:
        error: str | None = None
        try:
            os.stat(self.root)
            with os.scandir(self.root) as it:
                next(it, None)
        except OSError as exc:
            error = f"repository root unreadable: {exc.strerror or exc}"
        with self._lock:
            if error != self._error:
                if error:
                    log.warning("readyz: %s", error)
                elif self._done_at > 0:
                    log.info("readyz: repository root readable again")
            self._error = error
            self._done_at = time.monotonic()
            self._running = None
        if not fut.done():
            fut.set_result(None)


class Health:
    """The process's liveness and readiness; ``draining`` is set once, on SIGTERM."""

    def __init__(self, root_check: RootCheck) -> None:
        self.root_check = root_check
        self.draining = False
        # A worker (--workers, workers.py) whose master is gone is not ready: nobody
        # restarts it, and it is about to drain (it gets SIGTERM when its master dies).
        self.master_alive: Callable[[], bool] | None = None

    async def respond(self, request: web.Request) -> web.Response:
        """The answer to a probe path (GET or HEAD)."""
        if request.method not in ("GET", "HEAD"):
            resp = web.Response(status=405, text="GET or HEAD\n", headers=NO_CACHE)
            resp.headers["Allow"] = "GET, HEAD"
            return resp
        if request.path == "/healthz":
            return web.Response(status=200, text="ok\n", headers=NO_CACHE)
        if self.draining:
            why: str | None = "draining"
        elif self.master_alive is not None and not self.master_alive():
            why = "the master process is gone"
        else:
            why = await self.root_check.verdict()
        if why is None:
            return web.Response(status=200, text="ready\n", headers=NO_CACHE)
        return web.Response(status=503, text=f"not ready: {why}\n", headers=NO_CACHE)
