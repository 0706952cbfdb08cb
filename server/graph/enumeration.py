"""What a fetch must get: ``rev-list --objects wants --not haves`` with shallow cuts,
object filters and include-tag, as an ordered list of (binary id, type number)
(:func:`enumerate_objects`), and include-tag over any set of objects being sent
(:func:`include_tags`).
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

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
from .closures import iter_closure
from .commits import CommitSource, tree_entries
from .treewalk import TreeDiffWalk

__all__ = ["enumerate_objects", "Enumeration", "ObjectEntry", "ObjectSet", "include_tags"]

ObjectEntry = tuple[bytes, int]


BLOB_SIZE_ENTRIES = 1 << 20  # sizes of blobs met by one walk (docs/ARCHITECTURE.md, "Caches")


@dataclass
class _Filter:
    """Evaluates a filter spec for an object at a depth below its root tree."""

    spec: FilterSpec | None
    src: CommitSource
    sizes: ByteLRU[int] = field(init=False)

    def __post_init__(self) -> None:
        self.sizes = ByteLRU("blob_sizes", BLOB_SIZE_ENTRIES, unit="entries", shared=False,
                             parent=self.src.odb.registry.memory)

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
    # An object sent -> the client's version of the same path in a child commit (a deepen's
    # unchanged file: the only delta base it has outside its own older versions).
    newer: dict[bytes, bytes] = field(default_factory=dict)


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
    return set(iter_closure(src, roots))


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
    newer: dict[bytes, bytes] = field(default_factory=dict)  # see Enumeration.newer
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

    def _note_newer(self, oid: bytes, base: bytes | None) -> None:
        if base is not None and oid in self.have and base not in self.have:
            self.newer.setdefault(base, oid)

    def enter(self, tree: bytes, base: bytes | None, depth: int) -> bool:
        if base is not None and self.base_is_had:
            self.have.add(base)
        self._note_newer(tree, base)
        if not self._visit(tree, depth):
            return False
        show, walk = self.flt.check(tree, OBJ_TREE, depth)
        if show:
            self._show(tree, OBJ_TREE, base)
        return walk

    def blob(self, oid: bytes, base: bytes | None, depth: int) -> None:
        if base is not None and self.base_is_had:
            self.have.add(base)
        self._note_newer(oid, base)
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
    root trees. A commit walked against no parent (a root: an orphan branch, an imported
    history) is compared path by path with the client's trees at the edges, as
    pack-objects' sparse walk compares every tree it sends with them.
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
    _walk_commit_trees(src, walker, commits, bad, cut, had, edges)
    if tag_refs:
        include_tags(_Listed(out), tag_refs, bad | have_objects)
    return Enumeration(out, have_objects, walker.hints, walker.newer)


def _walk_commit_trees(src: CommitSource, walker: _TreeWalk, commits: Sequence[bytes],
                       bad: Container[bytes], cut: frozenset[bytes], had: set[bytes],
                       edges: set[bytes]) -> None:
    """The trees of ``commits``, oldest first, each diffed against a tree whose objects
    are listed already or that the client has (its objects' versions there become the
    delta hints of the changed ones)."""
    done: set[bytes] = set()
    last: bytes | None = None  # the root tree walked last
    # A deepen sends history under commits the client has whole (its old shallow tips):
    # a sent parent of such a commit is diffed against that commit's tree, so the files it
    # changed get the client's versions as delta bases (thin deltas, as pack-objects finds
    # them among its preferred bases). Against its own parent, they got older versions
    # that git packs store as deltas of these very files: a cycle, so they went whole.
    under_had = {p: c for c in had for p in src.commit(c).parents} if cut else {}
    # The client's trees at the walk's edges (its commits that are parents of commits
    # sent), for the commits walked against none of them (below).
    edge_trees = [] if cut else list(dict.fromkeys(src.commit(p).tree for p in sorted(edges)))
    paired: set[tuple[bytes, bytes]] = set()  # (tree, edge tree) compared: once a request
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
        if base is None and edge_trees:
            # Not walked against its parent: a root (an orphan branch, an imported
            # history), or a commit whose parent is not walked yet. What it holds at a
            # path where the client's edge trees hold the same object is had, as
            # pack-objects' sparse walk finds by path across every edge
            # (revision.c mark_trees_uninteresting_sparse). A commit walked against its
            # parent needs none: what it shares with the parent is listed or had already.
            _mark_same_paths(src, info.tree, edge_trees[:MAX_PATH_PAIRS], walker.have, paired)
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


# Edge trees a commit walked without a had base is compared with, path by path: a fetch
# of an orphan branch has one or a few; a fetch of many merged branches may have hundreds.
MAX_PATH_PAIRS = 16


def _mark_same_paths(src: CommitSource, tree: bytes, had_trees: Sequence[bytes],
                     have: set[bytes], paired: set[tuple[bytes, bytes]]) -> None:
    """Add to ``have`` what ``tree`` holds at a path where one of ``had_trees`` (trees the
    client has whole) holds the same object, descending into the subtrees at a path that
    both hold and that differ. Reads only trees of paths both sides share; a pair of trees
    in ``paired`` (compared by an earlier call of the same walk) is not compared again."""
    hash_len = src.odb.hash_len
    stack = [(tree, h) for h in had_trees]
    while stack:
        mine, theirs = stack.pop()
        if mine == theirs:
            have.add(mine)
            continue
        if mine in have or (mine, theirs) in paired:
            continue
        paired.add((mine, theirs))
        held = {name: (is_tree, oid)
                for name, is_tree, oid in tree_entries(src.tree_data(theirs), hash_len)}
        for name, is_tree, oid in tree_entries(src.tree_data(mine), hash_len):
            other = held.get(name)
            if other is None:
                continue
            if other[1] == oid:
                have.add(oid)
            elif is_tree and other[0]:
                stack.append((oid, other[1]))


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
