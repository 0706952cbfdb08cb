"""Admission control for pack generation (docs/ARCHITECTURE.md "Admission control").

A fetch that will send a pack takes a *slot* before its response starts and keeps it until
the response ends. Slots are limited over the process (``--max-packs``) and per repository
(``--max-packs-per-repo``). A request that finds no slot waits in one FIFO queue of at
most ``--pack-queue`` requests, for at most ``--pack-queue-wait`` seconds; past either it
is answered ``503`` with ``Retry-After``, before the 200 and before any pack byte, so a
stream is never cut half-way for load (I4). A queued request for a repository at its own
limit does not hold back those behind it for other repositories.

Negotiation-only rounds and ref listings take no slot: they send no pack.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["Admission", "AdmissionLimits", "Overloaded", "REJECT_REASONS", "BodyCharge"]

REJECT_REASONS = ("queue_full", "wait_timeout", "body_memory")
# The first bytes of every request body are not charged against --body-memory: ref
# listings and small fetches (a few wants and haves) go on while large bodies fill it;
# that is at most this much per connection more (--max-connections).
FREE_BODY = 64 << 10
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Overloaded(Exception):
    """No slot for this pack now: answer 503 with ``Retry-After: retry_after``."""

    def __init__(self, reason: str, retry_after: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after

    @property
    def text(self) -> str:
        why = {"queue_full": "too many requests waiting",
               "body_memory": "too many request bodies held"}.get(self.reason,
                                                                  "waited too long")
        return f"gitspout: server busy ({why}); retry in {self.retry_after} s"


@dataclass(frozen=True)
class AdmissionLimits:
    """0 turns ``max_packs`` or ``per_repo`` off; ``queue`` 0 means no waiting at all."""

    max_packs: int = 32
    per_repo: int = 16
    queue: int = 256
    max_wait: float = 60.0
    retry_after: int = 10
    body_memory: int = 256 << 20  # request bodies held at once (BodyCharge); 0: no cap


@dataclass
class _Waiter:
    repo: str
    fut: asyncio.Future[None]
    since: float = field(default_factory=time.monotonic)


class Admission:
    """Slots for pack generation, the queue in front of them, and their metrics."""

    def __init__(self, limits: AdmissionLimits, registry: CollectorRegistry | None = None) -> None:
        self.limits = limits
        self.running = 0
        self.by_repo: dict[str, int] = {}
        self.waiters: list[_Waiter] = []
        self.rejected = dict.fromkeys(REJECT_REASONS, 0)
        self.body_bytes = 0  # request bodies held now (BodyCharge)
        self.wait = Histogram("gitspout_admission_wait_seconds",
                              "Time a pack request waited for a slot (admitted or timed out).",
                              buckets=WAIT_BUCKETS, registry=registry)
        if registry is not None:
            registry.register(_AdmissionCollector(self))

    @asynccontextmanager
    async def slot(self, repo: str) -> AsyncIterator[None]:
        """Hold a slot for ``repo`` for the duration of the block; raises
        :class:`Overloaded` (before the block runs) when none comes in time."""
        await self._enter(repo)
        try:
            yield
        finally:
            self._release(repo)

    async def _enter(self, repo: str) -> None:
        if self._fits(repo):
            self._take(repo)
            self.wait.observe(0.0)
            return
        if len(self.waiters) >= self.limits.queue:
            self._reject("queue_full")
        waiter = _Waiter(repo, asyncio.get_running_loop().create_future())
        self.waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter.fut), self.limits.max_wait)
        except TimeoutError:
            if not self._granted(waiter):
                self._drop(waiter)
                self.wait.observe(time.monotonic() - waiter.since)
                self._reject("wait_timeout")
        except asyncio.CancelledError:  # the client went away while it waited
            if self._granted(waiter):
                self._release(repo)
            else:
                self._drop(waiter)
            raise
        self.wait.observe(time.monotonic() - waiter.since)

    def _fits(self, repo: str) -> bool:
        lim = self.limits
        return ((not lim.max_packs or self.running < lim.max_packs)
                and (not lim.per_repo or self.by_repo.get(repo, 0) < lim.per_repo))

    def _take(self, repo: str) -> None:
        self.running += 1
        self.by_repo[repo] = self.by_repo.get(repo, 0) + 1

    def _release(self, repo: str) -> None:
        self.running -= 1
        left = self.by_repo[repo] - 1
        if left:
            self.by_repo[repo] = left
        else:
            del self.by_repo[repo]
        self._wake()

    def _wake(self) -> None:
        """Grant freed slots to the first waiters that fit, in arrival order."""
        for waiter in list(self.waiters):
            if self.limits.max_packs and self.running >= self.limits.max_packs:
                return
            if self._fits(waiter.repo):
                self.waiters.remove(waiter)
                self._take(waiter.repo)
                waiter.fut.set_result(None)

    @staticmethod
    def _granted(waiter: _Waiter) -> bool:
        return waiter.fut.done() and not waiter.fut.cancelled()

    def _drop(self, waiter: _Waiter) -> None:
        waiter.fut.cancel()
        if waiter in self.waiters:
            self.waiters.remove(waiter)

    def _reject(self, reason: str) -> None:
        self.rejected[reason] += 1
        raise Overloaded(reason, self.limits.retry_after)

    def charge(self) -> BodyCharge:
        """What one request's body holds against --body-memory (released when it ends)."""
        return BodyCharge(self)


class BodyCharge:
    """One request's share of ``--body-memory``: the bytes of its body as received, then
    as inflated, beyond its first :data:`FREE_BODY`, held until the request ends
    (:meth:`release`; a body too slow to arrive ends its request, httpreq.py). Past the
    limit over all requests, :meth:`take` answers 503 with Retry-After, as a full queue
    does: sixteen 32 MB bodies at once peaked near 500 MB. Used on the event loop only
    (no lock)."""

    def __init__(self, admission: Admission) -> None:
        self._adm = admission
        self.held = 0
        self.seen = 0

    def take(self, n: int) -> None:
        free = max(0, min(n, FREE_BODY - self.seen))
        self.seen += n
        n -= free
        if not n:
            return
        adm = self._adm
        limit = adm.limits.body_memory
        if limit and adm.body_bytes + n > limit:
            adm._reject("body_memory")
        adm.body_bytes += n
        self.held += n

    def release(self) -> None:
        self._adm.body_bytes -= self.held
        self.held = 0


class _AdmissionCollector:
    """``gitspout_admission_*``: packs in progress, requests queued, rejections by reason
    (read at scrape time from plain integers)."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        adm = self.admission
        for name, doc, value in (
            ("gitspout_admission_in_progress", "Packs being generated (slots held).",
             adm.running),
            ("gitspout_admission_queued", "Pack requests waiting for a slot.",
             len(adm.waiters)),
            ("gitspout_admission_limit", "The --max-packs limit (0: none).",
             adm.limits.max_packs),
            ("gitspout_admission_body_bytes", "Bytes of request bodies held against "
             "--body-memory.", adm.body_bytes),
        ):
            gauge = GaugeMetricFamily(name, doc)
            gauge.add_metric([], value)
            yield gauge
        rejected = CounterMetricFamily("gitspout_admission_rejected",
                                       "Pack requests answered 503 for load, by reason.",
                                       labels=["reason"])
        for reason, n in adm.rejected.items():
            rejected.add_metric([reason], n)
        yield rejected
