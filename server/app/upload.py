"""One upload-pack conversation over smart HTTP (gitprotocol-http, gitprotocol-v2,
gitprotocol-pack): the advertisement of ``info/refs``, and each POST: a v2 command
(``ls-refs``, ``object-info``, ``fetch``) or a v0/v1 upload-request.

It asks core for every decision in the pool, one step per request (``core/commands.py``,
``core/decided.py``: the plan of ``core/fetch.py``, the lines before the pack framed by
``core/framing.py``) before the response starts (I4); then takes a pack slot when a pack
follows (admission.py), starts the response, writes what core framed and the pack
packgen produces (through the pack cache), and records what core and packgen measured. A
fetch seen before under the same repository state skips the deciding: its answer is kept
(samefetch.py) and its pack read from the cache as it is (cacheread.py). The HTTP adapter
(``http.py``) calls it, having decoded the request; whatever is raised here goes back to
the adapter, or, once the pack is under way, in-band (both through errors.py).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web
from gitspout.protocol.advertise import format_service_header
from gitspout.protocol.fetch_request import FetchRequest, Sideband

from ..core import answers
from ..core.commands import Command, FetchCommand, Listing, read_command
from ..core.context import RequestContext
from ..core.decided import DecidedFetch, decide_fetch, empty_v0, read_v0_request
from ..packgen import PackStream
from .bundles import full_clone
from .errors import answer_for
from .httpreq import ADVERTISEMENT, RESULT, UPLOAD_PACK, start_response
from .metrics import RequestRecord
from .packcache import SentPack
from .samefetch import SameAnswer, SameKey
from .scope import RequestScope
from .sendregion import SocketSender
from .state import ServerState
from .stream import PktWriter, frame_items, pump_pack

__all__ = ["advertise", "serve_post"]

log = logging.getLogger("gitspout")

T = TypeVar("T")

SERVICE_LINE = format_service_header(UPLOAD_PACK.encode())  # smart HTTP's v0 preamble

Check = Callable[[], None] | None  # the service's switches (http.py), raising a refusal


def _checked(check: Check, fn: Callable[..., T], *args: Any) -> T:
    """In the pool: ``check()`` (the service's switches, not checked yet), then ``fn``:
    a request's first pool step takes both in one trip."""
    if check is not None:
        check()
    return fn(*args)


async def advertise(state: ServerState, scope: RequestScope, request: web.Request,
                    version: int, check: Check = None) -> web.StreamResponse:
    """``GET info/refs``: v2's capabilities, or v0/v1's refs (gitprotocol-http)."""
    start = time.monotonic()
    chunks = await scope.run(_checked, check, answers.advertisement_chunks, _view(scope),
                             version, [SERVICE_LINE])
    resp = await start_response(request, ADVERTISEMENT)
    await PktWriter(resp, record=scope.record).end_with(chunks)
    scope.since("advertise", start)
    return resp


async def serve_post(state: ServerState, scope: RequestScope, request: web.Request,
                     body: bytes, version: int, check: Check = None) -> web.StreamResponse:
    """``POST git-upload-pack``: one stateless round of the conversation. A fetch seen
    before is answered as it was when the repository stands as it did then (one pool
    step: samefetch.py); any other request is parsed and decided in one pool step."""
    same = state.pack_cache.same if state.pack_cache is not None else None
    key = same.key(scope, version, body) if same is not None else None
    answer = None
    if same is not None and key is not None:
        answer = same.get(key) or await same.planned(key)
    if same is not None and key is not None and answer is not None:
        now = await scope.run(_checked, check, _view(scope).fetch_state)
        check = None
        if now is None or now != answer.state:
            same.forget(key, "stale")
        else:
            resp = await _same_fetch(state, scope, request, key, answer, body, version)
            if resp is not None:
                return resp
    return await _planned(state, scope, request, body, version, key, check)


def _read_post(check: Check, ctx: RequestContext, body: bytes, version: int,
               with_state: bool) -> tuple[Command | FetchRequest, DecidedFetch | None,
                                          Exception | None]:
    """In the pool, one trip: the service check, the body parsed (a v2 listing answered
    whole: core/commands.py) and a fetch decided. A fetch that cannot be decided comes
    back with its exception, to be raised once its request is recorded."""
    if check is not None:
        check()
    req: FetchRequest | None
    parsed: Command | FetchRequest
    if version == 2:
        parsed = read_command(ctx, body)
        req = parsed.req if isinstance(parsed, FetchCommand) else None
    else:
        req = parsed = read_v0_request(ctx, body)
        if not req.wants:
            return parsed, empty_v0(), None
    if req is None:
        return parsed, None, None
    try:
        return parsed, decide_fetch(ctx, req, with_state), None
    except Exception as exc:
        return parsed, None, exc


async def _planned(state: ServerState, scope: RequestScope, request: web.Request,
                   body: bytes, version: int, key: SameKey | None,
                   check: Check) -> web.StreamResponse:
    start = time.monotonic()
    rec = scope.record
    if version != 2:
        rec.command = "fetch"  # recorded as one even when it cannot be parsed
    same = state.pack_cache.same if state.pack_cache is not None else None
    if same is not None and key is not None:
        same.begin(key)  # the same request meanwhile waits for this plan
    try:
        parsed, decided, failed = await scope.run(_read_post, check, _view(scope), body,
                                                  version, key is not None)
        req = _note_command(rec, parsed)
        if failed is not None:
            raise failed
        if req is not None and decided is not None:
            sideband = Sideband.LARGE if version == 2 else req.sideband
            sideband_all = req.sideband_all and version == 2
            _remember(state, scope, key, decided, sideband, sideband_all, req)
    finally:
        if same is not None and key is not None:
            same.end(key)
    if req is not None and decided is not None:
        return await _respond(state, scope, request, decided, sideband, sideband_all)
    resp = await start_response(request, RESULT)
    await PktWriter(resp, record=rec).end_with(
        parsed.chunks if isinstance(parsed, Listing) else [])
    if isinstance(parsed, Listing):
        scope.since("advertise", start)
    return resp


def _note_command(rec: RequestRecord, parsed: Command | FetchRequest) -> FetchRequest | None:
    """Record what a POST asked for; its fetch request, if it is one."""
    req: FetchRequest | None = None
    if isinstance(parsed, FetchRequest):  # v0/v1
        rec.command, req = "fetch", parsed
    elif parsed is not None:
        rec.command = parsed.command.decode()
        rec.agent = (parsed.agent or b"").decode("utf-8", "replace")
        req = parsed.req if isinstance(parsed, FetchCommand) else None
    if req is not None:
        _note_fetch(rec, req)
    return req


def _remember(state: ServerState, scope: RequestScope, key: SameKey | None,
              decided: DecidedFetch, sideband: Sideband, sideband_all: bool,
              req: FetchRequest) -> None:
    """Keep what this fetch is answered for the same request again (samefetch.py): a pack
    through the cache, and nothing that depends on more than the request and the state."""
    cache = state.pack_cache
    same = cache.same if cache is not None else None
    if same is None or key is None or decided.state is None or decided.key is None \
            or not decided.head.pack or state.bundles is not None:
        return
    rec = scope.record
    same.put(key, SameAnswer(
        decided.key, decided.state, b"".join(decided.head.before),
        frame_items(decided.after, sideband_all), sideband, sideband_all, req.no_progress,
        rec.command, rec.agent, rec.haves))


async def _same_fetch(state: ServerState, scope: RequestScope, request: web.Request,
                      key: SameKey, answer: SameAnswer, body: bytes,
                      version: int) -> web.StreamResponse | None:
    """The answer of a fetch seen before (the repository stands as it did then) while its
    pack is in the cache; None (nothing sent) otherwise: the caller plans it."""
    cache = state.pack_cache
    assert cache is not None and cache.same is not None
    rec = scope.record
    rec.command, rec.agent, rec.haves = answer.command, answer.agent, answer.haves
    async with _pack_slot(state, scope, True):
        found = cache.open_found(answer.pack_key)
        if found is None:  # evicted (TTL, cap), failed, whole, or not begun: planned again
            if cache.store.find(answer.pack_key) is None:
                cache.same.forget(key, "gone")
            return None
        cache.same.hit()
        entry = found[0]
        if entry.done and answer.sideband is Sideband.LARGE and SocketSender.usable(request):
            # Complete: the whole response's length is known (cacheread.py send_complete).
            start = time.monotonic()
            resp, sent = await cache.send_complete(
                found, request, rec, answer.before, answer.after, answer.no_progress,
                lambda length: start_response(request, RESULT, length))
            _record_pack(scope, sent)
            scope.since("send", start)
            await resp.write_eof()
            return resp
        consumed = False

        async def stream_of() -> PackStream:
            """This request's own stream, should the pack have to be made here after all
            (the producer could not write the file, or the entry turned out to name a
            whole pack): planned as the first one was."""
            _, decided, failed = await scope.run(_read_post, None, _view(scope), body,
                                                 version, False)
            if failed is not None:
                raise failed
            if decided is None or decided.pack is None:
                raise RuntimeError("a fetch seen before sends no pack any more")
            return decided.pack

        def send() -> Awaitable[SentPack]:
            nonlocal consumed
            consumed = True  # read_entry owns the descriptor from here
            return cache.send_found(found, writer, scope.executor, stream_of,
                                    state.cfg.keepalive, answer.no_progress)

        try:
            resp = await start_response(request, RESULT)
            writer = PktWriter(resp, answer.sideband, sideband_all=answer.sideband_all,
                               record=rec, request=request)
            await writer.framed(answer.before)
            await _send_pack(state, scope, writer, None, answer.no_progress, found=send)
            await writer.framed(answer.after)
            await resp.write_eof()
        finally:
            if not consumed:
                cache.close_found(found)
    return resp



async def _respond(state: ServerState, scope: RequestScope, request: web.Request,
                   decided: DecidedFetch, sideband: Sideband,
                   sideband_all: bool) -> web.StreamResponse:
    """Write a decided fetch: a slot first when a pack follows (or 503 before the 200),
    then the framed lines, the pack where protocol/ put it, and what follows it."""
    plan, head = decided.plan, decided.head
    if plan is not None:
        scope.phase("negotiate", plan.seconds)
    async with _pack_slot(state, scope, head.pack):
        resp = await start_response(request, RESULT)
        writer = PktWriter(resp, sideband, sideband_all=sideband_all, record=scope.record,
                           request=request)
        scope.record.negotiation_round = plan is not None and not plan.send_pack
        await writer.chunks(head.before)
        if head.pack and decided.pack is not None and plan is not None:
            await _send_pack(state, scope, writer, decided.pack, plan.req.no_progress,
                             key=decided.key)
            await writer.items(decided.after)
            _offloaded(state, scope, decided)
        await writer.drain()
        await resp.write_eof()
    return resp


def _offloaded(state: ServerState, scope: RequestScope, decided: DecidedFetch) -> None:
    """A pack went out: count its packfile URIs; a full clone counts towards a bundle
    (bundles.py), written in the background once due."""
    if state.offload is not None and decided.uris:
        state.offload.packfile_uris.inc(decided.uris)
    store, view = state.bundles, scope.view
    if store is None or view is None or view.namespace or not full_clone(decided.plan):
        return
    ctx = state.detached_view(view.repo)

    def note() -> None:
        try:
            store.note_clone(ctx)
        except Exception:  # logged; the next due clone tries again
            log.exception("writing the bundle of %s failed", view.repo.url_path)
        finally:
            ctx.close()

    state.pool.submit_for(("bundle", view.repo.url_path), note)


def _pack_slot(state: ServerState, scope: RequestScope,
               pack: bool) -> contextlib.AbstractAsyncContextManager[None]:
    """A slot for the pack of this response (admission.py), if it sends one: taken
    before the 200, or :class:`~.admission.Overloaded` (503) is raised."""
    if not pack or state.admission is None:
        return contextlib.nullcontext()
    return state.admission.slot(scope.repo)


async def _send_pack(state: ServerState, scope: RequestScope, writer: PktWriter,
                     stream: PackStream | None, no_progress: bool, key: bytes | None = None,
                     found: Callable[[], Awaitable[SentPack]] | None = None) -> None:
    """The pack, through the pack cache when there is one (``found``: an entry an
    identical request found, samefetch.py); a failure goes in-band (after the 200 the
    client is told there: I4, P10)."""
    start = time.monotonic()
    keepalive = state.cfg.keepalive
    try:
        if found is not None:
            sent = await found()
        elif state.pack_cache is None:
            assert stream is not None
            await pump_pack(writer, scope.executor, stream, keepalive, no_progress)
            sent = SentPack(stream.stats, stream.phases)
        else:
            assert stream is not None
            sent = await state.pack_cache.send(stream, scope.repo, writer, scope.executor,
                                               keepalive, no_progress, key)
        _record_pack(scope, sent)
    except Exception as exc:
        if stream is not None and stream.stats.kind:  # decided here: what it was to send
            _record_pack(scope, SentPack(stream.stats, stream.phases))  # is recorded
        answer = answer_for(exc, scope.repo, started=True, faults=state.registry.faults)
        if answer.gone:
            raise  # the client went away: nothing more to say to it
        await writer.error(answer.text, in_band=True)
    scope.since("send", start)


def _record_pack(scope: RequestScope, sent: SentPack) -> None:
    rec = scope.record
    rec.pack_stats = sent.stats
    rec.objects = sent.stats.objects
    rec.pack_source = sent.stats.kind
    rec.pack_cache = sent.cache
    for phase, seconds in sent.phases.items():
        scope.phase(phase, seconds)


def _note_fetch(rec: RequestRecord, req: FetchRequest) -> None:
    rec.haves = len(req.haves)
    if req.agent:
        rec.agent = req.agent.decode("utf-8", "replace")


def _view(scope: RequestScope) -> RequestContext:
    view = scope.view
    assert view is not None, "the adapter resolves the repository first"
    return view
