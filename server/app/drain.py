"""The drain (docs/ARCHITECTURE.md "Drain and health"; docs/operations.md "Overload, memory,
drain and health"): on SIGTERM the server stops taking connections, lets the requests in
flight finish, and exits only once what it wrote has left the kernel's send buffers, or its
clients are gone.

A request that finished has written its last bytes into a socket, not to its client: a
slow reader's connection may still hold megabytes in the kernel (``SIOCOUTQ``: bytes not
yet acknowledged). A process that exits then leaves them to the kernel, which delivers
them only while the network namespace exists: a container's (and a Kubernetes pod's) dies
with its last process, and a clone in flight lost the end of its pack. So each connection
open when the drain starts is watched through a duplicate of its socket: once its
transport is closing with nothing left in its own buffer, the duplicate sends the FIN
(``shutdown``), and the process waits until every such socket's send queue is empty (its
data and FIN acknowledged; a client that reset the connection empties it too), all within
``--drain-timeout``. (aiohttp drops its reference to a transport when it asks it to
close, while the transport still flushes its buffer: a FIN sent then cut the response.)
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiohttp import web

from .connections import ConnectionGuard, GuardedHandler
from .sendwatch import unsent_bytes
from .state import ServerState

__all__ = ["drain", "SendQueues"]

log = logging.getLogger("gitspout")

POLL = 0.02  # seconds between two looks at the send queues


@dataclass
class _Watched:
    transport: asyncio.BaseTransport
    sock: socket.socket  # our duplicate of the connection's socket
    finished: bool = False  # the transport closed and flushed; ours sent the FIN


class SendQueues:
    """Duplicates of the sockets of the connections open at the start of the drain, so
    that their send queues can be watched after aiohttp has closed them."""

    def __init__(self, guards: Sequence[ConnectionGuard]) -> None:
        self.watched: list[_Watched] = []
        self.abandoned = False  # stop now (signals.py): no waiting for anything
        for guard in guards:
            for handler in list(guard.handlers):
                sock = _dup_socket(handler)
                if sock is not None and handler.transport is not None:
                    self.watched.append(_Watched(handler.transport, sock))

    def pending(self) -> tuple[int, int]:
        """(connections with bytes still to deliver, those bytes); closes the duplicates
        of the connections that are done."""
        left: list[_Watched] = []
        unsent = 0
        for w in self.watched:
            if not w.finished and _flushed(w.transport):
                w.finished = True  # the FIN goes after the data, all in the kernel now
                try:
                    w.sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass  # reset by the client meanwhile
            n = unsent_bytes(w.sock.fileno())
            if w.finished and n == 0:
                w.sock.close()
                continue
            unsent += n
            left.append(w)
        self.watched = left
        return len(left), unsent

    async def delivered(self, deadline: float) -> bool:
        """Wait until every watched connection is closed by aiohttp and its send queue
        empty, or until ``deadline`` (loop time); True when all were delivered."""
        loop = asyncio.get_running_loop()
        while self.pending()[0]:
            if self.abandoned or loop.time() >= deadline:
                return False
            await asyncio.sleep(POLL)
        return True

    def close(self) -> None:
        for w in self.watched:
            w.sock.close()
        self.watched = []


def _flushed(transport: asyncio.BaseTransport) -> bool:
    """Closing, and nothing of the response left in the transport's own buffer (uvloop
    counts libuv's write queue in it)."""
    if not transport.is_closing():
        return False
    size = getattr(transport, "get_write_buffer_size", None)
    return size is None or size() == 0


def _dup_socket(handler: GuardedHandler) -> socket.socket | None:
    transport = handler.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return None
    try:
        return socket.socket(fileno=os.dup(sock.fileno()))
    except OSError:  # out of descriptors: that connection is not watched
        return None


async def drain(state: ServerState, listeners: list[asyncio.Server],
                runners: list[web.AppRunner], guards: list[ConnectionGuard],
                timeout: float, now: asyncio.Event | None = None) -> None:
    """Readiness fails at once, new connections are refused, idle ones closed; requests in
    flight finish, and what they wrote is delivered, for up to ``timeout`` seconds in all;
    the pool is shut down after the requests. Once ``now`` is set (a second signal,
    SIGQUIT: signals.py) every connection is cut at once and nothing is waited for.

    aiohttp's shutdown waits ``timeout`` for a handler, then cancels it and waits as long
    again: a handler blocked writing to a client that stopped reading ends only when its
    connection does. So at the deadline every connection still open is aborted."""
    if state.health is not None:
        state.health.draining = True
    for listener in listeners:
        listener.close()  # stop accepting: a new connection is refused from now on
    log.info("draining: %d requests in flight, up to %g s (drain-timeout)", state.in_flight,
             timeout)
    start = time.monotonic()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    queues = SendQueues(guards)

    def cut_all() -> None:
        queues.abandoned = bool(now is not None and now.is_set())
        for guard in guards:
            guard.abort_all()

    cut = loop.call_at(deadline, cut_all)
    hurry = loop.create_task(_when_set(now, cut_all)) if now is not None else None
    try:
        for r in runners:
            await r.cleanup()  # waits for handlers (shutdown_timeout), then the pool closes
        if not await queues.delivered(deadline):
            conns, unsent = queues.pending()
            log.warning("drain-timeout: %d connections still had %d bytes unsent", conns,
                        unsent)
    finally:
        cut.cancel()
        if hurry is not None:
            hurry.cancel()
        queues.close()
    log.info("%s in %.1f s", "stopped" if queues.abandoned else "drained",
             time.monotonic() - start)


async def _when_set(event: asyncio.Event, action: Callable[[], None]) -> None:
    await event.wait()
    action()
