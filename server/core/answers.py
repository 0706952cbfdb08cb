"""What a request answers from ref state alone: the v0 advertisement, the v2 capabilities,
ls-refs and object-info, and the cache of encoded answers kept per ref state and config."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from gitspout.protocol.advertise import (
    format_v0_capabilities,
    iter_v0_advertisement,
    iter_v0_ref_lines,
)
from gitspout.protocol.capabilities import V2Features, iter_v2_capabilities
from gitspout.protocol.ls_refs import LsRefsRequest, iter_ls_refs
from gitspout.protocol.object_info import ObjectInfoRequest, iter_object_info
from gitspout.protocol.oid import zero_oid
from gitspout.protocol.pktline import DEFAULT_CHUNK_SIZE, FLUSH_PKT, PktBuffer, encode_pkt
from gitspout.protocol.refs import HeadInfo, Ref, ref_is_hidden, ref_matches_prefixes

from ..graph.reachability import reachable_subset
from ..store.packedrefs import RefSegment
from ..store.refsnapshot import RefSnapshot
from .context import RequestContext, small_prefixes

__all__ = ["SESSION_ID", "v0_capabilities", "v0_advertisement", "v2_features", "v2_capabilities",
           "ls_refs", "encoded", "object_info", "Segmented", "v0_segmented", "ls_refs_segmented",
           "advertisement_chunks"]

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

def v0_segmented(ctx: RequestContext, version: int) -> Segmented | None:
    """The advertisement by segments of refs, when HEAD carries the capabilities (else the
    first ref does, and the answer is made whole by :func:`v0_advertisement`)."""
    snap = ctx.refs
    head = _visible_head(ctx, snap)
    if head is None or head.oid is None:
        return None
    caps = v0_capabilities(ctx, head)
    first = list(iter_v0_advertisement(head, (), caps, zero_oid(ctx.object_format), version))
    return Segmented(snap, first, iter_v0_ref_lines, ("v0",))

def v2_features(ctx: RequestContext) -> V2Features:
    cfg = ctx.config
    return V2Features(
        agent=ctx.agent,
        object_format=ctx.object_format.encode(),
        allow_filter=cfg.allow_filter,
        allow_ref_in_want=cfg.allow_ref_in_want,
        allow_sideband_all=cfg.allow_sideband_all or ctx.blob_uris is not None,
        advertise_unborn=cfg.unborn == "advertise",
        session_id=SESSION_ID if cfg.advertise_sid else None,
        bundle_uri=cfg.advertise_bundle_uris or ctx.bundles_offered,
        packfile_uris=bool(cfg.blob_packfile_uris) or ctx.blob_uris is not None,
    )

def v2_capabilities(ctx: RequestContext) -> Iterator[bytes]:
    return iter_v2_capabilities(v2_features(ctx))


def advertisement_chunks(ctx: RequestContext, version: int,
                         preamble: Sequence[bytes] = ()) -> list[bytes]:
    """The body of ``info/refs``: v2's capability advertisement (gitprotocol-v2
    "Capability Advertisement"), or v0/v1's refs and capabilities after ``preamble``
    (smart HTTP's service line), kept per ref state (:func:`encoded`)."""
    if version == 2:
        buf = PktBuffer()
        for payload in v2_capabilities(ctx):
            buf.add(payload)
        buf.add_flush()
        return [buf.take()]
    return encoded(ctx, ("v0", version), lambda: v0_advertisement(ctx, version), preamble,
                   lambda: v0_segmented(ctx, version))

def ls_refs(ctx: RequestContext, req: LsRefsRequest) -> Iterator[bytes]:
    unborn = req.unborn and ctx.config.unborn != "ignore"
    snap = ctx.refs_with_prefixes(req.prefixes)
    head, refs = snap.visible(ctx.hide_refs)
    if req.prefixes and not ref_matches_prefixes(b"HEAD", req.prefixes):
        head = None
    if req.prefixes and snap.complete:
        refs = [r for r in refs if ref_matches_prefixes(r.name, req.prefixes)]
    # The snapshot holds only refs under the prefixes: no need to test them again.
    return iter_ls_refs(LsRefsRequest(req.peel, req.symrefs, unborn), head,
                        [*_namespace_head(ctx, head, req.prefixes), *refs])

def ls_refs_segmented(ctx: RequestContext, req: LsRefsRequest) -> Segmented:
    """ls-refs by segments of refs (with ref-prefix, the segments that hold refs under
    the prefixes, each filtered)."""
    snap = ctx.refs_with_prefixes(req.prefixes)
    head = _visible_head(ctx, snap)
    unborn = req.unborn and ctx.config.unborn != "ignore"
    first = list(iter_ls_refs(LsRefsRequest(req.peel, req.symrefs, unborn, req.prefixes),
                              head, _namespace_head(ctx, head, req.prefixes)))
    plain = LsRefsRequest(req.peel, req.symrefs)
    return Segmented(snap, first, lambda refs: iter_ls_refs(plain, None, refs),
                     ("ls-refs", req.peel, req.symrefs), req.prefixes)


def _namespace_head(ctx: RequestContext, head: HeadInfo | None,
                    prefixes: Sequence[bytes]) -> list[Ref]:
    """In a namespace, C git's ls-refs lists the namespace's HEAD a second time, as a ref:
    it walks every ref under ``refs/namespaces/<ns>/`` + prefix, and that takes in
    ``refs/namespaces/<ns>/HEAD`` (ls-refs.c, refs_for_each_fullref_in_prefixes). The v0
    advertisement walks ``refs/namespaces/<ns>/refs/`` and does not."""
    if not ctx.namespace or head is None or head.oid is None \
            or not ref_matches_prefixes(b"HEAD", prefixes):
        return []
    return [Ref(b"HEAD", head.oid, None, head.target)]


def _visible_head(ctx: RequestContext, snap: RefSnapshot) -> HeadInfo | None:
    hide = ctx.hide_refs
    return None if hide and ref_is_hidden(b"HEAD", list(hide)) else snap.head


@dataclass(frozen=True)
class Segmented:
    """An answer made of a first part and the refs of a snapshot, segment by segment.

    ``refs`` gives the payloads of a run of visible refs; ``key`` names what they depend
    on besides the refs (with hideRefs, the key of each segment's kept encoding)."""

    snapshot: RefSnapshot
    first: list[bytes]
    refs: Callable[[Iterable[Ref]], Iterable[bytes]]
    key: tuple[object, ...]
    prefixes: tuple[bytes, ...] = ()  # only refs under these (all when empty)


def encoded(ctx: RequestContext, kind: tuple[object, ...], payloads: Callable[[], Iterable[bytes]],
            preamble: Sequence[bytes] = (),
            segmented: Callable[[], Segmented | None] | None = None,
            prefixes: tuple[bytes, ...] = ()) -> list[bytes]:
    """The response body as 32 KiB chunks, kept per ref state and config: a repeated
    advertisement of an unchanged repository costs its validation and its writes.
    ``kind`` names the answer, ``prefixes`` the refs it lists (ls-refs' ref-prefix; none:
    every ref).

    With ``segmented``, the body is put together from the encoding each segment of refs
    keeps (:class:`~..store.packedrefs.RefSegment`): after a change, only the segments that
    changed are encoded again."""
    # Read first: the key names the config this answer is made with (the request's own:
    # another request may have read a newer one meanwhile).
    config = ctx.config
    # A shallow repository's v0 advertisement ends with its shallow commits
    # (upload-pack.c: advertise_shallow_grafts, after the refs, before the flush).
    trailer = _shallow_lines(ctx) if kind and kind[0] == "v0" else []
    snap = ctx.refs_with_prefixes(prefixes)
    key = (kind, prefixes, snap.state, config.identity,
           hashlib.sha1(b"".join(trailer)).digest() if trailer else b"")
    # Nothing is put while the cross-request cache is off: the lookup is then a miss.
    hit = ctx.repo.ref_cache.encoded.get(key)
    if hit is not None:
        return hit
    # Nor for ref-prefixes too large to be part of a key (budgets count values): such an
    # answer is made and not kept, its segments' encodings included.
    keep = ctx.dirs.enabled and small_prefixes(prefixes)
    seg = segmented() if segmented is not None and keep else None
    if seg is not None:
        whole = _from_segments(ctx, seg, preamble, trailer)
        # A large answer is not kept whole: its chunks are the segments' encodings, kept
        # (and counted) in ref_encodings, and joining them again costs a lookup each.
        size = sum(len(c) for c in whole)
        if snap.cacheable and size <= WHOLE_ANSWER_BYTES:
            ctx.repo.ref_cache.encoded.put(key, whole, nbytes=size + 40 * len(whole))
        return whole
    buf = PktBuffer()
    chunks: list[bytes] = []
    for payload in preamble:
        _keep(chunks, buf.add(payload))
    if preamble:
        _keep(chunks, buf.add_flush())
    for payload in payloads():
        _keep(chunks, buf.add(payload))
    for payload in trailer:
        _keep(chunks, buf.add(payload))
    _keep(chunks, buf.add_flush())
    _keep(chunks, buf.take())
    if keep and snap.cacheable:
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
    return reachable_subset(ctx.src, oids, ctx.tips(), ctx.pack_caches.closures)


WHOLE_ANSWER_BYTES = 1 << 20
"""Answers up to this size are also kept whole (advertisements); larger ones are joined
from the segments' encodings (ref_encodings) at each request."""

_PLAIN = ("plain",)  # the key of a segment's lines where v0 and ls-refs agree


def _pkt_prefixes() -> list[bytes]:
    return [b"%04x" % (n + 5) for n in range(65516 - 5)]


_NEWLINE = [b"\n"]
_PKT_PREFIX = _pkt_prefixes()  # a line of n bytes (newline excluded): its pkt-line header


def _plain_lines(segment: RefSegment) -> bytes:
    """The pkt-lines ``<oid> <name>\n`` of a segment without peeled or symbolic refs: its
    packed-refs lines each behind its length, made without a Ref object (C speed)."""
    lines = segment.lines()
    n = len(lines)
    out = [b""] * (3 * n)  # header, line, newline: filled by slices, joined once
    try:
        out[0::3] = [_PKT_PREFIX[len(ln)] for ln in lines]
    except IndexError:  # a line no pkt-line holds: encode_pkt says so
        return b"".join(map(encode_pkt, (ln + b"\n" for ln in lines)))
    out[1::3] = lines
    out[2::3] = _NEWLINE * n
    return b"".join(out)


def _shallow_lines(ctx: RequestContext) -> list[bytes]:
    """``shallow <id>`` for each of the repository's own shallow commits, by id, as C
    git's graft list holds them."""
    return [b"shallow %s\n" % oid.hex().encode() for oid in sorted(ctx.grafts)]


def _from_segments(ctx: RequestContext, seg: Segmented, preamble: Sequence[bytes],
                   trailer: Sequence[bytes] = ()) -> list[bytes]:
    """The body: preamble, first part, each segment's kept encoding (made when missing),
    flush; pieces are joined into chunks of at least 32 KiB (a segment is about that)."""
    hide = tuple(ctx.hide_refs)
    encodings = ctx.repo.ref_cache.encodings
    ekey = (seg.key, hide)
    head = [encode_pkt(p) for p in preamble]
    if preamble:
        head.append(FLUSH_PKT)
    head.extend(encode_pkt(p) for p in seg.first)
    chunks: list[bytes] = []
    pieces: list[bytes] = [b"".join(head)]
    size = len(pieces[0])
    prefixes = seg.prefixes
    pkey = (seg.key, hide, prefixes)
    for segment in seg.snapshot.segments:
        # A segment wholly under one prefix (sorted: its first and last names are) is
        # encoded as without prefixes; another one is filtered and kept apart.
        whole = not prefixes or _under_one(segment, prefixes)
        if whole and not hide and segment.plain:
            k: tuple[object, ...] = _PLAIN  # the same lines in v0 and in ls-refs
        else:
            k = ekey if whole else pkey
        body = encodings.get((segment, k))
        if body is None:
            if k is _PLAIN:
                body = _plain_lines(segment)
            else:
                refs: Iterable[Ref] = segment.refs()
                if not whole:
                    refs = [r for r in refs if ref_matches_prefixes(r.name, prefixes)]
                if hide:
                    patterns = list(hide)
                    refs = [r for r in refs if not ref_is_hidden(r.name, patterns)]
                body = b"".join(map(encode_pkt, seg.refs(refs)))
            # Counted in --cache-memory; the key holds the segment (counted where it is
            # held: the packed parse, merged segments, snapshots).
            encodings.put((segment, k), body, len(body) + 120)
        if not body:
            continue
        pieces.append(body)
        size += len(body)
        if size >= DEFAULT_CHUNK_SIZE:
            chunks.append(pieces[0] if len(pieces) == 1 else b"".join(pieces))
            pieces, size = [], 0
    pieces.extend(encode_pkt(p) for p in trailer)
    pieces.append(FLUSH_PKT)
    chunks.append(b"".join(pieces))
    return chunks


def _under_one(segment: RefSegment, prefixes: Sequence[bytes]) -> bool:
    if not segment.raw:
        return True
    first, last = segment.first, segment.last
    return any(first.startswith(p) and last.startswith(p) for p in prefixes)


def _keep(chunks: list[bytes], chunk: bytes | None) -> None:
    if chunk:
        chunks.append(chunk)
