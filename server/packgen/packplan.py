"""Choose how to produce a fetch's pack (ARCHITECTURE.md I5): fastest source first.

With a bitmapped pack and no shallow boundary, the object set comes from bitmaps; if it
is exactly the pack's contents the pack goes out verbatim. Otherwise entries are copied
from the packs they live in, and only what cannot be reused is generated.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, Sequence

from ..core.context import RequestContext
from ..core.fetch import FetchPlan
from ..core.stats import Progress
from ..graph.bitmapwalk import (
    BitmapIndex,
    Reach,
    ReachSet,
    bitmap_filter_supported,
    filter_walk_level,
    open_bitmap_index,
)
from ..graph.commits import WalkTooLong
from ..graph.reachability import Enumeration, enumerate_objects, include_tags
from ..store.bitmaps import iter_set_bits
from ..store.packs import PackFile
from .packsource import (
    PackSource,
    ReusePackSource,
    Selection,
    ThinCheck,
    WholePackSource,
    select_objects,
)

__all__ = ["build_pack_source", "iter_pack"]


def _tag_refs(ctx: RequestContext) -> list[tuple[bytes, bytes]]:
    """(tag object, peeled target) of visible refs/tags/* for include-tag."""
    return [
        (bytes.fromhex(r.oid.decode()), bytes.fromhex(r.peeled.decode()))
        for r in ctx.visible_under(b"refs/tags/")
        if r.peeled is not None
    ]


def _wants(plan: FetchPlan) -> list[bytes]:
    return list(dict.fromkeys(plan.wants + list(plan.shallow.extra_wants)))


def _haves(plan: FetchPlan) -> list[bytes]:
    """What the client has: its common haves, and the shallow commits a deepen unshallows
    (upload-pack.c send_unshallow passes them to pack-objects as edges: their trees are
    on the client, only their parents' history is new)."""
    return list(dict.fromkeys(plan.common + list(plan.shallow.unshallow)))


def build_pack_source(ctx: RequestContext, plan: FetchPlan) -> PackSource:
    """Enumerate the objects to send and pick the pack source (blocking)."""
    start = time.monotonic()
    req = plan.req
    source: PackSource | None = None
    shallow = plan.shallow.sent or bool(plan.shallow.cut)
    if not shallow and bitmap_filter_supported(req.filter):
        budget = _cold_budget(ctx) if plan.common and req.filter is None else 0
        if budget:
            # A client that has nearly all of it, cold: try a short walk before the bitmaps.
            source = _from_walk(ctx, plan, max_objects=budget)
        if source is None:
            bi = open_bitmap_index(ctx.src)
            if bi is not None:
                source = _from_bitmaps(ctx, plan, bi)
    if source is None:
        source = _from_walk(ctx, plan)
    assert source is not None
    ctx.timed("enumerate", start)
    return source


# A fetch of a few new commits from a pack not yet used in this process: bitmaps (and
# copying entries) need the pack's reverse index first, a sort of every entry's offset
# (50 ms for git/git's 841k entries), and the closures of the client's haves, where a
# walk from the wants down to the haves reads a few trees, and writing a few objects
# afresh costs less (docs/ARCHITECTURE.md, "Cold path"). ``--cold-walk-pack-entries``
# says how large a pack must be; the objects written afresh may number 16 for each such
# size, up to SMALL_FETCH_OBJECTS (at the default: dulwich 55, git/git 256).
SMALL_FETCH_COMMITS = 16
SMALL_FETCH_OBJECTS = 256


def _cold_budget(ctx: RequestContext) -> int:
    """How many objects may be written afresh to spare the reverse index of the largest
    pack of the request that has none yet (0: none may)."""
    unit = ctx.cold_walk_entries
    if unit <= 0:
        return 0
    cold = [p.count for p in ctx.odb.packs if p.count >= unit and not p.knows("reverse")]
    return min(SMALL_FETCH_OBJECTS, 16 * max(cold) // unit) if cold else 0


def _walk_key(plan: FetchPlan, tags: Sequence[tuple[bytes, bytes]],
              grafts: frozenset[bytes]) -> tuple[object, ...]:
    """What a walk's result depends on. Objects are immutable, so the objects reachable from
    given wants, minus given haves, never change: the key needs no repository state but the
    repository's own shallow commits, where every walk stops."""
    req = plan.req
    parts = [b"w", *sorted(_wants(plan)), b"h", *sorted(_haves(plan)), b"c", *sorted(plan.shallow.cut),
             b"t", *sorted(t for pair in tags for t in pair), b"g", *sorted(grafts)]
    digest = hashlib.sha1(b"\0".join(parts)).digest()
    return ("walk", digest, repr(req.filter))


def _from_walk(ctx: RequestContext, plan: FetchPlan,
               max_objects: int | None = None) -> PackSource | None:
    """The walk's pack source. With ``max_objects``, None when the walk meets more than
    :data:`SMALL_FETCH_COMMITS` commits or lists more objects than that: the caller has
    a better means for a large answer."""
    req = plan.req
    tags = _tag_refs(ctx) if req.include_tag else []
    cache = ctx.registry.reach_cache
    key = _walk_key(plan, tags, ctx.src.grafts)
    enum = cache.get(key)
    if not isinstance(enum, Enumeration):
        try:
            enum = enumerate_objects(ctx.src, _wants(plan), _haves(plan), plan.shallow.cut,
                                     req.filter, tags,
                                     max_commits=SMALL_FETCH_COMMITS if max_objects else None)
        except WalkTooLong:
            return None
        cache.put(key, enum, 80 * len(enum.objects) + 40 * len(enum.have_objects))
    if max_objects is not None and len(enum.objects) > max_objects:
        return None
    # Where the objects live depends on the pack list, which this request froze.
    where = key + tuple(p.key for p in ctx.odb.packs)
    cached = cache.get(where)
    listed_only = False
    if isinstance(cached, Selection):
        selection = cached.fresh(ctx.odb.packs)
    elif len(enum.objects) <= (max_objects if max_objects is not None else _cold_budget(ctx)):
        # Written afresh, no reverse index needed. Not kept: once the index is known,
        # entries are copied.
        selection = Selection([], [oid for oid, _ in enum.objects])
        listed_only = True
    else:
        selection = select_objects(ctx.odb, (oid for oid, _ in enum.objects))
        cache.put(where, selection, 16 * selection.count)
        selection = selection.fresh(ctx.odb.packs)
    thin: ThinCheck | None = None
    if req.thin_pack and enum.have_objects:
        have = enum.have_objects
        thin = lambda _pack, _rank, oid: oid in have  # noqa: E731
    source = ReusePackSource(ctx.odb, selection, ofs_delta=req.ofs_delta, thin=thin,
                             delta_hints=enum.hints, listed_only=listed_only)
    source.stats.kind = "walk"
    return source


def _filtered_reach(ctx: RequestContext, plan: FetchPlan, bi: BitmapIndex
                    ) -> tuple[Reach, Reach | None]:
    """The wants' closure minus the haves', filtered; and the haves' closure. Without haves
    the filtered closure is kept across requests like the closure itself (same key, plus
    the filter), so a second identical filtered clone neither filters nor looks up tips."""
    req = plan.req
    wants = _wants(plan)
    cache = ctx.registry.reach_cache
    key: tuple[object, ...] | None = None
    if not plan.common and req.filter is not None:
        digest = hashlib.sha1(b"".join(sorted(set(wants)))).digest()
        key = ("filtered", bi.pack.key, digest, repr(req.filter))
        hit = cache.get(key)
        if isinstance(hit, Reach):
            return hit.copy(), None
    reach = bi.reach_cached(wants, cache,  # type: ignore[arg-type]
                            level=filter_walk_level(req.filter))
    haves: Reach | None = None
    if plan.common:
        haves = bi.reach(plan.common)
        reach.bits = reach.bits & ~haves.bits
        for oid in haves.extra:
            reach.extra.pop(oid, None)
    bi.apply_filter(reach, req.filter, wants)
    if key is not None:
        cache.put(key, reach.copy(), reach.nbytes + 64 * len(reach.extra))
    return reach, haves


def _from_bitmaps(ctx: RequestContext, plan: FetchPlan, bi: BitmapIndex) -> PackSource:
    req = plan.req
    reach, haves = _filtered_reach(ctx, plan, bi)
    if req.include_tag:
        include_tags(ReachSet(bi, reach), _tag_refs(ctx),
                     ReachSet(bi, haves) if haves is not None else frozenset())
    pack = bi.pack
    # Not verbatim when the pack holds a REF_DELTA: to a client that asked for ofs-delta
    # every delta in the pack is an OFS_DELTA, and a REF_DELTA may precede its base (as
    # index-pack --fix-thin leaves a pushed pack, its bases appended at the end), which
    # libgit2 and isomorphic-git cannot resolve. C git's repack never writes one.
    if (not reach.extra and req.ofs_delta and reach.bits == (1 << pack.count) - 1
            and not pack.has_ref_deltas()):
        return WholePackSource(pack)
    ranks = iter_set_bits(reach.bits, pack.count)
    selection = select_objects(ctx.odb, list(reach.extra), base={id(pack): ranks},
                               packs={id(pack): pack})
    thin: ThinCheck | None = None
    if req.thin_pack and haves is not None:
        thin = _thin_from_reach(bi, haves)
    source = ReusePackSource(ctx.odb, selection, ofs_delta=req.ofs_delta, thin=thin,
                             delta_hints=reach.hints)
    source.stats.kind = "bitmap"
    return source


def _thin_from_reach(bi: BitmapIndex, haves: Reach) -> ThinCheck:
    def has(pack: PackFile | None, rank: int, oid: bytes) -> bool:
        if pack is bi.pack or pack is None:
            if rank < 0:
                found = bi.rank(oid)
                if found is None:
                    return oid in haves.extra
                rank = found
            return haves.test(rank)
        if oid in haves.extra:
            return True
        found = bi.rank(oid)
        return found is not None and haves.test(found)

    return has


def iter_pack(ctx: RequestContext, plan: FetchPlan, source: PackSource | None = None
              ) -> Iterator[bytes | Progress]:
    """Enumerate (unless ``source`` was decided already), then produce the pack: the
    iterator the stream writer pulls from."""
    if source is None:
        source = build_pack_source(ctx, plan)
    n = source.stats.objects
    yield Progress(b"Enumerating objects: %d, done.\n" % n)
    yield Progress(b"Counting objects: 100%% (%d/%d), done.\n" % (n, n))
    ctx.pack_stats = source.stats
    start = time.monotonic()
    yield from source.chunks()
    ctx.timed("pack", start)
