"""Prometheus metrics and the per-request JSON log line (observed at the edges of the
request phases; nothing here reaches into protocol/).

Every name starts with ``gitspout_``. Labels stay low-cardinality: service, protocol
version, command, status, phase, source, cache and result. Repositories get a label only
in ``gitspout_repo_requests_total`` and only when listed in ``--metrics-repos``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..packgen import PackStats
from ..store.closurestore import RESULTS, ClosureStore
from ..store.faults import KINDS
from ..store.lru import MemoryBudget
from ..store.registry import PackRegistry
from .logtext import FIELDS
from .namespaces import plain_name
from .pool import WorkPool

__all__ = ["Metrics", "RequestRecord", "ConnectionStats", "CONTENT_TYPE", "TIMEOUT_KINDS"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
access_log = logging.getLogger("gitspout.access")

# From a 1 ms ref request to a 10-minute clone.
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                    30, 60, 120, 300, 600, 1200)
WRITE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384, 65536)
HAVES_BUCKETS = (0, 1, 8, 32, 128, 256, 1024, 4096, 16384, 65536)
SERIES_KEPT = 512  # label values whose series observe() keeps at hand (a few dozen occur)


@dataclass
class RequestRecord:
    """What one HTTP request did; filled in by the HTTP adapter as the request runs."""

    service: str = "none"
    protocol: str = "0"
    client: str = ""  # the client's address (--trusted-proxies: from X-Forwarded-For)
    method: str = ""
    path: str = ""
    user: str | None = None  # who --auth-file's check proved (None: anonymous)
    command: str = "none"
    repo: str = ""
    agent: str = ""
    status: int = 0
    bytes: int = 0
    writes: int = 0
    objects: int = 0
    haves: int = 0
    negotiation_round: bool = False
    pack_source: str = ""  # what made the pack (walk, bitmap, verbatim, reuse, cache-hit...)
    pack_cache: str = ""  # the pack cache's lookup: hit, joined, miss, bypass (empty: none)
    pack_stats: PackStats | None = None
    phases: dict[str, float] = field(default_factory=dict)
    fs: dict[str, int] = field(default_factory=dict)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    started: float = field(default_factory=time.monotonic)


class _ProcIoCollector:
    """Read and write syscalls of this process, from /proc/self/io."""

    def collect(self) -> Iterable[CounterMetricFamily]:
        values = {}
        try:
            with open("/proc/self/io", "rb") as fh:
                for line in fh:
                    key, _, value = line.partition(b":")
                    values[key.strip()] = int(value)
        except OSError:
            return
        for key, name, doc in ((b"syscr", "read", "Read"), (b"syscw", "write", "Write")):
            fam = CounterMetricFamily(f"gitspout_process_{name}_syscalls",
                                      f"{doc} syscalls made by the process (/proc/self/io).")
            fam.add_metric([], values.get(key, 0))
            yield fam


class _PoolCollector:
    """Size, busy threads and queue of the blocking-work thread pool (``pool.py``)."""

    def __init__(self, pool: WorkPool | None) -> None:
        self.pool = pool

    def collect(self) -> Iterable[GaugeMetricFamily]:
        pool = self.pool
        if pool is None:
            return
        for name, doc, value in (
            ("gitspout_thread_pool_size", "Configured threads of the pool.", pool.size),
            ("gitspout_thread_pool_busy", "Pool threads running blocking work.", pool.busy),
            ("gitspout_thread_pool_queue_length", "Work items waiting for a pool thread.",
             pool.queued),
            ("gitspout_thread_pool_threads", "Pool threads started so far.", pool.threads),
        ):
            fam = GaugeMetricFamily(name, doc)
            fam.add_metric([], value)
            yield fam


TIMEOUT_KINDS = ("header", "body", "idle", "send", "send_rate")


@dataclass
class ConnectionStats:
    """Connection counts, kept as plain integers by server/connections.py (and by the body
    reader for body timeouts) and turned into metrics at scrape time: the accept path stays
    free of metric-library locks."""

    open: int = 0
    rejected: int = 0
    evicted: int = 0
    timeouts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIMEOUT_KINDS, 0))


class _ConnectionCollector:
    """``gitspout_connections_*``: open connections, refusals and evictions at the cap, and
    connections closed because the client was too slow to send, by phase."""

    def __init__(self, stats: ConnectionStats) -> None:
        self.stats = stats

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        st = self.stats
        gauge = GaugeMetricFamily("gitspout_connections_open", "Open client connections.")
        gauge.add_metric([], st.open)
        yield gauge
        for name, doc, value in (
            ("gitspout_connections_rejected",
             "Connections refused (503) because the cap was reached and none was idle.",
             st.rejected),
            ("gitspout_connections_evicted",
             "Idle connections closed to make room for a new one at the cap.", st.evicted),
        ):
            fam = CounterMetricFamily(name, doc)
            fam.add_metric([], value)
            yield fam
        timeouts = CounterMetricFamily(
            "gitspout_connection_timeouts",
            "Connections closed because the client did not send (or take) in time, by phase "
            "(header, body, idle keep-alive; send: a response that made no progress, "
            "send_rate: one under --send-min-rate).", labels=["kind"])
        for kind, value in st.timeouts.items():
            timeouts.add_metric([kind], value)
        yield timeouts


class _CacheCollector:
    """Lookups and evictions of every cache, by cache name (store/lru.py counts them over
    all instances of a name: each repository's, each request's), and the bytes the caches
    shared across requests hold within --cache-memory, read at scrape time."""

    def __init__(self, budget: MemoryBudget | None) -> None:
        self.budget = budget  # --cache-memory, where every cache counts

    def collect(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        budget = self.budget
        if budget is None:
            return
        lookups = CounterMetricFamily("gitspout_cache_lookups", "Cache lookups by cache and result.",
                                      labels=["cache", "result"])
        evictions = CounterMetricFamily("gitspout_cache_evictions",
                                        "Values dropped to stay within a cache's budget or "
                                        "within --cache-memory.", labels=["cache"])
        for stats in budget.all_stats():
            lookups.add_metric([stats.name, "hit"], stats.hits)
            lookups.add_metric([stats.name, "miss"], stats.misses)
            evictions.add_metric([stats.name], stats.evictions)
        yield lookups
        yield evictions
        held: dict[str, int] = {}
        for cache in budget.caches():
            held[cache.name] = held.get(cache.name, 0) + cache.held
        size = GaugeMetricFamily("gitspout_cache_bytes",
                                 "Bytes held by the caches shared across requests, by cache.",
                                 labels=["cache"])
        for name in sorted(held):
            size.add_metric([name], held[name])
        yield size
        for name, doc, value in (
            ("gitspout_cache_memory_bytes", "Bytes held by all caches shared across requests.",
             budget.total),
            ("gitspout_cache_memory_limit_bytes", "The --cache-memory budget.", budget.limit),
        ):
            gauge = GaugeMetricFamily(name, doc)
            gauge.add_metric([], value)
            yield gauge


class _FaultCollector:
    """``gitspout_storage_faults_total{kind,outcome}`` (store/faults.py): requests failed
    by a damaged file of each kind, and unusable files done without (once per file)."""

    def __init__(self, registry: PackRegistry | None) -> None:
        self.registry = registry

    def collect(self) -> Iterable[CounterMetricFamily]:
        if self.registry is None:
            return
        fam = CounterMetricFamily(
            "gitspout_storage_faults",
            "Storage faults by file kind: outcome=failed counts requests answered as a "
            "server fault (500 or in-band error); outcome=fallback counts unusable files "
            "(once per file version) served without (walk, parsed commits, pack skipped).",
            labels=["kind", "outcome"])
        counts = self.registry.faults.snapshot()
        for kind in KINDS:
            for outcome in ("failed", "fallback"):
                fam.add_metric([kind, outcome], counts.get((kind, outcome), 0))
        yield fam


class ClosureStoreCollector:
    """``gitspout_closure_store_total{result}`` and ``gitspout_closure_store_bytes``
    (store/closurestore.py): closures, layouts and clones' object walks read from the
    local disk instead of computed (loaded), computed for want of one (missed), of those
    computed on top of a closure stored for an earlier ref state (based), written, removed
    (stale: their pack was replaced; corrupt; evicted over the budget, or a repository's
    walks past eight) or not written (dropped)."""

    def __init__(self, store: ClosureStore) -> None:
        self.store = store

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        st = self.store.stats
        fam = CounterMetricFamily(
            "gitspout_closure_store",
            "Closures, layouts and walks on the local disk by result: loaded (instead of "
            "computed), missed (a closure computed; walks not found are not counted), "
            "based (computed on an earlier ref state's; "
            "also counted as missed), written, stale (pack replaced, or another gitspout "
            "version), corrupt, evicted, "
            "dropped.",
            labels=["result"])
        for result in RESULTS:
            fam.add_metric([result], st.results.get(result, 0))
        yield fam
        yield GaugeMetricFamily("gitspout_closure_store_bytes",
                                "Bytes of closure files on the local disk (as this process "
                                "last counted them).", value=st.bytes)


class _OpenFilesCollector:
    """``gitspout_open_files*``: pack and commit-graph descriptors and maps held open
    across requests (store/registry.py), against ``--max-open-packs``, and why files were
    closed, from the pack registry."""

    def __init__(self, source: PackRegistry | None) -> None:
        self.source = source

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        reg = self.source
        if reg is None:
            return
        for name, doc, value in (
            ("gitspout_open_files", "Descriptors and maps of pack, idx and commit-graph "
             "files held open now.", reg.handles),
            ("gitspout_open_files_limit", "The --max-open-packs budget.", reg.max_open),
            ("gitspout_open_files_leased", "Packs and commit-graphs held open, leased by "
             "requests or idle.", reg.open_files),
        ):
            gauge = GaugeMetricFamily(name, doc)
            gauge.add_metric([], value)
            yield gauge
        closed = CounterMetricFamily(
            "gitspout_open_files_closed", "Packs and commit-graphs closed: evicted (least "
            "recently used, to stay within --max-open-packs) or released (gone from disk, "
            "once no request held them).", labels=["reason"])
        closed.add_metric(["evicted"], reg.evicted)
        closed.add_metric(["released"], reg.released)
        yield closed
        opened = CounterMetricFamily("gitspout_open_files_opened",
                                     "Packs and commit-graphs opened (again, after eviction).")
        opened.add_metric([], reg.opened)
        yield opened


class Metrics:
    """The registry and every metric of one server process."""

    def __init__(self, repos_allowlist: Iterable[str] = (), pool: WorkPool | None = None,
                 memory: MemoryBudget | None = None, registry: PackRegistry | None = None) -> None:
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        r.register(_ProcIoCollector())
        r.register(_PoolCollector(pool))
        self.connections = ConnectionStats()
        r.register(_ConnectionCollector(self.connections))
        # by plain name: ``x`` and ``x.git`` name one repository (namespaces.plain_name)
        self.repos = frozenset(plain_name(r) for r in repos_allowlist)
        labels = ["service", "protocol", "command"]
        self.requests = Counter("gitspout_requests", "HTTP requests served.",
                                labels + ["status"], registry=r)
        self.duration = Histogram("gitspout_request_duration_seconds",
                                  "Time from request start to the last byte.",
                                  ["service", "command"], buckets=DURATION_BUCKETS, registry=r)
        self.phase = Histogram("gitspout_phase_duration_seconds",
                               "Time spent in each request phase.", ["phase"],
                               buckets=DURATION_BUCKETS, registry=r)
        self.in_flight = Gauge("gitspout_requests_in_flight", "Requests being served.",
                               registry=r)
        self.response_bytes = Counter("gitspout_response_bytes",
                                      "Response body bytes written.", labels, registry=r)
        self.writes = Histogram("gitspout_response_write_calls",
                                "Transport writes per response.", ["command"],
                                buckets=WRITE_BUCKETS, registry=r)
        self._series: dict[tuple[str, str, str, int], tuple[Any, Any, Any, Any]] = {}
        self._phases: dict[str, Any] = {}  # phase names: a fixed set, in the code
        self.fs_ops = Counter("gitspout_fs_operations",
                              "Filesystem operations by the ref and object layers.", ["kind"],
                              registry=r)
        self.rescans = Counter("gitspout_pack_dir_rescans",
                               "Rescans of objects/pack after a true miss.", registry=r)
        self.pack_objects = Counter("gitspout_pack_objects",
                                    "Objects sent in packs, by how they were produced.",
                                    ["source"], registry=r)
        self.pack_bytes = Counter("gitspout_pack_bytes",
                                  "Pack entry bytes sent, by how they were produced.",
                                  ["source"], registry=r)
        self.rounds = Counter("gitspout_negotiation_rounds",
                              "Fetch requests answered with acknowledgments only.", ["protocol"],
                              registry=r)
        for version in ("0", "1", "2"):
            self.rounds.labels(version)
        for source in ("verbatim", "reused", "generated"):
            self.pack_bytes.labels(source)
        self.pack_objects.labels("cache")  # app/packcache.py readers: from the first scrape
        self.pack_bytes.labels("cache")
        self.haves = Histogram("gitspout_negotiation_haves", "Haves per fetch request.",
                               buckets=HAVES_BUCKETS, registry=r)
        r.register(_CacheCollector(memory))
        r.register(_OpenFilesCollector(registry))
        r.register(_FaultCollector(registry))
        self.repo_requests = Counter("gitspout_repo_requests",
                                     "Requests per allow-listed repository.", ["repo", "command"],
                                     registry=r)

    def scrape(self) -> bytes:
        return generate_latest(self.registry)

    def _children(self, rec: RequestRecord) -> tuple[Any, Any, Any, Any]:
        """The labelled series one request counts in, found once per label values (a
        ``labels()`` lookup takes a lock and validates its values: four per request)."""
        key = (rec.service, rec.protocol, rec.command, rec.status)
        found = self._series.get(key)
        if found is None:
            if len(self._series) >= SERIES_KEPT:
                self._series.clear()
            found = self._series[key] = (
                self.requests.labels(rec.service, rec.protocol, rec.command, str(rec.status)),
                self.duration.labels(rec.service, rec.command),
                self.response_bytes.labels(rec.service, rec.protocol, rec.command),
                self.writes.labels(rec.command))
        return found

    def observe(self, rec: RequestRecord) -> None:
        """Account one finished request."""
        duration = time.monotonic() - rec.started
        requests, durations, response_bytes, writes = self._children(rec)
        requests.inc()
        durations.observe(duration)
        response_bytes.inc(rec.bytes)
        if rec.writes:
            writes.observe(rec.writes)
        for phase, seconds in rec.phases.items():
            child = self._phases.get(phase)
            if child is None:
                child = self._phases[phase] = self.phase.labels(phase)
            child.observe(seconds)
        for kind, n in rec.fs.items():
            if kind == "rescan":
                self.rescans.inc(n)
            else:
                self.fs_ops.labels(kind).inc(n)
        if rec.command == "fetch":
            self.haves.observe(rec.haves)
            if rec.negotiation_round:
                self.rounds.labels(rec.protocol).inc()
        st = rec.pack_stats
        if st is not None and st.kind.startswith("cache-"):  # app/packcache.py: a reader
            self.pack_objects.labels("cache").inc(st.objects)
            self.pack_bytes.labels("cache").inc(st.size)
        elif st is not None:
            whole = st.verbatim
            self.pack_objects.labels("verbatim").inc(whole)
            self.pack_objects.labels("reused").inc(max(0, st.reused - whole))
            self.pack_objects.labels("generated").inc(st.generated)
            if whole:
                self.pack_bytes.labels("verbatim").inc(st.size)
            else:
                self.pack_bytes.labels("reused").inc(st.reused_bytes)
                self.pack_bytes.labels("generated").inc(st.generated_bytes)
        if rec.repo and plain_name(rec.repo) in self.repos:
            self.repo_requests.labels(rec.repo, rec.command).inc()
        _log_request(rec, duration)


def _log_request(rec: RequestRecord, duration: float) -> None:
    """The access line (server/app/logtext.py writes it as text or JSON)."""
    if not access_log.isEnabledFor(logging.INFO):
        return
    fields = {
        "request_id": rec.id,
        "client": rec.client,
        "user": rec.user,
        "method": rec.method,
        "path": rec.path,
        "status": rec.status,
        "bytes": rec.bytes,
        "duration_ms": round(duration * 1000, 3),
        "repo": rec.repo,
        "service": rec.service,
        "protocol": rec.protocol,
        "command": rec.command,
        "pack_source": rec.pack_source,
        "pack_cache": rec.pack_cache,
        "objects": rec.objects,
        "haves": rec.haves,
        "writes": rec.writes,
        "phases_ms": {k: round(v * 1000, 3) for k, v in rec.phases.items()},
        "fs_ops": rec.fs,
        "agent": rec.agent[:100],
    }
    access_log.info("", extra={FIELDS: fields})
