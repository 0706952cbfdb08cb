"""Commit and tree facts for walks, read through one request's :class:`ObjectSnapshot`.

Parsed commits are cached per request (a walk touches each commit once or twice) and trees
are parsed with dulwich's compiled ``parse_tree``.
"""

from __future__ import annotations

import functools
import heapq
import re
from binascii import a2b_hex
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from dulwich.objects import parse_tree

from ..store.commitgraph import CommitGraph, CommitGraphError
from ..store.errors import MissingObject, ObjectStoreError
from ..store.faults import report_unusable
from ..store.lru import ByteLRU
from ..store.objformat import MODE_GITLINK, MODE_TREE, MODE_TYPE, OBJ_COMMIT, OBJ_TAG, OBJ_TREE, TYPE_NUMS
from ..store.odb import ObjectSnapshot
from ..store.packs import PackFile

__all__ = ["CommitInfo", "CommitSource", "PEEL_LIMIT", "TreeChange", "WalkTooLong", "equal_run",
           "parse_commit", "parse_tag_target", "tree_entries"]

PEEL_LIMIT = 64  # tags followed at most by peel(); a longer chain is cut there

TreeChange = tuple[int, bytes, bytes | None]
"""A tree entry that differs from its base: (mode, binary id, the base's id at its name)."""


class CommitInfo(NamedTuple):
    """A commit's root tree, parents and committer time (a tuple: walks make many)."""

    tree: bytes
    parents: tuple[bytes, ...]
    time: int


def _committer_time(data: bytes) -> int:
    at = data.find(b"\ncommitter ")
    if at < 0:
        return 0
    end = data.find(b"\n", at + 1)
    line = data[at + 1 : end if end >= 0 else len(data)]
    close = line.rfind(b">")
    try:
        return int(line[close + 1 :].split()[0])
    except (ValueError, IndexError):
        return 0


def parse_commit(data: bytes, hex_len: int) -> CommitInfo:
    """Tree, parents and committer time of a raw commit."""
    if not data.startswith(b"tree "):
        raise ObjectStoreError("malformed commit")
    tree = bytes.fromhex(data[5 : 5 + hex_len].decode("ascii"))
    parents = []
    pos = 6 + hex_len
    while data.startswith(b"parent ", pos):
        parents.append(bytes.fromhex(data[pos + 7 : pos + 7 + hex_len].decode("ascii")))
        pos += 8 + hex_len
    return CommitInfo(tree, tuple(parents), _committer_time(data))


def parse_tag_target(data: bytes, hex_len: int) -> tuple[bytes, int]:
    """The object a raw tag points to, and that object's type number."""
    if not data.startswith(b"object "):
        raise ObjectStoreError("malformed tag")
    target = bytes.fromhex(data[7 : 7 + hex_len].decode("ascii"))
    at = data.find(b"\ntype ")
    end = data.find(b"\n", at + 1)
    type_num = TYPE_NUMS.get(data[at + 6 : end])
    if at < 0 or type_num is None:
        raise ObjectStoreError("malformed tag")
    return target, type_num


def _kind(mode: int) -> int:
    """Tree, gitlink or blob (regular file or symlink), from a tree entry's mode."""
    kind = mode & MODE_TYPE
    return kind if kind in (MODE_TREE, MODE_GITLINK) else 0


@functools.cache
def _whole_entries(hash_len: int) -> re.Pattern[bytes]:
    """Any number of whole tree entries (mode and name up to a NUL, then the id): matched up
    to a position, it ends where the entry holding that position starts. The regular
    expression engine steps over the entries in C."""
    return re.compile(rb"(?:[^\0]*\0.{%d})*" % hash_len, re.DOTALL)


def _id_only_changes(new: bytes, old: bytes, hash_len: int) -> list[TreeChange] | None:
    """The changes between two trees of the same length whose bytes differ only inside
    entry ids (same modes, same names, same order), or None when they differ otherwise.

    Each difference is found by comparing the bytes (:func:`equal_run`); entry
    boundaries are found from the start of ``new`` only up to the last difference, and
    nothing is parsed past it. Identical bytes before an entry parse identically in both
    trees, so a difference that falls inside an id belongs to the same entry of both.
    """
    n = len(new)
    out: list[TreeChange] = []
    skip = _whole_entries(hash_len).match
    i = 0  # the start of an entry
    while True:
        first = i + equal_run(new, i, old, i, n - i)
        if first == n:
            return out
        m = skip(new, i, first)  # the entries that end before it
        i = m.end() if m is not None else i
        found = _entry_at(new, i, hash_len)
        if found is None or first < found[3] - hash_len:
            return None  # a mode or a name differs: not this case
        mode, _, oid, end = found
        out.append((mode, oid, old[end - hash_len : end]))
        i = end


def equal_run(a: bytes, i: int, b: bytes, j: int, length: int) -> int:
    """How many bytes from ``a[i:]`` and ``b[j:]`` are equal (at most ``length``).

    A long range is halved with slice comparisons (memcmp) down to 64 bytes or fewer; those
    are read as little-endian integers and XORed, which is zero up to the first differing
    byte, and its lowest set bit says which byte that is. A few Python steps whatever the
    length, and the integers stay small (converting a whole tree costs more than halving)."""
    lo, hi = 0, length
    if length > 256:
        if a[i : i + length] == b[j : j + length]:
            return length
        while hi - lo > 64:
            mid = (lo + hi) >> 1
            if a[i + lo : i + mid] == b[j + lo : j + mid]:
                lo = mid
            else:
                hi = mid
    x = int.from_bytes(a[i + lo : i + hi], "little") ^ int.from_bytes(b[j + lo : j + hi], "little")
    if not x:
        return hi
    return lo + (((x & -x).bit_length() - 1) >> 3)


def _entry_at(buf: bytes, i: int, hash_len: int) -> tuple[int, bytes, bytes, int] | None:
    """(mode, name, binary id, where the next entry starts) of the entry at ``i``, or None
    when it is malformed (the caller parses the whole tree, which says what is wrong)."""
    nul = buf.find(b"\0", i)
    end = nul + 1 + hash_len
    if nul < 0 or end > len(buf):
        return None
    space = buf.find(b" ", i, nul)
    if space < 0:
        return None
    try:
        mode = int(buf[i:space], 8)
    except ValueError:
        return None
    return mode, buf[space + 1 : nul], buf[nul + 1 : end], end


def _merge_changes(new: bytes, old: bytes, hash_len: int) -> list[TreeChange] | None:
    """The changes between two trees by a merge of their entries in tree order, skipping
    runs of identical bytes without parsing them (None when an entry is malformed).

    From two entry boundaries, the bytes both trees have in common up to their first
    difference are whole entries of both, the same ones: they are stepped over in C
    (:func:`_whole_entries`). Only the entries where the trees differ are parsed, one from
    each side: the same name is a changed entry, otherwise the one that sorts first was
    added (in ``new``) or removed (from ``old``). A tree of 500 entries with a file added
    is a few comparisons, not two whole parses.
    """
    n, o = len(new), len(old)
    skip = _whole_entries(hash_len).match
    out: list[TreeChange] = []
    i = j = 0  # entry boundaries in new and old
    while i < n:
        if j < o:
            same = equal_run(new, i, old, j, min(n - i, o - j))
            if same == n - i:
                return out  # the rest of new is the rest of old, or a prefix of it
            if same:
                m = skip(new, i, i + same)
                step = m.end() - i if m is not None else 0
                i += step
                j += step
        theirs = _entry_at(old, j, hash_len) if j < o else None
        ours = _entry_at(new, i, hash_len)
        if ours is None or (theirs is None and j < o):
            return None
        mode, name, oid, after = ours
        if theirs is not None and theirs[1] == name:
            if theirs[2] != oid:
                # A base of another kind (a file that became a directory) is no base.
                same_kind = _kind(theirs[0]) == _kind(mode)
                out.append((mode, oid, theirs[2] if same_kind else None))
            i, j = after, theirs[3]
        elif theirs is None or _sort_key(mode, name) < _sort_key(theirs[0], theirs[1]):
            out.append((mode, oid, None))  # added
            i = after
        else:
            j = theirs[3]  # removed
    return out


def _sort_key(mode: int, name: bytes) -> bytes:
    """Where an entry sorts in a tree: a directory as its name followed by "/"."""
    return name + b"/" if mode & MODE_TYPE == MODE_TREE else name


def tree_entries(data: bytes, hash_len: int) -> Iterator[tuple[bytes, bool, bytes]]:
    """(name, is_tree, binary id) for each entry; gitlinks (submodules) are skipped."""
    try:
        entries = parse_tree(data, hash_len)
    except Exception as exc:  # dulwich raises ObjectFormatException and friends
        raise ObjectStoreError(f"malformed tree: {exc}") from None
    for name, mode, sha in entries:
        if mode == MODE_GITLINK:
            continue
        yield name, (mode & MODE_TYPE) == MODE_TREE, a2b_hex(sha)


# Budgets of one request's caches (docs/ARCHITECTURE.md, "Caches").
COMMITS_BUDGET = 256 << 20  # bytes of parsed commits, at COMMIT_COST + PARENT_COST a parent
COMMIT_COST = 200
PARENT_COST = 40
TREES_BUDGET = 8 << 20  # bytes of raw trees
TREE_COST = 100  # the LRU's own bookkeeping per tree
GRAPH_POS_KEPT = 1 << 16  # commit-graph positions of peeled commits, kept for commit()


class WalkTooLong(Exception):
    """A walk given a limit met more commits than that (:meth:`CommitSource.walk_by_date`)."""


_SLOP = 5  # revision.c SLOP: uninteresting commits walked past the last interesting one


class CommitSource:
    """Reads commits (and trees, tags) for one request, caching parsed commits and trees."""

    def __init__(self, odb: ObjectSnapshot, graph: CommitGraph | None = None,
                 grafts: frozenset[bytes] = frozenset()) -> None:
        self.odb = odb
        self.graph = graph
        # The repository's own shallow commits ($GIT_DIR/shallow): their parents are not
        # here, and every walk stops at them, as C git's grafts make it (shallow.c).
        self.grafts = grafts
        self.hex_len = odb.hash_len * 2
        memory = odb.registry.memory  # where this request's caches are counted (lru.py)
        self._commits = ByteLRU[CommitInfo]("commits", COMMITS_BUDGET, shared=False,
                                            parent=memory)
        self._trees = ByteLRU[bytes]("trees", TREES_BUDGET, shared=False, parent=memory)
        self._graph_pos: dict[bytes, int] = {}  # see object_type

    def commit(self, oid: bytes) -> CommitInfo:
        if self.grafts and oid in self.grafts:
            info = self._commit(oid)
            return CommitInfo(info.tree, (), info.time)
        return self._commit(oid)

    def _commit(self, oid: bytes) -> CommitInfo:
        if self.graph is not None:
            # The commit-graph answers from a mapped file: no need to keep a copy.
            try:
                pos = self._graph_pos.pop(oid, None)
                entry = self.graph.entry(oid) if pos is None else self.graph.entry_at(pos)
            except CommitGraphError as exc:
                # Its checksum was right when it was opened: a git bug, or a file changed
                # in place. This request parses commits from here on (ARCHITECTURE.md
                # "Errors": an unusable commit-graph means parsed commits).
                report_unusable(self.odb.registry.faults, "commit-graph", self.graph.path,
                                self.graph.key, exc, "parsing commits instead")
                self.graph, entry = None, None
            if entry is not None:
                return CommitInfo(entry[0], entry[1], entry[2])
        info = self._commits.get(oid)
        if info is None:
            type_num, data = self.odb.read(oid)
            if type_num != OBJ_COMMIT:
                raise ObjectStoreError(f"{oid.hex()} is not a commit")
            info = parse_commit(data, self.hex_len)
            self._commits.put(oid, info, COMMIT_COST + PARENT_COST * len(info.parents))
        return info

    def first_parent_tree(self, oid: bytes, info: CommitInfo) -> bytes | None:
        """The root tree of the first parent of commit ``oid`` (whose ``info`` the caller
        has): from the commit-graph at the parent's position when there is one."""
        if not info.parents:
            return None
        if self.graph is not None:
            try:
                found = self.graph.first_parent_tree(oid)
            except CommitGraphError:
                found = None  # commit() reports it and parses from here on
            if found is not None:
                return found
        return self.commit(info.parents[0]).tree

    def object_type(self, oid: bytes) -> int:
        if oid in self._commits:
            return OBJ_COMMIT
        if self.graph is not None:
            pos = self.graph.find(oid)
            if pos >= 0:
                # The commit-graph lists only commits: no pack lookup. The position is
                # kept for the commit() that follows (a want peeled, then walked).
                if len(self._graph_pos) < GRAPH_POS_KEPT:
                    self._graph_pos[oid] = pos
                return OBJ_COMMIT
        found = self.odb.object_size(oid)
        if found is None:
            raise MissingObject(oid)
        return found[0]

    def peel(self, oid: bytes) -> tuple[bytes, int, list[bytes]]:
        """Follow tags: (final object, its type, the tag objects passed on the way)."""
        tags: list[bytes] = []
        type_num = self.object_type(oid)
        while type_num == OBJ_TAG and len(tags) < PEEL_LIMIT:
            tags.append(oid)
            _, data = self.odb.read(oid)
            oid, type_num = parse_tag_target(data, self.hex_len)
        return oid, type_num, tags

    def tree_data(self, oid: bytes, at: tuple[PackFile, int] | None = None) -> bytes:
        """The raw content of tree ``oid``. A walk diffing each tree against its parent's
        meets most trees twice (first as a commit's, then as its child's base): the
        request's ``trees`` cache answers the second time without a lookup in the pack.
        ``at`` is where the caller found it (pack, index position): no second lookup."""
        data = self._trees.get(oid)
        if data is None:
            if at is not None:
                pack, pos = at
                type_num, data = self.odb.read_packed(pack, pack.offset_at(pos))
            else:
                type_num, data = self.odb.read(oid)
            if type_num != OBJ_TREE:
                raise ObjectStoreError(f"{oid.hex()} is not a tree")
            self._trees.put(oid, data, len(data) + TREE_COST)
        return data

    def tree_changes(self, tree: bytes, base: bytes | None,
                     at: tuple[PackFile, int] | None = None) -> list[TreeChange]:
        """The entries of tree ``tree`` that differ from the entry of the same name in tree
        ``base`` (all entries without a base), in tree order: (mode, id, the base's id at
        that name or None). Ids are binary.

        The common case, a commit that modified files, leaves a tree the same length as its
        base with only some entries' ids changed: those are found from the bytes where the
        two differ, without parsing the entries in between (docs/ARCHITECTURE.md, "Cold
        path"). Anything else (entries added, removed or renamed) is a merge of the two
        that parses only the entries where they differ (:func:`_merge_changes`). ``at``:
        where ``tree`` is, when the caller looked it up (:meth:`tree_data`).
        """
        data = self.tree_data(tree, at)
        if base is None:
            return [(mode, a2b_hex(hx), None) for _, mode, hx in self._parse(data)]
        old = self.tree_data(base)
        if len(old) == len(data):
            found = _id_only_changes(data, old, self.odb.hash_len)
            if found is not None:
                return found
        found = _merge_changes(data, old, self.odb.hash_len)
        if found is not None:
            return found
        known = {name: (mode, hx) for name, mode, hx in self._parse(old)}
        out: list[TreeChange] = []
        for name, mode, hx in self._parse(data):
            prev = known.get(name)
            if prev is None:
                out.append((mode, a2b_hex(hx), None))
            elif prev[1] != hx:
                # A base of another kind (a file that became a directory) is no base.
                same_kind = _kind(prev[0]) == _kind(mode)
                out.append((mode, a2b_hex(hx), a2b_hex(prev[1]) if same_kind else None))
        return out

    def _parse(self, data: bytes) -> list[tuple[bytes, int, bytes]]:
        try:
            return list(parse_tree(data, self.odb.hash_len))
        except Exception as exc:  # dulwich raises ObjectFormatException and friends
            raise ObjectStoreError(f"malformed tree: {exc}") from None

    def tree(self, oid: bytes) -> list[tuple[bytes, bool, bytes]]:
        type_num, data = self.odb.read(oid)
        if type_num != OBJ_TREE:
            raise ObjectStoreError(f"{oid.hex()} is not a tree")
        return list(tree_entries(data, self.odb.hash_len))

    def walk_by_date(
        self,
        interesting: Iterable[bytes],
        uninteresting: Iterable[bytes],
        cut: frozenset[bytes] | set[bytes] = frozenset(),
        since: int | None = None,
        limit: int | None = None,
    ) -> tuple[list[bytes], set[bytes]]:
        """``rev-list interesting --not uninteresting``, newest first.

        Parents of commits in ``cut`` (shallow boundaries) are not followed. With ``since``,
        commits older than it are left out and not walked through (``--max-age``).
        With ``limit``, :class:`WalkTooLong` is raised once more interesting commits than
        that have been met: a caller trying the walk before a costlier means gives up early.
        Returns the interesting commits and the set of commits found uninteresting.
        """
        flags: dict[bytes, bool] = {}  # oid -> uninteresting
        heap: list[tuple[int, int, bytes]] = []
        queued: set[bytes] = set()
        seq = 0

        def push(oid: bytes) -> None:
            nonlocal seq
            heapq.heappush(heap, (-self.commit(oid).time, seq, oid))
            queued.add(oid)
            seq += 1

        for oid in uninteresting:
            if oid not in flags:
                flags[oid] = True
                push(oid)
        for oid in interesting:
            if oid not in flags:
                flags[oid] = False
                push(oid)
        def spread_bad(start: bytes) -> int:
            """Mark ``start`` uninteresting, and the parents of those already walked
            (revision.c ``mark_parents_uninteresting``): with clock skew, a commit may be
            walked as interesting before an uninteresting path reaches it, and its
            ancestors must not stay interesting. How many queued commits it turned."""
            turned = 0
            stack = [start]
            while stack:
                oid = stack.pop()
                if flags.get(oid) is not False:
                    continue
                flags[oid] = True
                if oid in queued:
                    turned += 1  # its own parents are marked when it is popped
                elif oid not in cut:
                    stack.extend(self.commit(oid).parents)
            return turned

        live = sum(1 for oid in queued if not flags[oid])
        out: list[bytes] = []
        last_time: int | None = None  # of the last interesting commit walked
        slop = _SLOP
        while heap and (live > 0 or (last_time is not None and slop > 0)):
            _, _, oid = heapq.heappop(heap)
            queued.discard(oid)
            bad = flags[oid]
            info = self.commit(oid)
            if not bad:
                live -= 1
                last_time = info.time
                if since is not None and info.time < since:
                    continue
                out.append(oid)
                if limit is not None and len(out) > limit:
                    raise WalkTooLong(limit)
            if oid not in cut:
                for parent in info.parents:
                    old = flags.get(parent)
                    if old is None:
                        flags[parent] = bad
                        push(parent)
                        if not bad:
                            live += 1
                    elif bad and not old:
                        live -= spread_bad(parent)
            if bad and live == 0 and last_time is not None:
                # Only uninteresting commits are left: as revision.c limit_list
                # (still_interesting), walk on while they are as new as the last
                # interesting one, then _SLOP more, so that one of them dated wrong
                # (clock skew) still reaches the commits walked as interesting. Its
                # parents are queued first, as limit_list's process_parents: a have dated
                # older than its parents must not end the walk before they are seen.
                slop = _SLOP if heap and -heap[0][0] >= last_time else slop - 1
        bad_set = {oid for oid, v in flags.items() if v}
        return [c for c in out if c not in bad_set], bad_set
