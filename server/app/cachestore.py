"""The pack cache's store: its entries on the local disk, their index, the byte cap, the
TTL and which keys are cached at all (docs/ARCHITECTURE.md "Pack cache").

An entry is one pack file being written or complete, read by any number of readers from
descriptors of their own (an evicted entry's file is unlinked; its readers keep reading).
Everything here runs on the event loop: the index, the byte counts and the entries need no
lock. Producing and reading entries is ``packcache.py``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from . import cacheshare
from .cachedir import make_directory, reclaim_orphans

__all__ = ["CacheStore", "CacheEntry", "CacheWriteError", "PackCacheLimits", "PackCacheStats",
           "WRITE_COOLDOWN"]

log = logging.getLogger("gitspout")

SEEN_KEYS = 4096  # keys remembered for "cache on second occurrence"
# After a cache file could not be written (the disk is full), requests stream without the
# cache this long before it is tried again.
WRITE_COOLDOWN = 30.0


@dataclass(frozen=True)
class PackCacheLimits:
    """``--pack-cache-size`` (0: no cache), ``--pack-cache-dir`` (none: the system's
    temporary directory), ``--pack-cache-ttl`` (0: until evicted), ``--pack-cache-on``."""

    size: int
    directory: str = ""
    ttl: float = 600.0
    on: str = "first"
    shared: str = ""  # --workers: the master's directory, shared by its workers (cacheshare.py)


class CacheWriteError(Exception):
    """Writing a cache file failed (ENOSPC, EIO, the directory gone): the cache's fault,
    not the repository's. The readers then generate the pack themselves (packcache.py _After)."""


@dataclass
class CacheEntry:
    """One pack in the cache: its file, how much of it is written, and how it ended."""

    key: bytes
    path: str
    repo: str
    created: float
    size: int = 0  # bytes written (side-band-64k packets), visible to readers
    pack_size: int = 0  # the pack's own bytes, once done
    progress: list[tuple[int, bytes]] = field(default_factory=list)  # (file offset, line)
    objects: int = 0
    done: bool = False
    failed: str | None = None  # the in-band error text every reader ends with
    resumable: bool = False  # failed writing the file: readers go on from their own source
    completed: float = 0.0  # when it was done (the TTL counts from here)
    verbatim: tuple[object, ...] | None = None  # the key of a pack sent whole: no file bytes
    readers: int = 0
    listed: bool = True  # still in the index (else: unlinked, read by those who opened it)
    lock: int = -1  # a shared directory's producer: its flock until published (cacheshare.py)
    owned: bool = True  # False: adopted from another worker, whose file and bytes it is
    # readers waiting for a change: (the size that wakes them, 0 for any change, future)
    waiters: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)

    def wake(self, grown_only: bool = False) -> None:
        """Wake the readers waiting for a change. ``grown_only``: the producer only wrote
        bytes; a reader waiting for more than there are now sleeps on."""
        if grown_only:
            size = self.size
            waiters = [w for w in self.waiters if w[0] <= size]
            self.waiters = [w for w in self.waiters if w[0] > size]
        else:
            waiters, self.waiters = self.waiters, []
        for _, fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def changed(self, timeout: float, until: int = 0) -> bool:
        """Wait until the producer writes (``until`` bytes in all, when given), ends or
        fails; False after ``timeout``."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = (until, fut)
        self.waiters.append(waiter)
        try:
            await asyncio.wait_for(fut, timeout if timeout > 0 else None)
            return True
        except TimeoutError:
            return False
        finally:
            # Timed out or cancelled: not left for a wake to find (woken: gone already).
            with contextlib.suppress(ValueError):
                self.waiters.remove(waiter)

    async def grown(self, since: int, want: int, timeout: float) -> bool:
        """Wait until ``want`` bytes more than ``since`` are written, or the producer
        ends or fails or decides something (progress, a whole pack); False after
        ``timeout`` in all. A reader following the producer sends a region per ``want``
        bytes, not per producer step (each region costs its writes and a wake-up)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout > 0 else None
        shown = len(self.progress)
        while self.size < since + want and not self.done and self.failed is None \
                and self.verbatim is None and len(self.progress) == shown:
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0 \
                    or not await self.changed(left or 0.0, since + want):
                return False
        return True


@dataclass
class PackCacheStats:
    lookups: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("hit", "miss", "joined", "bypass"), 0))
    # bytes of cache files sent (every reader), by sendfile or through Python (cacheread.py)
    served_bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("sendfile", "python"), 0))
    generated_bytes: int = 0  # bytes producers wrote
    evictions: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("size", "ttl", "failed"), 0))


class CacheStore:
    """The index of cache entries and their files, within the byte cap. In a directory
    shared by ``--workers N`` the cap is this worker's share (``--pack-cache-size``/N,
    workers.py ``worker_config``) and counts only the files it produced (``owned``): the
    workers' shares add up to the setting, so the directory holds at most that in all."""

    def __init__(self, limits: PackCacheLimits) -> None:
        base = limits.directory or tempfile.gettempdir()
        os.makedirs(base, exist_ok=True)
        reclaim_orphans(base)
        # A directory of our own: two servers sharing the base never touch each other's
        # files, and shutdown removes everything this process wrote. It is locked while
        # this process lives, so that a server started after a crash (an OOM kill keeps
        # the emptyDir) removes it.
        self.base = base
        self.shared = bool(limits.shared)
        if self.shared:  # the master's, locked and removed by it
            self.directory, self._lock = limits.shared, -1
        else:
            self.directory, self._lock = make_directory(base)
        self.max_bytes = limits.size
        self.ttl = limits.ttl
        self.second = limits.on == "second"
        self.bytes = 0  # sum of the listed entries' sizes
        self.entries: OrderedDict[bytes, CacheEntry] = OrderedDict()  # least recently used first
        self.seen: OrderedDict[bytes, None] = OrderedDict()
        self.alone: OrderedDict[bytes, None] = OrderedDict()  # see first_alone
        self.stats = PackCacheStats()
        self._serial = 0
        self.write_failed_at = -WRITE_COOLDOWN  # monotonic time of the last CacheWriteError

    # -- the index ---------------------------------------------------------------

    def lookup(self, key: bytes, repo: str) -> tuple[CacheEntry | None, str]:
        """The entry to read for ``key`` and how it was found: ``hit`` (complete),
        ``joined`` (being produced), ``miss`` (a new entry: the caller starts its
        producer) or ``bypass`` (none: not cached, stream directly)."""
        now = time.monotonic()
        self._expire(now)
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
            result = "hit" if entry.done else "joined"
        elif self.second and key not in self.seen:
            self._remember(key)
            result, entry = "bypass", None
        elif now - self.write_failed_at < WRITE_COOLDOWN:
            result, entry = "bypass", None
        elif self.shared:
            self.seen.pop(key, None)
            entry, result = self._claim(key, repo, now)
        else:
            self.seen.pop(key, None)
            entry = self._create(key, repo, now)
            result = "miss" if entry is not None else "bypass"
        self.stats.lookups["joined" if result == "remote" else result] += 1
        return entry, result

    def find(self, key: bytes) -> CacheEntry | None:
        """The entry of ``key`` in this process's index (complete or being written), if
        any, as the most recently used; nothing created, nothing counted."""
        self._expire(time.monotonic())
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
        return entry

    def _claim(self, key: bytes, repo: str, now: float) -> tuple[CacheEntry | None, str]:
        """A shared directory's lookup past our own index (cacheshare.py): ``hit`` (a
        pack another worker completed), ``miss`` (ours to produce) or ``remote`` (another
        worker produces it: the caller waits for it)."""
        try:
            found = cacheshare.claim(self.directory, key)
        except OSError as exc:
            log.warning("pack cache: cannot claim %s in %s: %s", key.hex()[:40],
                        self.directory, exc)
            return None, "bypass"
        if found.kind == "wait":
            return None, "remote"
        if found.kind == "adopt" and found.meta is not None:
            return self.adopt(key, repo, found.meta, now), "hit"
        entry = self.entries[key] = CacheEntry(key, found.part, repo, now, lock=found.lock)
        return entry, "miss"

    def adopt(self, key: bytes, repo: str, meta: dict[str, object],
              now: float | None = None) -> CacheEntry:
        """An index entry for a pack another worker completed (its file and bytes stay
        that worker's)."""
        now = time.monotonic() if now is None else now
        progress = meta.get("progress")
        entry = CacheEntry(key, cacheshare.pack_path(self.directory, key), repo, now,
                           size=int(str(meta["size"])), objects=int(str(meta["objects"])),
                           pack_size=int(str(meta.get("pack_size", 0))),
                           progress=[(int(o), bytes.fromhex(t)) for o, t in
                                     (progress if isinstance(progress, list) else [])],
                           done=True, completed=now, owned=False)
        self.entries[key] = entry
        return entry

    def completed(self, entry: CacheEntry) -> None:
        """Its producer is done: in a shared directory, publish the pack for the other
        workers (a whole pack named by the entry is not published: each decides again)
        and let the lock go."""
        if entry.lock < 0:
            return
        try:
            if entry.verbatim is None and entry.listed and entry.done:
                entry.path = cacheshare.publish(self.directory, entry.key, entry.path, {
                    "size": entry.size, "objects": entry.objects, "pid": os.getpid(),
                    "pack_size": entry.pack_size,
                    "progress": [[o, t.hex()] for o, t in entry.progress]})
        except OSError as exc:
            log.warning("pack cache: cannot publish %s: %s", entry.path, exc)
        finally:
            cacheshare.release(entry.lock)
            entry.lock = -1

    def _remember(self, key: bytes, keys: OrderedDict[bytes, None] | None = None) -> None:
        """Note ``key`` in ``keys`` (``seen`` unless told), the last SEEN_KEYS of them."""
        keys = self.seen if keys is None else keys
        keys[key] = None
        while len(keys) > SEEN_KEYS:
            keys.popitem(last=False)

    def first_alone(self, key: bytes) -> bool:
        """True the first time a whole pack's key is asked for by one request alone (it is
        then sent from the pack); the second time it is copied, for the requests after."""
        if key in self.alone:
            del self.alone[key]
            return False
        self._remember(key, self.alone)
        return True

    def _create(self, key: bytes, repo: str, now: float) -> CacheEntry | None:
        self._serial += 1
        path = os.path.join(self.directory, f"{key.hex()[:40]}-{self._serial}.pack")
        try:
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except FileNotFoundError:  # removed under us (a temp dir cleaner): a new one
                if self.shared:
                    raise
                self._replace_directory()
                path = os.path.join(self.directory, os.path.basename(path))
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except OSError as exc:  # the cache directory is unusable: serve without it
            log.warning("pack cache: cannot create %s: %s", path, exc)
            return None
        entry = self.entries[key] = CacheEntry(key, path, repo, now)
        return entry

    def _replace_directory(self) -> None:
        """Our directory is gone: make another. Entries listed in the old one have lost
        their files (readers keep their descriptors); they are dropped."""
        for entry in list(self.entries.values()):
            self.drop(entry, "failed")
        os.makedirs(self.base, exist_ok=True)
        directory, lock = make_directory(self.base)
        os.close(self._lock)
        self.directory, self._lock = directory, lock
        log.warning("pack cache: its directory was removed; now %s", directory)

    def drop(self, entry: CacheEntry, reason: str | None) -> None:
        """Unlist an entry and unlink its file; its readers keep reading from their open
        descriptors (Linux keeps an unlinked file's data until its last close)."""
        if not entry.listed:
            return
        entry.listed = False
        if self.entries.get(entry.key) is entry:
            del self.entries[entry.key]
        if reason is not None:
            self.stats.evictions[reason] += 1
        if reason in ("ttl", "size"):
            self._remember(entry.key)  # it was asked for: the next request caches it again
        if not entry.owned:
            return  # another worker's file
        self.bytes -= entry.size
        if self.shared:
            cacheshare.unpublish(entry.path, entry.lock)
        else:
            try:
                os.unlink(entry.path)
            except OSError:
                pass
        cacheshare.release(entry.lock)  # after the unlink: a waiter then finds no pack
        entry.lock = -1

    def forget(self, entry: CacheEntry) -> None:
        """Unlist another worker's entry whose file it has removed (not counted: its owner
        counted the eviction); the key was asked for, so the next lookup claims it (with
        --pack-cache-on second too)."""
        self.drop(entry, None)
        self._remember(entry.key)

    def discard(self, entry: CacheEntry) -> None:
        """Forget an entry that cannot be read (its producer, if any, fails it)."""
        entry.failed = entry.failed or "pack cache entry lost"
        self.drop(entry, "failed")
        entry.wake()

    def _expire(self, now: float) -> None:
        if self.ttl <= 0:
            return
        old = [e for e in self.entries.values() if e.done and now - e.completed > self.ttl]
        for entry in old:
            self.drop(entry, "ttl")

    def grew(self, entry: CacheEntry, n: int) -> None:
        """The producer wrote ``n`` bytes: count them, then get back under the cap, least
        recently used first, entries nobody reads before those being read; an entry still
        being produced goes last (its readers carry on, nobody new joins it)."""
        entry.size += n
        self.stats.generated_bytes += n
        if not entry.listed:
            return
        self.bytes += n
        if self.bytes <= self.max_bytes:
            return
        for pick in (lambda e: e.done and not e.readers, lambda e: e.done,
                     lambda e: e is not entry, lambda e: True):
            for victim in [e for e in self.entries.values() if e.owned and pick(e)]:
                if self.bytes <= self.max_bytes:
                    return
                self.drop(victim, "size")

    def close(self) -> None:
        """Shutdown: forget every entry and remove the directory."""
        for entry in list(self.entries.values()):
            self.drop(entry, None)
        if not self.shared:
            shutil.rmtree(self.directory, ignore_errors=True)
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1

    # -- producing ---------------------------------------------------------------

    def open_reader(self, entry: CacheEntry) -> int:
        """A descriptor on the entry's file, opened at once (on the loop, before any
        await) so that an eviction can unlink the file but not take it from this reader."""
        fd = os.open(entry.path, os.O_RDONLY)
        entry.readers += 1
        return fd
