"""Closures of tips: every object reachable from given refs, kept across requests.

Objects are immutable, so the objects reachable from given tips never change: a closure is
computed once per set of tips and kept in the process's :class:`ClosureCaches`. With a
bitmapped pack it is a :class:`~.bitmapwalk.Reach` (``object_sets``); without one, an
:class:`IdSet` (``tip_closures``). The want checks (:mod:`.reachability`) and the pack
producer (``packgen``) read them.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence, Set
from dataclasses import dataclass

import numpy as np

from ..store.closurestore import ClosureStore
from ..store.lru import ByteLRU
from ..store.objformat import OBJ_COMMIT, OBJ_TREE, ids_digest
from ..store.registry import PackRegistry
from .bitmapwalk import ALL, COMMITS, Reach
from .commits import CommitSource

__all__ = ["ClosureCaches", "IdSet", "tips_closure", "TIP_TREES", "expand_tips", "walk_until",
           "iter_closure", "CLOSURES_BUDGET"]

CLOSURES_BUDGET = 64 << 20  # bytes of each cache of closures (docs/ARCHITECTURE.md "Caches")


@dataclass(frozen=True)
class ClosureCaches:
    """The closures kept across requests, one cache per type."""

    # (bitmapped pack key, digest of the roots[, level]) -> the closure, bits in pack order
    sets: ByteLRU[Reach]
    # (digest of the tips and the repository's grafts, level) -> the closure's ids
    ids: ByteLRU[IdSet]
    # closures by bitmaps on the local disk, for the next process (store/closurestore.py)
    disk: ClosureStore | None = None

    @classmethod
    def create(cls, registry: PackRegistry, disk: ClosureStore | None = None) -> ClosureCaches:
        """The process's caches, within its --cache-memory; a closure by bitmaps goes when
        its pack does."""
        memory = registry.memory
        return cls(registry.keyed_by_packs(ByteLRU[Reach]("object_sets", CLOSURES_BUDGET,
                                                          parent=memory)),
                   ByteLRU[IdSet]("tip_closures", CLOSURES_BUDGET, parent=memory), disk)


class IdSet:
    """Object ids in a sorted numpy table of fixed-width rows: about ``hash_len`` bytes an
    id where a Python set costs over 100 (a closure of git/git is 849k ids)."""

    __slots__ = ("ids",)

    def __init__(self, oids: Iterable[bytes], hash_len: int) -> None:
        self.ids = np.array(list(oids), dtype=f"S{hash_len}")
        self.ids.sort()

    @property
    def nbytes(self) -> int:
        return int(self.ids.nbytes) + 128

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, oid: object) -> bool:
        if not isinstance(oid, bytes):
            return False
        ids = self.ids
        k = int(np.searchsorted(ids, oid))
        # numpy drops trailing NULs when it hands a row back; ids are all one width, so
        # equal once stripped means equal.
        return k < len(ids) and bool(ids[k] == oid.rstrip(b"\0"))


TIP_TREES = "tip-trees"  # the tips, their commits' trees and what those reach: no history
_CLOSURE_LEVELS = (ALL, COMMITS)


def tips_closure(src: CommitSource, tips: Set[bytes], level: str,
                 cache: ByteLRU[IdSet] | None) -> IdSet:
    """Every object reachable from ``tips`` (``level`` ALL), their commits only (COMMITS),
    or the tips with the whole trees of the tip commits (``TIP_TREES``), kept in
    ``cache`` by the tips: objects are immutable, so the closure of given tips never
    changes (ARCHITECTURE.md I7). A closure of ALL answers the other levels."""
    digest = ids_digest(tips, src.grafts)
    held = (ALL, level) if level != ALL else (ALL,)
    for name in held:
        hit = cache.get(("tips_closure", digest, name)) if cache is not None else None
        if hit is not None:
            return hit
    tip_commits, tip_others = expand_tips(src, tips)
    ids: set[bytes] = set(tip_others)
    commits = tip_commits if level == TIP_TREES else list(walk_until(src, tip_commits, None))
    ids.update(commits)
    if level != COMMITS:
        roots = [src.commit(c).tree for c in commits]
        roots += [o for o in tip_others if src.object_type(o) == OBJ_TREE]
        ids.update(iter_closure(src, roots))
    closure = IdSet(ids, src.odb.hash_len)
    if cache is not None:
        cache.put(("tips_closure", digest, level), closure, closure.nbytes)
    return closure


def walk_until(src: CommitSource, starts: Sequence[bytes], targets: set[bytes] | None) -> set[bytes]:
    """Commits reachable from ``starts``, newest first, stopping once all ``targets`` (when
    given) have been seen: a client's shallow boundary lies near the tips, so a check of it
    costs the commits above it, not the whole history."""
    left = set(targets) if targets is not None else None
    seen: set[bytes] = set()
    heap: list[tuple[int, bytes]] = []

    def meet(oid: bytes) -> None:
        seen.add(oid)
        if left is not None:
            left.discard(oid)
        heapq.heappush(heap, (-src.commit(oid).time, oid))

    for oid in starts:
        if oid not in seen:
            meet(oid)
    while heap and (left is None or left):
        _, oid = heapq.heappop(heap)
        for parent in src.commit(oid).parents:
            if parent not in seen:
                meet(parent)
    return seen


def expand_tips(src: CommitSource, tips: Set[bytes]) -> tuple[list[bytes], set[bytes]]:
    """Commits to walk from, and non-commit objects (tags, trees, blobs) the tips name."""
    commits, others = [], set()
    for tip in tips:
        target, type_num, tags = src.peel(tip)
        others.update(tags)
        if type_num == OBJ_COMMIT:
            commits.append(target)
        else:
            others.add(target)
    return commits, others


def iter_closure(src: CommitSource, roots: Iterable[bytes]) -> Iterator[bytes]:
    """Every tree and blob reachable from the trees ``roots``, each once."""
    seen: set[bytes] = set()
    stack = list(roots)
    while stack:
        tree = stack.pop()
        if tree in seen:
            continue
        seen.add(tree)
        yield tree
        for _, is_tree, oid in src.tree(tree):
            if is_tree:
                if oid not in seen:
                    stack.append(oid)
            elif oid not in seen:
                seen.add(oid)
                yield oid
