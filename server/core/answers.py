"""What a request answers from ref state alone: the v0 advertisement, the v2 capabilities,
ls-refs and object-info, and the cache of encoded answers kept per ref state and config."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence

from gitspout.protocol.advertise import format_v0_capabilities, iter_v0_advertisement
from gitspout.protocol.capabilities import V2Features, iter_v2_capabilities
from gitspout.protocol.ls_refs import LsRefsRequest, iter_ls_refs
from gitspout.protocol.object_info import ObjectInfoRequest, iter_object_info
from gitspout.protocol.oid import zero_oid
from gitspout.protocol.pktline import PktBuffer
from gitspout.protocol.refs import HeadInfo, ref_matches_prefixes

from ..graph.reachability import reachable_subset
from .context import RequestContext

__all__ = ["SESSION_ID", "v0_capabilities", "v0_advertisement", "v2_features", "v2_capabilities",
           "ls_refs", "encoded", "object_info"]

# transfer.advertiseSID: one id for this server process, like C git's trace2 session id.
SESSION_ID = f"gitspout-{os.getpid()}-{uuid.uuid4().hex[:12]}".encode()


def v0_capabilities(ctx: RequestContext, head: HeadInfo | None) -> bytes:
    cfg = ctx.config
    return format_v0_capabilities(
        object_format=ctx.object_format.encode(),
        agent=ctx.agent,
        head_target=head.target if head is not None and head.oid is not None else None,
        allow_tip_sha1=cfg.allow_tip_sha1 or cfg.allow_any_sha1,
        # Every want is checked for reachability from visible refs whatever the
        # protocol version, so v0 clients may ask for any reachable object: that is
        # what partial-clone lazy fetches (blobs by id) need.
        allow_reachable_sha1=True,
        allow_filter=cfg.allow_filter,
        session_id=SESSION_ID if cfg.advertise_sid else None,
    )

def v0_advertisement(ctx: RequestContext, version: int) -> Iterator[bytes]:
    head, refs = ctx.visible()
    caps = v0_capabilities(ctx, head)
    return iter_v0_advertisement(head, refs, caps, zero_oid(ctx.object_format), version)

def v2_features(ctx: RequestContext) -> V2Features:
    cfg = ctx.config
    return V2Features(
        agent=ctx.agent,
        object_format=ctx.object_format.encode(),
        allow_filter=cfg.allow_filter,
        allow_ref_in_want=cfg.allow_ref_in_want,
        allow_sideband_all=cfg.allow_sideband_all,
        advertise_unborn=cfg.unborn == "advertise",
        session_id=SESSION_ID if cfg.advertise_sid else None,
    )

def v2_capabilities(ctx: RequestContext) -> Iterator[bytes]:
    return iter_v2_capabilities(v2_features(ctx))

def ls_refs(ctx: RequestContext, req: LsRefsRequest) -> Iterator[bytes]:
    unborn = req.unborn and ctx.config.unborn != "ignore"
    snap = ctx.refs_with_prefixes(req.prefixes)
    head, refs = snap.visible(ctx.config.hide_refs)
    if req.prefixes and not ref_matches_prefixes(b"HEAD", req.prefixes):
        head = None
    if req.prefixes and snap.complete:
        refs = [r for r in refs if ref_matches_prefixes(r.name, req.prefixes)]
    # The snapshot holds only refs under the prefixes: no need to test them again.
    return iter_ls_refs(LsRefsRequest(req.peel, req.symrefs, unborn), head, refs)

def encoded(ctx: RequestContext, kind: tuple[object, ...], payloads: Callable[[], Iterable[bytes]],
            preamble: Sequence[bytes] = ()) -> list[bytes]:
    """The response body as 32 KiB chunks, kept per ref state and config: a repeated
    advertisement of an unchanged repository costs its validation and its writes."""
    _ = ctx.config  # read first: the key names the config this answer depends on
    key = (kind, ctx.refs_state(kind), ctx.repo.config_key())
    # Nothing is put while the cross-request cache is off: the lookup is then a miss.
    hit = ctx.repo.ref_cache.encoded.get(key)
    if hit is not None:
        return hit
    buf = PktBuffer()
    chunks: list[bytes] = []
    for payload in preamble:
        _keep(chunks, buf.add(payload))
    if preamble:
        _keep(chunks, buf.add_flush())
    for payload in payloads():
        _keep(chunks, buf.add(payload))
    _keep(chunks, buf.add_flush())
    _keep(chunks, buf.take())
    if ctx.dirs.enabled and ctx.refs_cacheable(kind):
        ctx.repo.ref_cache.encoded.put(key, chunks, nbytes=sum(len(c) + 40 for c in chunks))
    return chunks

def object_info(ctx: RequestContext, req: ObjectInfoRequest) -> list[bytes]:
    allowed = _reachable_subset(ctx, req.oids)
    sizes = []
    for oid in req.oids:
        found = ctx.odb.object_size(oid) if oid in allowed else None
        sizes.append((oid, found[1] if found else None))
    return list(iter_object_info(req, sizes))

def _reachable_subset(ctx: RequestContext, oids: Sequence[bytes]) -> set[bytes]:
    if ctx.config.allow_any_sha1:
        return set(oids)
    return reachable_subset(ctx.src, oids, ctx.tips(), ctx.registry.reach_cache)


def _keep(chunks: list[bytes], chunk: bytes | None) -> None:
    if chunk:
        chunks.append(chunk)
