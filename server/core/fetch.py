"""A fetch, decided before the response starts (ARCHITECTURE.md I4): the want policy
(ARCHITECTURE.md I7), filters allowed by the repository, the shallow boundary, the
negotiation and, when a pack follows, its order for packgen. Blocking; runs in the
server's thread pool."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from gitspout.protocol.errors import Refusal
from gitspout.protocol.fetch_request import FetchRequest
from gitspout.protocol.filters import (
    FilterSpec,
    SparseOid,
    TreeDepth,
    filter_config_name,
    iter_filter_leaves,
)
from gitspout.protocol.negotiate import V0Answer, V2Answer, negotiate_v0, negotiate_v2
from gitspout.protocol.refs import Ref

from ..graph.commits import PEEL_LIMIT
from ..graph.negotiation import HaveTracker
from ..graph.reachability import check_wants, reachable_subset
from ..graph.shallow import ShallowBoundary, shallow_boundary
from ..packgen import PackOrder
from ..store.errors import ObjectStoreError, StorageError
from ..store.objformat import OBJ_COMMIT, OBJ_TAG
from ..store.repos import RepoConfig
from .bigblobs import LargeBlob, large_blobs
from .context import RequestContext
from .offload import offload_lines

__all__ = ["FetchPlan", "plan_fetch", "Negotiation"]

log = logging.getLogger("gitspout")


# What the negotiation answers, by protocol version (None: an empty v2 response).
Negotiation = V0Answer | V2Answer | None


@dataclass(frozen=True)
class FetchPlan:
    """Everything decided before the response starts: the lines before the pack, and the
    pack's order (None when no pack follows). ``seconds`` is how long deciding took."""

    req: FetchRequest
    wants: list[bytes]
    shallow: ShallowBoundary
    answer: Negotiation
    wanted_refs: list[tuple[bytes, bytes]] = field(default_factory=list)
    common: list[bytes] = field(default_factory=list)
    order: PackOrder | None = None
    seconds: float = 0.0
    # packfile URIs the client may be given: object -> "<pack-hash> <uri>" (offload.py)
    offload: dict[bytes, bytes] = field(default_factory=dict)
    # large blobs the client may be given as packs of gitspout's own (bigblobs.py)
    large: dict[bytes, LargeBlob] = field(default_factory=dict)

    @property
    def send_pack(self) -> bool:
        return self.order is not None


def _check_filter(cfg: RepoConfig, spec: FilterSpec | None) -> None:
    if spec is None:
        return
    for leaf in [spec, *iter_filter_leaves(spec)]:
        name = filter_config_name(leaf)
        if isinstance(leaf, SparseOid):
            raise Refusal("filter 'sparse:oid' not supported by this server")
        allowed = cfg.filter_allow.get(name, cfg.filter_allow_default)
        if not allowed:
            raise Refusal(f"filter '{name}' not supported")
        if isinstance(leaf, TreeDepth) and cfg.tree_filter_max_depth is not None:
            if leaf.depth > cfg.tree_filter_max_depth:
                raise Refusal(
                    f"tree filter allows max depth {cfg.tree_filter_max_depth}, "
                    f"but got {leaf.depth}")


def _expand_ref(name: bytes, ctx: RequestContext) -> Ref:
    """refs.c expand_ref's rules (the dwim a client may lean on for deepen-not)."""
    rules = [b"%s", b"refs/%s", b"refs/tags/%s", b"refs/heads/%s", b"refs/remotes/%s",
             b"refs/remotes/%s/HEAD"]
    found = [r for r in (ctx.visible_ref(rule % name) for rule in rules) if r is not None]
    if len(found) > 1 and len({f.oid for f in found}) > 1:
        raise Refusal(f"git upload-pack: ambiguous deepen-not: {name.decode('utf-8', 'replace')}")
    if not found:
        raise Refusal(f"git upload-pack: deepen-not is not a ref: {name.decode('utf-8', 'replace')}")
    return found[0]


def plan_fetch(ctx: RequestContext, req: FetchRequest) -> FetchPlan:
    """Validate and decide (blocking). Raises :class:`Refusal` to refuse in-band."""
    start = time.monotonic()
    cfg = ctx.config
    if req.filter is not None:
        if not cfg.allow_filter:
            raise Refusal("git upload-pack: filtering capability not negotiated")
        _check_filter(cfg, req.filter)
    wants = list(req.wants)
    wanted_refs: list[tuple[bytes, bytes]] = []
    for name in req.want_refs:
        ref = ctx.visible_ref(name)
        if ref is None:
            raise Refusal(f"unknown ref {name.decode('utf-8', 'replace')}")
        wanted_refs.append((name, ref.oid))
        wants.append(bytes.fromhex(ref.oid.decode()))
    _check_want_policy(ctx, wants)
    src = ctx.src
    client_shallows = _known_commits(ctx, req.shallows)
    deepen_not = [bytes.fromhex(_expand_ref(n, ctx).oid.decode()) for n in req.deepen_not]
    try:
        shallow = shallow_boundary(src, req, wants, client_shallows, deepen_not)
    except ObjectStoreError as exc:
        raise Refusal(f"git upload-pack: {exc}") from None
    tracker = HaveTracker(src, wants + list(shallow.extra_wants))
    answer: Negotiation = negotiate_v2(req, tracker) if req.version == 2 \
        else negotiate_v0(req, tracker)
    common = list(tracker.common)
    send = answer is not None and answer.send_pack
    offload: dict[bytes, bytes] = {}
    if send and req.uri_protocols and cfg.blob_packfile_uris:
        offload = offload_lines(cfg.blob_packfile_uris, req.uri_protocols, ctx.hash_len)
    large = _large_blobs(ctx, req) if send else {}
    order = _pack_order(ctx, req, wants, shallow, common,
                        frozenset(offload) | frozenset(large)) if send else None
    return FetchPlan(req, wants, shallow, answer, wanted_refs, common, order,
                     time.monotonic() - start, offload, large)


def _large_blobs(ctx: RequestContext, req: FetchRequest) -> dict[bytes, LargeBlob]:
    """The blobs this fetch may send as packs of gitspout's own: only to a client that
    accepts the protocol it reached us by, never under a namespace (the URI would name the
    repository, whose refs the namespace's client may not see), sha1 only."""
    policy = ctx.blob_uris
    if policy is None or policy.scheme not in req.uri_protocols or ctx.namespace \
            or ctx.object_format != "sha1":
        return {}
    return large_blobs(ctx.objects().packs(), policy)


def _pack_order(ctx: RequestContext, req: FetchRequest, wants: list[bytes],
                shallow: ShallowBoundary, common: list[bytes],
                exclude: frozenset[bytes] = frozenset()) -> PackOrder:
    """What packgen is to send, and how (packgen/order.py)."""
    unshallow = tuple(shallow.unshallow)
    return PackOrder(
        wants=tuple(dict.fromkeys(wants + list(shallow.extra_wants))),
        common=tuple(dict.fromkeys(common)),
        unshallow=unshallow,
        shallow_cut=shallow.cut,
        deepen=shallow.sent,
        grafts=ctx.grafts,
        filter=req.filter,
        # thin-pack against nothing changes nothing: clones share one order with or without
        thin=req.thin_pack and bool(common or unshallow),
        ofs_delta=req.ofs_delta,
        tags=_include_tags(ctx) if req.include_tag else (),
        exclude=exclude,
    )


def _include_tags(ctx: RequestContext) -> tuple[tuple[bytes, bytes], ...]:
    """(tag object, peeled target) of each visible annotated tag, for include-tag. Only the
    segments of ``refs/tags/`` are decoded (store/refsnapshot.py): a Ref of every ref was
    0.1 s of each fetch of a 100k-ref repository."""
    return tuple((bytes.fromhex(r.oid.decode()), bytes.fromhex(r.peeled.decode()))
                 for r in ctx.visible_under(b"refs/tags/") if r.peeled is not None)


def _known_commits(ctx: RequestContext, shallows: Sequence[bytes]) -> list[bytes]:
    """The client's shallow lines that we may act on: commits we have that are reachable
    from a visible ref. The others are ignored, as upload-pack ignores unknown ones.

    A shallow commit is unshallowed by deepening, and its parents (with their trees and
    blobs) are then sent: a shallow line naming a commit reachable only from a hidden ref
    would be a way round the want check (ARCHITECTURE.md, "one reachability rule"). So the
    rule applied to wants applies here too, before anything else looks at the commit; an id
    that fails it gets no error either, which would tell the client that it exists.
    """
    # The client got these commits from us, so a miss may be a concurrent gc that packed
    # them after this request froze its pack list: look again (once per request).
    known = [oid for oid in dict.fromkeys(shallows)
             if ctx.odb.locate(oid, needed=True) is not None]
    if known and not ctx.config.allow_any_sha1:
        allowed = reachable_subset(ctx.src, known, ctx.tips(), ctx.pack_caches.closures)
        dropped = [o for o in known if o not in allowed]
        if dropped:
            log.info("ignoring %d shallow line(s) of %s not reachable from visible refs: %s",
                     len(dropped), ctx.repo.url_path, dropped[0].hex())
        known = [o for o in known if o in allowed]
    for oid in known:
        if ctx.src.object_type(oid) != OBJ_COMMIT:
            raise Refusal(f"invalid shallow object {oid.hex()}")
    return known


def _orphan_tags(ctx: RequestContext, wants: Sequence[bytes],
                 tips: frozenset[bytes]) -> dict[bytes, bytes]:
    """The wants that may be served as tags no ref names any more, each with the object it
    peels to (which the caller checks like a want). A client that read a tag before it was
    moved (``git tag -f``, a nightly tag) asks for the old tag object: C git's v0 check
    passes it when its commit is reachable. It must be a tag object no ref holds, hidden
    or not, whose chain of tags no ref holds nor a hidden ref's chain passes through:
    what it adds is tag objects nothing refers to, never an object reachable from a
    hidden ref (ARCHITECTURE.md P7). A chain cut at the peel limit, or an object that
    cannot be read, is not taken (the want is refused as before)."""
    src = ctx.src
    out: dict[bytes, bytes] = {}
    held: set[bytes] | None = None  # every ref's value, and the tags hidden chains pass
    known = False
    for want in dict.fromkeys(wants):
        if want in tips:
            continue
        try:
            if src.object_type(want) != OBJ_TAG:
                continue
            target, _, chain = src.peel(want)
            if len(chain) >= PEEL_LIMIT:
                continue
            if not known:
                held, known = _held_objects(ctx, tips), True
        except (StorageError, ValueError):
            return {}
        if held is not None and not held & set(chain):
            out[want] = target
    return out


def _held_objects(ctx: RequestContext, tips: frozenset[bytes]) -> set[bytes] | None:
    """Every ref's value (HEAD's too) and every tag a hidden ref's chain passes; None when
    a hidden chain is cut at the peel limit (nothing can be said of what lies beyond).
    In a namespace, the refs of the whole repository: one outside the namespace is hidden
    from its URL like any other."""
    snap = ctx.all_refs
    held = {bytes.fromhex(h.decode()) for h in snap.visible_oids(())}
    for head in (snap.head, ctx.refs.head):
        if head.oid is not None:
            held.add(bytes.fromhex(head.oid.decode()))
    for oid in held - tips:  # hidden refs
        if ctx.src.object_type(oid) == OBJ_TAG:
            chain = ctx.src.peel(oid)[2]
            if len(chain) >= PEEL_LIMIT:
                return None
            held.update(chain)
    return held


def _check_want_policy(ctx: RequestContext, wants: Sequence[bytes]) -> None:
    """Every want must exist and, unless allowAnySHA1InWant, be reachable from a visible
    ref (ARCHITECTURE.md P7). The refusal names the first offending id, as C git does."""
    # A want is a true miss: the object list may be older than a concurrent repack, so
    # look again (one rescan per request at most) before calling it unknown.
    # A tip found before under this ref state is there still (RequestContext.present_tips):
    # a mirror clone's thousands of wants skip their index lookups.
    tips = ctx.tips()
    present = ctx.present_tips()
    locate = ctx.odb.locate
    missing: list[bytes] = []
    for w in wants:
        if w in present:
            continue
        if locate(w, needed=True) is None:
            missing.append(w)
        elif w in tips:
            present.add(w)
    if not missing and ctx.config.allow_any_sha1:
        return
    if missing:
        bad: bytes | None = missing[0]
    else:
        orphans = _orphan_tags(ctx, wants, tips)  # checked by what they peel to
        bad = check_wants(ctx.src, [orphans.get(w, w) for w in wants], tips,
                          ctx.pack_caches.closures)
        bad = next((t for t, target in orphans.items() if target == bad), bad)
    if bad is not None:
        log.info("refusing want %s of %s: %s (rescans %d, packs %d)", bad.hex(),
                 ctx.repo.url_path, "missing" if missing else "not reachable from visible refs",
                 ctx.odb.rescans, len(ctx.odb.packs))
        raise Refusal(f"upload-pack: not our ref {bad.hex()}")
