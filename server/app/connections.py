"""Connection lifetimes: deadlines on the phases in which the server waits for the client to
send, a cap on open connections, and one log line (not a traceback) per malformed request.

aiohttp alone keeps a connection that sends nothing, or a request head at one byte a second,
for an hour (its keep-alive timer is the only one, and a dribbling head never completes).
Enough of those exhaust the process's descriptors and every client is refused. So each
connection here is in one of two states:

- *waiting*: the server is waiting for a request head. A fresh connection must complete its
  first head within ``header_timeout`` of opening; a kept-alive one gets ``idle_timeout``
  for the first byte of its next request and then ``header_timeout`` from that byte.
- *busy*: a request head arrived and its handler runs. No connection timer runs: the
  handler's body reader applies the body deadlines (server/httpreq.py), and a client that
  is slowly *receiving* a response is held back by backpressure, and cut only when it
  stops taking bytes or takes them too slowly (sendwatch.py: ``--send-timeout``,
  ``--send-min-rate``).

At ``max_connections`` a new connection closes the connection that has been waiting the
longest (an idle keep-alive, or a head that never completed) and takes its place; if every
connection is busy it is refused with a 503. Evicting waiting connections rather than
refusing newcomers is what keeps the server reachable while idle sockets pile up: a real
client's head arrives within a round trip, so it is busy long before it is the oldest.

The handler is aiohttp's :class:`RequestHandler` with hooks on its own methods
(``connection_made``, ``data_received``, ``_handle_request``, ``connection_lost``) and reads
of its queue (``_messages``, ``_request_count``): the tests in
tests/server/test_server_connections.py fail if an aiohttp upgrade changes them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from .metrics import ConnectionStats
from .sendwatch import SendLimits, SendWatch

__all__ = ["ConnectionLimits", "ConnectionGuard", "GuardedHandler", "listen",
           "OneLineBadRequests", "install_log_filter", "describe_bad_request"]

log = logging.getLogger("gitspout")

TIMER_SLACK = 0.002  # loop timers may fire this early (uvloop rounds to milliseconds)
REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
           b"Content-Length: 32\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
           b"gitspout: too many connections\r\n")
# Connections over the cap, when every open one is busy, that may still ask /healthz or
# /readyz (anything else: 503): slow clients holding every connection must not get a
# healthy pod restarted by its liveness probe (docs/ARCHITECTURE.md "Drain and health").
PROBE_RESERVE = 8


@dataclass(frozen=True)
class ConnectionLimits:
    """The connection settings (app/budgets.py); 0 turns one off."""

    header_timeout: float = 20.0
    idle_timeout: float = 75.0
    max_connections: int = 512
    send: SendLimits = SendLimits()


class ConnectionGuard:
    """Counts the open connections of its listeners against ``max_connections`` and knows
    which are waiting, longest-waiting first. ``stats`` (shared by every guard of the
    process) is what /metrics shows."""

    def __init__(self, limits: ConnectionLimits, stats: ConnectionStats) -> None:
        self.limits = limits
        self.stats = stats
        self.open = 0
        # Insertion order is the order in which connections started waiting: the first key
        # is the one to evict. Moving a key to the end is a pop and a set, O(1).
        self.waiting: dict[GuardedHandler, None] = {}
        self.probes = 0  # connections admitted over the cap for health probes only
        self.handlers: set[GuardedHandler] = set()  # every connection admitted and open
        self._warned: set[str] = set()  # what was logged in this episode of saturation

    def admit(self, handler: GuardedHandler) -> bool | None:
        """Count a new connection in, closing the longest-waiting one if the cap is reached;
        None when every open connection is busy but the probe reserve is not (the new one
        may only ask a health probe); False when that is full too (it must be refused)."""
        cap = self.limits.max_connections
        if cap and self.open >= cap:
            if not self.waiting:
                self._warn("refused", "every connection is busy; refusing new ones (503)")
                if self.probes < PROBE_RESERVE:
                    self.probes += 1
                    return None
                self.stats.rejected += 1
                return False
            victim = next(iter(self.waiting))
            self.stats.evicted += 1
            self._warn("evicted", "closing the longest-waiting idle connections to admit new "
                       "ones")
            victim.evict()
        self.open += 1
        self.stats.open += 1
        return True

    def abort_all(self) -> None:
        """Drop every open connection at once (the drain's deadline): a handler blocked on
        a client that stopped reading then fails its write and ends; a plain close would
        wait for the socket's buffer to empty, which that client never lets it do."""
        for handler in list(self.handlers):
            transport = handler.transport
            if transport is not None:
                transport.abort()

    def release(self, handler: GuardedHandler) -> None:
        self.handlers.discard(handler)
        if handler.probe_only:
            self.probes -= 1
            return
        self.waiting.pop(handler, None)
        self.open -= 1
        self.stats.open -= 1
        if self._warned and self.open <= self.limits.max_connections * 9 // 10:
            self._warned.clear()

    def _warn(self, kind: str, what: str) -> None:
        """One line per kind per episode of saturation, not one per connection of a flood."""
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("%d connections open (max-connections): %s",
                        self.limits.max_connections, what)

    def protocol_factory(self, runner: web.BaseRunner,
                         **handler_kwargs: Any) -> Callable[[], GuardedHandler]:
        """What ``loop.create_server`` calls per accepted socket, instead of aiohttp's
        ``Server.__call__`` (which would build a plain RequestHandler)."""
        server = runner.server
        assert server is not None, "runner.setup() first"
        loop = asyncio.get_running_loop()

        def factory() -> GuardedHandler:
            return GuardedHandler(server, self, loop=loop, **handler_kwargs)

        return factory


class GuardedHandler(RequestHandler):
    """aiohttp's per-connection protocol, with the deadlines and the cap of this module."""

    def __init__(self, manager: web.Server, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._counted = False  # counted in guard.open; cleared on release or eviction
        self._refused = False
        self.probe_only = False  # over the cap: health probes only (PROBE_RESERVE)
        self._busy = False
        self._opened = 0.0
        self._idle_since: float | None = None  # None until the first request was handled
        self._head_started: float | None = None  # first byte of a head not yet complete
        self._payload: Any = None  # body stream of the latest request head
        self._timer: asyncio.TimerHandle | None = None
        self._send_watch: SendWatch | None = None  # while a handler writes (sendwatch.py)

    # -- aiohttp hooks -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        admitted = self._guard.admit(self)
        if admitted is None:
            self.probe_only = True
        elif not admitted:
            self._refused = True
            refused = cast(asyncio.Transport, transport)
            refused.write(REFUSAL)
            refused.close()
            return
        self._counted = True
        self._guard.handlers.add(self)
        super().connection_made(transport)
        self._opened = self._loop.time()
        self._wait()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        count = self._request_count
        payload = self._payload
        # Bytes after the previous body ended belong to the next request's head. (Bytes that
        # end one body and start the next head in the same read are not noticed here; that
        # head is then timed from its next read, or as idle: still bounded.)
        head_bytes = bool(data) and (payload is None or payload.is_eof())
        super().data_received(data)
        if self._request_count != count:
            # A head (or an unparsable one, answered 400) is complete: the handler owns the
            # connection until it returns.
            self._payload = self._messages[-1][1] if self._messages else None
            self._head_started = None
            self._set_busy()
        elif head_bytes and self._head_started is None:
            self._head_started = self._loop.time()
            if not self._busy:
                self._arm()

    async def _handle_request(self, request: Any, start_time: Any,
                              request_handler: Any) -> Any:
        self._set_busy()
        send = self._guard.limits.send
        if send.timeout and self.transport is not None:
            self._send_watch = SendWatch(self._loop, send, self.transport, request.writer,
                                         self._send_cut)
        try:
            return await super()._handle_request(request, start_time, request_handler)
        finally:
            if self._send_watch is not None:
                self._send_watch.stop()
                self._send_watch = None
            if not self._messages:  # nothing pipelined behind it: wait for the client
                self._idle_since = self._loop.time()
                if self._head_started is not None:  # part of a head came while busy
                    self._head_started = self._idle_since
                self._wait()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._refused:
            return
        self._cancel_timer()
        if self._counted:
            self._counted = False
            self._guard.release(self)
        else:
            self._guard.waiting.pop(self, None)
        super().connection_lost(exc)

    # -- states ----------------------------------------------------------------------------

    def evict(self) -> None:
        """Closed to make room at the cap; it no longer counts as open from now on."""
        self._guard.waiting.pop(self, None)
        self._guard.handlers.discard(self)
        if self._counted:
            self._counted = False
            self._guard.open -= 1
            self._guard.stats.open -= 1
        log.debug("evicted a waiting connection at max-connections")
        self._cancel_timer()
        self.force_close()

    def _set_busy(self) -> None:
        if not self._busy:
            self._busy = True
            self._guard.waiting.pop(self, None)
            self._cancel_timer()

    def _wait(self) -> None:
        self._busy = False
        if not self._counted or self.transport is None:
            return  # gone (a handler can end after its connection was lost)
        if not self.probe_only:  # never evicted to make room: it holds none
            waiting = self._guard.waiting
            waiting.pop(self, None)
            waiting[self] = None
        self._arm()

    def _deadline(self) -> tuple[str, float] | None:
        """(kind, loop time) of the current waiting phase's deadline; None when off."""
        limits = self._guard.limits
        if self._idle_since is None or self._head_started is not None:
            if not limits.header_timeout:
                return None
            start = self._opened if self._idle_since is None else self._head_started
            assert start is not None
            return "header", start + limits.header_timeout
        if not limits.idle_timeout:
            return None
        return "idle", self._idle_since + limits.idle_timeout

    def _arm(self) -> None:
        self._cancel_timer()
        if self._busy or self.transport is None:
            return
        deadline = self._deadline()
        if deadline is not None:
            self._timer = self._loop.call_at(deadline[1], self._expire)

    def _expire(self) -> None:
        self._timer = None
        if self._busy or self.transport is None:
            return
        deadline = self._deadline()
        if deadline is None:
            return
        kind, when = deadline
        if self._loop.time() < when - TIMER_SLACK:  # the phase changed since it was set
            self._arm()
            return
        self._guard.stats.timeouts[kind] += 1
        log.debug("closed a connection: %s timeout", kind)
        self.force_close()

    def _send_cut(self, kind: str) -> None:
        """The response stopped moving (``send``) or crawled (``send_rate``): abort the
        connection, so that the handler's write fails and it gives back what it holds."""
        self._guard.stats.timeouts[kind] += 1
        log.debug("cut a response: %s timeout", kind)
        if self.transport is not None:
            self.transport.abort()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def refuse_over_cap(self) -> None:
        """Count the 503 of a request other than a health probe on a probe-only
        connection."""
        self._guard.stats.rejected += 1

    def skip_lingering(self) -> None:
        """After the current response, close instead of reading what is left of the body
        (aiohttp otherwise reads it for up to ``lingering_time``, 10 s): for a body that
        was already too slow."""
        self._lingering_time = 0.0


async def listen(runner: web.BaseRunner, guard: ConnectionGuard, host: str, port: int,
                 reuse_port: bool = False, **handler_kwargs: Any) -> asyncio.Server:
    """Listen on ``host:port`` for ``runner``'s application, each connection a
    :class:`GuardedHandler` (aiohttp's TCPSite would make plain ones); ``reuse_port``
    for a worker sharing the port with the others (workers.py)."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(guard.protocol_factory(runner, **handler_kwargs),
                                    host, port, reuse_address=True, backlog=128,
                                    reuse_port=reuse_port or None)


def describe_bad_request(exc: HttpProcessingError) -> str:
    """aiohttp's parser message on one line, without the bytes of the request it quotes:
    they may be an ``Authorization`` header, part of a password or a query's token (the
    access log drops query strings; this line must not bring them back). What is left is
    the kind of fault ("Invalid header value char"), at most 200 characters."""
    text = exc.message if isinstance(exc.message, str) else str(exc)
    kind, colon, rest = text.partition(":")
    kind = " ".join(kind.split())
    kind = "".join(ch if ch.isprintable() else "?" for ch in kind)[:200]
    return f"{kind} (the {len(rest.strip())} characters it quotes not logged)" \
        if colon and rest.strip() else kind


class OneLineBadRequests(logging.Filter):
    """Turns aiohttp's "Error handling request" record for a request it could not parse
    (``HttpProcessingError``: bad request line, header, chunk...) into one warning line.

    The traceback points into aiohttp's parser, says nothing about gitspout and is the
    client's fault; one line per bad request keeps scanners from flooding the log. Other
    exceptions (bugs) keep their traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        remote = args[0] if args else "?"
        record.msg = "bad HTTP request from %s: %s"
        record.args = (remote, describe_bad_request(exc))
        record.exc_info = None
        record.exc_text = None
        if record.levelno > logging.WARNING:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return logging.getLogger(record.name).isEnabledFor(record.levelno)


def install_log_filter() -> None:
    """Put :class:`OneLineBadRequests` on the logger aiohttp's protocol reports through."""
    logger = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, OneLineBadRequests) for f in logger.filters):
        logger.addFilter(OneLineBadRequests())
