"""The gate in front of password checks (docs/operations.md "Access control").

bcrypt costs a quarter of a second of CPU on purpose, so whoever may make the server check
passwords may make it busy; a flood of wrong passwords must not delay valid users nor
anonymous requests (docs/performance.md, "Slow and hostile clients"). So:

- Checks run in threads of their own (``--auth-threads``), never in the pool that serves
  repositories, and never ahead of repository work.
- They wait in three lanes, served in order: credentials that were right before (their
  cache entry expired), then client addresses with no failed login lately, then the rest
  (*suspect*). A flood becomes suspect at its first failure; a user it does not share an
  address with goes ahead of it.
- Failed logins are rate-limited per client address (a burst of :data:`ADDRESS_BURST`,
  then one per :data:`ADDRESS_REFILL` s) and over the process (:data:`GLOBAL_BURST`, then
  :data:`GLOBAL_RATE` a second): past either, a suspect address's credentials get 429 with
  Retry-After without a check. A full queue (:data:`QUEUE`) drops the newest suspect check
  to make room for a better lane, or answers 503.
- Known-good credentials are cached apart from failed ones (``auth.py``): random
  passwords cannot push them out.

Behind a reverse proxy every client has the proxy's address: the per-address limit then
acts as a second overall one (docs/operations.md "Access control").
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .auth import Access, AuthDenied

__all__ = ["PasswordGate", "AuthBusy", "GateCollector", "ADDRESS_BURST", "ADDRESS_REFILL"]

ADDRESS_BURST = 5  # failed logins an address may have at once...
ADDRESS_REFILL = 10.0  # ...then one per this many seconds
GLOBAL_BURST = 50  # failed logins over the process at once...
GLOBAL_RATE = 5.0  # ...then this many a second (one thread checks 4 a second at cost 12)
QUEUE = 64  # checks waiting at most
ADDRESSES = 65_536  # addresses remembered (the least recently failed forgotten first)
KNOWN, CLEAN, SUSPECT = 0, 1, 2  # the lanes, served in this order


class AuthBusy(Exception):
    """Too many password checks waiting: 503 with Retry-After."""

    retry_after = 1


class _Bucket:
    """Failed logins allowed: ``burst`` at once, refilled at ``rate`` a second."""

    __slots__ = ("tokens", "stamp", "burst", "rate")

    def __init__(self, burst: float, rate: float, now: float) -> None:
        self.tokens, self.stamp, self.burst, self.rate = burst, now, burst, rate

    def level(self, now: float) -> float:
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        return self.tokens

    def wait(self, now: float) -> int:
        """Seconds until one failure is allowed again (Retry-After)."""
        return max(1, int((1 - self.level(now)) / self.rate + 0.999))


@dataclass
class _Check:
    header: str
    future: Future[str | None]


class PasswordGate:
    """Password checks for one server: lanes, limits and threads of their own."""

    def __init__(self, access: Access, threads: int = 1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.access = access  # replaced on SIGHUP (cli.py): checks read it when they run
        self._clock = clock
        self._threads = max(1, threads)
        self._started = 0
        self._cond = threading.Condition()
        self._lanes: tuple[deque[_Check], ...] = (deque(), deque(), deque())
        self._closed = False
        self._addresses: OrderedDict[str, _Bucket] = OrderedDict()
        self._global = _Bucket(GLOBAL_BURST, GLOBAL_RATE, clock())
        # counted on the loop, read at scrape time (metrics.py)
        self.counts = {"ok": 0, "failed": 0, "refused": 0, "busy": 0}

    @property
    def queued(self) -> int:
        return sum(len(lane) for lane in self._lanes)

    async def user_for(self, header: str, address: str | None) -> str | None:
        """The user ``header`` proves (None without one); AuthDenied (401, or 429 for a
        client over its failed-login limit), or AuthBusy (503)."""
        access = self.access
        known, user = access.known_user(header)  # cached: no check, no thread
        if known:
            return user
        now = self._clock()
        bucket = self._addresses.get(address or "")
        lane = KNOWN if access.was_right(header) else \
            CLEAN if bucket is None or bucket.level(now) >= bucket.burst else SUSPECT
        if lane == SUSPECT and bucket is not None and (
                bucket.level(now) < 1 or self._global.level(now) < 1):
            self.counts["refused"] += 1
            wait = bucket.wait(now) if bucket.level(now) < 1 else self._global.wait(now)
            raise AuthDenied(429, "too many failed logins; retry later", retry_after=wait)
        future = self._submit(lane, header)
        try:
            user = await asyncio.wrap_future(future)
        except AuthDenied as exc:
            if exc.status == 401:
                self._failed(address or "")
            raise
        except asyncio.CancelledError:
            future.cancel()  # the client went away: its check need not run
            raise
        self.counts["ok"] += 1
        return user

    def _failed(self, address: str) -> None:
        now = self._clock()
        self.counts["failed"] += 1
        bucket = self._addresses.get(address)
        if bucket is None:
            bucket = self._addresses[address] = _Bucket(ADDRESS_BURST, 1 / ADDRESS_REFILL, now)
            if len(self._addresses) > ADDRESSES:
                self._addresses.popitem(last=False)
        else:
            self._addresses.move_to_end(address)
        bucket.tokens = bucket.level(now) - 1
        self._global.tokens = self._global.level(now) - 1

    def _submit(self, lane: int, header: str) -> Future[str | None]:
        check = _Check(header, Future())
        dropped: list[_Check] = []
        with self._cond:
            if self._closed:
                raise AuthBusy()
            if self.queued >= QUEUE:
                self._forget_cancelled()
            if self.queued >= QUEUE:
                suspects = self._lanes[SUSPECT]
                if lane == SUSPECT or not suspects:
                    self.counts["busy"] += 1
                    raise AuthBusy()
                dropped.append(suspects.pop())  # the newest suspect makes room
            self._lanes[lane].append(check)
            if self._started < self._threads:
                self._started += 1
                threading.Thread(target=self._work, name=f"gitspout-auth_{self._started}",
                                 daemon=True).start()
            self._cond.notify()
        for old in dropped:
            self.counts["busy"] += 1
            _answer_busy(old)
        return check.future

    def _forget_cancelled(self) -> None:
        """Drop the waiting checks whose clients went away (their futures cancelled), so
        that they hold no place in the queue. Under ``_cond``."""
        for lane in self._lanes:
            if any(c.future.cancelled() for c in lane):
                kept = [c for c in lane if not c.future.cancelled()]
                lane.clear()
                lane.extend(kept)

    def _next(self) -> _Check | None:
        with self._cond:
            while True:
                for lane in self._lanes:
                    if lane:
                        return lane.popleft()
                if self._closed:
                    return None
                self._cond.wait()

    def _work(self) -> None:
        while (check := self._next()) is not None:
            if not check.future.set_running_or_notify_cancel():
                continue  # its client went away while it waited
            try:
                check.future.set_result(self.access.user_for(check.header))
            except BaseException as exc:  # AuthDenied, mostly
                check.future.set_exception(exc)

    def close(self) -> None:
        """No more checks; the waiting ones are answered 503."""
        with self._cond:
            self._closed = True
            waiting = [c for lane in self._lanes for c in lane]
            for lane in self._lanes:
                lane.clear()
            self._cond.notify_all()
        for check in waiting:
            _answer_busy(check)



class GateCollector:
    """``gitspout_auth_checks_total{result}`` (ok, failed: bcrypt said no; refused: 429
    without a check; busy: 503, the queue full) and ``gitspout_auth_queued``."""

    def __init__(self, gate: PasswordGate) -> None:
        self.gate = gate

    def collect(self) -> Any:
        checks = CounterMetricFamily("gitspout_auth_checks", "Password checks by result "
                                     "(refused: over the failed-login limit, no check; "
                                     "busy: queue full).", labels=["result"])
        for result, n in self.gate.counts.items():
            checks.add_metric([result], n)
        yield checks
        queued = GaugeMetricFamily("gitspout_auth_queued", "Password checks waiting.")
        queued.add_metric([], self.gate.queued)
        yield queued


def _answer_busy(check: _Check) -> None:
    """Answer a waiting check 503, unless its client went away meanwhile (the event loop
    cancelled the future: setting it would raise InvalidStateError into the request that
    took its place)."""
    try:
        check.future.set_exception(AuthBusy())
    except InvalidStateError:
        pass
