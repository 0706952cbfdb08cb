"""The parent-diffing tree walk, the one both object walks use: the enumeration of
``reachability.py`` and the walk of commits without a bitmap in ``bitmapwalk.py``.

A commit's tree is walked against its first parent's tree: an entry whose id equals the
entry at the same path in that base tree is skipped without reading it, since everything
the base reaches is already accounted for (listed, in the closure, or the client's). Only
call it with such a base; each caller says when that holds (docs/ARCHITECTURE.md I7: an
object skipped on both sides would never be sent).
"""

from __future__ import annotations

from binascii import a2b_hex

from ..store.objformat import MODE_GITLINK, MODE_TREE, MODE_TYPE
from .commits import CommitSource

__all__ = ["TreeDiffWalk"]


class TreeDiffWalk:
    """Walks trees depth first; a subclass records what it meets in :meth:`enter` and
    :meth:`blob`. ``reverse`` visits each tree's entries last to first."""

    src: CommitSource
    reverse = False

    def enter(self, tree: bytes, base: bytes | None, depth: int) -> bool:
        """A tree that differs from ``base``, the tree at its path in the base (if any),
        ``depth`` levels below the root: record it; True to walk its entries."""
        raise NotImplementedError

    def blob(self, oid: bytes, base: bytes | None, depth: int) -> None:
        """A blob that differs from ``base``, the blob at its path in the base (if any)."""
        raise NotImplementedError

    def walk(self, root: bytes, base: bytes | None = None) -> None:
        """Walk the tree ``root``, skipping what the tree ``base`` has at the same paths.
        Gitlinks (submodules) are never followed."""
        tree_hex = self.src.tree_hex
        stack: list[tuple[bytes, bytes | None, int]] = [(root, base, 0)]
        while stack:
            tree, old_tree, depth = stack.pop()
            if tree == old_tree or not self.enter(tree, old_tree, depth):
                continue
            known = {name: hx for name, _, hx in tree_hex(old_tree)} if old_tree else {}
            entries = tree_hex(tree)
            for name, mode, hx in reversed(entries) if self.reverse else entries:
                old = known.get(name)
                if old == hx or mode == MODE_GITLINK:
                    continue
                oid = a2b_hex(hx)
                old_oid = a2b_hex(old) if old else None
                if mode & MODE_TYPE == MODE_TREE:
                    stack.append((oid, old_oid, depth + 1))
                else:
                    self.blob(oid, old_oid, depth + 1)
