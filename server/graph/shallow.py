"""Shallow boundaries: deepen, deepen-relative, deepen-since and deepen-not.

Mirrors upload-pack.c (``deepen``, ``deepen_by_rev_list``, ``send_unshallow``) and
shallow.c (``get_shallow_commits``, ``get_shallow_commits_by_rev_list``) so that the
boundary matches C git's commit for commit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gitspout.protocol.errors import Refusal
from gitspout.protocol.fetch_request import INFINITE_DEPTH, FetchRequest

from ..store.objformat import OBJ_COMMIT
from .commits import CommitSource

__all__ = ["ShallowBoundary", "shallow_boundary"]


@dataclass(frozen=True)
class ShallowBoundary:
    """What to tell the client and how to cut the object walk.

    ``shallow``/``unshallow`` are the lines to send; ``cut`` holds the commits whose parents
    the walk must not follow; ``extra_wants`` are parents of unshallowed commits.
    """

    shallow: tuple[bytes, ...] = ()
    unshallow: tuple[bytes, ...] = ()
    cut: frozenset[bytes] = frozenset()
    extra_wants: tuple[bytes, ...] = ()
    sent: bool = False  # a shallow list is part of the answer (deepen was asked for)


def _depth_walk(
    src: CommitSource, heads: Sequence[bytes], depth: int
) -> tuple[list[bytes], set[bytes], set[bytes]]:
    """shallow.c get_shallow_commits: (boundary list, SHALLOW-flagged, NOT_SHALLOW-flagged).

    C git walks depth first and walks a commit again each time it finds a shorter path to
    it: deepen 1000 on dulwich's history is 397k visits for 3k commits, each a commit
    lookup here. What that walk settles on is each commit's shortest distance from the
    heads: commits closer than ``depth - 1`` end NOT_SHALLOW, and those at exactly
    ``depth - 1`` (reached, and never by a shorter path) are the boundary, SHALLOW and not
    NOT_SHALLOW. One breadth-first pass finds the same two sets, each commit looked up
    once. The boundary comes in discovery order (C git lists it in its walk's order;
    clients sort their shallow file).
    """
    level = list(dict.fromkeys(heads))
    seen = set(level)
    not_shallow: set[bytes] = set()
    boundary: list[bytes] = []
    grafts = src.grafts
    distance = 0
    while level:
        if depth != INFINITE_DEPTH and distance + 1 >= depth:
            for commit in level:
                src.commit(commit)  # C git parses the boundary too: a broken one fails here
            boundary.extend(level)
            return boundary, set(boundary), not_shallow
        following: list[bytes] = []
        for commit in level:
            info = src.commit(commit)
            if commit in grafts:
                # One of the repository's own shallow commits: a boundary whatever the
                # depth, SHALLOW and not NOT_SHALLOW (shallow.c get_shallows_or_depth).
                boundary.append(commit)
                continue
            not_shallow.add(commit)
            for parent in info.parents:
                if parent not in seen:
                    seen.add(parent)
                    following.append(parent)
        level = following
        distance += 1
    return boundary, set(boundary), not_shallow


def _rev_list_walk(
    src: CommitSource, wants: Sequence[bytes], since: int | None, not_oids: Sequence[bytes]
) -> tuple[list[bytes], set[bytes], set[bytes]]:
    """shallow.c get_shallow_commits_by_rev_list."""
    commits, _ = src.walk_by_date(wants, not_oids, since=since)
    if not commits:
        raise Refusal("no commits selected for shallow requests")
    selected = set(commits)
    border = [c for c in commits if any(p not in selected for p in src.commit(c).parents)]
    shallow = set(border)
    return list(reversed(border)), shallow, selected - shallow


def _commit_heads(src: CommitSource, oids: Sequence[bytes]) -> list[bytes]:
    heads = []
    for oid in oids:
        target, type_num, _ = src.peel(oid)
        if type_num == OBJ_COMMIT:
            heads.append(target)
    return heads


def shallow_boundary(
    src: CommitSource,
    req: FetchRequest,
    wants: Sequence[bytes],
    client_shallows: Sequence[bytes],
    deepen_not: Sequence[bytes],
) -> ShallowBoundary:
    """Compute the shallow/unshallow answer. ``client_shallows`` are the client's shallow
    lines that name commits we have; ``deepen_not`` are resolved commit ids."""
    depth = req.depth
    if depth == 0 and not req.deepen_rev_list:
        if not (src.grafts and req.version == 2):
            return ShallowBoundary(cut=frozenset(client_shallows))
        # A shallow repository answers every v2 fetch with its shallow commits the wants
        # reach (upload-pack.c send_shallow_info: deepen(INFINITE_DEPTH)).
        depth = INFINITE_DEPTH
    if depth == INFINITE_DEPTH and not src.grafts:
        result: list[bytes] = []
        flagged_shallow: set[bytes] = set()
        not_shallow = set(client_shallows)
    elif depth > 0 and req.deepen_relative:
        # upload-pack.c (2.39) deepen(): walk depth+1 from the client's current boundary.
        heads = [s for s in client_shallows]
        result, flagged_shallow, not_shallow = _depth_walk(src, heads, depth + 1)
    elif depth > 0:
        result, flagged_shallow, not_shallow = _depth_walk(src, _commit_heads(src, wants), depth)
    else:
        result, flagged_shallow, not_shallow = _rev_list_walk(
            src, _commit_heads(src, wants), req.deepen_since, _commit_heads(src, deepen_not)
        )
    client = set(client_shallows)
    # dict.fromkeys: an ordered set (a list lookup here made 40k lines quadratic).
    shallow_lines = list(dict.fromkeys(c for c in result if c not in client and c not in not_shallow))
    unshallow = [c for c in client_shallows if c in not_shallow]
    extra: list[bytes] = []
    for c in unshallow:
        extra.extend(src.commit(c).parents)
    cut = frozenset(shallow_lines) | client
    return ShallowBoundary(tuple(shallow_lines), tuple(unshallow), cut, tuple(extra), True)
