"""One request being served, as one object passed along: :class:`RequestScope` carries its
record (metrics and the access log), its view of the repository once resolved (core's
:class:`~..core.context.RequestContext`), and the leases that view holds on packs while
pool work runs for it.

Blocking work of a request goes to the pool through its scope (:meth:`RequestScope.run`,
:meth:`RequestScope.executor`): queued fairly under its repository (pool.py), and holding
the view's leases until the job is over, so that a handler cancelled while the pool still
runs a step for it (the client went away) does not have its packs closed under that step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

from ..core.context import RequestContext
from .metrics import RequestRecord
from .pool import WorkPool

__all__ = ["RequestScope", "HeldExecutor"]

T = TypeVar("T")


class HeldExecutor(Executor):
    """The pool as one request's work sees it: every job queued under the request's
    repository, holding its view (when it has one) from submission to completion, also
    when cancelled before it ran. :meth:`hold` and :meth:`release` let a task that outlives
    the request (the pack cache's producer) keep the view for its own life."""

    def __init__(self, pool: Executor, key: Hashable = None,
                 view: RequestContext | None = None) -> None:
        self._pool = pool
        self._key = key
        self._view = view

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        view = self._view
        if view is not None:
            view.hold()
        try:
            if isinstance(self._pool, WorkPool):  # queued fairly, per repository (pool.py)
                fut = self._pool.submit_for(self._key, fn, *args, **kwargs)
            else:
                fut = self._pool.submit(fn, *args, **kwargs)
        except BaseException:
            if view is not None:
                view.unhold()
            raise
        if view is not None:
            fut.add_done_callback(lambda _f: view.unhold())
        return fut

    def hold(self) -> None:
        if self._view is not None:
            self._view.hold()

    def release(self) -> None:
        if self._view is not None:
            self._view.unhold()


class RequestScope:
    """One request: its record, its view of the repository, the pool as it sees it."""

    def __init__(self, pool: Executor, record: RequestRecord) -> None:
        self.record = record
        self.view: RequestContext | None = None
        self._pool = pool
        self.executor = HeldExecutor(pool)

    def attach(self, view: RequestContext) -> RequestContext:
        """The repository is resolved: its view is this request's from now on."""
        self.view = view
        self.record.repo = view.repo.url_path
        self.executor = HeldExecutor(self._pool, view.repo.url_path, view)
        return view

    @property
    def repo(self) -> str:
        """The repository's URL path (empty before it is resolved)."""
        return self.record.repo

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the pool, holding this request's leases while it runs."""
        return await asyncio.wrap_future(self.executor.submit(fn, *args))

    def phase(self, name: str, seconds: float) -> None:
        """Record ``seconds`` spent in phase ``name`` (measured here or returned by core
        and packgen)."""
        phases = self.record.phases
        phases[name] = phases.get(name, 0.0) + seconds

    def since(self, name: str, start: float) -> None:
        """Record the time since ``start`` (time.monotonic) in phase ``name``."""
        self.phase(name, time.monotonic() - start)

    def close(self) -> None:
        """The handler is done: its view's leases end once the pool is done with it too;
        the file-system calls it made go to the record."""
        view = self.view
        if view is not None:
            self.record.fs = dict(view.fs.counts)
            view.close()
