"""Choose how to produce a pack (ARCHITECTURE.md I5): fastest source first.

With a bitmapped pack and no shallow boundary, the object set comes from bitmaps; if it
is exactly the pack's contents the pack goes out verbatim. Otherwise entries are copied
from the packs they live in, and only what cannot be reused is generated.
"""

from __future__ import annotations

from ..graph.bitmapwalk import (
    BitmapIndex,
    Reach,
    ReachSet,
    bitmap_filter_supported,
    filter_walk_level,
    open_bitmap_index,
)
from ..graph.commits import WalkTooLong
from ..graph.enumeration import Enumeration, enumerate_objects, include_tags
from ..store.bitmaps import iter_set_bits
from ..store.packs import PackFile
from .access import ObjectAccess
from .order import PackOrder
from .reuse import ReusePackSource
from .selection import Selection, ThinCheck, select_objects
from .sources import PackSource, WholePackSource
from .walkrecord import load_walk, save_walk, touch_walk

__all__ = ["choose_source"]


def choose_source(order: PackOrder, objects: ObjectAccess) -> PackSource:
    """Enumerate the objects to send and pick the pack source (blocking)."""
    source: PackSource | None = None
    if not order.shallow and bitmap_filter_supported(order.filter):
        budget = _cold_budget(objects) if order.common and order.filter is None else 0
        if budget:
            # A client that has nearly all of it, cold: try a short walk before the bitmaps.
            source = _from_walk(order, objects, max_objects=budget)
        if source is None:
            bi = open_bitmap_index(objects.src)
            if bi is not None:
                source = _from_bitmaps(order, objects, bi)
    if source is None:
        source = _from_walk(order, objects)
    assert source is not None
    return source


# A fetch of a few new commits from a pack not yet used in this process: bitmaps (and
# copying entries) need the pack's reverse index first, a sort of every entry's offset
# (50 ms for git/git's 841k entries), and the closures of the client's haves, where a
# walk from the wants down to the haves reads a few trees, and writing a few objects
# afresh costs less (docs/performance.md, "Cold path"). ``--cold-walk-pack-entries``
# says how large a pack must be; the objects written afresh may number 16 for each such
# size, up to SMALL_FETCH_OBJECTS (at the default: dulwich 55, git/git 256).
SMALL_FETCH_COMMITS = 16
SMALL_FETCH_OBJECTS = 256


def _cold_budget(objects: ObjectAccess) -> int:
    """How many objects may be written afresh to spare the reverse index of the largest
    pack of the request that has none yet (0: none may)."""
    unit = objects.cold_walk_entries
    if unit <= 0:
        return 0
    cold = [p.count for p in objects.odb.packs if p.count >= unit and not p.knows("reverse")]
    return min(SMALL_FETCH_OBJECTS, 16 * max(cold) // unit) if cold else 0


def _from_walk(order: PackOrder, objects: ObjectAccess,
               max_objects: int | None = None) -> PackSource | None:
    """The walk's pack source. With ``max_objects``, None when the walk meets more than
    :data:`SMALL_FETCH_COMMITS` commits or lists more objects than that: the caller has
    a better means for a large answer."""
    caches, odb = objects.caches, objects.odb
    enum = _walk(order, objects, max_objects)
    if enum is None:
        return None
    if max_objects is not None and len(enum.objects) > max_objects:
        return None
    listed = [oid for oid, _ in enum.objects]
    offloaded: tuple[bytes, ...] = ()
    if order.exclude:
        offloaded = tuple(oid for oid in listed if oid in order.exclude)
        listed = [oid for oid in listed if oid not in order.exclude]
    # Where the objects live depends on the pack lists (the alternates' too), which this
    # request froze.
    packs = objects.packs()
    where = (order.key, *(p.key for p in packs))
    cached = caches.selections.get(where)
    listed_only = False
    if cached is not None:
        selection = cached.fresh(packs)
    elif len(listed) <= (max_objects if max_objects is not None else _cold_budget(objects)):
        # Written afresh, no reverse index needed. Not kept: once the index is known,
        # entries are copied.
        selection = Selection([], listed)
        listed_only = True
    else:
        selection = select_objects(odb, listed)
        caches.selections.put(where, selection, 16 * selection.count)
        selection = selection.fresh(packs)
    thin: ThinCheck | None = None
    if order.thin and enum.have_objects:
        have = enum.have_objects
        thin = lambda _pack, _rank, oid: oid in have  # noqa: E731
    source = ReusePackSource(odb, selection, ofs_delta=order.ofs_delta, thin=thin,
                             delta_hints=enum.hints, newer_hints=enum.newer,
                             listed_only=listed_only,
                             inflate=objects.inflate, layouts=caches.layouts,
                             layout_disk=caches.closures.disk)
    source.stats.kind = "walk"
    source.stats.offloaded = offloaded
    return source


def _walk(order: PackOrder, objects: ObjectAccess, max_objects: int | None
          ) -> Enumeration | None:
    """The objects of ``order``, walked, or kept from an earlier walk: in memory, or for a
    large clone on the local disk by an earlier process (walkrecord.py). None when a walk
    limited by ``max_objects`` meets too many commits."""
    caches = objects.caches
    # The objects reachable from given wants, minus given haves, never change: the key
    # needs no repository state but the repository's own shallow commits (in the order),
    # where every walk stops.
    enum = caches.walks.get(order.key)
    disk = caches.closures.disk if max_objects is None else None
    if enum is not None:
        if disk is not None:
            touch_walk(disk, objects.odb, order, enum)
        return enum
    enum = load_walk(disk, objects.odb, order) if disk is not None else None
    if enum is None:
        try:
            enum = enumerate_objects(objects.src, list(order.wants), order.haves,
                                     order.shallow_cut, order.filter, order.tags,
                                     max_commits=SMALL_FETCH_COMMITS if max_objects else None)
        except WalkTooLong:
            return None
        if disk is not None:
            save_walk(disk, objects.odb, order, enum)
    caches.walks.put(order.key, enum, 80 * len(enum.objects) + 40 * len(enum.have_objects)
                     + 100 * (len(enum.hints) + len(enum.newer)))
    return enum


FILTERED = "filtered"  # a filtered closure of a pack order, in the closure store


def _filtered_reach(order: PackOrder, objects: ObjectAccess, bi: BitmapIndex
                    ) -> tuple[Reach, Reach | None]:
    """The wants' closure minus the haves', filtered; and the haves' closure. Without haves
    the filtered closure is kept across requests like the closure itself (keyed by the
    order), so a second identical filtered clone neither filters nor looks up tips."""
    caches = objects.caches
    disk = caches.closures.disk
    wants = list(order.wants)
    key: tuple[object, ...] | None = None
    if not order.common and order.filter is not None:
        key = (bi.pack.key, order.key)
        hit = caches.filtered.get(key)
        if hit is None and disk is not None:  # a previous process's (store/closurestore.py)
            hit = bi.load_stored(disk, order.key, (FILTERED,))
            if hit is not None:
                caches.filtered.put(key, hit, hit.nbytes + 64 * len(hit.extra))
        if hit is not None:
            return hit.copy(), None
    reach = bi.reach_cached(wants, caches.closures.sets, level=filter_walk_level(order.filter),
                            disk=disk)
    haves: Reach | None = None
    if order.common:
        haves = bi.reach(order.common)
        reach.bits = reach.bits & ~haves.bits
        for oid in haves.extra:
            reach.extra.pop(oid, None)
    bi.apply_filter(reach, order.filter, wants)
    if key is not None:
        caches.filtered.put(key, reach.copy(), reach.nbytes + 64 * len(reach.extra))
        if disk is not None:
            bi.save_stored(disk, order.key, FILTERED, reach)
    return reach, haves


def _from_bitmaps(order: PackOrder, objects: ObjectAccess, bi: BitmapIndex) -> PackSource:
    reach, haves = _filtered_reach(order, objects, bi)
    if order.tags:
        include_tags(ReachSet(bi, reach), order.tags,
                     ReachSet(bi, haves) if haves is not None else frozenset())
    offloaded = _exclude(order, bi, reach) if order.exclude else ()
    pack = bi.pack
    # Not verbatim when the pack holds a REF_DELTA: to a client that asked for ofs-delta
    # every delta in the pack is an OFS_DELTA, and a REF_DELTA may precede its base (as
    # index-pack --fix-thin leaves a pushed pack, its bases appended at the end), which
    # libgit2 and isomorphic-git cannot resolve. C git's repack never writes one.
    # Every entry with loose objects beside (a clone after a push) is one run of the
    # pack's body (packgen/layout.py): either way, whether the pack holds a REF_DELTA is
    # asked, and kept in the closure store for the next process.
    whole = (order.ofs_delta and reach.bits == (1 << pack.count) - 1
             and not bi.delta_facts(objects.caches.closures.disk)[0])
    if whole and not reach.extra:
        return WholePackSource(pack)
    ranks = iter_set_bits(reach.bits, pack.count)
    selection = select_objects(objects.odb, list(reach.extra), base={id(pack): ranks},
                               packs={id(pack): pack})
    thin: ThinCheck | None = None
    if order.thin and haves is not None:
        thin = _thin_from_reach(bi, haves)
    source = ReusePackSource(objects.odb, selection, ofs_delta=order.ofs_delta, thin=thin,
                             delta_hints=reach.hints, inflate=objects.inflate,
                             layouts=objects.caches.layouts,
                             layout_disk=objects.caches.closures.disk)
    source.stats.kind = "bitmap"
    source.stats.offloaded = offloaded
    return source


def _exclude(order: PackOrder, bi: BitmapIndex, reach: Reach) -> tuple[bytes, ...]:
    """Take the order's excluded objects out of ``reach``: those it held, in order."""
    out = []
    for oid in sorted(order.exclude):
        rank = bi.rank(oid)
        if rank is not None and reach.test(rank):
            reach.bits = reach.bits & ~(1 << rank)
            out.append(oid)
        elif reach.extra.pop(oid, None) is not None:
            out.append(oid)
    return tuple(out)


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
