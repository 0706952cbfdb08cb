"""Cross-request caches of directory listings and small files, behind stat validation.

A directory's listing is reused while its (inode, mtime_ns, size) is unchanged: git adds,
replaces and removes refs, packs and loose objects by creating and renaming files, and
every such change moves the directory's mtime. A listing taken within ``RACY_NS`` of the
directory's mtime is not trusted (a second change in the same timestamp tick would go
unseen), the same guard git uses for its index ("racy git"). On a local filesystem whose
mtimes have sub-second digits (ext4, xfs, btrfs, tmpfs, overlay...: a tick is the kernel's
coarse clock, a few ms, and the mtime comes from the clock this process reads) the window
is ``LOCAL_RACY_NS``; anywhere else (NFS, FUSE, anything unknown, or an mtime in whole
seconds) it stays ``RACY_NS``. The filesystem is told by the device number of the stat,
looked up once in ``/proc/self/mountinfo``.

Freshness is exactly that of ``stat()``. On NFS, attribute caching (``actimeo``,
``acdirmin``/``acdirmax``) may return an older mtime for a while; see README "Repositories on NFS".

Listings also record which entries are symlinks (from ``d_type``, no extra syscall), so that
the :class:`~server.confine.LinkGuard` is asked about those entries only.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from .confine import LinkGuard
from .fsops import FsOps
from .lru import ByteLRU, MemoryBudget

__all__ = ["DirCache", "Listing", "Entry", "RACY_NS", "LOCAL_RACY_NS", "racy_window"]

RACY_NS = 2_000_000_000  # NFS servers may keep mtimes to the second
LOCAL_RACY_NS = 100_000_000  # local, fine-grained mtimes: ticks of a few ms, no clock skew
LOCAL_FILESYSTEMS = frozenset({"ext4", "ext3", "xfs", "btrfs", "tmpfs", "overlay", "zfs",
                               "f2fs", "bcachefs"})

_FS_TYPES: dict[int, str] = {}  # st_dev -> filesystem type (from mountinfo)


def _fs_type(dev: int, mountinfo: str = "/proc/self/mountinfo") -> str:
    """The type of the filesystem of device ``dev`` ("" when unknown)."""
    found = _FS_TYPES.get(dev)
    if found is None:
        found = ""
        want = f"{os.major(dev)}:{os.minor(dev)}"
        try:
            with open(mountinfo, encoding="utf-8", errors="replace") as f:
                for line in f:
                    fields = line.split()
                    if len(fields) > 3 and fields[2] == want and " - " in line:
                        found = line.split(" - ", 1)[1].split()[0]
        except OSError:
            pass
        _FS_TYPES[dev] = found
    return found


def racy_window(st: os.stat_result) -> int:
    """How long after its mtime a directory's listing stays untrusted (see above)."""
    if st.st_mtime_ns % 1_000_000_000 and _fs_type(st.st_dev) in LOCAL_FILESYSTEMS:
        return LOCAL_RACY_NS
    return RACY_NS

Entry = tuple[str, int, bool]
"""(name, inode, is a directory) as getdents reports it."""


@dataclass(frozen=True, slots=True)
class Listing:
    key: tuple[int, int, int]
    entries: tuple[Entry, ...]
    trusted: bool
    links: frozenset[str] = frozenset()  # names of the entries that are symlinks
    # What a reader made of this listing with the files it names (store/refs.py: the
    # loose refs of one directory), kept for the listing's life: as the files cache, it
    # holds while the directory's stat does. Filled only for trusted listings (but for
    # the entries by name, which depend on nothing else: names()).
    derived: dict[str, object] = field(default_factory=dict, compare=False)

    def names(self) -> dict[str, Entry]:
        """The entries by name, made once per listing (not to be changed): the loose refs
        of a directory look up each of their files here, and a dict made on every call
        cost a directory of 30,000 loose refs minutes of a pool thread."""
        names: dict[str, Entry] | None = self.derived.get("names")  # type: ignore[assignment]
        if names is None:
            names = self.derived["names"] = {e[0]: e for e in self.entries}
        return names


def _stat_key(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class DirCache:
    """Listings of directories and contents of small files, shared by all requests."""

    def __init__(self, enabled: bool = True, max_dirs: int = 100_000,
                 guard: LinkGuard | None = None, memory: MemoryBudget | None = None) -> None:
        self.enabled = enabled
        self.guard = guard  # None: symlinks are followed wherever they lead (tests, tools)
        # path -> its last listing; (path, inode, directory listing key) -> content
        self._dirs = ByteLRU[Listing]("listings", max_dirs, unit="entries", parent=memory)
        self._files = ByteLRU[bytes]("files", max_dirs, unit="entries", parent=memory)

    def listing(self, fs: FsOps, path: str, nofollow: bool = False) -> Listing | None:
        """The entries of ``path`` (None when it does not exist): one stat when cached.

        ``nofollow`` is for a directory whose parent nobody listed (``objects/pack``,
        ``objects/info``): it is looked at with ``lstat()``, which costs the same, and when
        it turns out to be a symlink the guard checks where it leads (and a ``stat()``
        gives the key of the directory it leads to).

        A listing that cannot be trusted (racy: taken within ``RACY_NS`` of the
        directory's mtime) is listed again by the next request, but not by this one: it
        keeps it in ``fs.racy`` (one request, one view of the directory; right after a
        push every request would otherwise list the git directory and its changed
        directories more than once). Whoever needs a fresher look calls :meth:`forget`
        with the request's ``fs``."""
        mine = fs.racy.get(path)
        if mine is not None:
            return mine  # type: ignore[return-value]
        if nofollow:
            st = fs.lstat_or_none(path)
            if st is not None and stat.S_ISLNK(st.st_mode):
                if self.guard is not None:
                    self.guard.check_link(fs, path)
                st = fs.stat_or_none(path)
        else:
            st = fs.stat_or_none(path)
        if st is None:
            return None
        key = _stat_key(st)
        # Nothing is put while the cache is off: the lookup is then a miss.
        cached = self._dirs.get(path, lambda c: c.trusted and c.key == key)
        if cached is not None:
            return cached
        now = time.time_ns()
        found = fs.scandir_or_empty(path)
        entries = tuple((e.name, e.inode(), e.is_dir(follow_symlinks=False)) for e in found)
        links = frozenset(e.name for e in found if e.is_symlink())
        listing = Listing(key, entries, now - st.st_mtime_ns > racy_window(st), links)
        if not listing.trusted and self.enabled:
            fs.racy[path] = listing
        if self.enabled:
            # What a listing holds: the object, and per entry a tuple, a name and an inode,
            # and what ``derived`` may keep for it (a ref name and a tuple, a slot of the
            # entries by name).
            self._dirs.put(path, listing, nbytes=400 + 350 * len(listing.entries))
        return listing

    def check_links(self, fs: FsOps, dirpath: str, listing: Listing,
                    names: Iterable[str] | None = None) -> None:
        """Raise :class:`~server.confine.OutsideRoot` when one of ``names`` (every entry
        when None) in the directory ``listing`` came from is a symlink leading outside the
        root. Free when the directory holds no symlinks."""
        if self.guard is None or not listing.links:
            return
        for name in listing.links if names is None else listing.links.intersection(names):
            self.guard.check_link(fs, os.path.join(dirpath, name))

    def forget(self, path: str, fs: FsOps | None = None) -> None:
        """List ``path`` again next time (and in this request, given its ``fs``)."""
        self._dirs.pop(path)
        if fs is not None:
            fs.racy.pop(path, None)

    def forget_under(self, top: str) -> None:
        """Forget the listings and files of ``top`` and everything below it (a repository
        that went away)."""
        inside = top.rstrip("/") + "/"
        self._dirs.drop_where(lambda p: p == top or str(p).startswith(inside))
        self._files.drop_where(lambda k: isinstance(k, tuple) and str(k[0]).startswith(inside))

    def file(self, fs: FsOps, path: str, listing: Listing) -> bytes | None:
        """Content of a small file in the directory ``listing`` came from.

        Reused only while that directory is unchanged (same listing key, so no file in it
        was created, renamed or removed since) and the file keeps its inode. The inode
        alone is not enough: filesystems hand a freed inode to the next new file, so the
        lock file of the update after next can reuse it.
        """
        name = os.path.basename(path)
        entry = listing.names().get(name)
        if entry is None:
            return None
        if name in listing.links and self.guard is not None:
            self.guard.check_link(fs, path)  # also on a cache hit: the link may have moved
        key = (path, entry[1], listing.key)
        if self.enabled:
            hit = self._files.get(key)
            if hit is not None:
                return hit
        data = fs.read_file_or_none(path)
        if data is not None and self.enabled and listing.trusted:
            self._files.put(key, data, nbytes=200 + len(data))
        return data
