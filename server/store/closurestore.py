"""Closures kept on the local cache disk for the next process (docs/ARCHITECTURE.md
"Closure store").

A cold process walks the commits and trees that a repository's bitmaps do not cover (tips
newer than the bitmap, refs its commits do not reach): the same walk on every restart.
What it derives is a pure function of immutable objects, so it is written here, keyed by
what pins it down, and read back by the next process on the same disk instead of walking.

The store knows nothing of what it holds: a record is an identity (bytes the caller says
must match exactly) and a payload. Every identity is stored after a digest of the server's
own source (:func:`code_digest`: ``server/`` and ``protocol/``): what a walk derives is a
function of the objects and of the code that walked them (which objects a filter keeps,
which delta hints a walk finds), so a record another version of gitspout wrote is
``stale`` here, as one of a replaced pack. Each record is one file::

    magic "GSCLOSR\\0", version (u16), identity length (u16), payload length (u64),
    identity, payload, SHA-256 of everything before it

written to a temporary name (``.tmp-<pid>-<thread>-<n>``) and renamed, so a reader sees a
whole file or none. A file that does not parse, whose checksum or length is wrong, is
removed and counted ``corrupt``, and so is a temporary file older than :data:`TMP_AGE`,
left by a process killed while writing it (found whenever the store lists its directory:
at start, when it evicts, and after each write when ``shared``;
a younger one may be another process's write in progress: the workers and the next
process share the directory, maybe from other containers, so the age decides, not the
pid); one whose identity differs (its pack was replaced) ``stale``. Files live in
``<base>/gitspout-closures/<scope>/``, a directory of this user's own (mode 0700, checked:
a file planted there by someone else could make the server send objects nobody may
have), never in the repositories. They hold at most ``max_bytes`` together (a fixed share
of ``--pack-cache-size``): past it, the least recently used go first (a load touches its
file's mtime). A store ``shared`` by the workers of ``--workers N`` has the pod's whole
sixteenth as ``max_bytes`` in each worker and counts the directory again after each of
its writes (the other workers write there too), so the one directory holds at most that
sixteenth, everyone's files; one store alone counts what it found at start and what it
wrote since. Past the budget the whole directory is trimmed to three quarters of it.
Writes are done by a background thread after the walk, never by a request.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import queue
import stat
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ClosureStore", "ClosureStoreStats", "STORE_DIR", "RESULTS", "code_digest"]

log = logging.getLogger("gitspout")

STORE_DIR = "gitspout-closures"
MAGIC = b"GSCLOSR\0"
VERSION = 1
_HEAD = struct.Struct(">8sHHQ")
_SUM = 32  # SHA-256
SUFFIX = ".clo"
RESULTS = ("loaded", "missed", "based", "written", "stale", "corrupt", "evicted", "dropped")
QUEUE_MAX = 64  # records waiting to be written; more are dropped (and counted)
TMP_PREFIX = ".tmp-"
# A temporary file untouched this long is a killed writer's: a record is written in one
# call of at most half the budget, within seconds.
TMP_AGE = 600.0


@functools.cache
def code_digest() -> bytes:
    """16 bytes of SHA-256 over the names and contents of the server's and the protocol's
    Python files, read once per process (at the store's start, before any request)."""
    server = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for top in (server, server.parent / "protocol"):
        for path in sorted(top.rglob("*.py")):
            h.update(str(path.relative_to(top.parent)).encode() + b"\0")
            h.update(path.read_bytes())
    return h.digest()[:16]


@dataclass
class ClosureStoreStats:
    """Counts by result (:data:`RESULTS`) and the bytes of the files this process knows of."""

    results: Counter[str] = field(default_factory=Counter)
    bytes: int = 0


def encode_record(identity: bytes, payload: bytes) -> bytes:
    """One file's bytes (the module docstring's format)."""
    body = _HEAD.pack(MAGIC, VERSION, len(identity), len(payload)) + identity + payload
    return body + hashlib.sha256(body).digest()


def decode_record(data: bytes) -> tuple[bytes, bytes] | None:
    """(identity, payload) of a file's bytes, or None when they are not one whole record."""
    if len(data) < _HEAD.size + _SUM:
        return None
    magic, version, id_len, pay_len = _HEAD.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        return None
    if len(data) != _HEAD.size + id_len + pay_len + _SUM:
        return None
    body = memoryview(data)[: len(data) - _SUM]
    if hashlib.sha256(body).digest() != data[len(data) - _SUM:]:
        return None
    start = _HEAD.size
    return data[start:start + id_len], data[start + id_len:len(data) - _SUM]


class ClosureStore:
    """Records on the local disk, shared by the processes using the same base directory
    (workers, and the next process after a restart)."""

    def __init__(self, base: str, max_bytes: int, shared: bool = False,
                 code: bytes | None = None) -> None:
        self.root = os.path.join(base, STORE_DIR)
        # Before every identity (the module doc); another code only in tests.
        self.code = code_digest() if code is None else code
        self.max_bytes = max_bytes
        self.shared = shared  # other processes write in the directory (module doc)
        self.stats = ClosureStoreStats()
        self._lock = threading.Lock()
        self._swept: set[tuple[str, str]] = set()
        self._queue: queue.Queue[tuple[str, str, bytes, bool] | threading.Event] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._seq = 0
        self._touched: dict[tuple[str, str], float] = {}  # (scope, name): monotonic time
        self.enabled = max_bytes > 0 and self._private_dir(self.root)
        if self.enabled:
            self.root = self._pinned(self.root)
            self.stats.bytes = self._scan_bytes()

    # -- reading ---------------------------------------------------------------------

    def load(self, scope: str, name: str, identity: bytes, count_miss: bool = True,
             count_hit: bool = True) -> bytes | None:
        """The payload stored under ``name`` if its identity is ``identity``; None
        otherwise (counted: loaded, unless not ``count_hit``, and then it is no use that
        keeps the file; missed unless not ``count_miss``; stale or corrupt, both of which
        remove the file). A reader that decodes the payload itself loads without
        ``count_hit``, then calls :meth:`accept` or :meth:`refuse`."""
        if not self.enabled:
            return None
        path = os.path.join(self.root, scope, name + SUFFIX)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as fh:
                data = fh.read()
        except OSError:
            if count_miss:
                self._count("missed")
            return None
        found = decode_record(data)
        if found is None or found[0] != self.code + identity:
            self._drop(path, len(data), "corrupt" if found is None else "stale")
            return None
        if count_hit:  # a use: evicted last (a look is not, nor does it reorder recent())
            self.accept(scope, name)
        return found[1]

    def accept(self, scope: str, name: str) -> None:
        """A record read with ``count_hit=False`` turned out usable: counted loaded, and
        evicted last (what :meth:`load` does for a record it accepts itself)."""
        self.touch(scope, name)
        self._count("loaded")

    def refuse(self, scope: str, name: str) -> None:
        """A record whose identity matched but whose payload its reader cannot use (a
        planted or damaged one): removed, and counted corrupt."""
        self._remove(scope, name, "corrupt")

    def touch(self, scope: str, name: str, every: float = 0.0) -> None:
        """Mark the record ``name`` as used now, if it exists: evicted last, and first in
        :meth:`recent`. With ``every``, not again within that many seconds of this
        process's last touch of it (a use on every request costs a syscall each)."""
        if not self.enabled:
            return
        if every:
            now = time.monotonic()
            if now - self._touched.get((scope, name), -every) < every:
                return
            if len(self._touched) >= 4096:
                self._touched.clear()
            self._touched[scope, name] = now
        try:
            os.utime(os.path.join(self.root, scope, name + SUFFIX))
        except OSError:
            pass

    def recent(self, scope: str, prefix: str, limit: int, largest: int | None = None
               ) -> list[str]:
        """The names (without suffix) of at most ``limit`` records of ``scope`` whose
        names start with ``prefix`` (and whose files are at most ``largest`` bytes), most
        recently written, loaded or touched first (a load with ``count_hit=False`` is a
        look, which does not count)."""
        if not self.enabled:
            return []
        found = []
        try:
            entries = list(os.scandir(os.path.join(self.root, scope)))
        except OSError:
            return []
        for entry in entries:
            name = entry.name
            if name.startswith(prefix) and name.endswith(SUFFIX):
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if largest is None or st.st_size <= largest:
                    found.append((st.st_mtime, name))
        found.sort(reverse=True)
        return [name[: -len(SUFFIX)] for _, name in found[:limit]]

    def sweep(self, scope: str, keep_prefix: str) -> None:
        """Remove the files of ``scope`` whose names do not start with ``keep_prefix``
        (their pack was replaced: they can never be loaded again), once per process and
        prefix."""
        if not self.enabled:
            return
        with self._lock:
            if (scope, keep_prefix) in self._swept:
                return
            self._swept.add((scope, keep_prefix))
        folder = os.path.join(self.root, scope)
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        for entry in entries:
            if entry.name.endswith(SUFFIX) and not entry.name.startswith(keep_prefix):
                try:
                    size = entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
                self._drop(entry.path, size, "stale")

    def trim(self, scope: str, prefix: str, keep: int) -> None:
        """Remove the records of ``scope`` whose names start with ``prefix`` but the
        ``keep`` most recently used (counted ``evicted``): records keyed by a state that
        moves on (tips after a push) are not loaded again once it has."""
        if not self.enabled:
            return
        for name in self.recent(scope, prefix, 1 << 30)[keep:]:
            self._remove(scope, name, "evicted")

    # -- writing ---------------------------------------------------------------------

    def save(self, scope: str, name: str, identity: bytes, payload: bytes,
             count: bool = True, share: int = 4) -> None:
        """Write the record in the background (dropped, and counted, when the writer is
        behind by :data:`QUEUE_MAX` records, or larger than ``1/share`` of the store).
        Without ``count``, its writing is not counted as ``written`` (a pack's facts:
        neither a closure nor a layout)."""
        if share < 2:  # past three quarters, a record would evict itself (_evict)
            raise ValueError("a record may take at most half the store")
        if not self.enabled:
            return
        data = encode_record(self.code + identity, payload)
        if len(data) > self.max_bytes // share:
            self._count("dropped")
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._write_loop, daemon=True,
                                                name="gitspout-closure-store")
                self._thread.start()
        if self._queue.qsize() >= QUEUE_MAX:
            self._count("dropped")
            return
        self._queue.put_nowait((scope, name, data, count))

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until every record queued so far is written (tests, shutdown)."""
        if self._thread is None:
            return
        done = threading.Event()
        self._queue.put(done)
        done.wait(timeout)

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self._write(*item)
            except OSError as exc:
                log.warning("closure store: cannot write %s: %s", item[1], exc)
                self._count("dropped")

    def _write(self, scope: str, name: str, data: bytes, count: bool = True) -> None:
        folder = os.path.join(self.root, scope)
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        path = os.path.join(folder, name + SUFFIX)
        with self._lock:
            self._seq += 1
            tmp = os.path.join(folder, f"{TMP_PREFIX}{os.getpid()}-{threading.get_ident()}-{self._seq}")
        try:
            old = os.lstat(path).st_size
        except OSError:
            old = 0
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.rename(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        files = self._files() if self.shared else None  # one listing, also for the trim
        with self._lock:
            if files is not None:
                self.stats.bytes = sum(size for _, size, _ in files)
            else:
                self.stats.bytes += len(data) - old
            if count:
                self.stats.results["written"] += 1
            over = self.stats.bytes > self.max_bytes
        if over:
            self._evict(files)

    # -- the budget ------------------------------------------------------------------

    def _files(self) -> list[tuple[float, int, str]]:
        """(mtime, size, path) of every record file, of every scope; temporary files older
        than :data:`TMP_AGE` (their writer was killed) are removed on the way."""
        found = []
        leftovers = 0
        now = time.time()
        try:
            scopes = list(os.scandir(self.root))
        except OSError:
            return []
        for scope in scopes:
            if not scope.is_dir(follow_symlinks=False):
                continue
            try:
                entries = list(os.scandir(scope.path))
            except OSError:
                continue
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if entry.name.endswith(SUFFIX) and stat.S_ISREG(st.st_mode):
                    found.append((st.st_mtime, st.st_size, entry.path))
                elif entry.name.startswith(TMP_PREFIX) and now - st.st_mtime > TMP_AGE:
                    try:
                        os.unlink(entry.path)
                    except OSError:
                        continue
                    leftovers += 1
        if leftovers:
            with self._lock:
                self.stats.results["corrupt"] += leftovers
            log.info("closure store: removed %d unfinished files of killed writers", leftovers)
        return found

    def _scan_bytes(self) -> int:
        return sum(size for _, size, _ in self._files())

    def _evict(self, files: list[tuple[float, int, str]] | None = None) -> None:
        """Remove the least recently used files until three quarters of the budget are
        used (the files of every process sharing the directory count); ``files``: the
        directory as just listed, if it was."""
        files = sorted(self._files() if files is None else files)
        total = sum(size for _, size, _ in files)
        for _, size, path in files:
            if total <= self.max_bytes * 3 // 4:
                break
            try:
                os.unlink(path)
            except FileNotFoundError:  # another worker's trim took it first: gone all
                total -= size  # the same (counting on would trim far below the target)
                continue
            except OSError:
                continue
            total -= size
            self._count("evicted")
        with self._lock:
            self.stats.bytes = total

    # -- helpers ---------------------------------------------------------------------

    def count(self, result: str) -> None:
        """Count one ``result`` (a caller's miss after several lookups)."""
        self._count(result)

    def _count(self, result: str) -> None:
        with self._lock:
            self.stats.results[result] += 1

    def _remove(self, scope: str, name: str, result: str) -> None:
        """:meth:`_drop` the record ``name`` of ``scope``, if it is there."""
        path = os.path.join(self.root, scope, name + SUFFIX)
        try:
            size = os.stat(path, follow_symlinks=False).st_size
        except OSError:
            return
        self._drop(path, size, result)

    def _drop(self, path: str, size: int, result: str) -> None:
        try:
            os.unlink(path)
        except OSError:
            pass
        else:
            with self._lock:
                self.stats.bytes = max(0, self.stats.bytes - size)
        self._count(result)

    @staticmethod
    def _pinned(path: str) -> str:
        """The directory found private, by its descriptor (``/proc/self/fd/N``), where
        Linux has one: whoever may write to its parent (an emptyDir is mode 0777) can
        rename it away later and put another in its place, but not under this name."""
        if not os.path.isdir("/proc/self/fd"):
            return path
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        st = os.fstat(fd)  # the one opened is the one checked (no swap in between)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            os.close(fd)
            raise PermissionError(f"{path} changed hands while it was being opened")
        return f"/proc/self/fd/{fd}"

    @staticmethod
    def _private_dir(path: str) -> bool:
        """Make ``path`` (mode 0700) or accept it only if it is a directory of this user's
        that nobody else may write to; otherwise the store is off (logged)."""
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            log.warning("closure store off: cannot make %s: %s", path, exc)
            return False
        try:
            st = os.lstat(path)
        except OSError as exc:
            log.warning("closure store off: %s: %s", path, exc)
            return False
        if (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid()
                or st.st_mode & 0o022):
            log.warning("closure store off: %s is not a directory of this user's that "
                        "only it may write to", path)
            return False
        return True
