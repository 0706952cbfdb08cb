"""Bundles of gitspout's own (``--bundles``; Documentation/technical/bundle-uri, gitformat-
bundle): a repository cloned ``--bundle-after`` times within ``--bundle-window`` gets a
bundle of its visible branches and tags, written once in the pool, kept in its own
directory under ``--bundle-size``, served at a stable URL with ``Range`` and ``sendfile``
(filesend.py), and advertised to v2 clients through the
``bundle-uri`` command with ``bundle.mode=all`` and a ``creationToken``, so a client with
``transfer.bundleURI`` downloads it and fetches only what is newer.

A bundle is offered, and served, only to a request whose visible refs reach every tip in
it (``core/bundlerefs.py``): never under a namespace, never once a ref it holds is hidden
(whatever its tip). Once refs have moved by ``--bundle-refresh-refs``, or by a quarter of
the refs it holds if that is fewer, it is stale: no longer offered; so it is too once it is
``--bundle-refresh-age`` old and any ref moved (a repository of many tags where only
``main`` moves would otherwise keep its first bundle for good). A bundle that is stale,
or that a full clone's view may not be offered (a ref it holds hidden, deleted or
force-pushed away, the repository made anew at its path), is replaced as a missing one
would be: the next ``--bundle-after`` full clones write its successor (the next creation
token), from the visible refs then. A client offered a bundle just before it was replaced
may still download it for ``GRACE`` seconds (it would otherwise fetch everything): a
stale or replaced bundle is served, though no longer offered, to a request that may have
it, by the same rule (its refs visible, its tips reached). Whether a bundle is stale
and may be offered is decided once per ref state and kept (``_verdict``), under a digest of
the state (core/refdigest.py) and a weak reference to the bundle: a verdict kept for a
repository never keeps its refs (100k refs: megabytes) or an old bundle's alive.

With ``--workers`` every worker counts, writes, offers and serves the same bundles: the
files, the clone counts and the writer's lock live in one directory of the master's
(bundleshare.py), so a bundle any worker wrote is offered and served by all.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from ..core.bundlerefs import bundle_order, bundle_refs, may_offer, refs_moved, stale_after
from ..core.context import RequestContext
from ..core.fetch import FetchPlan
from ..core.refdigest import ref_state_digest
from ..packgen import PackStream
from ..packgen.verify import PackCheck
from .bundleshare import Bundle, BundleFiles
from .cachedir import make_directory, reclaim_orphans, unlink_quietly
from .config import Config
from .filesend import send_file

__all__ = ["BundleStore", "BUNDLE_ROUTE", "OffloadMetrics", "full_clone"]

log = logging.getLogger("gitspout")

BUNDLE_ROUTE = "/gitspout-bundle/"  # <repo>/gitspout-bundle/<file>: served here
REPOS_SWEEP = 4096  # repositories with a verdict kept before all are forgotten
# How long a replaced bundle is still served (not offered): the time between a client's
# bundle-uri command and its download (a download that started keeps its open file).
GRACE = 600.0
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
        self.blob_packs_written = Counter("gitspout_blob_packs_written",
                                          "One-blob packs gitspout wrote for packfile URIs.",
                                          registry=registry)
        self.blob_pack_bytes_written = Counter("gitspout_blob_pack_written_bytes",
                                               "Bytes of the one-blob packs gitspout wrote.",
                                               registry=registry)
        self.blob_pack_requests = Counter("gitspout_blob_pack_requests",
                                          "One-blob pack downloads from gitspout, by result.",
                                          ["result"], registry=registry)
        self.packfile_uri_bytes = Counter("gitspout_packfile_uri_served_bytes",
                                          "Bytes of one-blob packs served (ranges counted "
                                          "as sent).", registry=registry)


class BundleStore:
    """The bundles of every repository, in a directory of this process's own or one that
    every worker of a master shares (bundleshare.py), and when to write them."""

    def __init__(self, cfg: Config, metrics: OffloadMetrics, shared: str = "") -> None:
        self.cfg = cfg
        self.metrics = metrics
        self._dir_lock = -1
        if shared:  # the master's, made, locked and removed by it (workers.py)
            self.dir = shared
        else:
            # A locked directory of this process's own, as the pack cache's (cachedir.py):
            # a server started after a crash removes what a dead one left.
            base = os.path.join(cfg.bundle_dir or tempfile.gettempdir(), "gitspout-bundles")
            os.makedirs(base, exist_ok=True)
            reclaim_orphans(base)
            self.dir, self._dir_lock = make_directory(base)
        self.files = BundleFiles(self.dir)
        # What a ref state makes of each repository's bundle: one verdict per repository
        # (its latest ref state), so a bundle-uri command costs a stat and a lookup. Keyed
        # by a digest of the state, not the state (whose segments hold every ref), and
        # the bundle weakly: an entry is ~200 bytes, however many refs the repository has.
        self._verdicts: dict[str, tuple[bytes, weakref.ref[Bundle], bool, bool, float]] = {}
        self._lock = threading.Lock()

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
        tag = self.files.tag(ctx.repo.gitdir)
        bundle = self.files.current(tag)
        if bundle is None or ctx.namespace:
            return None
        stale, allowed = self._verdict(tag, ctx, bundle)
        return bundle if allowed and not stale else None

    def _verdict(self, tag: str, ctx: RequestContext, bundle: Bundle) -> tuple[bool, bool]:
        """(stale, this request may have it) of ``bundle`` for this request's ref state,
        computed once per ref state (and bundle): the visible refs of 100k refs take
        0.1 s. A fresh verdict of moved refs is kept until the bundle's age makes it
        stale."""
        key = ref_state_digest(ctx)  # changes with any ref, HEAD or hideRefs
        now = time.time()
        with self._lock:
            hit = self._verdicts.get(bundle.path)
        if hit is not None and hit[0] == key and hit[1]() is bundle and now < hit[4]:
            return hit[2], hit[3]
        moved = refs_moved(bundle.refs, bundle_refs(ctx))
        age = self.cfg.bundle_refresh_age
        stale_at = bundle.written + age if moved and age else math.inf
        stale = moved >= stale_after(self.cfg.bundle_refresh_refs, len(bundle.refs)) \
            or now >= stale_at
        allowed = may_offer(ctx, bundle.refs)
        with self._lock:
            if len(self._verdicts) >= REPOS_SWEEP:
                self._verdicts.clear()
            self._verdicts[bundle.path] = (key, weakref.ref(bundle), stale, allowed,
                                           math.inf if stale else stale_at)
        return stale, allowed

    def file_for(self, ctx: RequestContext, name: str) -> Bundle | None:
        """The bundle called ``name`` of this repository, if this request may have it: the
        current one, stale or not, or the one it replaced, for ``GRACE`` seconds."""
        if ctx.namespace:
            return None
        tag = self.files.tag(ctx.repo.gitdir)
        bundle = self.files.current(tag)
        if bundle is None or bundle.name != name:
            previous = self.files.previous(tag)
            if previous is None or previous[0].name != name or time.time() >= previous[1]:
                return None
            bundle = previous[0]
        return bundle if self._verdict(tag, ctx, bundle)[1] else None

    # -- writing (pool) --------------------------------------------------------

    def note_clone(self, ctx: RequestContext) -> Bundle | None:
        """A full clone of ``ctx``'s repository was sent (any worker's): count it, and
        write the repository's bundle once due (blocking; ``ctx`` a view of no request).
        The bundle written, if this call wrote one."""
        tag = self.files.tag(ctx.repo.gitdir)
        bundle = self.files.current(tag)
        if bundle is not None and self._offerable(tag, ctx, bundle):
            return None  # a fresh one that may be offered: nothing to count
        # None, stale, or one that can no longer be offered (a ref it holds hidden, or a
        # tip no visible ref reaches): replaced as a missing one would be. ``ctx`` is a
        # full clone's view (never a namespace's), so its successor may be offered to it.
        if self.files.count_clone(tag, self.cfg.bundle_after,
                                  self.cfg.bundle_window) < self.cfg.bundle_after:
            return None
        return self.write(ctx)

    def write(self, ctx: RequestContext) -> Bundle | None:
        """Write the repository's bundle (blocking, in the pool); None when another
        process writes it, or it cannot be (sha256, no refs, over --bundle-size)."""
        tag = self.files.tag(ctx.repo.gitdir)
        lock = self.files.lock(tag)
        if lock is None:
            return None  # another worker (or thread) writes it
        try:
            old = self.files.current(tag)
            if old is not None and self._offerable(tag, ctx, old):
                return None  # written by another while this one waited
            bundle = self._write(ctx, tag, old.token + 1 if old is not None else 1)
            if bundle is None:
                return None
            # The one replaced is served a while to who was offered it, if it may be.
            older = self.files.previous(tag)
            kept = old if old is not None and self._verdict(tag, ctx, old)[1] else None
            self.files.publish(tag, bundle, kept, time.time() + GRACE)
            self.files.reset_clones(tag)
        finally:
            self.files.unlock(lock)
        if older is not None:
            unlink_quietly(older[0].path)
        if old is not None and kept is None:
            unlink_quietly(old.path)
        self._evict(keep=tag)
        self.metrics.bundles_written.inc()
        self.metrics.bundle_bytes_written.inc(bundle.size)
        log.info("bundle written for %s: %s (%d bytes, %d refs)", ctx.repo.url_path,
                 bundle.name, bundle.size, len(bundle.refs))
        return bundle

    def _write(self, ctx: RequestContext, tag: str, token: int) -> Bundle | None:
        refs = bundle_refs(ctx)
        if ctx.object_format != "sha1" or not refs:
            return None
        path = os.path.join(self.dir, f"{tag}-{token}.bundle")
        tmp = path + ".tmp"
        size = 0
        check = PackCheck()
        try:
            with open(tmp, "wb") as f:
                head = HEADER + b"".join(oid + b" " + name + b"\n" for name, oid in refs)
                f.write(head + b"\n")
                size = len(head) + 1
                for item in PackStream(bundle_order(refs), ctx.objects()):
                    if isinstance(item, bytes):
                        f.write(item)
                        check.feed(item)
                        size += len(item)
                        if size > self.cfg.bundle_size:
                            raise _TooLarge
            fault = check.fault()
            if fault is not None:
                # Data copied as stored from a damaged pack: a fetch fails in its client
                # and the next one is whole once the repository is repaired, but a bundle
                # would be offered until its refs moved (packgen/verify.py).
                unlink_quietly(tmp)
                log.error("bundle of %s not kept: its pack is damaged (%s)",
                          ctx.repo.url_path, fault)
                return None
            os.rename(tmp, path)
        except _TooLarge:
            unlink_quietly(tmp)
            log.warning("bundle of %s over --bundle-size: not kept", ctx.repo.url_path)
            return None
        except BaseException:
            unlink_quietly(tmp)
            raise
        return Bundle(token, path, tuple(refs), size)

    def _offerable(self, tag: str, ctx: RequestContext, bundle: Bundle) -> bool:
        stale, allowed = self._verdict(tag, ctx, bundle)
        return allowed and not stale

    def _evict(self, keep: str) -> None:
        """Replaced bundles whose time is over go; then, until all fit in --bundle-size,
        the other replaced ones, then the oldest current bundles of other repositories
        (every worker's: the directory is one)."""
        now = time.time()
        held = []
        for tag, bundle, until in self.files.held():
            if until is not None and (until <= now or not os.path.exists(bundle.path)):
                unlink_quietly(bundle.path)  # over, or evicted before: counts no more
            else:
                held.append((until is None, bundle.written, tag, bundle))
        total = sum(h[3].size for h in held)
        for current, _, tag, bundle in sorted(held, key=lambda h: h[:2]):
            if total <= self.cfg.bundle_size:
                break
            if not current:
                total -= bundle.size
                unlink_quietly(bundle.path)
            elif tag != keep:
                total -= bundle.size
                self.files.drop(tag, bundle)

    def close(self) -> None:
        """Remove every file of a directory of this process's own (a shared one is the
        master's to remove)."""
        if self._dir_lock >= 0:
            self.files.close()
            os.close(self._dir_lock)


class _TooLarge(Exception):
    pass


def full_clone(plan: FetchPlan | None) -> bool:
    """A pack of every visible ref asked for from nothing: what counts towards a bundle."""
    if plan is None:
        return False
    order = plan.order
    return order is not None and not order.common and not order.shallow \
        and order.filter is None and not order.exclude


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
        resp = await send_file(request, bundle.path)
    except FileNotFoundError:
        store.metrics.bundle_requests.labels("missing").inc()
        return web.Response(status=404, text="no such bundle\n")
    store.metrics.bundle_requests.labels("served").inc()
    if resp.content_length and request.method != "HEAD":
        store.metrics.bundle_bytes.inc(resp.content_length)
    return resp
