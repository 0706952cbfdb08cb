"""What each signal does (docs/operations.md "Overload, memory, drain and health", its
signals table; docs/ARCHITECTURE.md "Drain and health").

- SIGTERM, and a first SIGINT: the drain (drain.py): readiness fails, new connections are
  refused, requests in flight finish and what they wrote is delivered, within
  ``--drain-timeout``; then the pack-cache directory is removed and the process exits 0.
- A second SIGTERM or SIGINT during the drain, or SIGQUIT at any time: stop now. Every
  connection is reset, so their handlers end at once; the pool and the pack-cache
  directory go as after a drain; exit 0. Clients in flight see a cut.
- SIGHUP (logrotate's, and a closing terminal's, signal): never stops the server. It
  reloads what can safely change under running requests, the ``--auth-file`` (a request
  keeps the users and rules it started with), and logs what it did; a file that cannot
  be used is logged and the previous one kept.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from .auth import load_access
from .config import Config, ConfigError
from .state import ServerState

__all__ = ["Signals", "ignore_hangup"]

log = logging.getLogger("gitspout")


def ignore_hangup() -> None:
    """SIGHUP's default action is to end the process: ignored from the very start, until
    the loop's handler takes over."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


class Signals:
    """The loop's signal handlers for one server: ``stop`` starts the drain, ``now``
    cuts it short."""

    def __init__(self, loop: asyncio.AbstractEventLoop, cfg: Config) -> None:
        self.cfg = cfg
        self.stop = asyncio.Event()
        self.now = asyncio.Event()
        self.state: ServerState | None = None  # known once created: SIGHUP reloads it
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop, sig)
        loop.add_signal_handler(signal.SIGQUIT, self._quit)
        loop.add_signal_handler(signal.SIGHUP, self._hangup)

    def _stop(self, sig: signal.Signals) -> None:
        if self.stop.is_set() and not self.now.is_set():
            log.warning("%s during the drain: stopping now, cutting what is in flight",
                        sig.name)
            self.now.set()
        self.stop.set()

    def _quit(self) -> None:
        log.warning("SIGQUIT: stopping now, without a drain")
        self.now.set()
        self.stop.set()

    def _hangup(self) -> None:
        state = self.state
        path = self.cfg.auth_file
        if not path or state is None or state.gate is None:
            log.info("SIGHUP: nothing to reload (no --auth-file); still serving")
            return
        try:
            access = load_access(path, state.budgets.memory)
        except ConfigError as exc:
            log.warning("SIGHUP: auth file not reloaded, the previous one stays: %s", exc)
            return
        state.access = state.gate.access = access
        log.info("SIGHUP: reloaded the auth file %s (%d rules); still serving", path,
                 len(access.rules))
