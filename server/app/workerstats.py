"""/metrics over every worker (``--workers N``; workers.py).

prometheus_client's multiprocess mode keeps only ``Counter``/``Gauge``/``Histogram``
values in shared files; most of gitspout's metrics are collectors that read the process's
own state at scrape time (pack cache, connections, caches, pool, admission, open files),
which it cannot see. So the equivalent here: each worker serves its own exposition on a
Unix socket in the master's private directory (``w-PID.sock``, made once it listens), and
the worker that answers a scrape asks every other one and merges the answers:

- counters and histograms are summed over the workers;
- gauges are summed too (bytes, entries, connections, threads: the pod's totals; limits
  are split between workers, so their sum is the configured one), except
  ``process_start_time_seconds`` (the oldest), ``gitspout_closure_store_bytes`` (the
  largest: each worker counts the one shared directory whole) and info metrics (one);
- a worker that died counts with its counters and histograms as the last scrape saw them
  (``last-PID.prom``, written at every scrape): a scraped counter never goes back, so
  ``rate()`` stays right; what a worker counted after the last scrape before it died is
  lost. Its gauges go with it (the master unlinks its socket: ``forget_worker``). A live
  worker that does not answer within ASK_TIMEOUT counts the same way, as last seen;
- ``gitspout_workers`` (wanted, alive, ready), ``gitspout_worker_restarts_total`` and
  ``gitspout_worker_requests_total{worker}`` (how evenly connections are spread).
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from .workers import WorkerLink, ready_path

__all__ = ["WorkerStats", "merge_expositions", "master_status"]

log = logging.getLogger("gitspout")

ASK_TIMEOUT = 5.0  # seconds for another worker's exposition
SUMMED = ("counter", "histogram", "summary")
OLDEST = {"process_start_time_seconds"}
# Gauges of one thing every worker measures whole (the closure store's one shared
# directory): the largest, not the sum (the freshest count is the writer's, the others'
# date from their last listing).
WHOLE = {"gitspout_closure_store_bytes"}


def master_status(directory: str) -> tuple[int, int, int, int]:
    """(wanted, alive, ready, restarts) as the master last wrote them; zeros if unknown."""
    try:
        with open(os.path.join(directory, "master.status")) as fh:
            a, b, c, d = (int(x) for x in fh.read().split()[:4])
        return a, b, c, d
    except (OSError, ValueError):
        return 0, 0, 0, 0


@dataclass
class _Family:
    name: str
    doc: str
    kind: str
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)


def merge_expositions(texts: Iterable[str], dead: Iterable[str] = ()) -> list[Metric]:
    """Families merged over the live workers' ``texts`` and the dead workers' last
    counters and histograms (``dead``), as the module doc says."""
    merged: dict[str, _Family] = {}
    for text, alive in [(t, True) for t in texts] + [(t, False) for t in dead]:
        for fam in text_string_to_metric_families(text):
            if not alive and fam.type not in SUMMED:
                continue
            into = merged.setdefault(fam.name, _Family(fam.name, fam.documentation, fam.type))
            for s in fam.samples:
                if s.name.endswith("_created"):
                    continue  # per-process creation times mean nothing summed
                key = (s.name, tuple(sorted(s.labels.items())))
                old = into.samples.get(key)
                if old is None:
                    into.samples[key] = s.value
                elif fam.name in OLDEST:
                    into.samples[key] = min(old, s.value)
                elif fam.name in WHOLE:
                    into.samples[key] = max(old, s.value)
                elif fam.type != "info":
                    into.samples[key] = old + s.value
    out = []
    for family in merged.values():
        metric = Metric(family.name, family.doc, family.kind)
        for (name, labels), value in family.samples.items():
            metric.add_sample(name, dict(labels), value)
        out.append(metric)
    return out


class _Static:
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> list[Metric]:
        return self.metrics


class WorkerStats:
    """One worker's side: serve its own exposition, and answer a scrape for all."""

    def __init__(self, link: WorkerLink, scrape: Callable[[], bytes]) -> None:
        self.link = link
        self.scrape = scrape
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        """Listen on ``w-PID.sock``: from now on this worker counts as ready."""
        path = ready_path(self.link.directory, os.getpid())

        async def answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                writer.write(self.scrape())
                await writer.drain()
            except ConnectionError:
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_unix_server(answer, path)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        try:
            os.unlink(ready_path(self.link.directory, os.getpid()))
        except OSError:
            pass

    async def aggregate(self) -> bytes:
        """The exposition of every worker merged (module doc)."""
        d = self.link.directory
        own = os.getpid()
        others = [p for p in glob.glob(os.path.join(d, "w-*.sock")) if _pid(p) != own]
        texts = {own: self.scrape().decode()}
        answers = await asyncio.gather(*(_ask(p) for p in others))
        for path, text in zip(others, answers, strict=True):
            if text is not None:
                texts[_pid(path)] = text
        for pid, text in texts.items():
            _keep_last(d, pid, text)
        dead = []
        for path in glob.glob(os.path.join(d, "last-*.prom")):
            pid = _pid(path)
            if pid not in texts:  # dead, or too busy to answer: as last seen
                try:
                    with open(path) as fh:
                        dead.append(fh.read())
                except OSError:
                    continue
        metrics = merge_expositions(texts.values(), dead)
        metrics += self._own_metrics(texts)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Static(metrics))
        return generate_latest(registry)

    def _own_metrics(self, texts: dict[int, str]) -> list[Metric]:
        wanted, alive, ready, restarts = master_status(self.link.directory)
        workers = Metric("gitspout_workers", "Worker processes: wanted (--workers), alive, "
                         "ready (listening), answered (in this scrape).", "gauge")
        for state, n in (("wanted", wanted), ("alive", alive), ("ready", ready),
                         ("answered", len(texts))):
            workers.add_sample("gitspout_workers", {"state": state}, n)
        restarted = Metric("gitspout_worker_restarts", "Workers restarted by the master "
                           "after they died.", "counter")
        restarted.add_sample("gitspout_worker_restarts_total", {}, restarts)
        per = Metric("gitspout_worker_requests", "HTTP requests served, by live worker "
                     "(pid): how evenly the kernel spreads connections.", "counter")
        for pid, text in sorted(texts.items()):
            per.add_sample("gitspout_worker_requests_total", {"pid": str(pid)},
                           _requests(text))
        return [workers, restarted, per]


def _requests(text: str) -> float:
    for fam in text_string_to_metric_families(text):
        if fam.name == "gitspout_requests":
            return sum(s.value for s in fam.samples if s.name == "gitspout_requests_total")
    return 0.0


async def _ask(path: str) -> str | None:
    """Another worker's exposition; None if it is gone or does not answer in time."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path),
                                                ASK_TIMEOUT)
    except (OSError, TimeoutError):
        return None
    try:
        data = await asyncio.wait_for(reader.read(), ASK_TIMEOUT)
        return data.decode()
    except (OSError, TimeoutError):
        return None
    finally:
        writer.close()


def _pid(path: str) -> int:
    base = os.path.basename(path)
    try:
        return int(base.split("-", 1)[1].split(".", 1)[0])
    except (IndexError, ValueError):
        return -1


def _keep_last(directory: str, pid: int, text: str) -> None:
    """The counters as this scrape saw them, for when the worker is dead (atomically:
    two workers may answer scrapes at once)."""
    path = os.path.join(directory, f"last-{pid}.prom")
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("workers: cannot keep %s: %s", path, exc)
