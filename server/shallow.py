"""Shallow boundaries: deepen, deepen-relative, deepen-since and deepen-not.

Mirrors upload-pack.c (``deepen``, ``deepen_by_rev_list``, ``send_unshallow``) and
shallow.c (``get_shallow_commits``, ``get_shallow_commits_by_rev_list``) so that the
boundary matches C git's commit for commit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from protocol.errors import ClientError
from protocol.fetch_request import INFINITE_DEPTH, FetchRequest

from .commits import CommitSource
from .packs import OBJ_COMMIT

__all__ = ["ShallowPlan", "plan_shallow"]


@dataclass(frozen=True)
class ShallowPlan:
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
    """shallow.c get_shallow_commits: (result list, SHALLOW-flagged, NOT_SHALLOW-flagged)."""
    result: list[bytes] = []
    shallow: set[bytes] = set()
    not_shallow: set[bytes] = set()
    depths: dict[bytes, int] = {}
    stack: list[bytes] = []
    i = 0
    commit: bytes | None = None
    cur = 0
    while commit is not None or i < len(heads) or stack:
        if commit is None:
            if i < len(heads):
                commit = heads[i]
                i += 1
                depths[commit] = 0
                cur = 0
            else:
                commit = stack.pop()
                cur = depths[commit]
        info = src.commit(commit)
        cur += 1
        if depth != INFINITE_DEPTH and cur >= depth:
            result.insert(0, commit)
            shallow.add(commit)
            commit = None
            continue
        not_shallow.add(commit)
        parents = info.parents
        commit = None
        for n, parent in enumerate(parents):
            old = depths.get(parent)
            if old is not None and cur >= old:
                continue
            depths[parent] = cur
            if n + 1 < len(parents):
                stack.append(parent)
            else:
                commit = parent
                cur = depths[commit]
    return result, shallow, not_shallow


def _rev_list_walk(
    src: CommitSource, wants: Sequence[bytes], since: int | None, not_oids: Sequence[bytes]
) -> tuple[list[bytes], set[bytes], set[bytes]]:
    """shallow.c get_shallow_commits_by_rev_list."""
    commits, _ = src.walk_by_date(wants, not_oids, since=since)
    if not commits:
        raise ClientError("no commits selected for shallow requests", 200)
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


def plan_shallow(
    src: CommitSource,
    req: FetchRequest,
    wants: Sequence[bytes],
    client_shallows: Sequence[bytes],
    deepen_not: Sequence[bytes],
) -> ShallowPlan:
    """Compute the shallow/unshallow answer. ``client_shallows`` are the client's shallow
    lines that name commits we have; ``deepen_not`` are resolved commit ids."""
    if req.depth == 0 and not req.deepen_rev_list:
        return ShallowPlan(cut=frozenset(client_shallows))
    if req.depth == INFINITE_DEPTH:
        result: list[bytes] = []
        flagged_shallow: set[bytes] = set()
        not_shallow = set(client_shallows)
    elif req.depth > 0 and req.deepen_relative:
        # upload-pack.c (2.39) deepen(): walk depth+1 from the client's current boundary.
        heads = [s for s in client_shallows]
        result, flagged_shallow, not_shallow = _depth_walk(src, heads, req.depth + 1)
    elif req.depth > 0:
        result, flagged_shallow, not_shallow = _depth_walk(src, _commit_heads(src, wants), req.depth)
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
    return ShallowPlan(tuple(shallow_lines), tuple(unshallow), cut, tuple(extra), True)
