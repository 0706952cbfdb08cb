"""The server's thread pool for blocking work, counting what it does for its gauges.

Everything blocking goes through one :class:`WorkPool`: request decoding and planning
(``RequestScope.run``) and the producing of a pack step by step (``stream.pump_pack``, which
takes the scope's executor), so that the pool gauges of ``metrics.py`` see all of it.

The queue is fair across repositories (docs/ARCHITECTURE.md "Fair queuing"): a job is
submitted with a key (the repository of its request; ``None`` for work of no request), each
key has its own FIFO queue, and a free thread takes the head of the next key in turn. A
storm of clones of one repository therefore delays another repository's job by at most one
job per thread, not by the whole burst queued ahead of it.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

__all__ = ["WorkPool"]

T = TypeVar("T")

_NOTHING = object()  # no key may run a job now (``None`` is a key)
_Job = tuple["Future[Any]", Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class WorkPool(Executor):
    """``size`` threads; ``busy`` work items run in them now and ``pending`` ones are
    submitted and not finished (so ``pending - busy`` wait for a thread)."""

    def __init__(self, size: int, name: str = "gitspout", per_key: int = 0) -> None:
        self.size = max(1, size)
        # At most this many threads run one key's jobs at once (0: all of them). Pure-Python
        # planning holds the GIL: 8 threads planning one storm's fetches leave the event
        # loop and every other request 1/9 of the interpreter (docs/ARCHITECTURE.md).
        self.per_key = per_key if per_key > 0 else self.size
        self._running: dict[Hashable, int] = {}
        self.busy = 0
        self.pending = 0
        self.threads = 0  # started so far
        self._name = name
        self._idle = 0  # threads waiting for a job
        self._waiting = 0  # jobs in the queues, not yet taken by a thread
        self._cond = threading.Condition(threading.Lock())
        # key -> its jobs, oldest first; the dict's order is the round-robin turn.
        self._queues: OrderedDict[Hashable, deque[_Job]] = OrderedDict()
        self._shut = False
        self._workers: list[threading.Thread] = []

    @property
    def queued(self) -> int:
        return max(0, self.pending - self.busy)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        return self.submit_for(None, fn, *args, **kwargs)

    def submit_for(self, key: Hashable, fn: Callable[..., T], /, *args: Any,
                   **kwargs: Any) -> Future[T]:
        """``fn(*args, **kwargs)`` queued behind the earlier jobs of ``key`` only."""
        future: Future[T] = Future()
        with self._cond:
            if self._shut:
                raise RuntimeError("cannot schedule new futures after shutdown")
            queue = self._queues.get(key)
            if queue is None:  # a key with nothing queued goes first: it waits only for
                queue = self._queues[key] = deque()  # the jobs running now, not for
                self._queues.move_to_end(key, last=False)  # the head of a busy key
            queue.append((future, fn, args, kwargs))
            self.pending += 1
            self._waiting += 1
            if self._idle < self._waiting and self.threads < self.size:
                self._start_thread()  # the idle threads have jobs enough already
            self._cond.notify()
        future.add_done_callback(self._finished)  # also when cancelled before it ran
        return future

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the pool, awaited."""
        return await asyncio.get_running_loop().run_in_executor(self, fn, *args)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new jobs; with ``cancel_futures`` the queued ones are cancelled, else the
        threads finish them. Running jobs always finish (a thread cannot be stopped)."""
        cancelled: list[Future[Any]] = []
        with self._cond:
            self._shut = True
            if cancel_futures:
                for queue in self._queues.values():
                    cancelled += [job[0] for job in queue]
                self._queues.clear()
                self._waiting = 0
            self._cond.notify_all()
            workers = list(self._workers)
        for future in cancelled:  # outside the lock: done callbacks take it
            future.cancel()
        if wait:
            for thread in workers:
                thread.join()

    def _start_thread(self) -> None:  # with the lock held
        # Daemon threads: an interpreter exiting without shutdown() (a test's state) must not
        # wait for idle threads; the server shuts the pool down on cleanup (state.py).
        thread = threading.Thread(target=self._work, name=f"{self._name}_{self.threads}",
                                  daemon=True)
        self.threads += 1
        self._workers.append(thread)
        thread.start()

    def _next(self) -> tuple[Hashable, _Job] | None:
        """The next job in round-robin order among the keys under their thread limit, or
        ``None`` once shut down and empty."""
        with self._cond:
            while (key := self._eligible()) is _NOTHING:
                if self._shut and not self._queues:
                    return None
                self._idle += 1
                try:
                    self._cond.wait()
                finally:
                    self._idle -= 1
            queue = self._queues[key]
            job = queue.popleft()
            self._running[key] = self._running.get(key, 0) + 1
            self._waiting -= 1
            if queue:
                self._queues.move_to_end(key)  # its next job after every other key's
            else:
                del self._queues[key]
            return key, job

    def _eligible(self) -> Hashable:  # with the lock held
        for key in self._queues:
            if self._running.get(key, 0) < self.per_key:
                return key
        return _NOTHING

    def _work(self) -> None:
        while (picked := self._next()) is not None:
            key, job = picked
            try:
                self._execute(*job)
            finally:
                with self._cond:
                    left = self._running[key] - 1
                    if left:
                        self._running[key] = left
                    else:
                        del self._running[key]
                    self._cond.notify()  # a job of this key may be takeable now
            del picked, job  # not held while waiting for the next one

    def _execute(self, future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        if not future.set_running_or_notify_cancel():
            return  # cancelled while queued
        with self._cond:
            self.busy += 1
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            with self._cond:
                self.busy -= 1
            future.set_exception(exc)
        else:
            with self._cond:
                self.busy -= 1
            future.set_result(result)

    def _finished(self, _future: Future[Any]) -> None:
        with self._cond:
            self.pending -= 1
