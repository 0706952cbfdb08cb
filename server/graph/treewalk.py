"""The parent-diffing tree walk, the one both object walks use: the enumeration of
``reachability.py`` and the walk of commits without a bitmap in ``bitmapwalk.py``.

A commit's tree is walked against its first parent's tree: an entry whose id equals the
entry at the same path in that base tree is skipped without reading it, since everything
the base reaches is already accounted for (listed, in the closure, or the client's). Only
call it with such a base; each caller says when that holds (docs/ARCHITECTURE.md I7: an
object skipped on both sides would never be sent).
"""

from __future__ import annotations

from ..store.objformat import MODE_GITLINK, MODE_TREE, MODE_TYPE
from ..store.packs import PackFile
from .commits import CommitSource

__all__ = ["TreeDiffWalk"]


class TreeDiffWalk:
    """Walks trees depth first; a subclass records what it meets in :meth:`enter` and
    :meth:`blob`. ``reverse`` visits each tree's entries last to first."""

    src: CommitSource
    reverse = False
    at: tuple[PackFile, int] | None = None
    """Set by :meth:`enter` when it looked the tree up: where it is, so that reading it
    needs no second lookup."""

    def enter(self, tree: bytes, base: bytes | None, depth: int) -> bool:
        """A tree that differs from ``base``, the tree at its path in the base (if any),
        ``depth`` levels below the root: record it; True to walk its entries."""
        raise NotImplementedError

    def blob(self, oid: bytes, base: bytes | None, depth: int) -> None:
        """A blob that differs from ``base``, the blob at its path in the base (if any)."""
        raise NotImplementedError

    def walk(self, root: bytes, base: bytes | None = None, depth: int = 0) -> None:
        """Walk the tree ``root`` (at ``depth``), skipping what the tree ``base`` has at
        the same paths.
        Gitlinks (submodules) are never followed. The entries that differ come from
        :meth:`CommitSource.tree_changes`, which reads the two trees' bytes and parses
        only what differs when it can."""
        changes = self.src.tree_changes
        stack: list[tuple[bytes, bytes | None, int]] = [(root, base, depth)]
        while stack:
            tree, old_tree, depth = stack.pop()
            if tree == old_tree or not self.enter(tree, old_tree, depth):
                continue
            found = changes(tree, old_tree, self.at)
            for mode, oid, old in reversed(found) if self.reverse else found:
                if mode == MODE_GITLINK:
                    continue
                if mode & MODE_TYPE == MODE_TREE:
                    stack.append((oid, old, depth + 1))
                else:
                    self.blob(oid, old, depth + 1)
