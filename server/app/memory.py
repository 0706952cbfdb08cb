"""Giving memory back to the system (docs/ARCHITECTURE.md "Memory caps").

glibc's malloc serves a block over its mmap threshold with a map of its own, returned to
the system when freed; smaller blocks come from heaps that keep freed memory. The
threshold grows by itself (up to 32 MiB) after such a block is freed, so after one 24 MB
blob every later one stayed in the heaps: 60 fetches of it left 1.5 GB behind. The
threshold is fixed instead, and once no request has been in flight for
:data:`TRIM_DELAY` seconds (what a finished request frees is freed by then: generators
closed in the pool, connections closed), garbage in reference cycles is collected (a
client that hung up leaves an exception whose traceback holds the frames of its pack
writer, and with the raised thresholds of cli.py an idle server would not collect them)
and the heaps' free pages are handed back (``malloc_trim``).
Elsewhere than glibc both are no-ops.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily

__all__ = ["fix_mmap_threshold", "HeapTrimmer", "HeapTrimCollector"]

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 128 << 10  # large objects get maps of their own (pack pieces are 64 KiB)
# Fixing the mmap threshold also fixes the trim threshold at 128 KiB: a heap whose top had
# that much free was shrunk at once. Pack pieces read in a pool thread and freed by the loop
# thread then left a thread's heap each time, to be faulted back in for the next ones:
# streaming 27 MB cost 37 ms instead of 23. The heaps keep up to this much free at their
# top; the idle trim below hands everything back.
TRIM_THRESHOLD = 2 << 20
TRIM_DELAY = 1.0
# Only when the RSS grew by this much since the last trim: a full collection of a server
# holding millions of objects (a 1M-ref repository) takes a while, with the GIL held.
TRIM_OVER = 32 << 20


def _libc() -> Any:
    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def fix_mmap_threshold() -> None:
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)


class HeapTrimmer:
    """Trims the heaps :data:`TRIM_DELAY` seconds after the server went idle."""

    def __init__(self) -> None:
        self._libc = _libc()
        self._timer: asyncio.TimerHandle | None = None
        self._floor = 0  # RSS after the last trim
        self.checks = 0  # idle passes that looked (a test waits for one: no event says so)
        self.trims = 0

    def schedule(self, then: Callable[[], None]) -> None:
        """Call ``then`` (which checks that the server is still idle and runs
        :meth:`trim` in the pool) in :data:`TRIM_DELAY` seconds, unless already due."""
        if (self._timer is not None and not self._timer.cancelled()
                                  and self._timer.when() > asyncio.get_running_loop().time()):
            return
        self._timer = asyncio.get_running_loop().call_later(TRIM_DELAY, then)

    def trim(self) -> None:
        """Blocking (it walks the objects and the heaps): run it in the pool."""
        try:
            if _rss() - self._floor < TRIM_OVER:
                return
            self._trim()
        finally:
            self.checks += 1

    def _trim(self) -> None:
        gc.collect()
        if self._libc is not None:
            self._libc.malloc_trim(0)
        self.trims += 1
        self._floor = _rss()


class HeapTrimCollector:
    """``gitspout_heap_trim_checks_total`` (idle passes) and ``gitspout_heap_trims_total``
    (passes that collected and trimmed: the RSS had grown by :data:`TRIM_OVER`)."""

    def __init__(self, trimmer: HeapTrimmer) -> None:
        self.trimmer = trimmer

    def collect(self) -> Iterable[CounterMetricFamily]:
        yield CounterMetricFamily("gitspout_heap_trim_checks", "Idle passes of the heap "
                                  "trimmer (TRIM_DELAY after the last git request).",
                                  value=self.trimmer.checks)
        yield CounterMetricFamily("gitspout_heap_trims", "Idle passes that collected "
                                  "garbage and gave free heap pages back (malloc_trim).",
                                  value=self.trimmer.trims)


def _rss() -> int:
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 1 << 62  # unknown: trim
