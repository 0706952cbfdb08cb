"""The HTTP adapter: smart-HTTP routes, request decoding, statuses (gitprotocol-http).

Decodes the request (service, ``Git-Protocol``, content type, gzip with caps), resolves the
repository, and drives the core in ``upload.py`` from the server's thread pool. Decisions
are taken before ``prepare()`` sends the 200; after that, errors go in-band.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import HttpVersion11, web
from gitspout.protocol.advertise import format_service_header, v0_request_capabilities
from gitspout.protocol.command import parse_command_request
from gitspout.protocol.fetch_request import FetchRequest, Sideband, parse_v0_request, parse_v2_fetch_args
from gitspout.protocol.fetch_response import Mark, iter_v0_fetch_response, iter_v2_fetch_response
from gitspout.protocol.ls_refs import parse_ls_refs_args
from gitspout.protocol.object_info import parse_object_info_args
from gitspout.protocol.pktline import PktBuffer

from ..core import answers
from ..core.context import RequestContext
from ..core.fetch import FetchPlan, plan_fetch
from ..packgen.packplan import iter_pack
from ..store.bigobjects import INFLATE
from ..store.confine import LinkGuard
from ..store.fscache import DirCache
from ..store.lru import MEMORY
from ..store.odb import PackRegistry
from ..store.repos import Repo, RepoNotFound, RepoResolver
from .admission import Admission, AdmissionLimits, Overloaded
from .auth import Access, AuthDenied, load_access, repo_name
from .authgate import AuthBusy, GateCollector, PasswordGate
from .config import Config
from .connections import GuardedHandler
from .errors import INTERNAL_ERROR, answer_for
from .health import PROBE_PATHS, Health, RootCheck
from .httpreq import (
    NO_CACHE,
    RECEIVE_PACK,
    UPLOAD_PACK,
    BodyLimits,
    BodyTimeout,
    BodyTooLarge,
    HttpError,
    check_declared_length,
    protocol_version,
    read_body,
    split_path,
    text_response,
)
from .memory import HeapTrimmer
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import Metrics, RequestRecord
from .namespaces import NamespaceMap
from .packcache import PackCache, PackCacheCollector, send_pack_cached
from .pool import WorkPool
from .stream import PktSection, PktWriter, cap_output

__all__ = ["ServerState", "make_app", "metrics_response", "RUNNER_KWARGS", "HANDLER_KWARGS",
           "SERVER_KWARGS",
           "STATE_KEY"]

log = logging.getLogger("gitspout")
T = TypeVar("T")

READ_ONLY = "gitspout is a read-only server: git-receive-pack (push) is not available\n"
# aiohttp must hand us request bodies as sent, so that gzip is inflated under our caps.
RUNNER_KWARGS: dict[str, Any] = {"auto_decompress": False}
# What each connection's handler is built with (server/connections.py builds them).
HANDLER_KWARGS: dict[str, Any] = {**RUNNER_KWARGS, "access_log": None}
# A handler is cancelled when its client goes away (CancelledError at its next await: 499):
# a request queued for a pack slot, or planning in the pool, for nobody, would hold its
# place in the admission queue, and the queue's room, until a slot or --pack-queue-wait.
SERVER_KWARGS: dict[str, Any] = {**RUNNER_KWARGS, "handler_cancellation": True}


@dataclass
class ServerState:
    """Process-wide state: config, repository resolver, pack registry, thread pool."""

    cfg: Config
    resolver: RepoResolver
    registry: PackRegistry
    pool: WorkPool
    dirs: DirCache
    metrics: Metrics
    body_limits: BodyLimits
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
    trimmer: HeapTrimmer = field(default_factory=HeapTrimmer)  # memory.py

    @classmethod
    def create(cls, cfg: Config) -> ServerState:
        pool = WorkPool(cfg.threads, per_key=cfg.threads_per_repo)
        repos = [r.strip().strip("/") for r in cfg.metrics_repos.split(",") if r.strip()]
        root, allow = str(cfg.root_path()), cfg.allow_symlinks_outside_root
        state = cls(
            cfg,
            RepoResolver(root, allow),
            PackRegistry(max_open=cfg.max_open_packs),
            pool,
            DirCache(enabled=cfg.cross_request_cache, guard=LinkGuard(root, allow)),
            Metrics(repos, pool),
            BodyLimits(cfg.max_body, cfg.max_inflated_body, cfg.body_timeout, cfg.body_min_rate),
        )
        state.metrics.open_files.source = state.registry
        state.namespaces = NamespaceMap.parse(cfg.namespaces)
        if cfg.auth_file:
            state.access = load_access(cfg.auth_file)
            state.gate = PasswordGate(state.access, cfg.auth_threads)
            state.metrics.registry.register(GateCollector(state.gate))
        MEMORY.limit = cfg.cache_memory  # every cross-request cache, together
        INFLATE.limit = cfg.inflate_memory  # large objects held whole, together
        state.metrics.caches.budget = MEMORY
        if cfg.pack_cache_size > 0:
            state.pack_cache = PackCache(cfg.pack_cache_dir, cfg.pack_cache_size,
                                         cfg.pack_cache_ttl, cfg.pack_cache_on)
            state.metrics.registry.register(PackCacheCollector(state.pack_cache))
        state.admission = Admission(
            AdmissionLimits(cfg.max_packs, cfg.max_packs_per_repo, cfg.pack_queue,
                            cfg.pack_queue_wait, cfg.retry_after, cfg.body_memory),
            state.metrics.registry)
        state.health = Health(RootCheck(root, cfg.ready_check_interval, cfg.ready_check_timeout))
        return state

    async def run_bounded(self, fn: Callable[..., T], *args: Any) -> T:
        """:meth:`run` under the ``inflating`` semaphore (request body decoding)."""
        async with self.inflating:
            return await self.run(fn, *args)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Blocking work, in the pool; it holds the request's leases while it runs."""
        return await asyncio.wrap_future(_Held(_REQUEST.get()).submit(self.pool, fn, *args))

    def context(self, repo: Any, rec: RequestRecord, namespace: bytes = b"") -> RequestContext:
        rec.repo = repo.url_path
        ctx = RequestContext(repo, self.registry, self.cfg.agent.encode(), self.dirs,
                             cold_walk_entries=self.cfg.cold_walk_pack_entries,
                             namespace=namespace)
        rec.context = ctx
        _REQUEST.set(ctx)  # this request's task: its pool work holds ctx (see _Held)
        return ctx

    def forget_repository(self, repo_path: str) -> None:
        """The repository is gone from disk: forget it, with everything cached for it (its
        packs and commit-graph are closed once no request holds them)."""
        repo = self.resolver.forget(repo_path)
        if repo is not None:
            self.registry.forget_repository(repo.objects_dir)
            self.dirs.forget_under(repo.gitdir)

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

    def pack_slot(self, ctx: RequestContext,
                  framed: _Framed) -> contextlib.AbstractAsyncContextManager[None]:
        """A slot for the pack of this response (admission.py), if it sends one: taken
        before the 200, or :class:`Overloaded` (503) is raised."""
        if not framed.pack or self.admission is None:
            return contextlib.nullcontext()
        return self.admission.slot(ctx.repo.url_path)

    def executor_for(self, ctx: RequestContext) -> Executor:
        """The pool, as seen by work for ``ctx`` (pack streaming): each job holds ctx."""
        return _HeldExecutor(self.pool, ctx)


_REQUEST: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "gitspout_request", default=None)


class _Held:
    """Submits pool work for one request so that the request's leases on packs
    (store/registry.py) outlive the work: a handler cancelled while the pool still runs a
    step for it (the client went away) must not have its packs closed under that step."""

    def __init__(self, ctx: RequestContext | None) -> None:
        self.ctx = ctx

    def submit(self, executor: Executor, fn: Callable[..., T], *args: Any) -> Future[T]:
        ctx = self.ctx
        if ctx is None:
            return executor.submit(fn, *args)
        ctx.hold()
        try:
            if isinstance(executor, WorkPool):  # queued fairly, per repository (pool.py)
                fut = executor.submit_for(ctx.repo.url_path, fn, *args)
            else:
                fut = executor.submit(fn, *args)
        except BaseException:
            ctx.unhold()
            raise
        fut.add_done_callback(lambda _f: ctx.unhold())  # also when cancelled unstarted
        return fut



class _HeldExecutor(Executor):
    def __init__(self, pool: Executor, ctx: RequestContext) -> None:
        self._pool = pool
        self._held = _Held(ctx)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        assert not kwargs
        return self._held.submit(self._pool, fn, *args)


async def _start(request: web.Request, content_type: str) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers={**NO_CACHE, "Content-Type": content_type})
    await resp.prepare(request)
    return resp


async def _service_refusal(state: ServerState, ctx: RequestContext) -> web.Response | None:
    """git-http-backend's switches, checked before anything is read or answered: without
    git-daemon-export-ok under --require-export-ok the repository is not there (404, as
    for a missing one), and http.uploadpack=false refuses the service (403)."""
    def check() -> str | None:
        if state.cfg.require_export_ok and not ctx.exported():
            raise RepoNotFound(ctx.repo.url_path)
        return None if ctx.config.http_upload_pack else "Service not enabled: 'upload-pack'"

    refusal = await state.run(check)
    if refusal is None:
        return None
    # Empty, as git-http-backend's (its message goes to the server's log): git's t5561.14
    # compares the access log's byte counts.
    log.info("refusing %s: %s", ctx.repo.url_path, refusal)
    return web.Response(status=403, headers=NO_CACHE)


async def _resolve(state: ServerState, repo_path: str) -> Repo:
    """The repository: from the resolver's memory, or found on disk in the pool (the first
    time it is asked for: realpath and stats must not block the event loop), queued under
    its own path: behind no other repository's work, no sweep, no password check."""
    repo = state.resolver.cached(repo_path)
    if repo is not None:
        return repo
    return await asyncio.wrap_future(
        state.pool.submit_for(("resolve", repo_path), state.resolver.resolve, repo_path))


async def handle_info_refs(state: ServerState, request: web.Request, repo_path: str,
                           rec: RequestRecord, namespace: bytes = b"") -> web.StreamResponse:
    service = request.query.get("service")
    rec.command = "info-refs"
    if service == RECEIVE_PACK:
        rec.service = RECEIVE_PACK
        return text_response(403, READ_ONLY)
    if service != UPLOAD_PACK:
        return text_response(403, "gitspout serves only the smart HTTP protocol (service=git-upload-pack)")
    rec.service = UPLOAD_PACK
    ctx = state.context(await _resolve(state, repo_path), rec, namespace)
    refusal = await _service_refusal(state, ctx)
    if refusal is not None:
        return refusal
    version = protocol_version(request)
    rec.protocol = str(version)
    start = time.monotonic()
    if request.method == "HEAD":
        return web.Response(status=200, headers={
            **NO_CACHE, "Content-Type": f"application/x-{UPLOAD_PACK}-advertisement"})
    if version == 2:
        chunks = await state.run(lambda: _capabilities_body(ctx))
    else:
        header = [format_service_header(UPLOAD_PACK.encode())]
        chunks = await state.run(lambda: answers.encoded(
            ctx, ("v0", version), lambda: answers.v0_advertisement(ctx, version), header,
            lambda: answers.v0_segmented(ctx, version)))
    resp = await _start(request, f"application/x-{UPLOAD_PACK}-advertisement")
    writer = PktWriter(resp, record=rec)
    await writer.chunks(chunks)
    ctx.timed("advertise", start)
    await resp.write_eof()
    return resp


def _capabilities_body(ctx: RequestContext) -> list[bytes]:
    buf = PktBuffer()
    for payload in answers.v2_capabilities(ctx):
        buf.add(payload)
    buf.add_flush()
    return [buf.take()]


async def handle_upload_pack(state: ServerState, request: web.Request, repo_path: str,
                             rec: RequestRecord, namespace: bytes = b"") -> web.StreamResponse:
    rec.service = UPLOAD_PACK
    rec.protocol = str(protocol_version(request))
    ctype = request.headers.get("Content-Type", "")
    if ctype.split(";")[0].strip() != f"application/x-{UPLOAD_PACK}-request":
        raise HttpError(415, f"expected Content-Type application/x-{UPLOAD_PACK}-request")
    ctx = state.context(await _resolve(state, repo_path), rec, namespace)
    refusal = await _service_refusal(state, ctx)
    if refusal is not None:
        return refusal
    charge = state.admission.charge() if state.admission is not None else None
    try:
        # The parsers count pkt-lines as they decode them (413 past MAX_REQUEST_PKTS).
        body = await read_body(request, state.body_limits, state.run_bounded,
                               charge.take if charge is not None else None)
        if protocol_version(request) == 2:
            return await _serve_v2(state, request, ctx, body, rec)
        rec.command = "fetch"
        return await _serve_v0(state, request, ctx, body, rec)
    finally:
        if charge is not None:
            charge.release()


async def _refuse_in_protocol(request: web.Request, text: str,
                              rec: RequestRecord) -> web.StreamResponse:
    """A refusal the protocol has a place for: 200 with an ERR pkt-line (as C git does)."""
    resp = await _start(request, f"application/x-{UPLOAD_PACK}-result")
    writer = PktWriter(resp, record=rec)
    await writer.error(text, in_band=False)
    await resp.write_eof()
    return resp


async def _serve_v0(state: ServerState, request: web.Request, ctx: RequestContext, body: bytes,
                    rec: RequestRecord) -> web.StreamResponse:
    fmt, caps = await state.run(
        lambda: (ctx.object_format, v0_request_capabilities(ctx.config.allow_filter)))
    req = await state.run(parse_v0_request, body, caps, fmt.encode(), ctx.hash_len * 2)
    _note_request(rec, req)
    if req.wants:
        plan, framed = await state.run(_plan_v0, ctx, req)
    else:
        plan, framed = None, _Framed.of(iter_v0_fetch_response(None))
    async with state.pack_slot(ctx, framed):
        resp = await _start(request, f"application/x-{UPLOAD_PACK}-result")
        writer = PktWriter(resp, req.sideband, record=rec)
        rec.negotiation_round = plan is not None and not plan.send_pack
        await _write_fetch(state, ctx, writer, plan, framed)
        await resp.write_eof()
    return resp


@dataclass
class _Framed:
    """A fetch response as protocol/fetch_response.py lays it out, framed up to the pack in
    the pool (many haves make megabytes of ACK lines): the chunks before the pack, whether
    the pack comes, and the items after it."""

    before: list[bytes]
    pack: bool
    after: Iterator[bytes | Mark]

    @classmethod
    def of(cls, items: Iterator[bytes | Mark], sideband_all: bool = False) -> _Framed:
        section = PktSection(sideband_all=sideband_all)
        pack = section.frame(items)
        return cls(section.take(), pack, items)


def _shallow_args(plan: FetchPlan) -> dict[str, Any]:
    return {"shallow": plan.shallow.shallow, "unshallow": plan.shallow.unshallow,
            "deepen": plan.shallow.sent}


def _plan_v0(ctx: RequestContext, req: FetchRequest) -> tuple[FetchPlan, _Framed]:
    """In the pool: the plan, and what precedes the pack (shallow lines, ACK/NAK lines)."""
    plan = plan_fetch(ctx, req)
    items = iter_v0_fetch_response(plan.v0, **_shallow_args(plan),
                                   sideband=req.sideband is not Sideband.NONE)
    return plan, _Framed.of(items)


async def _write_fetch(state: ServerState, ctx: RequestContext, writer: PktWriter,
                       plan: FetchPlan | None, framed: _Framed) -> None:
    """Write a framed fetch response; the pack goes where protocol/ put it."""
    await writer.chunks(framed.before)
    if framed.pack:
        assert plan is not None
        await _send_pack(state, ctx, writer, plan)
        await writer.items(framed.after)
    await writer.drain()


async def _send_pack(state: ServerState, ctx: RequestContext, writer: PktWriter, plan: FetchPlan) -> None:
    start = time.monotonic()
    try:
        await send_pack_cached(state.pack_cache, ctx, plan, writer, state.executor_for(ctx),
                               lambda source: iter_pack(ctx, plan, source),
                               state.cfg.keepalive)
    except ConnectionError:
        raise  # the client went away: nothing more to say to it
    except Exception as exc:  # in-band, whatever it is: the client never sees a cut
        answer = answer_for(exc, ctx.repo.url_path, started=True)
        await writer.error(answer.text if answer is not None else INTERNAL_ERROR, in_band=True)
    ctx.timed("send", start)


@dataclass
class _V2Answer:
    """What one pass in the pool decided for a v2 POST: a ready listing, or a fetch."""

    command: bytes = b""
    agent: bytes | None = None
    chunks: list[bytes] | None = None
    fetch: FetchRequest | None = None


def _prepare_v2(ctx: RequestContext, body: bytes) -> _V2Answer:
    """Parse the command and, for ls-refs and object-info, produce the whole answer: one
    trip to the pool, so a listing costs its writes and not extra event-loop wake-ups."""
    features = answers.v2_features(ctx)
    cmd = parse_command_request(body, features)
    if cmd is None:
        return _V2Answer()
    answer = _V2Answer(cmd.command, cmd.agent)
    if cmd.command == b"ls-refs":
        ls = parse_ls_refs_args(cmd.args)
        kind = ("ls-refs", ls.peel, ls.symrefs, ls.unborn, ls.prefixes)
        answer.chunks = answers.encoded(ctx, kind, lambda: answers.ls_refs(ctx, ls),
                                        segmented=lambda: answers.ls_refs_segmented(ctx, ls))
    elif cmd.command == b"object-info":
        oi = parse_object_info_args(cmd.args, ctx.hash_len * 2)
        buf = PktBuffer()
        # PktBuffer hands back a chunk every 32 KiB: keep each (an answer for a few
        # thousand ids used to lose all but its tail).
        chunks = [c for c in map(buf.add, answers.object_info(ctx, oi)) if c]
        chunks += [c for c in (buf.add_flush(), buf.take()) if c]
        answer.chunks = chunks
    else:
        answer.fetch = parse_v2_fetch_args(cmd.args, features, ctx.hash_len * 2)
    return answer


async def _serve_v2(state: ServerState, request: web.Request, ctx: RequestContext, body: bytes,
                    rec: RequestRecord) -> web.StreamResponse:
    start = time.monotonic()
    answer = await state.run(_prepare_v2, ctx, body)
    if answer.command:
        rec.command = answer.command.decode()
        rec.agent = (answer.agent or b"").decode("utf-8", "replace")
    if answer.fetch is not None:
        _note_request(rec, answer.fetch)
        return await _serve_v2_fetch(state, request, ctx, answer.fetch, rec)
    resp = await _start(request, f"application/x-{UPLOAD_PACK}-result")
    if answer.chunks is not None:
        await PktWriter(resp, record=rec).chunks(answer.chunks)
        ctx.timed("advertise", start)
    await resp.write_eof()
    return resp


def _note_request(rec: RequestRecord, req: FetchRequest) -> None:
    rec.haves = len(req.haves)
    if req.agent:
        rec.agent = req.agent.decode("utf-8", "replace")


async def _serve_v2_fetch(state: ServerState, request: web.Request, ctx: RequestContext,
                          req: FetchRequest, rec: RequestRecord) -> web.StreamResponse:
    plan, framed = await state.run(_plan_v2, ctx, req)
    async with state.pack_slot(ctx, framed):
        resp = await _start(request, f"application/x-{UPLOAD_PACK}-result")
        writer = PktWriter(resp, Sideband.LARGE, sideband_all=req.sideband_all, record=rec)
        rec.negotiation_round = plan.v2 is not None and not plan.v2.send_pack
        await _write_fetch(state, ctx, writer, plan, framed)
        await resp.write_eof()
    return resp


def _plan_v2(ctx: RequestContext, req: FetchRequest) -> tuple[FetchPlan, _Framed]:
    """In the pool: the plan, and every section before the pack data (acknowledgments,
    shallow-info, wanted-refs, the packfile line), as for v0."""
    plan = plan_fetch(ctx, req)
    items = iter_v2_fetch_response(plan.v2, **_shallow_args(plan),
                                   client_shallow=bool(plan.shallow.cut),
                                   wanted_refs=plan.wanted_refs)
    return plan, _Framed.of(items, sideband_all=req.sideband_all)


STATE_KEY = web.AppKey("state", ServerState)


def make_app(state: ServerState, metrics_route: bool = True) -> web.Application:
    """The aiohttp application: one catch-all route, dispatched by path suffix."""
    app = web.Application(client_max_size=state.cfg.max_body)
    app[STATE_KEY] = state

    async def dispatch(request: web.Request) -> web.StreamResponse:
        handler = request.protocol
        if isinstance(handler, GuardedHandler) and handler.probe_only \
                and request.path not in PROBE_PATHS:
            handler.refuse_over_cap()  # admitted over the cap for health probes only
            refused = web.Response(status=503, text="gitspout: too many connections\n",
                                   headers={"Retry-After": "1"})
            refused.force_close()
            return refused
        if request.path == "/metrics" and metrics_route:
            if request.method not in ("GET", "HEAD"):
                return web.Response(status=405, text="method not allowed\n",
                                    headers={"Allow": "GET, HEAD"})
            return metrics_response(state)
        if request.path in PROBE_PATHS and state.health is not None:
            return await state.health.respond(request)  # not a git request: not counted
        rec = RequestRecord(agent=request.headers.get("User-Agent", "")[:100])
        cap_output(request.transport, state.cfg.output_buffer)
        state.metrics.in_flight.inc()
        state.in_flight += 1
        resp: web.StreamResponse | None = None
        status = 500  # a bug escaped the handler: aiohttp answers 500
        try:
            resp = await _dispatch(state, request, rec)
            return resp
        except (asyncio.CancelledError, ConnectionError):
            status = 499  # the client went away
            raise
        finally:
            state.metrics.in_flight.dec()
            state.in_flight -= 1
            _finish(state, rec, resp, status)
            if rec.context is not None:
                rec.context.close()  # leases end once the pool is done with it too
            if not state.in_flight:
                state.trimmer.schedule(lambda: _trim_heap(state))

    async def expect(request: web.Request) -> web.StreamResponse | None:
        """``Expect: 100-continue`` (git sends it before large bodies): a body declared
        over --max-body gets its 413 now, not an invitation to send it first."""
        try:
            check_declared_length(request, state.cfg.max_body)
        except BodyTooLarge as exc:
            resp = text_response(exc.status, exc.text)
            resp.force_close()
            return resp
        if request.version != HttpVersion11:
            return None
        if request.headers.get("Expect", "").lower() != "100-continue":
            return text_response(417, "unknown Expect")  # as aiohttp's own handler
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the response proper has not started
        return None

    app.router.add_route("*", "/{tail:.*}", dispatch, expect_handler=expect)
    app.on_startup.append(lambda _app: _start_sweeper(state))
    app.on_shutdown.append(lambda _app: _stop_sweeper(state))
    # The pool goes last, once aiohttp has let the handlers finish (or cut them at
    # --drain-timeout): on_cleanup runs after that, on_shutdown before it.
    app.on_cleanup.append(lambda _app: _close_pool(state))
    return app


def metrics_response(state: ServerState) -> web.Response:
    body = state.metrics.scrape()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


def _trim_heap(state: ServerState) -> None:
    """No request in flight for a while: give the heaps' free pages back (memory.py)."""
    if state.in_flight:
        return
    try:
        state.pool.submit(state.trimmer.trim)
    except RuntimeError:  # the pool is shut down
        pass


def _finish(state: ServerState, rec: RequestRecord, resp: web.StreamResponse | None,
            status: int) -> None:
    rec.status = resp.status if resp is not None else status
    if isinstance(resp, web.Response) and resp.body is not None and not rec.bytes:
        rec.bytes = len(resp.body)  # type: ignore[arg-type]
    ctx = rec.context
    if ctx is not None:
        rec.fs = dict(ctx.fs.counts)
        rec.phases = dict(ctx.phases)
        if ctx.pack_stats is not None:
            rec.pack_stats = ctx.pack_stats
            rec.objects = ctx.pack_stats.objects
            rec.pack_source = ctx.pack_stats.kind
    state.metrics.observe(rec)


async def _dispatch(state: ServerState, request: web.Request, rec: RequestRecord) -> web.StreamResponse:
    repo_path, action = split_path(request.path)
    if "%2f" in request.raw_path.lower() or "%5c" in request.raw_path.lower():
        return text_response(404, "not found")
    repo_path, namespace = state.namespaces.map(repo_path)
    try:
        if action == RECEIVE_PACK:
            rec.service = RECEIVE_PACK
            return text_response(403, READ_ONLY)
        if action == "info/refs" and request.method in ("GET", "HEAD"):
            await _authorize(state, request, repo_path)
            return await handle_info_refs(state, request, repo_path, rec, namespace)
        if action == UPLOAD_PACK and request.method == "POST":
            await _authorize(state, request, repo_path)
            return await handle_upload_pack(state, request, repo_path, rec, namespace)
        if action:
            allow = "POST" if action == UPLOAD_PACK else "GET, HEAD"
            resp = text_response(405, f"method {request.method} not allowed here")
            resp.headers["Allow"] = allow
            return resp
        return text_response(404, "not found")
    except ConnectionError:
        # The client went away mid-response: end this connection quietly, the way
        # aiohttp treats a premature disconnection (no 500, no traceback).
        log.debug("client went away: %s %s", request.method, request.path)
        raise asyncio.CancelledError() from None
    except AuthBusy as exc:  # too many password checks waiting (authgate.py)
        resp = text_response(503, "gitspout: server busy (password checks); retry later")
        resp.headers["Retry-After"] = str(exc.retry_after)
        return resp
    except Overloaded as exc:  # load, not a fault: 503 before any pack byte (admission.py)
        resp = text_response(503, exc.text)
        resp.headers["Retry-After"] = str(exc.retry_after)
        if exc.reason == "body_memory":
            _close_at_once(request, resp)  # its body is not read to the end
        return resp
    except Exception as exc:  # before the 200: the one mapping (errors.py) decides
        answer = answer_for(exc, repo_path)
        if answer is None:
            raise  # a bug: aiohttp answers 500 and logs the traceback
        if isinstance(exc, RepoNotFound):
            state.forget_repository(repo_path)
        if answer.status == 200:
            try:
                return await _refuse_in_protocol(request, answer.text, rec)
            except ConnectionError:  # gone before its refusal: as above, quietly
                log.debug("client went away: %s %s", request.method, request.path)
                raise asyncio.CancelledError() from None
        resp = text_response(answer.status, answer.text)
        if isinstance(exc, AuthDenied) and exc.status == 401 and state.access is not None:
            resp.headers["WWW-Authenticate"] = state.access.challenge  # git asks its helper
        if isinstance(exc, AuthDenied) and exc.retry_after:
            resp.headers["Retry-After"] = str(exc.retry_after)
        if isinstance(exc, BodyTimeout):
            state.metrics.connections.timeouts["body"] += 1
            _close_at_once(request, resp)
        elif isinstance(exc, BodyTooLarge):
            _close_at_once(request, resp)
        return resp


async def _authorize(state: ServerState, request: web.Request, repo_path: str) -> None:
    """With --auth-file, before anything is read: the credentials (bcrypt, in the pool),
    then the rule of the repository's real path (auth.py). Raises AuthDenied."""
    access, gate = state.access, state.gate
    if access is None or gate is None:
        return
    header = request.headers.get("Authorization")
    user = None
    if header:  # checked lately: no bcrypt; else in the gate's own threads (authgate.py)
        user = await gate.user_for(header, request.remote)
    try:
        repo = await _resolve(state, repo_path)
    except RepoNotFound:
        if user is None and not access.anonymous(repo_path.strip("/")):
            raise AuthDenied(401, "authentication required") from None
        raise
    access.decide(repo_name(repo.gitdir, state.resolver.root), user)


def _close_at_once(request: web.Request, resp: web.Response) -> None:
    """The body is unfinished (too slow, or too large to read): answer, then close at once
    instead of letting aiohttp read ("linger" over) the rest of it."""
    resp.force_close()
    if isinstance(request.protocol, GuardedHandler):
        request.protocol.skip_lingering()


async def _start_sweeper(state: ServerState) -> None:
    if state.cfg.sweep_interval > 0:
        state.sweeper = asyncio.get_running_loop().create_task(state.sweep_forever())


async def _stop_sweeper(state: ServerState) -> None:
    if state.sweeper is not None:
        state.sweeper.cancel()


async def _close_pool(state: ServerState) -> None:
    state.pool.shutdown(wait=False, cancel_futures=True)
    if state.gate is not None:
        state.gate.close()
    if state.pack_cache is not None:
        state.pack_cache.close()
