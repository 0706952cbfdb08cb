"""Responses that stop moving are cut (docs/ARCHITECTURE.md "Drain and health"; docs/operations.md
"Slow clients and the connection cap").

A client that asks for a pack and never reads would hold its pack slot, its producer and
up to ``--output-buffer`` for as long as it stays connected: 32 of them would hold every
``--max-packs`` slot, and every other fetch wait ``--pack-queue-wait`` for a 503. So
while a response is written, its connection is sampled every
:data:`TICK` s: the bytes its client has acknowledged (what aiohttp handed the
transport, minus what the transport still buffers, minus what the kernel has not had
acknowledged: ``SIOCOUTQ``), and whether data was waiting for the client then (either
buffer not empty). Only that waiting time counts: a server busy producing a pack is never
the client's fault. (What the kernel takes from the transport is no measure: a socket
becomes writable again only once a third of its buffer, up to megabytes, is free.)

- **No progress** for ``--send-timeout`` seconds while data waits: cut (``send``).
- **Too slow**: once the response has waited ``--send-timeout`` seconds in all, the bytes
  taken over its last ``--send-timeout`` seconds of waiting must average
  ``--send-min-rate`` bytes/s, or it is cut (``send_rate``): reading a byte now and then
  is no way to keep a slot.

A cut aborts the connection: the handler's write fails, it ends, and its slot, its
producer and its buffers go with it. The defaults (60 s, 1 KiB/s) keep a slow but live
client (64 KiB/s) going for as long as its clone lasts.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import struct
import termios
from collections import deque
from dataclasses import dataclass
from typing import Any

__all__ = ["SendLimits", "SendWatch", "unsent_bytes"]

log = logging.getLogger("gitspout")

TICK = 1.0  # seconds between two samples (less for a send timeout under 8 s)


def unsent_bytes(fd: int) -> int:
    """Bytes of a TCP socket's send queue not yet acknowledged by its peer (``SIOCOUTQ``,
    the same request as ``TIOCOUTQ``; a FIN not yet acknowledged counts one)."""
    try:
        out = fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0")
    except OSError:
        return 0  # not a socket any more, or one in LISTEN: nothing of ours to deliver
    return int(struct.unpack("i", out)[0])


@dataclass(frozen=True)
class SendLimits:
    """``timeout`` 0 turns both rules off; ``min_rate`` 0 turns the rate rule off."""

    timeout: float = 60.0
    min_rate: int = 1024

    @property
    def tick(self) -> float:
        return min(TICK, self.timeout / 8)


class SendWatch:
    """Samples one connection while its handler writes a response; ``cut`` is called
    (with ``send`` or ``send_rate``) when a rule is broken. On the event loop only."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limits: SendLimits,
                 transport: Any, writer: Any, cut: Any) -> None:
        self._loop = loop
        self._limits = limits
        self._transport = transport
        sock = transport.get_extra_info("socket")
        self._fd = sock.fileno() if sock is not None else -1
        self._writer = writer  # aiohttp's StreamWriter: ``output_size`` handed over so far
        self._cut = cut
        self._taken = 0
        self._stalled = 0.0  # seconds waiting with no byte taken, in a row
        # bytes taken in each of the last ``timeout`` seconds spent waiting for the client
        self._window: deque[int] = deque(maxlen=max(1, round(limits.timeout / limits.tick)))
        self._timer: asyncio.TimerHandle | None = loop.call_later(limits.tick, self._sample)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _sample(self) -> None:
        self._timer = None
        transport = self._transport
        if transport.is_closing():
            return
        # Read while the transport is open: its descriptor is still this connection's.
        pending = transport.get_write_buffer_size()
        pending += unsent_bytes(self._fd) if self._fd >= 0 else 0
        taken = self._writer.output_size - pending
        delta, self._taken = taken - self._taken, taken
        verdict = self._judge(pending > 0, delta)
        if verdict is not None:
            self._cut(verdict)
            return
        self._timer = self._loop.call_later(self._limits.tick, self._sample)

    def _judge(self, waiting: bool, delta: int) -> str | None:
        """``send``, ``send_rate`` or None (fine) after one sample."""
        if not waiting:
            self._stalled = 0.0  # nothing for the client to take: not its fault
            return None
        lim = self._limits
        self._stalled = self._stalled + lim.tick if delta <= 0 else 0.0
        if self._stalled >= lim.timeout - 1e-9:
            return "send"
        window = self._window
        window.append(max(delta, 0))
        if lim.min_rate and len(window) == window.maxlen:
            # Measured over recent waiting only: bytes taken earlier buy nothing now.
            if sum(window) < lim.min_rate * len(window) * lim.tick:
                return "send_rate"
        return None
