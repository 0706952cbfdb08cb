"""A fetch decided before its response starts (I4): its plan, the response up to the pack
(framed by :mod:`.framing`), the pack's stream with its pack-cache key, and what follows
the pack. Blocking: each runs in the server's pool, a POST's parsing and deciding in one
trip (app/upload.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from gitspout.protocol.advertise import v0_request_capabilities
from gitspout.protocol.fetch_request import FetchRequest, parse_v0_request
from gitspout.protocol.fetch_response import Mark

from ..packgen import PackStream
from .context import RequestContext
from .fetch import FetchPlan, plan_fetch
from .framing import ResponseHead, frame_empty_v0, frame_fetch

__all__ = ["DecidedFetch", "decide_fetch", "empty_v0", "read_v0_request"]


@dataclass
class DecidedFetch:
    """A fetch decided: its plan, its response up to the pack and after it, and the pack
    with its key; the repository state it was planned under, when asked for (what an
    identical request is checked against: app/samefetch.py)."""

    plan: FetchPlan | None
    head: ResponseHead
    pack: PackStream | None
    uris: int = 0  # packfile URIs in the response
    key: bytes | None = None  # PackStream.key
    after: list[bytes | Mark] = field(default_factory=list)  # head.after, made
    state: tuple[object, ...] | None = None  # RequestContext.fetch_state


def decide_fetch(ctx: RequestContext, req: FetchRequest,
                 with_state: bool = False) -> DecidedFetch:
    """The plan, what precedes the pack, the pack's stream (nothing of it produced yet)
    and its key; with ``with_state``, the state it was planned under (for a pack that
    depends on nothing else: no packfile URIs)."""
    plan = plan_fetch(ctx, req)
    pack = PackStream(plan.order, ctx.objects()) if plan.order is not None else None
    uris: list[bytes] = []
    if pack is not None and (plan.offload or plan.large):
        # Which objects the pack would have held is known once its objects are
        # enumerated: decided here, before the 200, so the section can precede the pack.
        left_out = pack.decide().stats.offloaded
        left = set(left_out)
        uris = [line for oid, line in plan.offload.items() if oid in left]
        large, kept = _large_uris(ctx, plan, left_out)
        if plan.order is not None and len(kept) < len(large):
            # Some blob's pack could not be kept (--blob-uri-size): it goes in the pack.
            order = replace(plan.order, exclude=plan.order.exclude - (set(large) - set(kept)))
            plan = replace(plan, order=order)
            pack = PackStream(order, ctx.objects())
            pack.decide()
        uris += list(kept.values())
    head = frame_fetch(plan, uris)
    after = list(head.after)
    key = pack.key() if pack is not None else None
    state = ctx.fetch_state() if with_state and pack is not None and not uris else None
    return DecidedFetch(plan, head, pack, len(uris), key, after, state)


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


def empty_v0() -> DecidedFetch:
    """The answer to a v0 request that wants nothing."""
    return DecidedFetch(None, frame_empty_v0(), None)


def read_v0_request(ctx: RequestContext, body: bytes) -> FetchRequest:
    """A v0/v1 upload-request, parsed against what the repository allows."""
    caps = v0_request_capabilities(ctx.config.allow_filter)
    return parse_v0_request(body, caps, ctx.object_format.encode(), ctx.hash_len * 2)
