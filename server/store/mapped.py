"""Read-only views of whole repository files: a memory map on a local filesystem, the
file read into memory on a network one.

A memory map is the cheapest view of a pack index or a commit-graph: nothing is read
until it is used, and the page cache is shared by every process. But a page of it that
cannot be read, once the kernel dropped it (memory pressure; a new mtime seen over NFS
or FUSE), is a SIGBUS, which ends the whole process: an NFS soft mount's timeout, or
ESTALE once another host's ``git repack -ad`` deleted the file this process still maps.
And a page fault on a hung mount blocks its thread while it holds the GIL, so the event
loop, ``/healthz`` included, stops with it. C git maps these files too, but in a process
per request; a server that keeps them mapped for hours cannot.

So on a filesystem that is not local (NFS, SMB, FUSE, Ceph, 9p, ...: by the magic number
of ``fstatfs``, checked once per device), the file is read whole with ``read`` calls,
which fail with an ``OSError`` (a storage fault of that request) or hang in a thread that
released the GIL. The bytes then stay in this process's memory (each worker's own) while
the file is open: bounded by ``--max-open-packs`` for indexes, each counted as the map it
replaces (docs/operations.md "Repositories on NFS").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import threading

__all__ = ["Mapped", "LoadedFile", "map_whole", "is_local"]


class LoadedFile(bytes):
    """A file's bytes, with what a read-only map offers besides them (``close``)."""

    __slots__ = ()
    closed = False

    def close(self) -> None:
        """Nothing to release: the bytes go with the last reference."""


Mapped = mmap.mmap | LoadedFile

# f_type of the filesystems whose pages may fail or hang (linux/magic.h and the
# filesystems' own headers): NFS, SMB/CIFS (three), FUSE, Ceph, 9p, AFS (two), Coda,
# GFS2, OCFS2, Lustre, GPFS, BeeGFS, GlusterFS (a FUSE), virtiofs (a FUSE).
_NETWORK = frozenset({
    0x6969, 0x517B, 0xFF534D42, 0xFE534D42, 0x65735546, 0x00C36400, 0x01021997,
    0x5346414F, 0x6B414653, 0x73757245, 0x01161970, 0x7461636F, 0x0BD00BD0, 0x47504653,
    0x19830326,
})
_by_device: dict[int, bool] = {}
_lock = threading.Lock()


class _Statfs(ctypes.Structure):
    # struct statfs begins with f_type, a __fsword_t (a long on Linux); the rest is room.
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 256)]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def is_local(fd: int, dev: int) -> bool:
    """Is the file open as ``fd``, on device ``dev``, on a local filesystem? Once per
    device; a filesystem that cannot be told counts as remote."""
    with _lock:
        known = _by_device.get(dev)
    if known is not None:
        return known
    buf = _Statfs()
    local = _libc.fstatfs(fd, ctypes.byref(buf)) == 0 \
        and (buf.f_type & 0xFFFFFFFF) not in _NETWORK
    with _lock:
        if len(_by_device) > 4096:
            _by_device.clear()
        _by_device[dev] = local
    return local


def map_whole(fd: int) -> Mapped:
    """The whole file open as ``fd``, read-only: mapped when its filesystem is local, else
    read (module doc) into an anonymous map of its size: one copy, no descriptor kept, and
    the API of a map. ValueError for an empty file, as ``mmap`` raises."""
    st = os.fstat(fd)
    size = st.st_size
    if size == 0:
        raise ValueError("cannot map an empty file")
    if is_local(fd, st.st_dev):
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    buf = mmap.mmap(-1, size)
    view = memoryview(buf)
    got = 0
    try:
        while got < size:
            n = os.preadv(fd, [view[got : got + min(size - got, 8 << 20)]], got)
            if n == 0:
                break  # shorter than its stat said: the parsers find it truncated
            got += n
    except BaseException:
        view.release()
        buf.close()
        raise
    view.release()
    if got < size:
        short = LoadedFile(buf[:got])
        buf.close()
        return short
    return buf
