"""The repository side of negotiation: which haves are common, and can we stop yet.

Implements :class:`protocol.negotiate.HaveOracle` the way upload-pack.c does
(``got_oid``/``do_got_oid`` and ``ok_to_give_up`` via ``can_all_from_reach_with_flag``):
a common commit's parents count as "they have" too, and a want is satisfied once a walk
from it, cut off at the oldest common commit's date, meets something they have.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..store.errors import ObjectStoreError
from ..store.objformat import OBJ_COMMIT
from .commits import CommitSource

__all__ = ["HaveTracker"]


class HaveTracker:
    """Tracks common haves for one request."""

    def __init__(self, src: CommitSource, wants: Sequence[bytes]) -> None:
        self.src = src
        self.common: list[bytes] = []
        self._they_have: set[bytes] = set()
        self._oldest: int | None = None
        self._want_commits: list[bytes] | None = None
        self._wants = wants
        self._satisfied: set[bytes] = set()
        # ok_to_give_up's answer only changes when a have adds to what they have: keep it
        # until then (v0 asks after every unknown have, and a request may hold 1M).
        self._give_up: bool | None = None

    # HaveOracle -------------------------------------------------------------

    def note_have(self, oid: bytes) -> bool:
        if not self.src.odb.contains(oid):
            return False
        before = len(self._they_have), self._oldest
        if self.src.object_type(oid) == OBJ_COMMIT:
            info = self.src.commit(oid)
            if self._oldest is None or info.time < self._oldest:
                self._oldest = info.time
            self._they_have.update(info.parents)
        if oid not in self._they_have:
            self._they_have.add(oid)
            self.common.append(oid)
        if (len(self._they_have), self._oldest) != before:
            self._give_up = None
        return True

    def have_count(self) -> int:
        return len(self.common)

    def ok_to_give_up(self) -> bool:
        if self._give_up is None:
            self._give_up = self._all_wants_reach()
        return self._give_up

    # internals ---------------------------------------------------------------

    def _all_wants_reach(self) -> bool:
        if not self.common:
            return False
        for want in self._commit_wants():
            if want in self._satisfied:
                continue
            if not self._reaches(want):
                return False
            self._satisfied.add(want)
        return True

    def _commit_wants(self) -> list[bytes]:
        if self._want_commits is None:
            out = []
            for want in self._wants:
                try:
                    target, type_num, _ = self.src.peel(want)
                except ObjectStoreError:
                    continue
                if type_num == OBJ_COMMIT:
                    out.append(target)
            self._want_commits = out
        return self._want_commits

    def _reaches(self, start: bytes) -> bool:
        """commit-reach.c can_all_from_reach_with_flag for one want: a parent the client
        has counts whatever its date; only the walk further down stops at commits older
        than the oldest common one."""
        cutoff = self._oldest if self._oldest is not None else 0
        if start in self._they_have or start in self._satisfied:
            return True
        stack = [start]
        seen = {start}
        while stack:
            info = self.src.commit(stack.pop())
            for parent in info.parents:
                if parent in self._they_have or parent in self._satisfied:
                    return True
            for parent in info.parents:
                if parent not in seen and self.src.commit(parent).time >= cutoff:
                    seen.add(parent)
                    stack.append(parent)
        return False
