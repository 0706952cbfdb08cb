"""The server's thread pool for blocking work, counting what it does for its gauges.

Everything blocking goes through one :class:`WorkPool`: request decoding and planning
(``ServerState.run``) and the producing of a pack step by step (``stream.pump_pack``, which
takes it as its executor), so that the pool gauges of ``metrics.py`` see all of it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["WorkPool"]

T = TypeVar("T")


class WorkPool(Executor):
    """``size`` threads; ``busy`` work items run in them now and ``pending`` ones are
    submitted and not finished (so ``pending - busy`` wait for a thread)."""

    def __init__(self, size: int, name: str = "gitspout") -> None:
        self.size = size
        self.busy = 0
        self.pending = 0
        self.threads = 0  # started so far
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(size, thread_name_prefix=name,
                                            initializer=self._thread_started)

    @property
    def queued(self) -> int:
        return max(0, self.pending - self.busy)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        with self._lock:
            self.pending += 1
        try:
            future = self._executor.submit(self._run, fn, args, kwargs)
        except BaseException:
            with self._lock:
                self.pending -= 1
            raise
        future.add_done_callback(self._finished)  # also when cancelled before it ran
        return future

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the pool, awaited."""
        return await asyncio.get_running_loop().run_in_executor(self, fn, *args)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._executor.shutdown(wait=wait, cancel_futures=cancel_futures)

    def _thread_started(self) -> None:
        with self._lock:
            self.threads += 1

    def _run(self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        with self._lock:
            self.busy += 1
        try:
            return fn(*args, **kwargs)
        finally:
            with self._lock:
                self.busy -= 1

    def _finished(self, _future: Future[Any]) -> None:
        with self._lock:
            self.pending -= 1
