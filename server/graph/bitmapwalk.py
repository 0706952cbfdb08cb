"""Object sets from reachability bitmaps: ``wants − haves`` without walking history.

A commit with a bitmap contributes its whole closure in one OR. Commits without one (new
commits, old tags) are walked until they reach bitmapped history, and only the trees those
commits add are read. Objects outside the bitmapped pack (loose, other packs) are kept in
an "extra" set, like git's extended bitmap index.
"""

from __future__ import annotations

import hashlib
import heapq
import struct
from collections.abc import Iterable

from gitspout.protocol.filters import (
    BlobLimit,
    BlobNone,
    FilterSpec,
    ObjectType,
    TreeDepth,
    iter_filter_leaves,
)

from ..store.bitmaps import PackBitmaps, iter_set_bits, load_bitmaps
from ..store.closurestore import ClosureStore
from ..store.lru import ByteLRU
from ..store.objformat import OBJ_BLOB, OBJ_COMMIT, OBJ_TAG, OBJ_TREE, TYPE_NUMS, ids_digest
from ..store.odb import ObjectSnapshot
from ..store.packs import PackFile
from ..store.revindex import facts_name
from .commits import CommitInfo, CommitSource
from .treewalk import TreeDiffWalk

_TreeRoot = tuple[bytes, bytes | None, bytes | None, bytes | None]
"""(tree, the commit it is the root of, that commit's first parent, the parent's tree)."""

__all__ = ["BitmapIndex", "Reach", "ReachSet", "open_bitmap_index", "bitmap_filter_supported",
           "filter_walk_level", "ALL", "TREES", "COMMITS"]

# What a closure holds of the commits no bitmap covers: their trees and blobs, their trees
# only, or neither (the roots themselves are always in, and so is everything under a
# bitmapped commit). A filter that drops those objects anyway needs no more
# (:func:`filter_walk_level`); checking a want (reachability.py) needs ALL.
ALL, TREES, COMMITS = "all", "trees", "commits"
_LEVELS = (ALL, TREES, COMMITS)  # each answers the ones after it
ROOTS = "roots"  # the roots of a stored closure: a base for the next ref state
_BASES = 8  # stored root sets considered for a base
_TRIES = 2  # of those, tried in turn when a base's roots are not all reached
_TOUCH_EVERY = 30.0  # seconds: a roots record used from memory is touched at most so often
_DIGEST = 32  # bytes of an ids_digest
_U64 = struct.Struct(">Q")


class Reach:
    """Objects reachable from some roots: pack bits plus ``extra`` (oid -> type) outside it.

    Bulk ORs work on a Python int; single-bit tests and sets work on a bytearray view, so
    neither costs a copy of the whole bitmap per object.
    """

    def __init__(self, nbits: int) -> None:
        self.nbytes = (nbits + 7) // 8 or 1
        self._int = 0
        self._buf: bytearray | None = None
        self._int_stale = False
        self.extra: dict[bytes, int] = {}
        self.hints: dict[bytes, bytes] = {}  # new object -> object at its path in the parent

    @property
    def bits(self) -> int:
        if self._int_stale:
            assert self._buf is not None
            self._int = int.from_bytes(self._buf, "little")
            self._int_stale = False
        return self._int

    @bits.setter
    def bits(self, value: int) -> None:
        self._int = value
        self._buf = None
        self._int_stale = False

    def _view(self) -> bytearray:
        if self._buf is None:
            self._buf = bytearray(self._int.to_bytes(self.nbytes, "little"))
        return self._buf

    def test(self, rank: int) -> bool:
        return bool(self._view()[rank >> 3] >> (rank & 7) & 1)

    def add_rank(self, rank: int) -> bool:
        """Set bit ``rank``; False when it was set already (a test and a set in one)."""
        view = self._view()
        bit = 1 << (rank & 7)
        if view[rank >> 3] & bit:
            return False
        view[rank >> 3] |= bit
        self._int_stale = True
        return True

    def set(self, rank: int) -> None:
        self._view()[rank >> 3] |= 1 << (rank & 7)
        self._int_stale = True

    def to_bytes(self) -> bytes:
        """The closure as the closure store keeps it: the bits, then the extras (id,
        type) and the hints (id, base), ids of one width."""
        parts = [_U64.pack(self.nbytes), self.bits.to_bytes(self.nbytes, "little"),
                 _U64.pack(len(self.extra))]
        parts += [oid + bytes((type_num,)) for oid, type_num in self.extra.items()]
        parts.append(_U64.pack(len(self.hints)))
        parts += [oid + base for oid, base in self.hints.items()]
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes, nbits: int, hash_len: int) -> Reach | None:
        """The closure :meth:`to_bytes` wrote, for a pack of ``nbits`` entries; None when
        ``data`` is not one."""
        reach = cls(nbits)
        try:
            (nbytes,) = _U64.unpack_from(data, 0)
            if nbytes != reach.nbytes:
                return None
            at = 8 + nbytes
            reach.bits = int.from_bytes(data[8:at], "little")
            (n,) = _U64.unpack_from(data, at)
            at += 8
            width = hash_len + 1
            for k in range(at, at + n * width, width):
                reach.extra[data[k:k + hash_len]] = data[k + hash_len]
            at += n * width
            (n,) = _U64.unpack_from(data, at)
            at += 8
            width = 2 * hash_len
            for k in range(at, at + n * width, width):
                reach.hints[data[k:k + hash_len]] = data[k + hash_len:k + width]
            at += n * width
        except (struct.error, IndexError):
            return None
        if at != len(data) or reach.bits >> nbits:
            return None
        return reach

    def copy(self) -> Reach:
        other = Reach(0)
        other.nbytes = self.nbytes
        other.bits = self.bits
        other.extra = dict(self.extra)
        other.hints = dict(self.hints)
        return other


class _Met:
    """What a walk from new roots met of an earlier closure (:meth:`BitmapIndex._reach`):
    ids, the bitmaps it OR-ed, and the roots it found in the closure."""

    __slots__ = ("ids", "bits", "held")

    def __init__(self) -> None:
        self.ids: set[bytes] = set()
        self.bits = 0
        self.held: list[bytes] = []  # roots found in the base, not walked


class BitmapIndex:
    """One request's use of the bitmapped pack."""

    def __init__(self, src: CommitSource, pack: PackFile, bitmaps: PackBitmaps) -> None:
        self.src = src
        self.pack = pack
        self.bm = bitmaps

    def rank(self, oid: bytes) -> int | None:
        pos = self.pack.find(oid)
        return None if pos < 0 else self.pack.rank_of_index_pos(pos)

    # -- closure ---------------------------------------------------------------

    def new_reach(self) -> Reach:
        return Reach(self.pack.count)

    def lookup(self, reach: Reach, oid: bytes) -> tuple[bool, int | None]:
        """Is ``oid`` in ``reach``, and its rank in the bitmapped pack (None outside it)."""
        rank = self.rank(oid)
        if rank is not None:
            return reach.test(rank), rank
        return oid in reach.extra, None

    def has(self, reach: Reach, oid: bytes) -> bool:
        """True when ``oid`` is in ``reach`` (in the bitmapped pack or among its extras)."""
        return self.lookup(reach, oid)[0]

    def add(self, reach: Reach, oid: bytes, rank: int | None, type_num: int) -> None:
        """Put ``oid`` (of pack rank ``rank``, as :meth:`lookup` found) in ``reach``."""
        if rank is not None:
            reach.set(rank)
        else:
            reach.extra[oid] = type_num

    def reach_cached(self, roots: Iterable[bytes], cache: ByteLRU[Reach],
                     level: str = ALL, disk: ClosureStore | None = None) -> Reach:
        """:meth:`reach`, remembered across requests by (pack, roots, level): a clone storm
        on one ref state computes its object set once. Packs never change, so the key is
        exact. A closure of a fuller level answers a request for a lesser one. With
        ``disk``, a closure not in memory is read from the closure store, where a
        previous process left it, before it is walked, and one walked is left there with
        its roots. After a push none of them is exact: the closure of an earlier ref state
        is the base of the walk, when its roots are all reachable from the new ones
        (:meth:`_reach_from_stored`)."""
        roots = list(roots)
        digest = ids_digest(roots)
        hit = self._cached(cache, digest, level)
        if hit is not None:
            if disk is not None:  # a hot state stays a candidate base (_BASES)
                disk.touch(*self._disk_key(digest, ROOTS)[:2], every=_TOUCH_EVERY)
            return hit.copy()
        fuller = (level, *reversed(_LEVELS[: _LEVELS.index(level)]))
        hit = self.load_stored(disk, digest, fuller) if disk is not None else None
        if hit is not None and disk is not None:
            disk.touch(*self._disk_key(digest, ROOTS)[:2])
        if hit is None:
            if disk is not None:
                hit = self._reach_from_stored(roots, level, fuller, cache, disk)
            if hit is None:
                hit = self.reach(roots, level=level)
            if disk is not None:
                self.save_stored(disk, digest, level, hit)
                self._save_roots(disk, digest, roots)
        key: tuple[object, ...] = (self.pack.key, digest)
        cache.put(key if level == ALL else (*key, level), hit, hit.nbytes + 64 * len(hit.extra))
        return hit.copy()

    def _cached(self, cache: ByteLRU[Reach], digest: bytes, level: str) -> Reach | None:
        """The closure of the roots named by ``digest`` at ``level`` or a fuller one, if
        this process holds it (not a copy)."""
        key: tuple[object, ...] = (self.pack.key, digest)
        for held in _LEVELS[: _LEVELS.index(level) + 1]:
            hit = cache.get(key if held == ALL else (*key, held))
            if hit is not None:
                return hit
        return None

    def _reach_from_stored(self, roots: list[bytes], level: str, fuller: tuple[str, ...],
                           cache: ByteLRU[Reach], disk: ClosureStore) -> Reach | None:
        """The closure of ``roots`` walked from the stored closure of an earlier ref state of
        the same pack, or None when there is no fit one.

        Of the last :data:`_BASES` root sets stored that are at most about twice as large
        as ``roots`` (a small fetch does not read a mirror's every ref), the one that
        leaves the fewest new roots to walk is tried first (then the one with the fewest
        roots that ``roots`` lack, then the newest), from memory or the disk: after a
        push, the previous state of all the refs, rather than one tag's. Its closure is
        exact for the new roots only when every one of its roots is reachable from them:
        the walk then stops where it meets the base, which is closed downwards. A root
        deleted, force-pushed away or newly hidden would bring in what the new refs no
        longer reach, so the walk checks that it met each old root, or OR-ed a bitmap
        holding it, before any tree is read. When one is not met, the next candidate is
        tried (at most :data:`_TRIES`: an older state may predate the branch that went),
        and then the closure is walked whole (the caller does)."""
        scope = self._scope()
        prefix = f"{self.pack.checksum.hex()[:16]}-{ROOTS}-"
        new = set(roots)
        # a record's bytes: its header and identity (< 512), the digest, the ids
        largest = 512 + _DIGEST + self.pack.hash_len * (2 * len(new) + 16)
        found: list[tuple[int, int, int, bytes, set[bytes]]] = []
        for order, name in enumerate(disk.recent(scope, prefix, _BASES, largest)):
            stored = self._load_roots(disk, scope, name)
            if stored is not None:
                digest, old = stored
                found.append((len(new - old), len(old - new), order, digest, old))
        tries = _TRIES
        for *_, digest, old in sorted(found):
            held = self._cached(cache, digest, level)
            base = (held.copy() if held is not None
                    else self._load_kinds(disk, digest, fuller, count=False))
            if base is None:
                continue  # its closure was evicted: the next best
            reach = self._reach(roots, base, level, old - new)
            if reach is not None:
                disk.count("based")
                return reach
            tries -= 1
            if not tries:
                break
        return None

    def delta_facts(self, disk: ClosureStore | None) -> tuple[bool, int]:
        """The bitmapped pack's delta facts (``PackFile.delta_facts``), kept in the
        closure store beside its closures, and swept with them once it is replaced;
        touched as used (at most every _TOUCH_EVERY seconds), as a closure served from
        memory is, so that a busy repository's are not the first evicted."""
        scope = self._scope()
        facts = self.pack.delta_facts(disk, scope)
        if disk is not None:
            disk.touch(scope, facts_name(self.pack), every=_TOUCH_EVERY)
        return facts

    def _scope(self) -> str:
        """The closure store's scope of this repository: its objects directory, so that
        the files of a pack replaced there can be found and removed."""
        return hashlib.sha256(self.src.odb.objects_dir.encode()).hexdigest()[:20]

    def _disk_key(self, digest: bytes, kind: str) -> tuple[str, str, bytes]:
        """(scope, name, identity) of a closure in the closure store. A closure of given
        roots (or a filtered one of a pack order) is a function of immutable objects;
        only where its bits stand depends on the bitmapped pack, so the pack's checksum
        and size pin it down with the roots (objects outside the pack are kept by id)."""
        pack = self.pack
        name = f"{pack.checksum.hex()[:16]}-{kind}-{digest.hex()[:40]}"
        identity = b"|".join((pack.checksum, str(pack.count).encode(), kind.encode(), digest))
        return self._scope(), name, identity

    def _roots_identity(self, name: str) -> bytes:
        pack = self.pack
        return b"|".join((pack.checksum, str(pack.count).encode(), ROOTS.encode(),
                          name.rsplit("-", 1)[1].encode()))

    def _save_roots(self, disk: ClosureStore, digest: bytes, roots: list[bytes]) -> None:
        """Leave the roots of the closure named by ``digest`` in the closure store: the
        full digest, then the ids, sorted."""
        scope, name, _ = self._disk_key(digest, ROOTS)
        disk.save(scope, name, self._roots_identity(name), digest + b"".join(sorted(set(roots))))

    def _load_roots(self, disk: ClosureStore, scope: str, name: str
                    ) -> tuple[bytes, set[bytes]] | None:
        """(digest, roots) of a roots record; None when it is not one of this pack's."""
        data = disk.load(scope, name, self._roots_identity(name), count_miss=False,
                         count_hit=False)
        if data is None:
            return None
        width = self.pack.hash_len
        # The store checked the bytes; this checks that they are roots, and whose.
        if (len(data) < _DIGEST or (len(data) - _DIGEST) % width
                or data[:_DIGEST].hex()[:40] != name.rsplit("-", 1)[1]):
            disk.refuse(scope, name)
            return None
        return data[:_DIGEST], {data[k:k + width] for k in range(_DIGEST, len(data), width)}

    def _load_kinds(self, disk: ClosureStore, digest: bytes, kinds: Iterable[str],
                    count: bool = True) -> Reach | None:
        """The first of ``kinds`` of the closure named by ``digest`` that the closure
        store has (no miss counted; a load only with ``count``)."""
        for kind in kinds:
            scope, name, identity = self._disk_key(digest, kind)
            data = disk.load(scope, name, identity, count_miss=False, count_hit=False)
            if data is None:
                continue
            found = Reach.from_bytes(data, self.pack.count, self.pack.hash_len)
            if found is None:  # whole, but not a closure of this pack: removed
                disk.refuse(scope, name)
            else:
                if count:
                    disk.accept(scope, name)
                return found
        return None

    def load_stored(self, disk: ClosureStore, digest: bytes, kinds: Iterable[str]
                    ) -> Reach | None:
        """The first of ``kinds`` of the closure named by ``digest`` that the closure
        store has; one miss counted when it has none (the walk that follows), and the
        files of packs this repository no longer uses removed."""
        found = self._load_kinds(disk, digest, kinds)
        if found is None:
            disk.count("missed")
            disk.sweep(self._scope(), self.pack.checksum.hex()[:16])
        return found

    def save_stored(self, disk: ClosureStore, digest: bytes, kind: str, reach: Reach) -> None:
        """Leave ``reach`` in the closure store for the next process (written later)."""
        disk.save(*self._disk_key(digest, kind), reach.to_bytes())

    def reach(self, roots: Iterable[bytes], level: str = ALL) -> Reach:
        """Everything reachable from ``roots`` (binary ids of any type), down to ``level``
        for the commits outside the bitmaps. Their trees are the slowest part of a cold
        closure: a filter that drops them, or their blobs (:func:`filter_walk_level`), is
        answered without looking them up."""
        reach = self._reach(roots, self.new_reach(), level, None)
        assert reach is not None  # nothing to check
        return reach

    def _reach(self, roots: Iterable[bytes], reach: Reach, level: str,
               check: set[bytes] | None) -> Reach | None:
        """:meth:`reach` into ``reach``; with ``check``, ``reach`` is a base closure and
        the result None when an object of ``check`` was not met on the way
        (:meth:`_reach_from_stored`)."""
        met = _Met() if check is not None else None
        commits: list[bytes] = []
        roots_t: list[_TreeRoot] = []
        for root in roots:
            if met is not None:
                met.ids.add(root)
                if self.lookup(reach, root)[0]:
                    met.held.append(root)  # in the base, and so is all it reaches
                    continue
            target, type_num, tags = self.src.peel(root)
            if met is not None:
                met.ids.add(target)
                met.ids.update(tags)
            for tag in tags:
                seen, rank = self.lookup(reach, tag)
                if not seen:
                    self.add(reach, tag, rank, OBJ_TAG)
            if type_num == OBJ_COMMIT:
                commits.append(target)
            elif type_num == OBJ_TREE:
                roots_t.append((target, None, None, None))
            else:
                seen, rank = self.lookup(reach, target)
                if not seen:
                    self.add(reach, target, rank, type_num)
        walked = self._walk_commits(reach, commits, met)
        if met is not None and check and not self._all_met(check, met):
            return None
        if level == COMMITS:
            for tree, _, _, _ in roots_t:
                seen, rank = self.lookup(reach, tree)
                if not seen:
                    self.add(reach, tree, rank, OBJ_TREE)
            return reach
        roots_t.extend(walked)
        self._walk_trees(reach, roots_t, blobs=level == ALL)
        return reach

    def _all_met(self, check: set[bytes], met: _Met) -> bool:
        """True when every object of ``check`` was met by the walk, or is in a bitmap it
        OR-ed: reachable from its roots. The roots found in the base were not walked:
        what they peel to and their bitmaps are looked at only if the walk's own do not
        account for every object, and then, for those with no bitmap, their commits'
        history down to the bitmaps (commits only: a branch fast-forwarded into another
        and deleted leaves an old root below a held one)."""
        left = [oid for oid in check if oid not in met.ids]
        if not left:
            return True
        bits = met.bits
        unmapped: list[bytes] = []
        for root in met.held:
            target, type_num, tags = self.src.peel(root)
            met.ids.add(target)
            met.ids.update(tags)
            pos = self.pack.find(target)
            closure = self.bm.bitmap_at(pos) if pos >= 0 else None
            if closure is not None:
                bits |= closure
            elif type_num == OBJ_COMMIT:
                unmapped.append(target)
        left = self._unmet(left, met.ids, bits, {})
        if not left or not unmapped:
            return not left
        below = self.new_reach()  # everything in it is reachable from a held root
        self._walk_commits(below, unmapped)
        return not self._unmet(left, met.ids, bits | below.bits, below.extra)

    def _unmet(self, oids: list[bytes], ids: set[bytes], bits: int, extra: dict[bytes, int]
               ) -> list[bytes]:
        """Those of ``oids`` neither in ``ids`` or ``extra`` nor at a rank set in ``bits``."""
        view = bits.to_bytes(self.new_reach().nbytes, "little")
        out = []
        for oid in oids:
            if oid in ids or oid in extra:
                continue
            rank = self.rank(oid)
            if rank is None or not view[rank >> 3] >> (rank & 7) & 1:
                out.append(oid)
        return out

    def _walk_commits(self, reach: Reach, start: list[bytes], met: _Met | None = None
                      ) -> list[_TreeRoot]:
        """OR in bitmaps where they exist; walk the rest, newest first.

        Roots with bitmaps go first, then a date-ordered walk: recent history reaches a
        bitmapped commit within a few steps and its closure covers the older roots (old
        tags), which are then skipped instead of walked. Returns the walked commits'
        (tree, commit, first parent), newest first, for :meth:`_walk_trees`.

        A commit is looked up in the pack once, when it is first met (a root, or a
        parent): one already in the closure is dropped there, before its date is read,
        and the others carry their index position through the heap. Most roots of a
        mirror clone (merged pull-request heads) and most parents at the edge of the
        walk are in a bitmap's closure by then (docs/ARCHITECTURE.md, "Cold path").
        With ``met``, the bitmaps OR-ed and the parents found in the closure are noted
        there (:meth:`_reach_from_stored`).
        """
        bm = self.bm
        commit, base_tree = self.src.commit, self.src.first_parent_tree
        infos: dict[bytes, CommitInfo] = {}  # commits pushed: their date, then their walk

        pack = self.pack
        find, rank_of, bitmap_at = pack.find, pack.rank_of_index_pos, bm.bitmap_at
        extra = reach.extra
        closures = 0
        rest: list[tuple[bytes, int]] = []
        for oid in start:
            pos = find(oid)
            closure = bitmap_at(pos) if pos >= 0 else None
            if closure is not None:
                closures |= closure
            else:
                rest.append((oid, pos))
        if closures:
            reach.bits = reach.bits | closures
        met_ids = met.ids if met is not None else None
        if met is not None:
            met.bits |= closures
        heap: list[tuple[int, bytes, int]] = []
        test = reach.test
        for oid, pos in rest:
            if (test(rank_of(pos)) if pos >= 0 else oid in extra):
                continue
            root = infos[oid] = commit(oid)
            heap.append((-root.time, oid, pos))
        heapq.heapify(heap)
        push, pop = heapq.heappush, heapq.heappop
        trees: list[_TreeRoot] = []
        while heap:
            _, oid, pos = pop(heap)
            rank = rank_of(pos) if pos >= 0 else None
            if reach.test(rank) if rank is not None else oid in extra:
                continue  # met twice, or covered by a bitmap since it was pushed
            if rank is not None:
                closure = bitmap_at(pos)
                if closure is not None:
                    reach.bits = reach.bits | closure
                    if met is not None:
                        met.bits |= closure
                    continue
            self.add(reach, oid, rank, OBJ_COMMIT)
            found = infos[oid]  # every commit in the heap was read when pushed
            parents = found.parents
            for parent in parents:
                ppos = find(parent)
                if reach.test(rank_of(ppos)) if ppos >= 0 else parent in extra:
                    if met_ids is not None:
                        met_ids.add(parent)
                    continue
                known = infos.get(parent)
                if known is None:
                    known = infos[parent] = commit(parent)
                push(heap, (-known.time, parent, ppos))
            if not parents:
                trees.append((found.tree, oid, None, None))
                continue
            first = parents[0]
            base = infos.get(first)
            ftree = base.tree if base is not None else base_tree(oid, found)
            trees.append((found.tree, oid, first, ftree))
        return trees

    def _walk_trees(self, reach: Reach, roots: list[_TreeRoot], blobs: bool = True) -> None:
        """Walk the trees of walked commits, oldest first. A commit's tree is diffed
        against its first parent's only when everything that tree reaches is already in
        the closure: the parent came from a bitmap, or its own walk is done. Otherwise an
        object both share could be skipped on both sides and never sent. Without
        ``blobs``, the blobs the trees name are not looked up."""
        pending = {commit for _, commit, _, _ in roots if commit is not None}
        done: set[bytes] = set()
        walker = _ReachWalk(self, reach) if blobs else _TreeReachWalk(self, reach)
        for tree, commit, parent, parent_tree in reversed(roots):
            base = None
            if parent is not None and (parent not in pending or parent in done):
                base = parent_tree
            walker.walk(tree, base)
            if commit is not None:
                done.add(commit)

    # -- filters -------------------------------------------------------------------

    def apply_filter(self, reach: Reach, spec: FilterSpec | None, wants: Iterable[bytes]) -> None:
        """Drop what ``spec`` filters out of ``reach``, as git's ``filter_bitmap`` does
        (pack-bitmap.c): whole types are masked with the type bitmaps, blob sizes read from
        the entry headers (for a delta, the result size its delta header gives). The tips
        (each want, the tags its chain passes and the object it peels to) are never
        filtered, as the walk never filters what the client named; a tip the client has
        (cut by its haves) stays cut. ``combine:`` applies its filters one after another,
        with the same tips."""
        if spec is None:
            return
        tips, tip_extra = self._tips(reach, wants)
        for leaf in iter_filter_leaves(spec):
            self._apply_leaf(reach, leaf, tips, tip_extra)

    def _tips(self, reach: Reach, wants: Iterable[bytes]) -> tuple[int, set[bytes]]:
        """The tips as pack bits, and those outside the bitmapped pack. A want's type comes
        from the type bitmaps; only tags are read (to peel them)."""
        tags = self.bm.tags
        marks = bytearray(reach.nbytes)
        extra: set[bytes] = set()

        def mark(oid: bytes, rank: int | None) -> None:
            if rank is None:
                extra.add(oid)
            else:
                marks[rank >> 3] |= 1 << (rank & 7)

        for oid in dict.fromkeys(wants):
            rank = self.rank(oid)
            mark(oid, rank)
            if (tags >> rank & 1) if rank is not None else reach.extra.get(oid) == OBJ_TAG:
                target, _, chain = self.src.peel(oid)
                for t in chain[1:] + [target]:
                    mark(t, self.rank(t))
        return int.from_bytes(marks, "little"), extra

    def _apply_leaf(self, reach: Reach, spec: FilterSpec, tips: int, tip_extra: set[bytes]) -> None:
        bm = self.bm
        if isinstance(spec, BlobLimit):
            self._drop_large_blobs(reach, spec.limit, tips, tip_extra)
            return
        if isinstance(spec, BlobNone):
            drop = {OBJ_BLOB}
        elif isinstance(spec, TreeDepth) and spec.depth == 0:
            drop = {OBJ_BLOB, OBJ_TREE}
        elif isinstance(spec, ObjectType):
            drop = {OBJ_COMMIT, OBJ_TREE, OBJ_BLOB, OBJ_TAG} - {TYPE_NUMS[spec.type_name.encode()]}
        else:
            raise ValueError(f"filter {spec!r} is not done with bitmaps")
        masks = {OBJ_COMMIT: bm.commits, OBJ_TREE: bm.trees, OBJ_BLOB: bm.blobs, OBJ_TAG: bm.tags}
        mask = 0
        for t in drop:
            mask |= masks[t]
        reach.bits = reach.bits & ~(mask & ~tips)
        for oid in [o for o, t in reach.extra.items() if t in drop and o not in tip_extra]:
            del reach.extra[oid]

    def _drop_large_blobs(self, reach: Reach, limit: int, tips: int, tip_extra: set[bytes]) -> None:
        odb: ObjectSnapshot = self.src.odb
        pack = self.pack
        offs = pack.sorted_offsets
        big = bytearray(reach.nbytes)
        for rank in iter_set_bits(reach.bits & self.bm.blobs & ~tips, pack.count):
            if odb.packed_object_size(pack, offs[rank]) >= limit:
                big[rank >> 3] |= 1 << (rank & 7)
        reach.bits = reach.bits & ~int.from_bytes(big, "little")
        for oid in [o for o, t in reach.extra.items() if t == OBJ_BLOB and o not in tip_extra]:
            found = odb.object_size(oid)
            if found is None or found[1] >= limit:
                del reach.extra[oid]


class _ReachWalk(TreeDiffWalk):
    """Adds the trees and blobs of walked commits to a closure. The base tree of a commit
    is in the closure already (see :meth:`BitmapIndex._walk_trees`). A tree it adds is
    read from where its lookup found it (``at``)."""

    def __init__(self, bi: BitmapIndex, reach: Reach) -> None:
        self.src = bi.src
        self.reach = reach
        self._pack = bi.pack
        self._find = bi.pack.find
        self._rank_of = bi.pack.rank_of_index_pos

    def _met(self, oid: bytes, base: bytes | None, type_num: int) -> bool:
        """Add ``oid`` unless the closure has it; True when it was added. An object outside
        the bitmapped pack keeps its base as a delta hint."""
        reach = self.reach
        pos = self._find(oid)
        if pos >= 0:
            if not reach.add_rank(self._rank_of(pos)):
                return False
            self.at = (self._pack, pos)
            return True
        self.at = None
        if oid in reach.extra:
            return False
        reach.extra[oid] = type_num
        if base is not None:
            reach.hints[oid] = base
        return True

    def enter(self, tree: bytes, base: bytes | None, depth: int) -> bool:
        return self._met(tree, base, OBJ_TREE)

    def blob(self, oid: bytes, base: bytes | None, depth: int) -> None:
        self._met(oid, base, OBJ_BLOB)


class _TreeReachWalk(_ReachWalk):
    """A :class:`_ReachWalk` that leaves blobs out (level :data:`TREES`)."""

    def blob(self, oid: bytes, base: bytes | None, depth: int) -> None:
        pass


class ReachSet:
    """A closure as include-tag sees it (``reachability.ObjectSet``)."""

    def __init__(self, bi: BitmapIndex, reach: Reach) -> None:
        self.bi = bi
        self.reach = reach

    def __contains__(self, oid: object) -> bool:
        return isinstance(oid, bytes) and self.bi.has(self.reach, oid)

    def add(self, oid: bytes, type_num: int) -> None:
        self.bi.add(self.reach, oid, self.bi.rank(oid), type_num)


def filter_walk_level(spec: FilterSpec | None) -> str:
    """How much of the commits outside the bitmaps a closure for ``spec`` needs: COMMITS
    when it drops every tree and blob but the tips (tree:0, object:type=commit or tag),
    TREES when it drops every blob but the tips (blob:none, blob:limit=0,
    object:type=tree), ALL otherwise; a combine: needs the least any of its filters does,
    since they apply one after another."""
    if spec is None:
        return ALL
    level = ALL
    for leaf in iter_filter_leaves(spec):
        if ((isinstance(leaf, TreeDepth) and leaf.depth == 0)
                or (isinstance(leaf, ObjectType) and leaf.type_name in ("commit", "tag"))):
            return COMMITS
        if (isinstance(leaf, BlobNone) or (isinstance(leaf, BlobLimit) and leaf.limit == 0)
                or (isinstance(leaf, ObjectType) and leaf.type_name == "tree")):
            level = TREES
    return level


def bitmap_filter_supported(spec: FilterSpec | None) -> bool:
    """Filters git's pack-bitmap.c also answers from bitmaps (``can_filter_bitmap``):
    blob:none, blob:limit, tree:0, object:type, and a combine: of those only."""
    if spec is None:
        return True
    return all(isinstance(leaf, (BlobNone, BlobLimit, ObjectType))
               or (isinstance(leaf, TreeDepth) and leaf.depth == 0)
               for leaf in iter_filter_leaves(spec))


def open_bitmap_index(src: CommitSource) -> BitmapIndex | None:
    """The bitmap index of the first pack that has a usable ``.bitmap``. None in a shallow
    repository: a bitmap reaches past its shallow commits (pack-objects does without
    bitmaps there too)."""
    if src.grafts:
        return None
    for pack in src.odb.packs:
        bitmaps = load_bitmaps(pack)
        if bitmaps is not None:
            return BitmapIndex(src, pack, bitmaps)
    return None
