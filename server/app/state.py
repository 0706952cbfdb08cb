"""The process: what every request of one server shares (config, budgets, repository
resolver, pack registry and caches, thread pool, metrics, admission, auth, the pack cache)
and its life from start to cleanup."""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from ..core.context import RequestContext
from ..graph.closures import ClosureCaches
from ..packgen import PackCaches
from ..store.closurestore import ClosureStore
from ..store.confine import LinkGuard
from ..store.fscache import DirCache
from ..store.registry import PackRegistry
from ..store.repos import Repo, RepoNotFound, RepoResolver
from .admission import Admission
from .auth import Access, load_access
from .authgate import GateCollector, PasswordGate
from .blobpacks import BlobPackStore
from .budgets import Budgets
from .bundles import BundleStore, OffloadMetrics
from .config import Config, proxy_networks
from .forwarded import Forwarding
from .health import Health, RootCheck
from .memory import HeapTrimCollector, HeapTrimmer
from .metrics import ClosureStoreCollector, Metrics, RequestRecord
from .namespaces import NamespaceMap
from .packcache import PackCache, PackCacheCollector
from .pool import WorkPool
from .samefetch import SameFetches
from .scope import RequestScope
from .workerstats import WorkerStats

log = logging.getLogger("gitspout")

__all__ = ["ServerState"]

T = TypeVar("T")


@dataclass
class ServerState:
    """Process-wide state: config, budgets, repository resolver, pack registry, pool."""

    cfg: Config
    budgets: Budgets
    resolver: RepoResolver
    registry: PackRegistry
    caches: PackCaches
    pool: WorkPool
    dirs: DirCache
    metrics: Metrics
    # Inflating gzip bodies is CPU-bound C code that lets the GIL go: run unbounded, four
    # 64 MiB bombs take every core and the event loop waits for a CPU (p99 of a tiny
    # ls-refs 87 ms on 2 cores). At most half the cores inflate at once; others wait,
    # without holding a pool thread.
    inflating: asyncio.Semaphore = field(
        default_factory=lambda: asyncio.Semaphore(max(1, (os.cpu_count() or 2) // 2)))
    sweeper: asyncio.Task[None] | None = None  # sweep_forever, from startup to shutdown
    access: Access | None = None  # --auth-file (auth.py); None: anonymous read
    gate: PasswordGate | None = None  # where password checks run (authgate.py)
    pack_cache: PackCache | None = None  # --pack-cache-size 0: none
    health: Health | None = None  # /healthz, /readyz; draining after SIGTERM (health.py)
    in_flight: int = 0  # git requests being served (the gauge, readable)
    admission: Admission | None = None  # slots for pack generation (admission.py)
    namespaces: NamespaceMap = field(default_factory=NamespaceMap)  # --namespaces
    forwarding: Forwarding = field(default_factory=lambda: Forwarding(()))  # --trusted-proxies
    trimmer: HeapTrimmer = field(default_factory=HeapTrimmer)  # memory.py
    offload: OffloadMetrics | None = None  # bundles and packfile URIs (bundles.py)
    bundles: BundleStore | None = None  # --bundles
    blob_packs: BlobPackStore | None = None  # --blob-uri-threshold
    worker_stats: WorkerStats | None = None  # --workers: /metrics over every worker

    @classmethod
    def create(cls, cfg: Config, shared_cache: str = "", shared_bundles: str = "",
               shared_blobs: str = "", workers: int = 1) -> ServerState:
        """Everything built once from the config; each budget handed to its enforcer.
        ``shared_cache``, ``shared_bundles``, ``shared_blobs``: the pack-cache, bundle and
        blob-pack directories a master shares among its workers, ``workers`` of them."""
        budgets = Budgets.from_config(cfg, workers)
        if shared_cache:
            budgets = replace(budgets, pack_cache=replace(budgets.pack_cache,
                                                          shared=shared_cache))
        memory = budgets.memory
        pool = WorkPool(budgets.threads, per_key=budgets.threads_per_repo)
        repos = [r.strip().strip("/") for r in cfg.metrics_repos.split(",") if r.strip()]
        root, allow = str(cfg.root_path()), cfg.allow_symlinks_outside_root
        registry = PackRegistry(max_open=budgets.open_files, memory=memory)
        disk = None
        if budgets.closure_store > 0:
            disk = ClosureStore(budgets.pack_cache.directory or tempfile.gettempdir(),
                                budgets.closure_store, shared=workers > 1)
        state = cls(
            cfg, budgets,
            RepoResolver(root, allow, memory),
            registry,
            PackCaches.create(registry, ClosureCaches.create(registry, disk)),
            pool,
            DirCache(enabled=cfg.cross_request_cache, guard=LinkGuard(root, allow, memory),
                     memory=memory),
            Metrics(repos, pool, memory, registry),
        )
        if disk is not None:
            state.metrics.registry.register(ClosureStoreCollector(disk))
        state.namespaces = NamespaceMap.parse(cfg.namespaces)
        state.forwarding = Forwarding(proxy_networks(cfg.trusted_proxies))
        if cfg.auth_file:
            state.access = load_access(cfg.auth_file, memory)
            state.gate = PasswordGate(state.access, budgets.auth_threads)
            state.metrics.registry.register(GateCollector(state.gate))
        if budgets.pack_cache.size > 0:
            state.pack_cache = PackCache(budgets.pack_cache, registry.faults)
            if cfg.cross_request_cache:  # its staleness checks are those caches' own
                state.pack_cache.same = SameFetches(memory)
            state.metrics.registry.register(PackCacheCollector(state.pack_cache))
        state.admission = Admission(budgets.admission, state.metrics.registry)
        state.metrics.registry.register(HeapTrimCollector(state.trimmer))
        state.offload = OffloadMetrics(state.metrics.registry)
        if cfg.bundles:
            state.bundles = BundleStore(cfg, state.offload, shared_bundles)
        if cfg.blob_uri_threshold > 0:
            state.blob_packs = BlobPackStore(cfg, state.offload, shared_blobs)
        state.health = Health(RootCheck(root, cfg.ready_check_interval, cfg.ready_check_timeout))
        return state

    def scope(self, record: RequestRecord) -> RequestScope:
        """A new request's scope (its view comes once the repository is resolved)."""
        return RequestScope(self.pool, record)

    def view(self, scope: RequestScope, repo: Repo, namespace: bytes = b"",
             base_url: str = "") -> RequestContext:
        """The request's view of ``repo`` (under ``namespace``), attached to its scope;
        ``base_url`` (scheme and host the client used) for the bundles it may be offered."""
        ctx = self.detached_view(repo, namespace)
        if (self.bundles is not None or self.blob_packs is not None) and not namespace \
                and base_url:
            # The repository's path as a URL path: percent-encoded (a space, '#', '?' or
            # '%' in a name made URLs that failed, or named another repository).
            url_path = urllib.parse.quote(repo.url_path, safe="/")
            if self.bundles is not None:
                ctx.bundle_offer = self.bundles.offer(base_url, url_path)
            if self.blob_packs is not None:
                ctx.blob_uris = self.blob_packs.policy(base_url, url_path)
        return scope.attach(ctx)

    def detached_view(self, repo: Repo, namespace: bytes = b"") -> RequestContext:
        """A view of ``repo`` of no request (the caller closes it)."""
        return RequestContext(
            repo, self.registry, self.cfg.agent.encode(), self.dirs,
            cold_walk_entries=self.cfg.cold_walk_pack_entries, namespace=namespace,
            caches=self.caches, inflate=self.budgets.inflate)

    async def resolve(self, repo_path: str) -> Repo:
        """The repository: from the resolver's memory, or found on disk in the pool (the
        first time it is asked for: realpath and stats must not block the event loop),
        queued under its own path: behind no other repository's work, no sweep, no
        password check."""
        repo = self.resolver.cached(repo_path)
        if repo is not None:
            return repo
        return await asyncio.wrap_future(
            self.pool.submit_for(("resolve", repo_path), self.resolver.resolve, repo_path))

    async def resolve_for(self, repo_path: str, namespace: bytes) -> Repo:
        """:meth:`resolve`, then RepoNotFound for a repository that --namespaces serves only
        as a namespace (mapped at its own path: namespaces.py) asked for without one. The
        same git directory, whatever path or link led to it: each confining entry is
        resolved as a URL would be (cached after the first time), each confining
        directory's real path found in the pool."""
        repo = await self.resolve(repo_path)
        ns = self.namespaces
        if namespace or not (ns.confined or ns.confined_dirs):
            return repo
        for path in ns.confined:
            try:
                other = await self.resolve(path)
            except RepoNotFound:
                continue
            if other.gitdir == repo.gitdir:
                raise self._confined(repo)
        for path in ns.confined_dirs:
            real = await asyncio.wrap_future(self.pool.submit_for(
                ("resolve", path), os.path.realpath, os.path.join(self.resolver.root, path)))
            if repo.gitdir.startswith(real.rstrip(os.sep) + os.sep):
                raise self._confined(repo)
        return repo

    @staticmethod
    def _confined(repo: Repo) -> RepoNotFound:
        log.info("refusing /%s without a namespace: --namespaces serves it only as one",
                 repo.url_path)
        return RepoNotFound(repo.url_path)

    async def run_bounded(self, scope: RequestScope, fn: Callable[..., T], *args: Any) -> T:
        """``scope.run`` under the ``inflating`` semaphore (request body decoding)."""
        async with self.inflating:
            return await scope.run(fn, *args)

    def forget_repository(self, repo_path: str) -> None:
        """The repository is gone from disk: forget it, with everything cached for it (its
        packs and commit-graph are closed once no request holds them)."""
        repo = self.resolver.forget(repo_path)
        if repo is not None:
            self.registry.forget_repository(repo.objects_dir)
            self.dirs.forget_under(repo.gitdir)

    # -- life --------------------------------------------------------------------

    async def start(self) -> None:
        """At startup: the sweeper of packs gone from disk."""
        if self.cfg.sweep_interval > 0:
            self.sweeper = asyncio.get_running_loop().create_task(self.sweep_forever())

    async def stop(self) -> None:
        """At shutdown, before the handlers are waited for."""
        if self.sweeper is not None:
            self.sweeper.cancel()

    async def close(self) -> None:
        """At cleanup, once aiohttp has let the handlers finish (or cut them at
        --drain-timeout): the pool, the password checks and the pack cache go last."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.gate is not None:
            self.gate.close()
        if self.pack_cache is not None:
            self.pack_cache.close()
        disk = self.caches.closures.disk
        if disk is not None:  # closures walked for the last requests: for the next process
            await asyncio.to_thread(disk.flush, 5.0)
        if self.bundles is not None:
            self.bundles.close()
        if self.blob_packs is not None:
            self.blob_packs.close()

    async def sweep_forever(self) -> None:
        """Every ``--sweep-interval`` seconds, close open packs and graphs whose files are
        gone, though nobody asked for their repository since (registry.sweep)."""
        interval = self.cfg.sweep_interval
        while interval > 0:
            await asyncio.sleep(interval)
            try:
                await asyncio.get_running_loop().run_in_executor(self.pool, self.registry.sweep)
            except RuntimeError:  # the pool is shutting down
                return

    def request_ended(self) -> None:
        """A git request ended; once none is in flight for a while, the heaps' free pages
        go back to the system (memory.py)."""
        if not self.in_flight:
            self.trimmer.schedule(self._trim_heap)

    def _trim_heap(self) -> None:
        if self.in_flight:
            return
        try:
            self.pool.submit(self.trimmer.trim)
        except RuntimeError:  # the pool is shut down
            pass
