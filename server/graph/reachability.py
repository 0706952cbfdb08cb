"""Which objects a fetch may have and must get (ARCHITECTURE.md I7).

* :func:`check_wants`: every want must be reachable from a visible ref (gitprotocol-pack,
  ARCHITECTURE.md P7). Objects reachable only from hidden refs are never served.
* :func:`reachable_subset`: which of a batch of ids are reachable from the visible refs,
  in one walk for the whole batch (object-info, client shallow lines).
* :func:`enumerate_objects`: ``rev-list --objects wants --not haves`` with shallow cuts,
  object filters and include-tag, as an ordered list of (binary id, type number).
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Container, Iterable, Iterator, Sequence, Set
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from gitspout.protocol.filters import (
    BlobLimit,
    BlobNone,
    Combine,
    FilterSpec,
    ObjectType,
    TreeDepth,
)

from ..store.lru import ByteLRU
from ..store.objformat import OBJ_BLOB, OBJ_COMMIT, OBJ_TAG, OBJ_TREE, TYPE_NAMES
from .bitmapwalk import ALL, COMMITS, open_bitmap_index
from .commits import CommitSource
from .treewalk import TreeDiffWalk

__all__ = ["check_wants", "tips_closure", "IdSet", "reachable_subset", "enumerate_objects",
           "Enumeration", "ObjectEntry", "ObjectSet", "include_tags"]

ObjectEntry = tuple[bytes, int]


def check_wants(
    src: CommitSource, wants: Iterable[bytes], tips: Iterable[bytes],
    cache: ByteLRU[object] | None = None,
) -> bytes | None:
    """Return the first want not reachable from ``tips`` (None when all are).

    Tips and their peeled targets are accepted at once. The others are looked up in the
    closure of the tips, kept in ``cache`` across requests (the objects reachable from
    given tips never change): through the bitmaps when the repository has them, else as a
    sorted table of ids (:class:`IdSet`). Commits need the commits' closure only; trees and
    blobs (partial-clone lazy fetches) first the closure of the tips' own trees, where a
    checkout's blobs are, and the whole history's only for what that lacks: a checkout
    after a blobless clone walked every tree of the history, per request.
    """
    tip_set: Set[bytes] = tips if isinstance(tips, (set, frozenset)) else set(tips)
    pending = [w for w in dict.fromkeys(wants) if w not in tip_set]
    if not pending:
        return None
    missing = [w for w in pending if src.odb.locate(w, needed=True) is None]
    if missing:
        return missing[0]
    trees = any(src.object_type(w) != OBJ_COMMIT for w in pending)
    bi = open_bitmap_index(src) if cache is not None else None
    if bi is not None:
        reach = bi.reach_cached(tip_set, cache, level=ALL if trees else COMMITS)  # type: ignore[arg-type]
        return next((w for w in pending if not bi.has(reach, w)), None)
    if trees:
        at_tips = tips_closure(src, tip_set, _TIP_TREES, cache)
        pending = [w for w in pending if w not in at_tips]
        if not pending:
            return None
    closure = tips_closure(src, tip_set, ALL if trees else COMMITS, cache)
    return next((w for w in pending if w not in closure), None)


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


_TIP_TREES = "tip-trees"  # the tips, their commits' trees and what those reach: no history
_CLOSURE_LEVELS = (ALL, COMMITS)


def tips_closure(src: CommitSource, tips: Set[bytes], level: str,
                 cache: ByteLRU[object] | None) -> IdSet:
    """Every object reachable from ``tips`` (``level`` ALL), their commits only (COMMITS),
    or the tips with the whole trees of the tip commits (``_TIP_TREES``), kept in
    ``cache`` by the tips: objects are immutable, so the closure of given tips never
    changes (ARCHITECTURE.md I7). A closure of ALL answers the other levels."""
    digest = hashlib.sha1(b"".join(sorted(tips)) + b"g" + b"".join(sorted(src.grafts))).digest()
    held = (ALL, level) if level != ALL else (ALL,)
    for name in held:
        hit = cache.get(("tips_closure", digest, name)) if cache is not None else None
        if isinstance(hit, IdSet):
            return hit
    tip_commits, tip_others = _expand_tips(src, tips)
    ids: set[bytes] = set(tip_others)
    commits = tip_commits if level == _TIP_TREES else list(_walk_until(src, tip_commits, None))
    ids.update(commits)
    if level != COMMITS:
        roots = [src.commit(c).tree for c in commits]
        roots += [o for o in tip_others if src.object_type(o) == OBJ_TREE]
        ids.update(_iter_closure(src, roots))
    closure = IdSet(ids, src.odb.hash_len)
    if cache is not None:
        cache.put(("tips_closure", digest, level), closure, closure.nbytes)
    return closure


def reachable_subset(
    src: CommitSource,
    oids: Iterable[bytes],
    tips: Iterable[bytes],
    cache: ByteLRU[object] | None = None,
) -> set[bytes]:
    """The ids of ``oids`` that exist and are reachable from ``tips``.

    One walk answers the whole batch, whatever its size: asking :func:`check_wants` once per
    id walked all history per id (2,000 object-info ids took minutes). With a bitmapped
    pack the closure of the tips is a few ORs (kept in ``cache`` across requests, keyed by
    the pack and the tips); otherwise one date-ordered commit walk (commit-graph backed
    when there is one), and a walk of the trees only when ids other than commits and tags
    remain to be found.
    """
    tip_set = set(tips)
    wanted = {o for o in oids if src.odb.contains(o)}
    found = wanted & tip_set
    pending = wanted - found
    if not pending:
        return found
    bi = open_bitmap_index(src)
    if bi is not None:
        reach = bi.reach_cached(tip_set, cache) if cache is not None else bi.reach(tip_set)  # type: ignore[arg-type]
        found.update(o for o in pending if bi.has(reach, o))
        return found
    commits: set[bytes] = set()
    others: set[bytes] = set()
    for oid in pending:
        (commits if src.object_type(oid) == OBJ_COMMIT else others).add(oid)
    tip_commits, tip_others = _expand_tips(src, tip_set)
    found.update(others & tip_others)  # tags (only refs reach them), trees and blobs at tips
    others -= tip_others
    others = {o for o in others if src.object_type(o) != OBJ_TAG}  # no tree or commit names a tag
    # Trees and blobs need every reachable commit; commits alone can stop early (a client's
    # shallow boundary lies near the tips).
    walked = _walk_until(src, tip_commits, commits if not others else None)
    found.update(commits & walked)
    if others:
        found.update(others - _find_in_trees(src, list(walked), tip_others, set(others)))
    return found


def _walk_until(src: CommitSource, starts: Sequence[bytes], targets: set[bytes] | None) -> set[bytes]:
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


def _expand_tips(src: CommitSource, tips: Set[bytes]) -> tuple[list[bytes], set[bytes]]:
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


def _iter_closure(src: CommitSource, roots: Iterable[bytes]) -> Iterator[bytes]:
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


def _find_in_trees(
    src: CommitSource, commits: Sequence[bytes], roots: set[bytes], wanted: set[bytes]
) -> set[bytes]:
    """The objects of ``wanted`` that the trees of ``commits`` (and tree ``roots``) lack."""
    trees = [src.commit(c).tree for c in commits]
    trees += [r for r in roots if src.object_type(r) == OBJ_TREE]
    for oid in _iter_closure(src, trees):
        wanted.discard(oid)
        if not wanted:
            break
    return wanted


# ---------------------------------------------------------------- filters


BLOB_SIZE_ENTRIES = 1 << 20  # sizes of blobs met by one walk (docs/ARCHITECTURE.md, "Caches")


@dataclass
class _Filter:
    """Evaluates a filter spec for an object at a depth below its root tree."""

    spec: FilterSpec | None
    src: CommitSource
    sizes: ByteLRU[int] = field(default_factory=lambda: ByteLRU(
        "blob_sizes", BLOB_SIZE_ENTRIES, unit="entries", shared=False))

    def _blob_size(self, oid: bytes) -> int:
        size = self.sizes.get(oid)
        if size is None:
            found = self.src.odb.object_size(oid)
            size = found[1] if found else 0
            self.sizes.put(oid, size)
        return size

    def _leaf(self, spec: FilterSpec, oid: bytes, type_num: int, depth: int) -> tuple[bool, bool]:
        if isinstance(spec, BlobNone):
            return type_num != OBJ_BLOB, True
        if isinstance(spec, BlobLimit):
            return type_num != OBJ_BLOB or self._blob_size(oid) < spec.limit, True
        if isinstance(spec, TreeDepth):
            if type_num in (OBJ_TREE, OBJ_BLOB):
                return depth < spec.depth, depth < spec.depth
            return True, True
        if isinstance(spec, ObjectType):
            return TYPE_NAMES[type_num].decode() == spec.type_name, True
        return True, True

    def check(self, oid: bytes, type_num: int, depth: int) -> tuple[bool, bool]:
        """(send it, walk into it) for an object ``depth`` levels below the root tree."""
        spec = self.spec
        if spec is None:
            return True, True
        if isinstance(spec, Combine):
            show = walk = True
            for sub in spec.filters:
                s, w = self._leaf(sub, oid, type_num, depth)
                show, walk = show and s, walk and w
            return show, walk
        return self._leaf(spec, oid, type_num, depth)


# ---------------------------------------------------------------- enumeration


@dataclass
class Enumeration:
    """The objects to send, in the order found, and what the client is known to have."""

    objects: list[ObjectEntry]
    have_objects: set[bytes]  # trees/blobs of the boundary: delta bases for thin packs
    hints: dict[bytes, bytes] = field(default_factory=dict)  # object -> same path in parent


def _split_wants(src: CommitSource, wants: Iterable[bytes]) -> tuple[list[bytes], list[ObjectEntry]]:
    """Commits to walk, and wanted non-commit objects (tags with their chain, trees, blobs)."""
    commits: list[bytes] = []
    direct: list[ObjectEntry] = []
    for want in wants:
        target, type_num, tags = src.peel(want)
        direct.extend((t, OBJ_TAG) for t in tags)
        if type_num == OBJ_COMMIT:
            commits.append(target)
        else:
            direct.append((target, type_num))
    return commits, direct


def _mark_have_trees(src: CommitSource, roots: Iterable[bytes]) -> set[bytes]:
    return set(_iter_closure(src, roots))


@dataclass
class _TreeWalk(TreeDiffWalk):
    """Lists the trees and blobs of one enumeration; ``seen`` maps an object to the smallest
    depth it was met at (tree:<depth> filters care), ``shown`` holds what was listed."""

    src: CommitSource
    flt: _Filter
    out: list[ObjectEntry]
    have: set[bytes]
    seen: dict[bytes, int] = field(default_factory=dict)
    shown: set[bytes] = field(default_factory=set)
    hints: dict[bytes, bytes] = field(default_factory=dict)  # object -> same path in parent
    reverse = True  # the enumeration's order, entry by entry
    base_is_had: bool = False  # the tree walked against is the client's: its side is had

    def _visit(self, oid: bytes, depth: int) -> bool:
        """True when ``oid`` still needs handling at ``depth``."""
        prev = self.seen.get(oid)
        if oid in self.have or (prev is not None and prev <= depth):
            return False
        self.seen[oid] = depth
        return True

    def _show(self, oid: bytes, type_num: int, base: bytes | None) -> None:
        if oid not in self.shown:
            self.shown.add(oid)
            self.out.append((oid, type_num))
        if base is not None:
            self.hints[oid] = base

    def enter(self, tree: bytes, base: bytes | None, depth: int) -> bool:
        if base is not None and self.base_is_had:
            self.have.add(base)
        if not self._visit(tree, depth):
            return False
        show, walk = self.flt.check(tree, OBJ_TREE, depth)
        if show:
            self._show(tree, OBJ_TREE, base)
        return walk

    def blob(self, oid: bytes, base: bytes | None, depth: int) -> None:
        if base is not None and self.base_is_had:
            self.have.add(base)
        if self._visit(oid, depth) and self.flt.check(oid, OBJ_BLOB, depth)[0]:
            self._show(oid, OBJ_BLOB, base)


def enumerate_objects(
    src: CommitSource,
    wants: Sequence[bytes],
    haves: Sequence[bytes],
    cut: frozenset[bytes],
    spec: FilterSpec | None,
    tag_refs: Sequence[tuple[bytes, bytes]] = (),
    max_commits: int | None = None,
) -> Enumeration:
    """``rev-list --objects wants --not haves``: commits newest first, then tags, trees and
    blobs. Wanted objects are always sent, whatever the filter (``--filter-provided-objects``
    is off in upload-pack). ``tag_refs`` are (tag object, peeled target) pairs for
    include-tag; pass them only when the client asked for include-tag. More than
    ``max_commits`` commits to send raises :class:`~.commits.WalkTooLong`.

    What the client has is marked sparsely where a commit is walked against a first
    parent the client has, as git's pack-objects does by default (``pack.useSparse``):
    that parent's root tree, and the objects met on its side of the diff, not every object
    its tree reaches (git/git: 4,900 objects, 221 trees read, per fetch of one commit). A
    changed entry equal to something elsewhere in the client's trees (a file moved, or
    reverted to an older version) may then be sent although the client has it. The other
    boundary commits (a merge's parents the client has) are marked in full, so that the
    changes a merge brings in from them are not sent; the client's other haves by their
    root trees.
    """
    want_commits, direct = _split_wants(src, wants)
    have_commits, have_direct = _split_wants(src, haves)
    commits, bad = src.walk_by_date(want_commits, have_commits, cut, limit=max_commits)
    flt = _Filter(spec, src)
    first = {src.commit(c).parents[0] for c in commits if src.commit(c).parents}
    edges = {p for c in commits for p in src.commit(c).parents if p in bad}
    had = {c for c in have_commits if c in bad}
    # A shallow client: what it has is marked in full, the trees of its haves too, as
    # pack-objects does then (--objects-edge-aggressive). A deepen sends history under
    # the client's commits, and their files are mostly the ones it has.
    marked = edges | had if cut else edges - first
    have_objects = _mark_have_trees(src, (src.commit(c).tree for c in marked))
    have_objects.update(src.commit(c).tree for c in edges | had)
    # Haves of any type count, as rev-list --not takes them: a tag (and the tags of its
    # chain), a tree with all it reaches, a blob (isomorphic-git sends the annotated tags
    # it has as haves; dropping them resent each tag on every fetch).
    have_objects.update(oid for oid, type_num in have_direct if type_num != OBJ_TREE)
    have_objects.update(_mark_have_trees(src, (oid for oid, type_num in have_direct
                                               if type_num == OBJ_TREE)))
    out: list[ObjectEntry] = []
    listed: set[bytes] = set()
    named = set(want_commits)
    for c in commits:
        # A commit the client named is never filtered (git's walk filters only objects it
        # met on the way: list-objects-filter.c, NOT_USER_GIVEN), like a named tag or tree.
        if c in named or flt.check(c, OBJ_COMMIT, 0)[0]:
            out.append((c, OBJ_COMMIT))
    for oid, type_num in direct:
        if oid not in listed and oid not in have_objects:
            listed.add(oid)
            out.append((oid, type_num))
    walker = _TreeWalk(src, flt, out, have_objects, shown=set(listed))
    for oid, type_num in direct:
        if type_num == OBJ_TREE:
            _walk_tree_keep_root(walker, oid)
    done: set[bytes] = set()
    last: bytes | None = None  # the root tree walked last
    # A deepen sends history under commits the client has whole (its old shallow tips):
    # a sent parent of such a commit is diffed against that commit's tree, so the files it
    # changed get the client's versions as delta bases (thin deltas, as pack-objects finds
    # them among its preferred bases). Against its own parent, they got older versions
    # that git packs store as deltas of these very files: a cycle, so they went whole.
    under_had = {p: c for c in had for p in src.commit(c).parents} if cut else {}
    for c in reversed(commits):  # oldest first: a parent's trees are done before its child's
        info = src.commit(c)
        base = None
        child = under_had.get(c)
        if child is not None:
            walker.base_is_had = True
            walker.walk(info.tree, src.commit(child).tree)
            last = info.tree
            done.add(c)
            continue
        # Diff against the first parent only when everything its tree reaches is already
        # listed (its walk is done) or the client has it (it is uninteresting: a shallow
        # client has the whole tree of each commit it has, and the walk never marks what
        # lies beyond its shallow commits). Across a shallow boundary only the latter: the
        # commit at the new boundary of a `fetch --depth 1` whose parent is the client's
        # old tip sends what changed, not its whole tree. Diffing against a parent whose
        # walk is still to come would let an object that both share be skipped twice, and
        # never sent.
        parent = info.parents[0] if info.parents else None
        if parent is not None and (parent in bad or (c not in cut and parent in done)):
            base = src.commit(parent).tree
        walker.base_is_had = base is not None and parent in bad
        if base is None and last is None and under_had:
            # The first commit of a deepen's walk: against a tree the client has whole, so
            # that what it sends gets the client's versions as delta bases, not none.
            base = src.commit(min(under_had.values())).tree
            walker.base_is_had = True
        elif base is None and last is not None:
            # A shallow boundary (each tip of a --depth 1 clone) or a root: diffed against
            # the tree walked last, which is done, so what both hold is listed already. Its
            # objects are sent too, so they are the delta bases of the changed ones (the
            # versions of the same paths), not the parent's, which are not sent.
            base = last
        walker.walk(info.tree, base)
        last = info.tree
        done.add(c)
    if tag_refs:
        include_tags(_Listed(out), tag_refs, bad | have_objects)
    return Enumeration(out, have_objects, walker.hints)


def _walk_tree_keep_root(walker: _TreeWalk, root: bytes) -> None:
    """Walk a wanted tree: the root itself is already listed, its contents follow the
    filter. Its entries count as depth 0 for tree:<depth>, as in C git, where a tree the
    client named stands where a commit would (tree:1 sends it and its entries)."""
    walker.shown.add(root)
    walker.walk(root, depth=-1)


# ---------------------------------------------------------------- include-tag


class ObjectSet(Protocol):
    """Objects being sent, as include-tag sees them: an enumeration's list (below) or a
    bitmap walk's closure (``bitmapwalk.ReachSet``)."""

    def __contains__(self, oid: bytes) -> bool: ...

    def add(self, oid: bytes, type_num: int) -> None: ...


class _Listed:
    """An enumeration's list of objects as an :class:`ObjectSet`."""

    def __init__(self, out: list[ObjectEntry]) -> None:
        self.out = out
        self.oids = {oid for oid, _ in out}

    def __contains__(self, oid: bytes) -> bool:
        return oid in self.oids

    def add(self, oid: bytes, type_num: int) -> None:
        self.out.append((oid, type_num))
        self.oids.add(oid)


def include_tags(sending: ObjectSet, tag_refs: Sequence[tuple[bytes, bytes]],
                 client_has: Container[bytes]) -> None:
    """pack-objects --include-tag: send the tag objects of ``tag_refs`` (tag, peeled
    target) whose target is being sent, unless the client has them. The tags are those of
    visible refs, so they are reachable (docs/ARCHITECTURE.md I7)."""
    for tag, target in tag_refs:
        if target in sending and tag not in sending and tag not in client_has:
            sending.add(tag, OBJ_TAG)
