"""Cross-request caches of directory listings and small files, behind stat validation.

A directory's listing is reused while its (inode, mtime_ns, size) is unchanged: git adds,
replaces and removes refs, packs and loose objects by creating and renaming files, and
every such change moves the directory's mtime. A listing taken within ``RACY_NS`` of the
directory's mtime is not trusted (a second change in the same timestamp tick would go
unseen), the same guard git uses for its index ("racy git").

Freshness is exactly that of ``stat()``. On NFS, attribute caching (``actimeo``,
``acdirmin``/``acdirmax``) may return an older mtime for a while; see README "NFS".
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from .fsops import FsOps

__all__ = ["DirCache", "Listing", "Entry", "RACY_NS"]

RACY_NS = 2_000_000_000  # NFS servers may keep mtimes to the second

Entry = tuple[str, int, bool]
"""(name, inode, is a directory) as getdents reports it."""


@dataclass(frozen=True, slots=True)
class Listing:
    key: tuple[int, int, int]
    entries: tuple[Entry, ...]
    trusted: bool

    def names(self) -> dict[str, Entry]:
        return {e[0]: e for e in self.entries}


def _stat_key(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class DirCache:
    """Listings of directories and contents of small files, shared by all requests."""

    def __init__(self, enabled: bool = True, max_dirs: int = 100_000) -> None:
        self.enabled = enabled
        self.max_dirs = max_dirs
        self._dirs: dict[str, Listing] = {}
        self._files: dict[tuple[str, int, tuple[int, int, int]], bytes] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def listing(self, fs: FsOps, path: str) -> Listing | None:
        """The entries of ``path`` (None when it does not exist): one stat when cached."""
        st = fs.stat_or_none(path)
        if st is None:
            return None
        key = _stat_key(st)
        cached = self._dirs.get(path) if self.enabled else None
        if cached is not None and cached.trusted and cached.key == key:
            self.hits += 1
            return cached
        self.misses += 1
        now = time.time_ns()
        entries = tuple(
            (e.name, e.inode(), e.is_dir(follow_symlinks=False)) for e in fs.scandir_or_empty(path)
        )
        listing = Listing(key, entries, now - st.st_mtime_ns > RACY_NS)
        if self.enabled:
            with self._lock:
                if len(self._dirs) >= self.max_dirs:
                    self._dirs.clear()
                self._dirs[path] = listing
        return listing

    def forget(self, path: str) -> None:
        with self._lock:
            self._dirs.pop(path, None)

    def is_trusted(self, path: str) -> bool:
        listing = self._dirs.get(path)
        return listing is not None and listing.trusted

    def file(self, fs: FsOps, path: str, listing: Listing) -> bytes | None:
        """Content of a small file in the directory ``listing`` came from.

        Reused only while that directory is unchanged (same listing key, so no file in it
        was created, renamed or removed since) and the file keeps its inode. The inode
        alone is not enough: filesystems hand a freed inode to the next new file, so the
        lock file of the update after next can reuse it.
        """
        entry = listing.names().get(os.path.basename(path))
        if entry is None:
            return None
        key = (path, entry[1], listing.key)
        if self.enabled:
            hit = self._files.get(key)
            if hit is not None:
                self.hits += 1
                return hit
        data = fs.read_file_or_none(path)
        if data is not None and self.enabled and listing.trusted:
            with self._lock:
                if len(self._files) >= self.max_dirs:
                    self._files.clear()
                self._files[key] = data
        return data
