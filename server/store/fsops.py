"""Counted filesystem operations.

The ref and object layers do their metadata work through an :class:`FsOps`, so that every
open, stat and directory listing a request costs is counted (and can be asserted on, logged
and exported as a metric) without a syscall tracer.
"""

from __future__ import annotations

import os
from collections import Counter

__all__ = ["FsOps", "READ_FLAGS", "nonblocking"]

# Every file of a repository is opened with O_NONBLOCK: a FIFO in its place (packed-refs, a
# ref, an included config, a pack) otherwise blocks the open, and with it a pool thread
# for good, until a writer comes (C git blocks too). Opened so, it reads as empty, or
# fails; a regular file reads as ever (O_NONBLOCK means nothing to regular files).
READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK


def nonblocking(path: str, flags: int) -> int:
    """An ``opener`` for ``open()``: the file opened with O_NONBLOCK (READ_FLAGS)."""
    return os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC)


class FsOps:
    """Thin wrappers over ``os`` that count by kind: open, stat, listdir, read."""

    __slots__ = ("counts", "racy")

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        # Listings this request took that could not be trusted by their stat (racy): the
        # request's own view, reused by it instead of listed again (fscache.DirCache).
        self.racy: dict[str, object] = {}

    def stat(self, path: str) -> os.stat_result:
        self.counts["stat"] += 1
        return os.stat(path)

    def stat_or_none(self, path: str) -> os.stat_result | None:
        try:
            return self.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def version(self, path: str) -> tuple[int, int, int, int] | None:
        """What the file at ``path`` is now (inode, size, mtime, ctime), None when it is
        not there: one stat, which sees an edit in place that keeps the inode and the
        directory's listing (C git's stat_validity_check for packed-refs)."""
        st = self.stat_or_none(path)
        return None if st is None else (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def lstat_or_none(self, path: str) -> os.stat_result | None:
        """``lstat()``: the same one syscall as ``stat()``, counted as one, but a symlink is
        reported as itself."""
        self.counts["stat"] += 1
        try:
            return os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def scandir(self, path: str) -> list[os.DirEntry[str]]:
        """List a directory (one open plus its getdents calls, counted as one listdir)."""
        self.counts["listdir"] += 1
        with os.scandir(path) as it:
            return list(it)

    def scandir_or_empty(self, path: str) -> list[os.DirEntry[str]]:
        try:
            return self.scandir(path)
        except (FileNotFoundError, NotADirectoryError):
            return []

    def read_file(self, path: str, limit: int = 1 << 26) -> bytes:
        """Open and read a whole (small) file, refusing more than ``limit`` bytes."""
        self.counts["open"] += 1
        fd = os.open(path, READ_FLAGS)
        try:
            self.counts["read"] += 1
            parts: list[bytes] = []
            total = 0
            while True:
                data = os.read(fd, 65536)
                if not data:
                    break
                parts.append(data)
                total += len(data)
                if total > limit:
                    raise OSError(f"{path}: larger than {limit} bytes")
            return b"".join(parts)
        finally:
            os.close(fd)

    def open_or_none(self, path: str) -> int | None:
        """Open a file for reading (one open, counted): the caller reads it with
        ``os.pread`` (each call counted with :meth:`note`) and closes it."""
        self.counts["open"] += 1
        try:
            return os.open(path, READ_FLAGS)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def read_file_or_none(self, path: str) -> bytes | None:
        try:
            return self.read_file(path)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def note(self, kind: str, n: int = 1) -> None:
        self.counts[kind] += n
