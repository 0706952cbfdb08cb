"""Bundles of gitspout's own (``--bundles``; Documentation/technical/bundle-uri, gitformat-
bundle): a repository cloned ``--bundle-after`` times within ``--bundle-window`` gets a
bundle of its visible branches and tags, written once in the pool, kept in its own
directory under ``--bundle-size``, served at a stable URL with ``Range`` and ``sendfile``
(filesend.py), and advertised to v2 clients through the
``bundle-uri`` command with ``bundle.mode=all`` and a ``creationToken``, so a client with
``transfer.bundleURI`` downloads it and fetches only what is newer.

A bundle is offered, and served, only to a request whose visible refs reach every tip in
it (``core/bundlerefs.py``): never under a namespace, never once a ref it holds is hidden.
Once refs have moved by ``--bundle-refresh-refs`` it is stale: no longer offered, and the
next full clone writes its successor (the next creation token).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from ..core.bundlerefs import bundle_order, bundle_refs, may_offer, refs_moved
from ..core.context import RequestContext
from ..core.fetch import FetchPlan
from ..packgen import PackStream
from ..store.repos import Repo
from .cachedir import make_directory, reclaim_orphans
from .config import Config
from .filesend import send_file

__all__ = ["BundleStore", "BUNDLE_ROUTE", "OffloadMetrics"]

log = logging.getLogger("gitspout")

BUNDLE_ROUTE = "/gitspout-bundle/"  # <repo>/gitspout-bundle/<file>: served here
REPOS_SWEEP = 4096  # repositories tracked before the idle ones are forgotten
HEADER = b"# v2 git bundle\n"  # gitformat-bundle: v2 for sha1 (v3 adds capabilities)


class OffloadMetrics:
    """Counters of what left the upload-pack path (README "Metrics")."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.bundles_written = Counter("gitspout_bundles_written",
                                       "Bundles gitspout wrote.", registry=registry)
        self.bundle_bytes_written = Counter("gitspout_bundle_written_bytes",
                                            "Bytes of the bundles gitspout wrote.",
                                            registry=registry)
        self.bundles_advertised = Counter("gitspout_bundles_advertised",
                                          "bundle-uri answers that listed a bundle.",
                                          registry=registry)
        self.bundle_requests = Counter("gitspout_bundle_requests",
                                       "Bundle downloads from gitspout, by result.",
                                       ["result"], registry=registry)
        self.bundle_bytes = Counter("gitspout_bundle_served_bytes",
                                    "Bytes of bundles served (ranges counted as sent).",
                                    registry=registry)
        self.packfile_uris = Counter("gitspout_packfile_uris",
                                     "Objects sent as packfile URIs instead of in the pack.",
                                     registry=registry)


@dataclass
class Bundle:
    """One written bundle: its file, creation token and the refs it holds."""

    token: int
    path: str
    refs: list[tuple[bytes, bytes]]
    size: int
    written: float = field(default_factory=time.monotonic)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


@dataclass
class _RepoBundles:
    clones: deque[float] = field(default_factory=deque)
    bundle: Bundle | None = None
    writing: bool = False
    stale: bool = False


class BundleStore:
    """The bundles of every repository of this process, and when to write them."""

    def __init__(self, cfg: Config, metrics: OffloadMetrics) -> None:
        self.cfg = cfg
        self.metrics = metrics
        # A locked directory of this process's own, as the pack cache's (cachedir.py): a
        # server started after a crash removes what a dead one left.
        base = os.path.join(cfg.bundle_dir or tempfile.gettempdir(), "gitspout-bundles")
        os.makedirs(base, exist_ok=True)
        reclaim_orphans(base)
        self.dir, self._dir_lock = make_directory(base)
        self._repos: dict[str, _RepoBundles] = {}
        self._sweep_at = REPOS_SWEEP  # _forget_idle
        self._lock = threading.Lock()  # offers run in the pool, notes on the loop

    # -- offering (pool) -------------------------------------------------------

    def offer(self, base_url: str, repo_path: str
              ) -> Callable[[RequestContext], list[tuple[bytes, bytes]] | None]:
        """The request's bundle offer (RequestContext.bundle_offer): its bundle list."""
        def lines(ctx: RequestContext) -> list[tuple[bytes, bytes]] | None:
            bundle = self.usable(ctx)
            if bundle is None:
                return None
            url = (self.cfg.bundle_base_url.rstrip("/") + "/" + bundle.name
                   if self.cfg.bundle_base_url
                   else f"{base_url}/{repo_path.strip('/')}{BUNDLE_ROUTE}{bundle.name}")
            self.metrics.bundles_advertised.inc()
            key = b"bundle.gitspout-%d" % bundle.token
            # Keys as C git's config callbacks name them: the variable lowercased (the
            # client compares "creationtoken" case-sensitively: bundle-uri.c).
            return [(b"bundle.version", b"1"), (b"bundle.mode", b"all"),
                    (b"bundle.heuristic", b"creationToken"),
                    (key + b".uri", url.encode()),
                    (key + b".creationtoken", b"%d" % bundle.token)]
        return lines

    def usable(self, ctx: RequestContext) -> Bundle | None:
        """The repository's bundle, if it is fresh and this request may have it (blocking)."""
        with self._lock:
            entry = self._repos.get(ctx.repo.gitdir)
            bundle = entry.bundle if entry is not None else None
        if bundle is None or entry is None:
            return None
        if refs_moved(bundle.refs, bundle_refs(ctx)) >= self.cfg.bundle_refresh_refs:
            entry.stale = True
            return None
        return bundle if may_offer(ctx, bundle.refs) else None

    def file_for(self, ctx: RequestContext, name: str) -> Bundle | None:
        """The bundle called ``name`` of this repository, if this request may have it."""
        bundle = self.usable(ctx)
        return bundle if bundle is not None and bundle.name == name else None

    # -- writing ---------------------------------------------------------------

    def note_clone(self, repo: Repo, plan: FetchPlan | None) -> bool:
        """A pack was sent: True when it was a full clone that calls for a (new) bundle
        now (the caller then writes it)."""
        if plan is None or plan.order is None or not _full_clone(plan):
            return False
        now = time.monotonic()
        with self._lock:
            entry = self._repos.get(repo.gitdir)
            if entry is None:
                if len(self._repos) >= self._sweep_at:
                    self._forget_idle(now)
                # Only whether the last bundle_after clones fall in the window matters.
                entry = self._repos[repo.gitdir] = _RepoBundles(
                    deque(maxlen=self.cfg.bundle_after))
            entry.clones.append(now)
            while entry.clones and entry.clones[0] < now - self.cfg.bundle_window:
                entry.clones.popleft()
            due = len(entry.clones) >= self.cfg.bundle_after and not entry.writing \
                and (entry.bundle is None or entry.stale)
            if due:
                entry.writing = True
            return due

    def _forget_idle(self, now: float) -> None:
        """Drop the repositories that hold nothing: no bundle, none being written, no
        clone within the window (DESIGN.md invariant 6: nothing kept across requests
        grows without bound). Under ``_lock``; the next sweep waits for twice as many."""
        window = now - self.cfg.bundle_window
        for key in [k for k, e in self._repos.items() if e.bundle is None
                    and not e.writing and (not e.clones or e.clones[-1] < window)]:
            del self._repos[key]
        self._sweep_at = max(REPOS_SWEEP, 2 * len(self._repos))

    def write(self, ctx: RequestContext) -> Bundle | None:
        """Write the repository's bundle (blocking, in the pool); None when it cannot be
        (sha256, no refs, over --bundle-size)."""
        gitdir = ctx.repo.gitdir
        try:
            bundle = self._write(ctx)
        finally:
            with self._lock:
                entry = self._repos.setdefault(gitdir, _RepoBundles())
                entry.writing = False
        if bundle is None:
            return None
        with self._lock:
            entry = self._repos[gitdir]
            old, entry.bundle, entry.stale = entry.bundle, bundle, False
        if old is not None:
            _unlink(old.path)
        self._evict(keep=gitdir)
        self.metrics.bundles_written.inc()
        self.metrics.bundle_bytes_written.inc(bundle.size)
        log.info("bundle written for %s: %s (%d bytes, %d refs)", ctx.repo.url_path,
                 bundle.name, bundle.size, len(bundle.refs))
        return bundle

    def _write(self, ctx: RequestContext) -> Bundle | None:
        refs = bundle_refs(ctx)
        if ctx.object_format != "sha1" or not refs:
            return None
        with self._lock:
            entry = self._repos.get(ctx.repo.gitdir)
            token = entry.bundle.token + 1 if entry is not None and entry.bundle else 1
        tag = hashlib.sha256(ctx.repo.gitdir.encode()).hexdigest()[:16]
        path = os.path.join(self.dir, f"{tag}-{token}.bundle")
        tmp = path + ".tmp"
        size = 0
        try:
            with open(tmp, "wb") as f:
                head = HEADER + b"".join(oid + b" " + name + b"\n" for name, oid in refs)
                f.write(head + b"\n")
                size = len(head) + 1
                for item in PackStream(bundle_order(refs), ctx.objects()):
                    if isinstance(item, bytes):
                        f.write(item)
                        size += len(item)
                        if size > self.cfg.bundle_size:
                            raise _TooLarge
            os.rename(tmp, path)
        except _TooLarge:
            _unlink(tmp)
            log.warning("bundle of %s over --bundle-size: not kept", ctx.repo.url_path)
            return None
        except BaseException:
            _unlink(tmp)
            raise
        return Bundle(token, path, refs, size)

    def _evict(self, keep: str) -> None:
        """Oldest bundles of other repositories go until all fit in --bundle-size."""
        with self._lock:
            held = [(e.bundle.written, k, e) for k, e in self._repos.items() if e.bundle]
            total = sum(e.bundle.size for _, _, e in held if e.bundle)
            for _, key, entry in sorted(held, key=lambda h: h[0]):
                if total <= self.cfg.bundle_size or key == keep or entry.bundle is None:
                    continue
                total -= entry.bundle.size
                _unlink(entry.bundle.path)
                entry.bundle = None

    def close(self) -> None:
        """Remove every file (the directory is this process's own)."""
        for name in os.listdir(self.dir):
            _unlink(os.path.join(self.dir, name))
        try:
            os.rmdir(self.dir)
        except OSError:
            pass
        os.close(self._dir_lock)


class _TooLarge(Exception):
    pass


def _full_clone(plan: FetchPlan) -> bool:
    order = plan.order
    return order is not None and not order.common and not order.shallow \
        and order.filter is None and not order.exclude


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


async def serve_bundle(store: BundleStore, ctx: RequestContext, name: str,
                       request: web.Request,
                       run: Callable[..., Awaitable[Any]]) -> web.StreamResponse:
    """``GET <repo>/gitspout-bundle/<name>``: the file, with Range and sendfile; 404 when
    it is not this repository's current bundle or this request may not have it."""
    bundle = await run(store.file_for, ctx, name)
    try:
        if bundle is None:
            raise FileNotFoundError(name)
        # Replaced or evicted between the lookup and the open: gone, as if never there.
        resp = await send_file(request, bundle.path, store.cfg.send_timeout)
    except FileNotFoundError:
        store.metrics.bundle_requests.labels("missing").inc()
        return web.Response(status=404, text="no such bundle\n")
    store.metrics.bundle_requests.labels("served").inc()
    if resp.content_length and request.method != "HEAD":
        store.metrics.bundle_bytes.inc(resp.content_length)
    return resp
