"""Keeping reads inside ``--root``: the one containment test, and the check of symlinks.

A repository under the root can hold symlinks of its own (``objects``, ``refs``,
``packed-refs``, ``HEAD``, ``config``, a loose ref, a pack) or name other object directories
in ``objects/info/alternates``. Each of them could lead anywhere on the machine, so each
one is followed only when its real path is inside the root, unless the operator said
``--allow-symlinks-outside-root``.

Cost: which directory entries are symlinks comes with the listings the server takes
anyway (``d_type``), so paths that are not symlinks cost nothing. A symlink costs one
``stat()`` per request that follows it: its verdict is kept by the identity (device,
inode) of what it leads to now, so retargeting it, or any link on the way, is seen at the
next request, and ``realpath()`` runs again only then.

What this cannot do without ``openat2(RESOLVE_BENEATH)``: a link swapped between the check
and the ``open()`` that follows it, within one request, is followed once.
"""

from __future__ import annotations

import os

from .fsops import FsOps
from .lru import ByteLRU, MemoryBudget

__all__ = ["is_within", "OutsideRoot", "LinkGuard"]

_MAX_VERDICTS = 100_000


def is_within(path: str, root: str) -> bool:
    """Is ``path`` the root itself or below it? Both must already be real paths (no
    symlinks, no ``..``); a root of ``/`` contains everything."""
    if path == root:
        return True
    return path.startswith(root if root.endswith(os.sep) else root + os.sep)


class OutsideRoot(Exception):
    """A path the request would read leads outside the root (answered with 404)."""

    def __init__(self, link: str, target: str) -> None:
        super().__init__(f"{link} leads to {target}, outside the root")
        self.link = link
        self.target = target


class LinkGuard:
    """Says whether symlinks stay inside ``root``; shared by all requests and threads."""

    def __init__(self, root: str, allow_outside: bool = False,
                 memory: MemoryBudget | None = None) -> None:
        self.root = os.path.realpath(root)
        self.allow_outside = allow_outside
        # link path -> (identity of its target, real path when outside the root, else None)
        self._verdicts = ByteLRU[tuple[tuple[int, int], str | None]](
            "link_verdicts", _MAX_VERDICTS, unit="entries", parent=memory)

    def check_link(self, fs: FsOps, link: str) -> None:
        """Raise :class:`OutsideRoot` when ``link``, a path a listing showed to be a
        symlink, resolves outside the root. A link that resolves to nothing (dangling, a
        loop) passes: reading through it fails on its own."""
        if self.allow_outside:
            return
        try:
            st = fs.stat(link)
        except OSError:
            return
        ident = (st.st_dev, st.st_ino)
        cached = self._verdicts.get(link, lambda v: v[0] == ident)
        if cached is None:
            real = os.path.realpath(link)
            fs.note("realpath")
            cached = (ident, None if is_within(real, self.root) else real)
            if _same_file(fs, real, ident):  # the link did not move while it was resolved
                self._verdicts.put(link, cached)
        if cached[1] is not None:
            raise OutsideRoot(link, cached[1])

    def check_real(self, what: str, real: str) -> None:
        """Raise :class:`OutsideRoot` when ``real`` (an already resolved path, named
        ``what`` in the message) is outside the root."""
        if not self.allow_outside and not is_within(real, self.root):
            raise OutsideRoot(what, real)


def _same_file(fs: FsOps, path: str, ident: tuple[int, int]) -> bool:
    try:
        st = fs.stat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == ident
