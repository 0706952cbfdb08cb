"""The HTTP adapter (gitprotocol-http): routes, request decoding (service, ``Git-Protocol``,
content type, gzip under caps), access, statuses and plain-text bodies.

Each git request gets a :class:`~.scope.RequestScope`; the conversation itself (what to
answer, and writing it) is ``upload.py``'s. Every exception of a request becomes its
answer in one place (:func:`~.errors.answer_for`), asked by :func:`_dispatch`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import HttpVersion11, web

from ..store.repos import RepoNotFound
from .auth import AuthDenied, repo_name
from .blobpacks import BLOBPACK_ROUTE, serve_blob_pack
from .bundles import BUNDLE_ROUTE, serve_bundle
from .connections import GuardedHandler
from .errors import REFUSED_IN_BAND, Answer, answer_for
from .forwarded import REQUEST_ID_HEADER, Forwarding
from .health import PROBE_PATHS
from .httpreq import (
    ADVERTISEMENT,
    CONTINUE_DUE,
    NO_CACHE,
    RECEIVE_PACK,
    RESULT,
    UPLOAD_PACK,
    BodyTooLarge,
    HttpError,
    ServiceDisabled,
    body_arrived,
    check_declared_length,
    protocol_version,
    read_body,
    split_path,
    start_response,
    text_response,
)
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import RequestRecord
from .scope import RequestScope
from .state import ServerState
from .stream import PktWriter, cap_output
from .upload import advertise, serve_post

__all__ = ["make_app", "metrics_response", "RUNNER_KWARGS", "HANDLER_KWARGS", "SERVER_KWARGS",
           "STATE_KEY", "ServerState"]

log = logging.getLogger("gitspout")

READ_ONLY = "gitspout is a read-only server: git-receive-pack (push) is not available\n"
# aiohttp must hand us request bodies as sent, so that gzip is inflated under our caps.
RUNNER_KWARGS: dict[str, Any] = {"auto_decompress": False}
# What each connection's handler is built with (connections.py builds them).
HANDLER_KWARGS: dict[str, Any] = {**RUNNER_KWARGS, "access_log": None}
# A handler is cancelled when its client goes away (CancelledError at its next await: 499):
# a request queued for a pack slot, or planning in the pool, for nobody, would hold its
# place in the admission queue, and the queue's room, until a slot or --pack-queue-wait.
SERVER_KWARGS: dict[str, Any] = {**RUNNER_KWARGS, "handler_cancellation": True}

STATE_KEY = web.AppKey("state", ServerState)
# The request's id, in its aiohttp request dict (typed keys since aiohttp 3.12; a string,
# which newer versions warn about, before).
REQUEST_ID: Any = (web.RequestKey("request_id", str) if hasattr(web, "RequestKey")
                   else "gitspout.request_id")


def request_id(forwarding: Forwarding, request: web.BaseRequest) -> str:
    """The request's id (forwarded.py), decided once and kept on the request."""
    rid = request.get(REQUEST_ID)
    if rid is None:
        rid = request[REQUEST_ID] = forwarding.request_id(
            request.remote, request.headers.get(REQUEST_ID_HEADER))
    return str(rid)


def make_app(state: ServerState, metrics_route: bool = True) -> web.Application:
    """The aiohttp application: one catch-all route, dispatched by path suffix."""
    app = web.Application(client_max_size=state.cfg.max_body)
    app[STATE_KEY] = state
    forwarding = state.forwarding

    async def tag(request: web.BaseRequest, response: web.StreamResponse) -> None:
        # Returned to whoever sent one, and to a trusted proxy; otherwise the answer's
        # headers stay git-http-backend's (git's t5551.5 compares them line by line).
        if REQUEST_ID_HEADER in request.headers or forwarding.trusts_peer(request.remote):
            response.headers[REQUEST_ID_HEADER] = request_id(forwarding, request)
        if request.get(CONTINUE_DUE):  # answered before its body was invited: the
            request[CONTINUE_DUE] = False  # connection closes after it; a body the client
            response.force_close()  # sent anyway (curl does after 1 s) is drained within
            response.headers["Connection"] = "close"  # aiohttp's lingering bounds, so the
            # answer is not lost to a reset. (Its headers are made: say it in them.)

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
            return await metrics_response(state)
        if request.path in PROBE_PATHS and state.health is not None:
            return await state.health.respond(request)  # not a git request: not counted
        return await _git_request(state, request, forwarding)

    async def expect(request: web.Request) -> web.StreamResponse | None:
        """``Expect: 100-continue`` (git sends it before large bodies): a body declared
        over --max-body gets its 413 now, not an invitation to send it first; otherwise
        the 100 is owed, and sent once the body is to be read (httpreq.py
        ``CONTINUE_DUE``), after the access check."""
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
        request[CONTINUE_DUE] = True
        return None

    app.router.add_route("*", "/{tail:.*}", dispatch, expect_handler=expect)
    app.on_response_prepare.append(tag)  # every answer says its request id
    app.on_startup.append(lambda _app: state.start())
    app.on_shutdown.append(lambda _app: state.stop())
    # The pool goes last, once aiohttp has let the handlers finish (or cut them at
    # --drain-timeout): on_cleanup runs after that, on_shutdown before it.
    app.on_cleanup.append(lambda _app: state.close())
    return app


async def metrics_response(state: ServerState) -> web.Response:
    """This process's metrics, or with ``--workers`` every worker's (workerstats.py)."""
    stats = state.worker_stats
    body = state.metrics.scrape() if stats is None else await stats.aggregate()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


async def _git_request(state: ServerState, request: web.Request,
                       forwarding: Forwarding) -> web.StreamResponse:
    """One git request, counted and recorded from start to end."""
    scope = state.scope(RequestRecord(
        agent=request.headers.get("User-Agent", "")[:100], id=request_id(forwarding, request),
        client=forwarding.client(request.remote, request.headers.getall("X-Forwarded-For", ())),
        method=request.method, path=request.path[:1024]))
    cap_output(request.transport, state.budgets.output_buffer)
    state.metrics.in_flight.inc()
    state.in_flight += 1
    resp: web.StreamResponse | None = None
    status = 500  # a bug escaped the handler: aiohttp answers 500
    try:
        resp = await _dispatch(state, request, scope)
        return resp
    except (asyncio.CancelledError, ConnectionError) as exc:
        status = 499  # the client went away: end quietly, as aiohttp treats a premature
        if isinstance(exc, ConnectionError):  # disconnection (no 500, no traceback)
            log.debug("client went away: %s %s", request.method, request.path)
            raise asyncio.CancelledError() from None
        raise
    finally:
        state.metrics.in_flight.dec()
        state.in_flight -= 1
        scope.close()  # leases end once the pool is done with the view too
        rec = scope.record
        rec.status = resp.status if resp is not None else status
        if isinstance(resp, web.Response) and resp.body is not None and not rec.bytes:
            rec.bytes = len(resp.body)  # type: ignore[arg-type]
        state.metrics.observe(rec)
        state.request_ended()


async def _dispatch(state: ServerState, request: web.Request,
                    scope: RequestScope) -> web.StreamResponse:
    url_path, action = split_path(request.path)
    if "%2f" in request.raw_path.lower() or "%5c" in request.raw_path.lower():
        return text_response(404, "not found")
    bundle = blob_pack = None
    if state.bundles is not None and BUNDLE_ROUTE in url_path and not action:
        url_path, _, bundle = url_path.partition(BUNDLE_ROUTE.strip("/") + "/")
        url_path = url_path.rstrip("/")
    elif state.blob_packs is not None and BLOBPACK_ROUTE in url_path and not action:
        url_path, _, blob_pack = url_path.partition(BLOBPACK_ROUTE.strip("/") + "/")
        url_path = url_path.rstrip("/")
    repo_path, namespace = state.namespaces.map(url_path)
    # A namespace's URL answers to the rules of that URL, not of its repository: each
    # tenant's namespace is a repository of its own to the access rules.
    rule_path = url_path if namespace else None
    try:
        if bundle is not None or blob_pack is not None:  # a file of ours: GET or HEAD
            if request.method not in ("GET", "HEAD"):
                return text_response(405, f"method {request.method} not allowed here")
            await _authorize(state, request, scope, repo_path, rule_path)
            scope.record.command = "bundle" if bundle is not None else "blob-pack"
            ctx = state.view(scope, await state.resolve_for(repo_path, namespace), namespace)
            await scope.run(_service_check(state, scope))  # as the other routes
            if bundle is not None and state.bundles is not None:
                resp = await serve_bundle(state.bundles, ctx, bundle, request, scope.run)
            else:
                assert blob_pack is not None and state.blob_packs is not None
                resp = await serve_blob_pack(state.blob_packs, ctx, blob_pack, request,
                                             scope.run)
            scope.record.bytes = resp.content_length or 0
            return resp
        if action == RECEIVE_PACK:
            scope.record.service = RECEIVE_PACK
            return text_response(403, READ_ONLY)
        if action == "info/refs" and request.method in ("GET", "HEAD"):
            await _authorize(state, request, scope, repo_path, rule_path)
            return await _info_refs(state, request, scope, repo_path, namespace)
        if action == UPLOAD_PACK and request.method == "POST":
            await _authorize(state, request, scope, repo_path, rule_path)
            return await _upload_pack(state, request, scope, repo_path, namespace)
        if action:
            resp = text_response(405, f"method {request.method} not allowed here")
            resp.headers["Allow"] = "POST" if action == UPLOAD_PACK else "GET, HEAD"
            return resp
        return text_response(404, "not found")
    except ServiceDisabled as exc:
        # Empty, as git-http-backend's (its message goes to the server's log): git's
        # t5561.14 compares the access log's byte counts.
        log.info("refusing /%s: %s", repo_path, exc)
        return web.Response(status=403, headers=NO_CACHE)
    except Exception as exc:  # before the 200: the one mapping (errors.py) decides
        challenge = state.access.challenge if state.access is not None else None
        answer = answer_for(exc, repo_path, challenge=challenge, faults=state.registry.faults)
        if answer.gone or answer.bug:
            raise  # gone: _git_request ends quietly; a bug: aiohttp's 500 and traceback
        return await _answer(state, request, scope, repo_path, answer)


async def _answer(state: ServerState, request: web.Request, scope: RequestScope,
                  repo_path: str, answer: Answer) -> web.StreamResponse:
    """Do what the mapping said, before the 200."""
    if answer.forget:
        state.forget_repository(repo_path)
    if answer.timeout is not None:
        state.metrics.connections.timeouts[answer.timeout] += 1
    if answer.status == REFUSED_IN_BAND:  # a refusal the protocol has a place for: 200
        resp = await start_response(request, RESULT)  # with an ERR pkt-line, as C git does
        await PktWriter(resp, record=scope.record).error(answer.text, in_band=False)
        await resp.write_eof()
        return resp
    refused = text_response(answer.status, answer.text)
    refused.headers.update(answer.headers)
    if answer.close:  # the body is unfinished (too slow, or too large to read): answer,
        refused.force_close()  # then close at once instead of letting aiohttp read
        if isinstance(request.protocol, GuardedHandler):  # ("linger" over) the rest of it
            request.protocol.skip_lingering()
    return refused


async def _info_refs(state: ServerState, request: web.Request, scope: RequestScope,
                     repo_path: str, namespace: bytes) -> web.StreamResponse:
    """``GET info/refs?service=git-upload-pack`` (HEAD: the headers alone)."""
    service = request.query.get("service")
    rec = scope.record
    rec.command = "info-refs"
    if service == RECEIVE_PACK:
        rec.service = RECEIVE_PACK
        return text_response(403, READ_ONLY)
    if service != UPLOAD_PACK:
        return text_response(403, "gitspout serves only the smart HTTP protocol "
                             "(service=git-upload-pack)")
    rec.service = UPLOAD_PACK
    state.view(scope, await state.resolve_for(repo_path, namespace), namespace, _base_url(state, request))
    version = protocol_version(request)
    rec.protocol = str(version)
    check = _service_check(state, scope)
    if request.method == "HEAD":
        await scope.run(check)
        return web.Response(status=200, headers={**NO_CACHE, "Content-Type": ADVERTISEMENT})
    return await advertise(state, scope, request, version, check)  # checked first


async def _upload_pack(state: ServerState, request: web.Request, scope: RequestScope,
                       repo_path: str, namespace: bytes) -> web.StreamResponse:
    """``POST git-upload-pack``: the body read whole under its caps, then answered."""
    rec = scope.record
    rec.service = UPLOAD_PACK
    version = protocol_version(request)
    rec.protocol = str(version)
    ctype = request.headers.get("Content-Type", "")
    if ctype.split(";")[0].strip() != f"application/x-{UPLOAD_PACK}-request":
        raise HttpError(415, f"expected Content-Type application/x-{UPLOAD_PACK}-request")
    state.view(scope, await state.resolve_for(repo_path, namespace), namespace, _base_url(state, request))
    check: Callable[[], None] | None = _service_check(state, scope)
    if not body_arrived(request):  # refused before its body is waited for
        await scope.run(_service_check(state, scope))
        check = None
    # else the body is here already: checked in the request's first pool step (upload.py)
    charge = state.admission.charge() if state.admission is not None else None
    try:
        # The parsers count pkt-lines as they decode them (413 past MAX_REQUEST_PKTS).
        body = await read_body(request, state.budgets.bodies,
                               lambda fn, *args: state.run_bounded(scope, fn, *args),
                               charge.take if charge is not None else None)
        return await serve_post(state, scope, request, body, version, check)
    finally:
        if charge is not None:
            charge.release()


def _base_url(state: ServerState, request: web.Request) -> str:
    """Scheme and host as the client addressed us (through a trusted proxy: as it says,
    forwarded.py): where our bundle and blob-pack URLs point."""
    headers = request.headers
    return state.forwarding.base_url(request.remote, request.scheme, request.host,
                                     headers.get("X-Forwarded-Proto"),
                                     headers.get("X-Forwarded-Host"))


async def _authorize(state: ServerState, request: web.Request, scope: RequestScope,
                     repo_path: str, rule_path: str | None) -> None:
    """With --auth-file, before anything is read: the credentials (checked lately: no
    bcrypt; else in the gate's own threads, authgate.py), then the rule of the
    repository's real path (auth.py), or of ``rule_path`` (a namespace's URL). Raises
    AuthDenied."""
    access, gate = state.access, state.gate
    if access is None or gate is None:
        return
    header = request.headers.get("Authorization")
    user = await gate.user_for(header, request.remote) if header else None
    scope.record.user = user
    try:
        repo = await state.resolve(repo_path)
    except RepoNotFound:
        if user is None and not access.anonymous((rule_path or repo_path).strip("/")):
            raise AuthDenied(401, "authentication required") from None
        raise
    access.decide(rule_path.strip("/") if rule_path is not None
                  else repo_name(repo.gitdir, state.resolver.root), user)


def _service_check(state: ServerState, scope: RequestScope) -> Callable[[], None]:
    """git-http-backend's switches, checked before anything is answered (blocking: in the
    pool, as the first thing the request's first pool step does): without
    git-daemon-export-ok under --require-export-ok the repository is not there (404, as
    for a missing one), and http.uploadpack=false refuses the service
    (:class:`ServiceDisabled`: 403)."""
    view = scope.view
    assert view is not None

    def check() -> None:
        if state.cfg.require_export_ok and not view.exported():
            raise RepoNotFound(view.repo.url_path)
        if not view.config.http_upload_pack:
            raise ServiceDisabled("Service not enabled: 'upload-pack'")

    return check
