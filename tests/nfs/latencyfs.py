"""latencyfs: a latency-injecting FUSE passthrough filesystem that simulates NFS.

The filesystem mirrors ``SOURCE_DIR`` read-write at ``MOUNTPOINT``.  Every
*metadata* request (lookup, getattr, setattr, readdir, open, create, rename,
...) sleeps ``--delay-ms`` before it is served, the way every NFS RPC costs a
network round trip.  The sleep is a ``trio.sleep`` so the daemon keeps serving
other requests meanwhile: concurrent clients see overlapping latencies, as
with an NFS client that has many RPCs in flight.  Data reads and writes are
not delayed unless ``--data-delay-ms`` is given.

Kernel caching is configurable: ``--attr-timeout`` and ``--entry-timeout``
default to 0 (every ``stat`` and every path component lookup reaches the
daemon: NFS with ``actimeo=0``, the worst case).  ``3.0`` would mimic NFS's
default attribute caching.  Directory listings are never cached by the
kernel (pyfuse3 does not expose ``cache_readdir``).  File data stays in the
page cache across opens (``keep_cache``) and is dropped by the kernel when a
``getattr`` shows a changed mtime or size (``auto_inval_data``), which is
NFS's close-to-open behaviour; ``--no-keep-cache`` drops it on every open.

Every request is counted by kind.  The counters are served on a unix socket
(``--control SOCK``): a client sends ``stats\\n`` (reply: one JSON line),
``reset\\n`` (zero the counters, reply ``ok``), ``dump\\n`` (write the
``--stats`` file, reply ``ok``), ``config\\n`` or ``ping\\n``; ``fail-reads SUBSTRING
ERRNO\\n`` makes reads of files whose real path holds SUBSTRING fail with that errno (a
storage fault: ``EIO``, ``ESTALE``) until ``clear-faults\\n``.  Use
:func:`read_stats` and :func:`reset_stats` from Python.  The ``--stats`` file
is also written on SIGUSR1 and at exit.  Counter keys that start with ``_``
are aggregates (``_total``, ``_delayed``, ``_delay_us``, ``_errors``,
``_read_bytes``, ``_write_bytes``, and ``_overlap_max``: the most delays in
progress at once); the others are request kinds.

Inodes are handled like libfuse's ``passthrough_ll``: each inode known to the
kernel holds an ``O_PATH`` file descriptor of the real file, and every
operation works relative to it (``*at()`` calls or ``/proc/self/fd/N``).  No
paths are tracked, so rename, unlink, rename-over and hard links need no
bookkeeping, an unlinked file that is still open keeps working (``fstat``,
``read``, ``mmap``), and the real inode number cannot be reused while the
kernel still knows the inode.  FUSE inode numbers come from a counter, are
stable for the life of the mount (the same real file always gets the same
number) and are what ``stat`` reports as ``st_ino``.

Run it as ``python -m tests.nfs.latencyfs SOURCE MOUNTPOINT [options]`` from
the repository root, or as ``python tests/nfs/latencyfs.py ...``.  Without
``--foreground`` the command returns once the mount is ready and the daemon
runs in the background; ``fusermount3 -u MOUNTPOINT`` (or SIGTERM to the
daemon) unmounts it and ends the daemon.

The module imports without pyfuse3 (only the socket client functions are then
usable), so callers can probe for it.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import functools
import json
import logging
import os
import resource
import signal
import socket
import stat
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

try:  # pragma: no cover - exercised implicitly
    import pyfuse3
    import trio
except ImportError:  # pyfuse3 or trio missing: only the client side works.
    pyfuse3 = None  # type: ignore[assignment]
    trio = None  # type: ignore[assignment]

log = logging.getLogger("latencyfs")

#: Request kinds that sleep ``delay_ms`` (one simulated RPC each).
DELAYED_OPS: frozenset[str] = frozenset(
    {
        "lookup", "getattr", "setattr", "readlink", "mknod", "mkdir", "unlink",
        "rmdir", "symlink", "rename", "link", "open", "opendir", "readdir",
        "statfs", "access", "create", "fsync", "fsyncdir",
    }
)
#: Request kinds that sleep ``data_delay_ms`` (0 by default).
DATA_OPS: frozenset[str] = frozenset({"read", "write"})
#: Request kinds that are counted but never delayed.
UNDELAYED_OPS: frozenset[str] = frozenset({"flush", "release", "releasedir", "forget"})
ALL_OPS: frozenset[str] = DELAYED_OPS | DATA_OPS | UNDELAYED_OPS
#: Aggregate counter keys (all start with ``_``).
AGGREGATES: tuple[str, ...] = (
    "_total", "_delayed", "_delay_us", "_errors", "_read_bytes", "_write_bytes",
    "_overlap_max",
)

# O_NOFOLLOW would refuse the /proc/self/fd magic link; O_DIRECT would make the
# kernel's unaligned FUSE reads fail on the real fd.
_OPEN_FLAGS_TO_DROP = os.O_CREAT | os.O_EXCL | os.O_NOCTTY | os.O_NOFOLLOW | os.O_DIRECT
_RENAME_FLAGS_SUPPORTED = 1 | 2  # RENAME_NOREPLACE | RENAME_EXCHANGE


# --------------------------------------------------------------------------
# Control socket client (no pyfuse3 needed)
# --------------------------------------------------------------------------


def control_request(sock_path: str | os.PathLike[str], command: str, timeout: float = 5.0) -> str:
    """Send one command line to a latencyfs control socket and return the reply line."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(os.fspath(sock_path))
        sock.sendall(command.strip().encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
    reply = buf.decode().strip()
    if reply.startswith("error"):
        raise RuntimeError(f"latencyfs control {command!r}: {reply}")
    return reply


def read_stats(sock_path: str | os.PathLike[str], timeout: float = 5.0) -> dict[str, int]:
    """Return the daemon's counters: request kind -> count, plus ``_``-prefixed aggregates."""
    data = json.loads(control_request(sock_path, "stats", timeout))
    return {str(k): int(v) for k, v in data.items()}


def reset_stats(sock_path: str | os.PathLike[str], timeout: float = 5.0) -> None:
    """Zero the daemon's counters."""
    reply = control_request(sock_path, "reset", timeout)
    if reply != "ok":
        raise RuntimeError(f"latencyfs reset: unexpected reply {reply!r}")


def ping(sock_path: str | os.PathLike[str], timeout: float = 1.0) -> bool:
    """Return True when a daemon answers on *sock_path*."""
    try:
        return control_request(sock_path, "ping", timeout) == "pong"
    except (OSError, RuntimeError):
        return False


def op_total(stats: dict[str, int], kinds: frozenset[str] | None = None) -> int:
    """Sum the counters of request *kinds* (default: all request kinds, no aggregates)."""
    return sum(
        v for k, v in stats.items() if not k.startswith("_") and (kinds is None or k in kinds)
    )


# --------------------------------------------------------------------------
# Configuration and counters
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """Tunables of one latencyfs instance."""

    delay_ms: float = 1.0
    data_delay_ms: float = 0.0
    attr_timeout: float = 0.0
    entry_timeout: float = 0.0
    negative_timeout: float = 0.0
    keep_cache: bool = True


class Counters:
    """Per-kind request counters plus aggregates."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self.reset()

    def reset(self) -> None:
        """Zero every counter (all known kinds stay present with value 0)."""
        self._counts = dict.fromkeys(sorted(ALL_OPS), 0)
        self._counts.update(dict.fromkeys(AGGREGATES, 0))

    def hit(self, kind: str) -> None:
        """Count one request of *kind*."""
        self._counts[kind] = self._counts.get(kind, 0) + 1
        self._counts["_total"] += 1

    def add(self, key: str, amount: int) -> None:
        """Add *amount* to counter *key*."""
        self._counts[key] = self._counts.get(key, 0) + amount

    def high(self, key: str, value: int) -> None:
        """Raise counter *key* to *value* if it is lower (a high-water mark)."""
        self._counts[key] = max(self._counts.get(key, 0), value)

    def snapshot(self) -> dict[str, int]:
        """Return a copy of all counters."""
        return dict(self._counts)


def write_stats_file(path: str, stats: dict[str, int]) -> None:
    """Write *stats* as JSON to *path* atomically."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(stats, fh, indent=1, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


# --------------------------------------------------------------------------
# The filesystem
# --------------------------------------------------------------------------


class _Inode:
    """An inode known to the kernel: an O_PATH fd of the real file plus a lookup count."""

    __slots__ = ("nodeid", "fd", "key", "nlookup")

    def __init__(self, nodeid: int, fd: int, key: tuple[int, int]) -> None:
        self.nodeid = nodeid
        self.fd = fd
        self.key = key
        self.nlookup = 0

    @property
    def proc(self) -> str:
        """A path that reaches the real file through /proc (follows the O_PATH fd)."""
        return f"/proc/self/fd/{self.fd}"


class _DirHandle:
    """An open directory with a listing snapshot taken at the first readdir."""

    __slots__ = ("inode", "fd", "names")

    def __init__(self, inode: _Inode, fd: int) -> None:
        self.inode = inode
        self.fd = fd
        self.names: list[bytes] | None = None


def _op(
    kind: str, threaded: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]]:
    """Wrap a synchronous handler: count it, delay it, map OSError to FUSEError.

    The real work runs after the delay without another await, so handlers
    never interleave and need no locks.  *threaded* handlers (slow syscalls
    that touch no shared state, like fsync) run in a worker thread so they do
    not stall the other requests.
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(fn)
        async def handler(self: LatencyFS, *args: Any) -> Any:
            self.counters.hit(kind)
            await self._delay(kind)
            try:
                if threaded:
                    return await trio.to_thread.run_sync(fn, self, *args)
                return fn(self, *args)
            except pyfuse3.FUSEError:
                self.counters.add("_errors", 1)
                raise
            except OSError as exc:
                self.counters.add("_errors", 1)
                raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
            except Exception:  # a bug: never let it kill the main loop
                self.counters.add("_errors", 1)
                log.exception("latencyfs: %s failed", kind)
                raise pyfuse3.FUSEError(errno.EIO) from None

        return handler

    return decorate


_Base: Any = pyfuse3.Operations if pyfuse3 is not None else object


class LatencyFS(_Base):  # type: ignore[misc]
    """Passthrough of a source directory with injected per-request latency."""

    enable_writeback_cache = False
    supports_dot_lookup = True

    def __init__(self, source: str, config: Config) -> None:
        if pyfuse3 is None:
            raise RuntimeError("pyfuse3 is not installed")
        super().__init__()
        self.config = config
        self.counters = Counters()
        self._delays = {k: config.delay_ms / 1000.0 for k in DELAYED_OPS}
        self._delays.update({k: config.data_delay_ms / 1000.0 for k in DATA_OPS})
        root_fd = os.open(source, os.O_PATH | os.O_DIRECTORY)
        st = os.fstat(root_fd)
        self._root = _Inode(pyfuse3.ROOT_INODE, root_fd, (st.st_dev, st.st_ino))
        self._root.nlookup = 1
        self._inodes: dict[int, _Inode] = {self._root.nodeid: self._root}
        self._live: dict[tuple[int, int], _Inode] = {self._root.key: self._root}
        self._nodeids: dict[tuple[int, int], int] = {self._root.key: self._root.nodeid}
        self._next_nodeid = self._root.nodeid + 1
        self._dirs: dict[int, _DirHandle] = {}
        self._chown_new = os.geteuid() == 0
        # Reads of files whose real path holds a key fail with its errno (``fail-reads``).
        self.failing_reads: dict[str, int] = {}
        self._lateness = 0.0  # learned mean timer lateness, seconds
        self._delaying = 0  # requests sleeping their delay now

    # ---- helpers -------------------------------------------------------

    async def _delay(self, kind: str) -> None:
        """Sleep the configured time for *kind*, letting other requests proceed.

        Timer wake-ups are late by a fraction of a millisecond (epoll rounds
        to whole ms); the mean lateness is learned and subtracted so that the
        mean delay matches the configured one.
        """
        seconds = self._delays.get(kind, 0.0)
        if seconds <= 0:
            return
        start = time.perf_counter()
        self._delaying += 1
        self.counters.high("_overlap_max", self._delaying)
        try:
            await precise_sleep(max(0.0, seconds - self._lateness))
        finally:
            self._delaying -= 1
        elapsed = time.perf_counter() - start
        late = elapsed - (seconds - self._lateness)
        self._lateness += 0.05 * (min(late, seconds) - self._lateness)
        self._lateness = min(max(self._lateness, 0.0), seconds)
        self.counters.add("_delayed", 1)
        self.counters.add("_delay_us", int(elapsed * 1e6))

    def _get(self, nodeid: int) -> _Inode:
        try:
            return self._inodes[nodeid]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ESTALE) from None

    def _nodeid_for(self, key: tuple[int, int]) -> int:
        """Stable FUSE inode number for a real (st_dev, st_ino)."""
        nodeid = self._nodeids.get(key)
        if nodeid is None:
            nodeid = self._next_nodeid
            self._next_nodeid += 1
            self._nodeids[key] = nodeid
        return nodeid

    def _adopt(self, fd: int) -> tuple[_Inode, os.stat_result]:
        """Register an O_PATH fd as an inode (or reuse the live one); takes ownership of fd."""
        try:
            st = os.fstat(fd)
        except OSError:
            os.close(fd)
            raise
        key = (st.st_dev, st.st_ino)
        inode = self._live.get(key)
        if inode is not None:
            os.close(fd)
            return inode, st
        inode = _Inode(self._nodeid_for(key), fd, key)
        self._inodes[inode.nodeid] = inode
        self._live[key] = inode
        return inode, st

    def _drop_if_unused(self, inode: _Inode) -> None:
        if inode.nlookup <= 0 and inode is not self._root:
            self._inodes.pop(inode.nodeid, None)
            if self._live.get(inode.key) is inode:
                del self._live[inode.key]
            os.close(inode.fd)

    def _child(self, parent: _Inode, name: bytes) -> tuple[_Inode, os.stat_result]:
        """Resolve *name* in *parent* without changing lookup counts."""
        if name == b"." or (name == b".." and parent is self._root):
            return parent, os.fstat(parent.fd)
        flags = os.O_PATH | os.O_NOFOLLOW
        return self._adopt(os.open(name, flags, dir_fd=parent.fd))

    def _entry(self, inode: _Inode, st: os.stat_result) -> pyfuse3.EntryAttributes:
        return self._attrs(inode.nodeid, st)

    def _attrs(self, nodeid: int, st: os.stat_result) -> pyfuse3.EntryAttributes:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = nodeid
        entry.generation = 0
        entry.entry_timeout = self.config.entry_timeout
        entry.attr_timeout = self.config.attr_timeout
        entry.st_mode = st.st_mode
        entry.st_nlink = st.st_nlink
        entry.st_uid = st.st_uid
        entry.st_gid = st.st_gid
        entry.st_rdev = st.st_rdev
        entry.st_size = st.st_size
        entry.st_blksize = st.st_blksize
        entry.st_blocks = st.st_blocks
        entry.st_atime_ns = st.st_atime_ns
        entry.st_mtime_ns = st.st_mtime_ns
        entry.st_ctime_ns = st.st_ctime_ns
        return entry

    def _lookup_counted(self, parent: _Inode, name: bytes) -> pyfuse3.EntryAttributes:
        inode, st = self._child(parent, name)
        inode.nlookup += 1
        return self._entry(inode, st)

    def _chown_to_caller(self, parent: _Inode, name: bytes, ctx: Any) -> None:
        if self._chown_new and (ctx.uid, ctx.gid) != (0, 0):
            os.chown(name, ctx.uid, ctx.gid, dir_fd=parent.fd, follow_symlinks=False)

    # ---- lookup and attributes ----------------------------------------

    @_op("lookup")
    def lookup(self, parent_inode: int, name: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        parent = self._get(parent_inode)
        try:
            return self._lookup_counted(parent, name)
        except FileNotFoundError:
            if self.config.negative_timeout > 0:
                entry = pyfuse3.EntryAttributes()
                entry.st_ino = 0
                entry.entry_timeout = self.config.negative_timeout
                return entry
            raise

    async def forget(self, inode_list: list[tuple[int, int]]) -> None:
        for nodeid, nlookup in inode_list:
            self.counters.hit("forget")
            inode = self._inodes.get(nodeid)
            if inode is None or inode is self._root:
                continue
            inode.nlookup -= nlookup
            self._drop_if_unused(inode)

    @_op("getattr")
    def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        node = self._get(inode)
        return self._entry(node, os.fstat(node.fd))

    @_op("setattr")
    def setattr(
        self, inode: int, attr: Any, fields: Any, fh: int | None, ctx: Any
    ) -> pyfuse3.EntryAttributes:
        node = self._get(inode)
        if fields.update_size:
            if fh is not None:
                os.ftruncate(fh, attr.st_size)
            else:
                os.truncate(node.proc, attr.st_size)
        if fields.update_mode:
            os.chmod(node.proc, stat.S_IMODE(attr.st_mode))
        if fields.update_uid or fields.update_gid:
            uid = attr.st_uid if fields.update_uid else -1
            gid = attr.st_gid if fields.update_gid else -1
            os.chown(node.proc, uid, gid)
        if fields.update_atime or fields.update_mtime:
            self._set_times(node, attr, fields)
        return self._entry(node, os.fstat(node.fd))

    @staticmethod
    def _set_times(node: _Inode, attr: Any, fields: Any) -> None:
        cur = os.fstat(node.fd)
        atime = attr.st_atime_ns if fields.update_atime else cur.st_atime_ns
        mtime = attr.st_mtime_ns if fields.update_mtime else cur.st_mtime_ns
        if stat.S_ISLNK(cur.st_mode):
            raise pyfuse3.FUSEError(errno.EPERM)  # no race-free way via O_PATH
        os.utime(node.proc, ns=(atime, mtime))

    @_op("readlink")
    def readlink(self, inode: int, ctx: Any) -> bytes:
        return os.readlink(b"", dir_fd=self._get(inode).fd)

    @_op("access")
    def access(self, inode: int, mode: int, ctx: Any) -> bool:
        return os.access(self._get(inode).proc, mode)

    @_op("statfs")
    def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        sv = os.statvfs(self._root.proc)
        data = pyfuse3.StatvfsData()
        for attr in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                     "f_files", "f_ffree", "f_favail"):
            setattr(data, attr, getattr(sv, attr))
        data.f_namemax = sv.f_namemax
        return data

    # ---- namespace changes --------------------------------------------

    @_op("mknod")
    def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: Any
              ) -> pyfuse3.EntryAttributes:
        parent = self._get(parent_inode)
        os.mknod(name, mode, rdev, dir_fd=parent.fd)
        self._chown_to_caller(parent, name, ctx)
        return self._lookup_counted(parent, name)

    @_op("mkdir")
    def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Any
              ) -> pyfuse3.EntryAttributes:
        parent = self._get(parent_inode)
        os.mkdir(name, stat.S_IMODE(mode), dir_fd=parent.fd)
        self._chown_to_caller(parent, name, ctx)
        return self._lookup_counted(parent, name)

    @_op("symlink")
    def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: Any
                ) -> pyfuse3.EntryAttributes:
        parent = self._get(parent_inode)
        os.symlink(target, name, dir_fd=parent.fd)
        self._chown_to_caller(parent, name, ctx)
        return self._lookup_counted(parent, name)

    @_op("link")
    def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any
             ) -> pyfuse3.EntryAttributes:
        node = self._get(inode)
        parent = self._get(new_parent_inode)
        os.link(node.proc, new_name, dst_dir_fd=parent.fd, follow_symlinks=True)
        return self._lookup_counted(parent, new_name)

    @_op("unlink")
    def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        os.unlink(name, dir_fd=self._get(parent_inode).fd)

    @_op("rmdir")
    def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        os.rmdir(name, dir_fd=self._get(parent_inode).fd)

    @_op("rename")
    def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int,
               name_new: bytes, flags: int, ctx: Any) -> None:
        old_fd = self._get(parent_inode_old).fd
        new_fd = self._get(parent_inode_new).fd
        if flags:
            _renameat2(old_fd, name_old, new_fd, name_new, flags)
        else:
            os.rename(name_old, name_new, src_dir_fd=old_fd, dst_dir_fd=new_fd)

    # ---- files ----------------------------------------------------------

    @_op("open")
    def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        fd = os.open(self._get(inode).proc, flags & ~_OPEN_FLAGS_TO_DROP)
        return pyfuse3.FileInfo(fh=fd, keep_cache=self.config.keep_cache)

    @_op("create")
    def create(self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: Any
               ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        parent = self._get(parent_inode)
        flags = (flags | os.O_CREAT) & ~(os.O_NOCTTY | os.O_NOFOLLOW | os.O_DIRECT)
        fd = os.open(name, flags, stat.S_IMODE(mode), dir_fd=parent.fd)
        try:
            self._chown_to_caller(parent, name, ctx)
            inode, st = self._adopt(os.open(f"/proc/self/fd/{fd}", os.O_PATH))
        except BaseException:
            os.close(fd)
            raise
        inode.nlookup += 1
        info = pyfuse3.FileInfo(fh=fd, keep_cache=self.config.keep_cache)
        return info, self._entry(inode, st)

    @_op("read")
    def read(self, fh: int, off: int, size: int) -> bytes:
        if self.failing_reads:  # a storage fault of files named so (``fail-reads``)
            name = os.readlink(f"/proc/self/fd/{fh}")
            for part, code in self.failing_reads.items():
                if part in name:
                    raise OSError(code, os.strerror(code))
        data = os.pread(fh, size, off)
        self.counters.add("_read_bytes", len(data))
        return data

    @_op("write")
    def write(self, fh: int, off: int, buf: bytes) -> int:
        written = os.pwrite(fh, buf, off)
        self.counters.add("_write_bytes", written)
        return written

    @_op("flush")
    def flush(self, fh: int) -> None:
        return None

    @_op("release")
    def release(self, fh: int) -> None:
        os.close(fh)

    @_op("fsync", threaded=True)
    def fsync(self, fh: int, datasync: bool) -> None:
        if datasync:
            os.fdatasync(fh)
        else:
            os.fsync(fh)

    # ---- directories ---------------------------------------------------

    @_op("opendir")
    def opendir(self, inode: int, ctx: Any) -> int:
        node = self._get(inode)
        fd = os.open(node.proc, os.O_RDONLY | os.O_DIRECTORY)
        self._dirs[fd] = _DirHandle(node, fd)
        return fd

    @_op("readdir")
    def readdir(self, fh: int, start_id: int, token: Any) -> None:
        handle = self._dirs.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        if start_id == 0 or handle.names is None:
            handle.names = self._list(handle.fd)
        for index in range(start_id, len(handle.names)):
            if not self._reply_entry(handle, handle.names[index], index + 1, token):
                break

    @staticmethod
    def _list(fd: int) -> list[bytes]:
        os.lseek(fd, 0, os.SEEK_SET)
        return [b".", b".."] + [os.fsencode(n) for n in os.listdir(fd)]

    def _reply_entry(self, handle: _DirHandle, name: bytes, next_id: int, token: Any) -> bool:
        """Send one readdirplus entry; False when the reply buffer is full."""
        if name in (b".", b".."):
            return self._reply_dot(handle, name, next_id, token)
        try:
            inode, st = self._child(handle.inode, name)
        except FileNotFoundError:
            return True  # removed since the snapshot: skip it
        if pyfuse3.readdir_reply(token, name, self._entry(inode, st), next_id):
            inode.nlookup += 1
            return True
        self._drop_if_unused(inode)
        return False

    def _reply_dot(self, handle: _DirHandle, name: bytes, next_id: int, token: Any) -> bool:
        """'.' and '..' carry attributes but no lookup reference."""
        if name == b"." or handle.inode is self._root:
            st = os.fstat(handle.inode.fd if name == b"." else self._root.fd)
            nodeid = handle.inode.nodeid if name == b"." else self._root.nodeid
        else:
            st = os.stat(b"..", dir_fd=handle.inode.fd, follow_symlinks=False)
            nodeid = self._nodeid_for((st.st_dev, st.st_ino))
        return bool(pyfuse3.readdir_reply(token, name, self._attrs(nodeid, st), next_id))

    @_op("releasedir")
    def releasedir(self, fh: int) -> None:
        handle = self._dirs.pop(fh, None)
        if handle is not None:
            os.close(handle.fd)

    @_op("fsyncdir", threaded=True)
    def fsyncdir(self, fh: int, datasync: bool) -> None:
        os.fsync(fh)

    # ---- serving --------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Current counters."""
        return self.counters.snapshot()

    def close_all(self) -> None:
        """Close every fd still held (after the main loop has ended)."""
        for handle in list(self._dirs.values()):
            os.close(handle.fd)
        self._dirs.clear()
        for inode in list(self._inodes.values()):
            if inode is not self._root:
                os.close(inode.fd)
        self._inodes = {self._root.nodeid: self._root}
        self._live = {self._root.key: self._root}


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_LIBC = ctypes.CDLL(None, use_errno=True)
_CLOCK_MONOTONIC = 1
_TFD_FLAGS = os.O_NONBLOCK | os.O_CLOEXEC  # TFD_NONBLOCK | TFD_CLOEXEC
_PR_SET_TIMERSLACK = 29
_timerfd_ok = hasattr(_LIBC, "timerfd_create")


async def precise_sleep(seconds: float) -> None:
    """Sleep *seconds* with microsecond precision, letting other trio tasks run.

    ``trio.sleep`` wakes up through epoll's millisecond timeout (a 0.2 ms
    sleep lasts over 1 ms); a timerfd has nanosecond resolution.
    """
    global _timerfd_ok
    if seconds <= 0:
        await trio.lowlevel.checkpoint()
        return
    fd = _LIBC.timerfd_create(_CLOCK_MONOTONIC, _TFD_FLAGS) if _timerfd_ok else -1
    if fd < 0:
        _timerfd_ok = False
        await trio.sleep(seconds)
        return
    try:
        nanos = max(1, int(seconds * 1e9))
        secs, nsecs = divmod(nanos, 1_000_000_000)
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(secs, nsecs))
        if _LIBC.timerfd_settime(fd, 0, ctypes.byref(spec), None) != 0:
            await trio.sleep(seconds)
            return
        await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)


def set_timer_slack(nanos: int = 1) -> None:
    """Shrink this process's timer slack (default 50 us) so wake-ups are punctual."""
    try:
        _LIBC.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(nanos), 0, 0, 0)
    except (AttributeError, OSError):
        pass


def _renameat2(old_dir: int, old: bytes, new_dir: int, new: bytes, flags: int) -> None:
    """renameat2(2) through libc (Python has no binding)."""
    if flags & ~_RENAME_FLAGS_SUPPORTED:
        raise OSError(errno.EINVAL, "unsupported rename flags")
    if _LIBC.renameat2(old_dir, old, new_dir, new, ctypes.c_uint(flags)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


# --------------------------------------------------------------------------
# Daemon: control socket, signals, main loop
# --------------------------------------------------------------------------


class Daemon:
    """Runs a :class:`LatencyFS` with its control socket and signal handling."""

    def __init__(self, fs: LatencyFS, control: str | None, stats_file: str | None,
                 max_tasks: int) -> None:
        self.fs = fs
        self.control = control
        self.stats_file = stats_file
        self.max_tasks = max_tasks

    def dump_stats(self) -> None:
        """Write the counters to the --stats file, if one was given."""
        if self.stats_file:
            write_stats_file(self.stats_file, self.fs.stats())

    async def serve(self, on_ready: Callable[[], None] | None = None) -> None:
        """Serve FUSE requests until unmounted or signalled."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._signals)
            if self.control:
                await nursery.start(self._control_server, self.control)
            if on_ready is not None:
                on_ready()
            await pyfuse3.main(max_tasks=self.max_tasks)
            nursery.cancel_scope.cancel()

    async def _signals(self) -> None:
        sigs = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
        with trio.open_signal_receiver(*sigs) as receiver:
            async for signum in receiver:
                if signum == signal.SIGUSR1:
                    self.dump_stats()
                    continue
                log.info("latencyfs: signal %d, unmounting", signum)
                pyfuse3.terminate()
                return

    async def _control_server(self, path: str, task_status: Any = None) -> None:
        if os.path.exists(path):
            os.unlink(path)
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.bind(path)
        sock.listen(64)
        listener = trio.SocketListener(sock)
        try:
            task_status.started()
            await trio.serve_listeners(self._control_client, [listener])
        finally:
            with _suppress_oserror():
                os.unlink(path)

    async def _control_client(self, stream: Any) -> None:
        buf = b""
        async with stream:
            while True:
                try:
                    chunk = await stream.receive_some(4096)
                except trio.BrokenResourceError:
                    return
                if not chunk:
                    return
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    reply = self._command(line.decode(errors="replace").strip())
                    try:
                        await stream.send_all(reply.encode() + b"\n")
                    except trio.BrokenResourceError:
                        return

    def _command(self, command: str) -> str:
        if command == "stats":
            return json.dumps(self.fs.stats(), sort_keys=True)
        if command == "reset":
            self.fs.counters.reset()
            return "ok"
        if command == "dump":
            self.dump_stats()
            return "ok"
        if command == "config":
            return json.dumps(asdict(self.fs.config), sort_keys=True)
        if command == "ping":
            return "pong"
        if command.startswith("fail-reads "):  # fail-reads SUBSTRING ERRNO-NAME
            _, part, name = command.split(" ", 2)
            code = getattr(errno, name, None)
            if not isinstance(code, int):
                return f"error unknown errno {name!r}"
            self.fs.failing_reads[part] = code
            return "ok"
        if command == "clear-faults":
            self.fs.failing_reads.clear()
            return "ok"
        return f"error unknown command {command!r}"


class _suppress_oserror:
    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        return exc_type is not None and issubclass(exc_type, OSError)


def mount_options(fsname: str = "latencyfs") -> set[str]:
    """FUSE mount options used by latencyfs."""
    return {f"fsname={fsname}", "subtype=latencyfs", "default_permissions"}


def raise_fd_limit() -> None:
    """Each inode known to the kernel holds an fd: raise RLIMIT_NOFILE as far as allowed."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if os.geteuid() == 0:
        try:
            with open("/proc/sys/fs/nr_open", encoding="ascii") as fh:
                target = max(hard, int(fh.read()))
        except (OSError, ValueError):
            pass
    for limit in (target, hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
            return
        except (ValueError, OSError):
            continue


def run(source: str, mountpoint: str, config: Config, *, control: str | None = None,
        stats_file: str | None = None, max_tasks: int = 128,
        on_ready: Callable[[], None] | None = None) -> None:
    """Mount, serve until unmounted or signalled, then unmount (always)."""
    if pyfuse3 is None:
        raise RuntimeError("pyfuse3 is not installed (pip install pyfuse3)")
    os.umask(0)  # the kernel already applied the caller's umask to modes
    raise_fd_limit()
    set_timer_slack()
    fs = LatencyFS(source, config)
    daemon = Daemon(fs, control, stats_file, max_tasks)
    pyfuse3.init(fs, mountpoint, mount_options())
    try:
        trio.run(daemon.serve, on_ready)
    finally:
        pyfuse3.close(unmount=True)
        fs.close_all()
        daemon.dump_stats()


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    p = argparse.ArgumentParser(
        prog="latencyfs", description="Latency-injecting FUSE passthrough (NFS simulator)."
    )
    p.add_argument("source", help="directory to mirror")
    p.add_argument("mountpoint", help="where to mount it")
    p.add_argument("--delay-ms", type=float, default=1.0,
                   help="sleep before each metadata request (default 1.0)")
    p.add_argument("--data-delay-ms", type=float, default=0.0,
                   help="sleep before each read/write request (default 0)")
    p.add_argument("--attr-timeout", type=float, default=0.0,
                   help="kernel attribute cache seconds (default 0: no caching)")
    p.add_argument("--entry-timeout", type=float, default=0.0,
                   help="kernel name-lookup cache seconds (default 0: no caching)")
    p.add_argument("--negative-timeout", type=float, default=0.0,
                   help="kernel cache seconds for failed lookups (default 0)")
    p.add_argument("--no-keep-cache", action="store_true",
                   help="drop a file's page cache on every open")
    p.add_argument("--control", help="unix socket for stats/reset requests")
    p.add_argument("--stats", dest="stats_file",
                   help="JSON file for the counters (written at exit, on SIGUSR1 and 'dump')")
    p.add_argument("--max-tasks", type=int, default=128,
                   help="max concurrently served requests (default 128)")
    p.add_argument("--foreground", "-f", action="store_true",
                   help="stay in the foreground (default: return once mounted)")
    p.add_argument("--log", help="log file (background mode; default /dev/null)")
    p.add_argument("--debug", action="store_true", help="debug logging")
    args = p.parse_args(argv)
    for name in ("delay_ms", "data_delay_ms", "attr_timeout", "entry_timeout",
                 "negative_timeout"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0")
    if not os.path.isdir(args.source):
        p.error(f"source {args.source!r} is not a directory")
    if not os.path.isdir(args.mountpoint):
        p.error(f"mountpoint {args.mountpoint!r} is not a directory")
    return args


def config_from_args(args: argparse.Namespace) -> Config:
    """Build a :class:`Config` from parsed arguments."""
    return Config(
        delay_ms=args.delay_ms,
        data_delay_ms=args.data_delay_ms,
        attr_timeout=args.attr_timeout,
        entry_timeout=args.entry_timeout,
        negative_timeout=args.negative_timeout,
        keep_cache=not args.no_keep_cache,
    )


def _daemonize(log_path: str | None) -> Callable[[], None]:
    """Fork into the background; the parent exits when the child reports readiness.

    Returns the callback the child calls once it serves requests.
    """
    read_end, write_end = os.pipe()
    if os.fork() > 0:  # parent: wait for the child's verdict
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            ok = pipe.read(1) == b"1"
        os._exit(0 if ok else 1)
    os.close(read_end)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    _redirect_stdio(log_path)

    def ready() -> None:
        os.write(write_end, b"1")
        os.close(write_end)

    return ready


def _redirect_stdio(log_path: str | None) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if log_path else null
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.INFO,
        format="%(asctime)s latencyfs[%(process)d] %(levelname)s %(message)s",
    )
    if pyfuse3 is None:
        print("latencyfs: pyfuse3 is not installed (pip install pyfuse3)", file=sys.stderr)
        return 2
    if args.debug:
        logging.getLogger("pyfuse3").setLevel(logging.DEBUG)
    source = os.path.abspath(args.source)
    mountpoint = os.path.abspath(args.mountpoint)
    control = os.path.abspath(args.control) if args.control else None
    stats_file = os.path.abspath(args.stats_file) if args.stats_file else None
    on_ready = None if args.foreground else _daemonize(args.log)
    run(source, mountpoint, config_from_args(args), control=control,
        stats_file=stats_file, max_tasks=args.max_tasks, on_ready=on_ready)
    return 0


if __name__ == "__main__":
    sys.exit(main())
