"""One upload-pack conversation over smart HTTP (gitprotocol-http, gitprotocol-v2,
gitprotocol-pack): the advertisement of ``info/refs``, and each POST: a v2 command
(``ls-refs``, ``object-info``, ``fetch``) or a v0/v1 upload-request.

It asks core for every decision in the pool (``core/commands.py``, ``core/fetch.py``, the
lines before the pack framed by ``core/framing.py``) before the response starts (I4);
then takes a pack slot when a pack follows (admission.py), starts the response, writes
what core framed and the pack packgen produces (through the pack cache), and records what
core and packgen measured. The HTTP adapter (``http.py``) calls it, having decoded the
request; whatever is raised here goes back to the adapter, or, once the pack is under way,
in-band (both through errors.py).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from aiohttp import web
from gitspout.protocol.advertise import format_service_header, v0_request_capabilities
from gitspout.protocol.fetch_request import FetchRequest, Sideband, parse_v0_request

from ..core import answers
from ..core.commands import FetchCommand, read_command
from ..core.context import RequestContext
from ..core.fetch import FetchPlan, plan_fetch
from ..core.framing import ResponseHead, frame_empty_v0, frame_fetch
from ..packgen import PackStream
from .bundles import full_clone
from .errors import answer_for
from .httpreq import ADVERTISEMENT, RESULT, UPLOAD_PACK, start_response
from .metrics import RequestRecord
from .packcache import SentPack
from .scope import RequestScope
from .state import ServerState
from .stream import PktWriter, pump_pack

__all__ = ["advertise", "serve_post"]

log = logging.getLogger("gitspout")

SERVICE_LINE = format_service_header(UPLOAD_PACK.encode())  # smart HTTP's v0 preamble


async def advertise(state: ServerState, scope: RequestScope, request: web.Request,
                    version: int) -> web.StreamResponse:
    """``GET info/refs``: v2's capabilities, or v0/v1's refs (gitprotocol-http)."""
    start = time.monotonic()
    chunks = await scope.run(answers.advertisement_chunks, _view(scope), version,
                             [SERVICE_LINE])
    resp = await start_response(request, ADVERTISEMENT)
    await PktWriter(resp, record=scope.record).chunks(chunks)
    scope.since("advertise", start)
    await resp.write_eof()
    return resp


async def serve_post(state: ServerState, scope: RequestScope, request: web.Request,
                     body: bytes, version: int) -> web.StreamResponse:
    """``POST git-upload-pack``: one stateless round of the conversation."""
    if version == 2:
        return await _command(state, scope, request, body)
    scope.record.command = "fetch"
    return await _v0_fetch(state, scope, request, body)


async def _command(state: ServerState, scope: RequestScope, request: web.Request,
                   body: bytes) -> web.StreamResponse:
    start = time.monotonic()
    cmd = await scope.run(read_command, _view(scope), body)
    rec = scope.record
    if cmd is not None:
        rec.command = cmd.command.decode()
        rec.agent = (cmd.agent or b"").decode("utf-8", "replace")
    if isinstance(cmd, FetchCommand):
        _note_fetch(rec, cmd.req)
        decided = await scope.run(_decide, _view(scope), cmd.req)
        return await _respond(state, scope, request, decided, Sideband.LARGE,
                              cmd.req.sideband_all)
    resp = await start_response(request, RESULT)
    if cmd is not None:
        await PktWriter(resp, record=rec).chunks(cmd.chunks)
        scope.since("advertise", start)
    await resp.write_eof()
    return resp


async def _v0_fetch(state: ServerState, scope: RequestScope, request: web.Request,
                    body: bytes) -> web.StreamResponse:
    ctx = _view(scope)
    fmt, caps = await scope.run(
        lambda: (ctx.object_format, v0_request_capabilities(ctx.config.allow_filter)))
    req = await scope.run(parse_v0_request, body, caps, fmt.encode(), ctx.hash_len * 2)
    _note_fetch(scope.record, req)
    if req.wants:
        decided = await scope.run(_decide, ctx, req)
    else:
        decided = _Decided(None, frame_empty_v0(), None)
    return await _respond(state, scope, request, decided, req.sideband, False)


@dataclass
class _Decided:
    """A fetch decided in the pool: its plan, its response up to the pack, and the pack."""

    plan: FetchPlan | None
    head: ResponseHead
    pack: PackStream | None
    uris: int = 0  # packfile URIs in the response


def _decide(ctx: RequestContext, req: FetchRequest) -> _Decided:
    """In the pool: the plan, what precedes the pack, and the pack's stream (nothing of it
    produced yet)."""
    plan = plan_fetch(ctx, req)
    pack = PackStream(plan.order, ctx.objects()) if plan.order is not None else None
    uris: list[bytes] = []
    if pack is not None and (plan.offload or plan.large):
        # Which objects the pack would have held is known once its objects are
        # enumerated: decided here, before the 200, so the section can precede the pack.
        left_out = pack.decide().stats.offloaded
        uris = [line for oid, line in plan.offload.items() if oid in set(left_out)]
        large, kept = _large_uris(ctx, plan, left_out)
        if plan.order is not None and len(kept) < len(large):
            # Some blob's pack could not be kept (--blob-uri-size): it goes in the pack.
            order = replace(plan.order, exclude=plan.order.exclude - (set(large) - set(kept)))
            plan = replace(plan, order=order)
            pack = PackStream(order, ctx.objects())
            pack.decide()
        uris += list(kept.values())
    return _Decided(plan, frame_fetch(plan, uris), pack, len(uris))


def _large_uris(ctx: RequestContext, plan: FetchPlan, left_out: Sequence[bytes]
                ) -> tuple[list[bytes], dict[bytes, bytes]]:
    """The large blobs the pack left out (core/bigblobs.py), and the packfile-uris line
    of each whose one-blob pack is kept (written now if need be: app/blobpacks.py)."""
    policy = ctx.blob_uris
    large = [oid for oid in left_out if oid in plan.large and oid not in plan.offload]
    kept: dict[bytes, bytes] = {}
    if policy is not None:
        for oid in large:
            line = policy.line(plan.large[oid])
            if line is not None:
                kept[oid] = line
    return large, kept


async def _respond(state: ServerState, scope: RequestScope, request: web.Request,
                   decided: _Decided, sideband: Sideband, sideband_all: bool) -> web.StreamResponse:
    """Write a decided fetch: a slot first when a pack follows (or 503 before the 200),
    then the framed lines, the pack where protocol/ put it, and what follows it."""
    plan, head = decided.plan, decided.head
    if plan is not None:
        scope.phase("negotiate", plan.seconds)
    async with _pack_slot(state, scope, head.pack):
        resp = await start_response(request, RESULT)
        writer = PktWriter(resp, sideband, sideband_all=sideband_all, record=scope.record)
        scope.record.negotiation_round = plan is not None and not plan.send_pack
        await writer.chunks(head.before)
        if head.pack and decided.pack is not None and plan is not None:
            await _send_pack(state, scope, writer, decided.pack, plan.req.no_progress)
            await writer.items(head.after)
            _offloaded(state, scope, decided)
        await writer.drain()
        await resp.write_eof()
    return resp


def _offloaded(state: ServerState, scope: RequestScope, decided: _Decided) -> None:
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
                     stream: PackStream, no_progress: bool) -> None:
    """The pack, through the pack cache when there is one; a failure goes in-band
    (after the 200 the client is told there: I4, P10)."""
    start = time.monotonic()
    keepalive = state.cfg.keepalive
    try:
        if state.pack_cache is None:
            await pump_pack(writer, scope.executor, stream, keepalive, no_progress)
            sent = SentPack(stream.stats, stream.phases)
        else:
            sent = await state.pack_cache.send(stream, scope.repo, writer, scope.executor,
                                               keepalive, no_progress)
        _record_pack(scope, sent)
    except Exception as exc:
        if stream.stats.kind:  # decided here: what it was to send is recorded all the same
            _record_pack(scope, SentPack(stream.stats, stream.phases))
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
