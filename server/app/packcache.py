"""The pack cache: one generation per distinct pack, streamed to every identical request
(docs/ARCHITECTURE.md, "Pack cache").

A fetch whose pack is decided (``core/fetch.py`` ``plan_fetch``) gets a key: what the pack
bytes are a function of (:func:`pack_key`). The first request for a key *produces*: a task,
not tied to any client, pulls the pack source in the pool and appends its bytes to a file
in the cache directory. Every request for that key, the first one included, is a *reader*:
it reads the file from its own descriptor, at its own pace, up to what the producer has
written, and frames the bytes for its own side-band (or none), progress (or no-progress)
and keepalives. A slow reader holds back nobody; memory stays one chunk per reader.

A large pack sent whole as it is on disk (verbatim reuse, ``WholePackSource``, over an eighth
of the cap) is not copied: the pack file already is the cached answer. Its producer only
decides that, once, for everyone waiting; the entry then names the pack (``verbatim``, by
key) and each reader sends it from its own request's lease of the same pack, through the
pool (packs may be on NFS). A clone storm on a monorepo computes its object set once and
does not fill the cache directory with a copy of its pack. A smaller one is copied like any
other when several requests wait for it: a reader of the local cache file costs less than
pool round trips to the pack. One request alone gains nothing from a copy: a whole pack
over 4 MiB that only it waits for is sent from the pack, and the entry dropped, the first
time; the second time its key comes alone it is copied, for the clones after it.

A producer that fails leaves its error on the entry: every reader sends it in-band once it
has sent what was written (I4, P10), the file is removed, and the next request generates
again. Completed entries serve later identical requests (hits) until their TTL, the byte
cap (least recently used first) or a new key (a push, a repack) makes them go.

Everything but the pool steps of the producer runs on the event loop, so the index, the
byte counts and the entries need no lock. Reading the cache file happens on the loop too:
it is local disk written moments ago (page cache), and a pool round trip per 64 KiB for
32 readers would queue other repositories' work behind a storm (the fairness target).
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..core.context import RequestContext
from ..core.fetch import FetchPlan
from ..core.stats import PackStats, Progress
from ..packgen.packplan import build_pack_source
from ..packgen.packsource import PackSource, WholePackSource
from ..store.odb import ObjectSnapshot
from .errors import INTERNAL_ERROR, answer_for
from .stream import PULL_END, PktWriter, pull_items, pump_pack

__all__ = ["PackCache", "PackCacheCollector", "pack_key", "send_pack_cached"]

log = logging.getLogger("gitspout")

READ_CHUNK = 64 * 1024  # one read per reader step; about one side-band-64k packet
# A reader whose client keeps taking data never waits in ``write``: without a yield, one
# reader would send megabytes (a loopback socket buffer) while every other request waits.
YIELD_EVERY = 256 * 1024
SEEN_KEYS = 4096  # keys remembered for "cache on second occurrence"
# A whole pack on disk larger than this, asked for by one client alone for the first time, is
# sent from the pack, not copied: the pack file already is the answer, and writing dulwich's
# 27 MB pack into the cache cost its cold clone about 30 ms of 300. Several clients, or the
# same key again, share a copy: a reader of a local file costs less than pool round trips
# (docs/ARCHITECTURE.md, "Pack cache").
WHOLE_COPY_MAX = 4 << 20
# After a cache file could not be written (the disk is full), requests stream without the
# cache this long before it is tried again.
WRITE_COOLDOWN = 30.0


class CacheWriteError(Exception):
    """Writing a cache file failed (ENOSPC, EIO, the directory gone): the cache's fault,
    not the repository's. The readers then generate the pack themselves (_After)."""


@dataclass
class _Entry:
    """One pack in the cache: its file, how much of it is written, and how it ended."""

    key: bytes
    path: str
    repo: str
    created: float
    size: int = 0  # bytes written, visible to readers
    progress: list[tuple[int, bytes]] = field(default_factory=list)  # (offset, line)
    objects: int = 0
    done: bool = False
    failed: str | None = None  # the in-band error text every reader ends with
    resumable: bool = False  # failed writing the file: readers go on from their own source
    completed: float = 0.0  # when it was done (the TTL counts from here)
    verbatim: tuple[object, ...] | None = None  # the key of a pack sent whole: no file bytes
    readers: int = 0
    listed: bool = True  # still in the index (else: unlinked, read by those who opened it)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)

    def wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def changed(self, timeout: float) -> bool:
        """Wait until the producer writes, ends or fails; False after ``timeout``."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        try:
            await asyncio.wait_for(fut, timeout if timeout > 0 else None)
            return True
        except TimeoutError:
            return False


@dataclass
class PackCacheStats:
    lookups: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("hit", "miss", "joined", "bypass"), 0))
    served_bytes: int = 0  # bytes read from cache files and sent (every reader)
    generated_bytes: int = 0  # bytes producers wrote
    evictions: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("size", "ttl", "failed"), 0))


DIR_PREFIX = "gitspout-packcache-"
NEW_PREFIX = ".gitspout-packcache-new-"  # made, then locked, then renamed to DIR_PREFIX...
ORPHAN_AGE = 60.0  # seconds: a NEW_PREFIX directory younger than this may be being locked


def make_directory(base: str) -> tuple[str, int]:
    """A cache directory of this process's own in ``base`` and the descriptor holding its
    flock. It is made under a temporary name and locked before it is renamed, so a
    directory with the final prefix is locked from the moment it has that name: an
    unlocked one is a dead server's, whatever its age (a crash loop restarts within
    seconds)."""
    tmp = tempfile.mkdtemp(prefix=NEW_PREFIX, dir=base)
    fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        final = os.path.join(base, DIR_PREFIX + os.path.basename(tmp)[len(NEW_PREFIX):])
        os.rename(tmp, final)
    except OSError:
        os.close(fd)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final, fd


def reclaim_orphans(base: str) -> int:
    """Remove the cache directories in ``base`` that no live server holds (their server
    was killed: close() never ran); how many. Each server holds an flock on its
    directory, which the kernel releases when the process dies, however it dies."""
    removed = 0
    try:
        found = [e for e in os.scandir(base)
                 if e.name.startswith((DIR_PREFIX, NEW_PREFIX)) and e.is_dir()]
    except OSError:
        return 0
    now = time.time()
    for entry in found:
        try:
            if entry.name.startswith(NEW_PREFIX) and now - entry.stat().st_mtime < ORPHAN_AGE:
                continue
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a live server's
        else:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
        finally:
            os.close(fd)
    if removed:
        log.info("pack cache: removed %d directories of stopped servers from %s", removed, base)
    return removed


class PackCache:
    """The index of cache entries, the byte cap and the producers (see the module doc)."""

    def __init__(self, directory: str, max_bytes: int, ttl: float, on: str = "first") -> None:
        base = directory or tempfile.gettempdir()
        os.makedirs(base, exist_ok=True)
        reclaim_orphans(base)
        # A directory of our own: two servers sharing the base never touch each other's
        # files, and shutdown removes everything this process wrote. It is locked while
        # this process lives, so that a server started after a crash (an OOM kill keeps
        # the emptyDir) removes it.
        self.base = base
        self.directory, self._lock = make_directory(base)
        self.max_bytes = max_bytes
        self.ttl = ttl
        self.second = on == "second"
        self.bytes = 0  # sum of the listed entries' sizes
        self.entries: OrderedDict[bytes, _Entry] = OrderedDict()  # least recently used first
        self.seen: OrderedDict[bytes, None] = OrderedDict()
        self.alone: OrderedDict[bytes, None] = OrderedDict()  # see _first_alone
        self.stats = PackCacheStats()
        self._serial = 0
        self.producers: set[asyncio.Task[None]] = set()  # referenced until they end
        self.write_failed_at = -WRITE_COOLDOWN  # monotonic time of the last CacheWriteError

    # -- the index ---------------------------------------------------------------

    def lookup(self, key: bytes, repo: str) -> tuple[_Entry | None, str]:
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
        else:
            self.seen.pop(key, None)
            entry = self._create(key, repo, now)
            result = "miss" if entry is not None else "bypass"
        self.stats.lookups[result] += 1
        return entry, result

    def _remember(self, key: bytes, keys: OrderedDict[bytes, None] | None = None) -> None:
        """Note ``key`` in ``keys`` (``seen`` unless told), the last SEEN_KEYS of them."""
        keys = self.seen if keys is None else keys
        keys[key] = None
        while len(keys) > SEEN_KEYS:
            keys.popitem(last=False)

    def _first_alone(self, key: bytes) -> bool:
        """True the first time a whole pack's key is asked for by one request alone (it is
        then sent from the pack); the second time it is copied, for the requests after."""
        if key in self.alone:
            del self.alone[key]
            return False
        self._remember(key, self.alone)
        return True

    def _create(self, key: bytes, repo: str, now: float) -> _Entry | None:
        self._serial += 1
        path = os.path.join(self.directory, f"{key.hex()[:40]}-{self._serial}.pack")
        try:
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except FileNotFoundError:  # removed under us (a temp dir cleaner): a new one
                self._replace_directory()
                path = os.path.join(self.directory, os.path.basename(path))
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except OSError as exc:  # the cache directory is unusable: serve without it
            log.warning("pack cache: cannot create %s: %s", path, exc)
            return None
        entry = self.entries[key] = _Entry(key, path, repo, now)
        return entry

    def _replace_directory(self) -> None:
        """Our directory is gone: make another. Entries listed in the old one have lost
        their files (readers keep their descriptors); they are dropped."""
        for entry in list(self.entries.values()):
            self._drop(entry, "failed")
        os.makedirs(self.base, exist_ok=True)
        directory, lock = make_directory(self.base)
        os.close(self._lock)
        self.directory, self._lock = directory, lock
        log.warning("pack cache: its directory was removed; now %s", directory)

    def _drop(self, entry: _Entry, reason: str | None) -> None:
        """Unlist an entry and unlink its file; its readers keep reading from their open
        descriptors (Linux keeps an unlinked file's data until its last close)."""
        if not entry.listed:
            return
        entry.listed = False
        if self.entries.get(entry.key) is entry:
            del self.entries[entry.key]
        self.bytes -= entry.size
        if reason is not None:
            self.stats.evictions[reason] += 1
        if reason in ("ttl", "size"):
            self._remember(entry.key)  # it was asked for: the next request caches it again
        try:
            os.unlink(entry.path)
        except OSError:
            pass

    def discard(self, entry: _Entry) -> None:
        """Forget an entry that cannot be read (its producer, if any, fails it)."""
        entry.failed = entry.failed or "pack cache entry lost"
        self._drop(entry, "failed")
        entry.wake()

    def _expire(self, now: float) -> None:
        if self.ttl <= 0:
            return
        old = [e for e in self.entries.values() if e.done and now - e.completed > self.ttl]
        for entry in old:
            self._drop(entry, "ttl")

    def _grew(self, entry: _Entry, n: int) -> None:
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
            for victim in [e for e in self.entries.values() if pick(e)]:
                if self.bytes <= self.max_bytes:
                    return
                self._drop(victim, "size")

    def close(self) -> None:
        """Shutdown: forget every entry and remove the directory."""
        for entry in list(self.entries.values()):
            self._drop(entry, None)
        shutil.rmtree(self.directory, ignore_errors=True)
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1

    # -- producing ---------------------------------------------------------------

    async def produce(self, entry: _Entry, ctx: RequestContext, plan: FetchPlan,
                      executor: Executor, make_iter: Callable[[PackSource | None], Iterator[Any]]) -> None:
        """Decide the pack source in the pool; a whole pack on disk only marks the entry
        (see the module doc). Otherwise pull the source in the pool and append its bytes
        to the entry's file, as fast as it goes, until it ends, fails, or nobody reads any
        more."""
        loop = asyncio.get_running_loop()
        ctx.hold()  # the packs it reads stay leased even once the first client is gone
        fd = -1
        it: Iterator[Any] | None = None
        step: asyncio.Future[Any] | None = None
        try:
            fd = os.open(entry.path, os.O_WRONLY | os.O_APPEND)
            source = await loop.run_in_executor(executor, build_pack_source, ctx, plan)
            if isinstance(source, WholePackSource) and source.pack.pack_size > WHOLE_COPY_MAX:
                large = source.pack.pack_size > self.max_bytes // 8
                if large or (entry.readers <= 1 and self._first_alone(entry.key)):
                    entry.verbatim, entry.objects = source.pack.key, source.stats.objects
                    entry.done = True
                    entry.completed = time.monotonic()
                    if not large:
                        self._drop(entry, None)  # the next request decides again
                    return
            it = make_iter(source)
            while entry.readers and not entry.done:
                step = loop.run_in_executor(executor, _produce_step, it, fd)
                for item in await step:
                    if item is PULL_END:
                        entry.done = True
                        entry.completed = time.monotonic()
                        if ctx.pack_stats is not None:
                            entry.objects = ctx.pack_stats.objects
                    elif isinstance(item, Progress):
                        entry.progress.append((entry.size, item.text))
                    else:
                        self._grew(entry, item)
                entry.wake()
        except CacheWriteError as exc:
            # Not the client's fault nor the repository's: each reader generates the rest
            # itself, and new requests stream without the cache for a while.
            log.warning("pack cache: cannot write %s (%s); streaming without the cache "
                        "for %.0f s", entry.path, exc, WRITE_COOLDOWN)
            self.write_failed_at = time.monotonic()
            entry.resumable = True
            entry.failed = "pack cache write failed"
        except Exception as exc:  # every reader ends with it, in-band
            answer = answer_for(exc, entry.repo, started=True)
            entry.failed = answer.text if answer is not None else INTERNAL_ERROR
            if answer is None:
                log.exception("pack cache: producing a pack of %s failed", entry.repo)
        finally:
            if not entry.done:
                entry.failed = entry.failed or "pack generation stopped"
                self._drop(entry, "failed")
            entry.wake()
            if fd >= 0:
                _release_when_done(step, it, fd, executor, loop)
            ctx.unhold()

    # -- reading -----------------------------------------------------------------

    def open_reader(self, entry: _Entry) -> int:
        """A descriptor on the entry's file, opened at once (on the loop, before any
        await) so that an eviction can unlink the file but not take it from this reader."""
        fd = os.open(entry.path, os.O_RDONLY)
        entry.readers += 1
        return fd

    async def read(self, entry: _Entry, fd: int, writer: PktWriter, keepalive: float,
                   no_progress: bool) -> int | None:
        """Send the entry to one client as it grows, framed for that client. Returns None
        when it is sent (or failed, in-band), :data:`WHOLE` when the entry turned out to
        name a pack to send whole (nothing was sent here), or the number of pack bytes
        sent when the producer could not write the file: the caller goes on (_After) and
        then owns ``fd``, which is closed here in every other case."""
        pos = shown = since_yield = 0
        resume = False
        try:
            while True:
                if entry.verbatim is not None:
                    return WHOLE
                while shown < len(entry.progress) and entry.progress[shown][0] <= pos:
                    if not no_progress:
                        await writer.progress(entry.progress[shown][1])
                        await writer.drain()
                    shown += 1
                if pos < entry.size:
                    data = os.pread(fd, min(READ_CHUNK, entry.size - pos), pos)
                    if not data:
                        raise OSError(f"pack cache file {entry.path} shrank")
                    pos += len(data)
                    self.stats.served_bytes += len(data)
                    await writer.pack_data(data)
                    since_yield += len(data)
                    if since_yield >= YIELD_EVERY:
                        since_yield = 0
                        await asyncio.sleep(0)
                elif entry.failed is not None and entry.resumable:
                    resume = True
                    return pos
                elif entry.failed is not None:
                    await writer.error(entry.failed, in_band=True)
                    return None
                elif entry.done and shown == len(entry.progress):
                    return None
                elif not entry.done and not await entry.changed(keepalive):
                    await writer.keepalive()
        finally:
            if not resume:
                os.close(fd)
            entry.readers -= 1
            if entry.readers == 0 and not entry.done:
                entry.wake()  # the producer notices at its next step and stops


WHOLE = -1
"""What :meth:`PackCache.read` returns for an entry naming a pack to send whole."""


def _release_when_done(step: asyncio.Future[Any] | None, it: Iterator[Any] | None, fd: int,
                       executor: Executor, loop: asyncio.AbstractEventLoop) -> None:
    """Close the source and the file once no pool step uses them (a cancelled producer's
    last step may still be running: closing under it would be a write to a reused fd)."""
    def release() -> None:
        try:
            close = getattr(it, "close", None)
            if close is not None:
                close()
        finally:
            os.close(fd)

    def after(_: object = None) -> None:
        try:
            loop.run_in_executor(executor, release)
        except RuntimeError:  # the pool or the loop is shutting down
            release()

    if step is None or step.done():
        after()
    else:
        step.add_done_callback(after)


def _produce_step(it: Iterator[Any], fd: int) -> list[object]:
    """In the pool: the next items (as :func:`~.stream.pull_items` pulls them, one pool
    round trip per 256 KiB), pack bytes appended to the file and given as their count,
    progress lines as they are, ``PULL_END`` last at the end."""
    out: list[object] = []
    for item in pull_items(it):
        if isinstance(item, bytes | bytearray | memoryview):
            view = memoryview(item)
            try:
                while view:
                    view = view[os.write(fd, view):]
            except OSError as exc:
                raise CacheWriteError(exc.strerror or str(exc)) from exc
            out.append(len(item))
        else:
            out.append(item)
    return out


def _tags_digest(ctx: RequestContext) -> bytes:
    """The visible tags (what include-tag may add), by value. Only the segments of
    ``refs/tags/`` are decoded (docs/ARCHITECTURE.md, ref state): ``ctx.visible()`` made a
    Ref of every ref, 0.1 s of each fetch of a 100k-ref repository."""
    tags = [r.oid + b" " + (r.peeled or b"") for r in ctx.visible_under(b"refs/tags/")]
    return hashlib.sha256(b"\n".join(tags)).digest() if tags else b""


def _packs_digest(odb: ObjectSnapshot) -> bytes:
    """The frozen pack set of ``odb`` and, in order, of each alternate it reads (an
    alternates file added, changed or removed is a new key)."""
    alts = b"".join(b"\0a" + alt.objects_dir.encode() + _packs_digest(alt)
                    for alt in odb.alternates)
    return repr([p.key for p in odb.packs]).encode() + alts


def pack_key(ctx: RequestContext, plan: FetchPlan) -> bytes:
    """What the pack's bytes are a function of (blocking, in the pool).

    The repository and its frozen pack set (name and inode per pack: a repack is a new
    key), and those of its alternates; what the ref state decided for this pack: the
    wants resolved against the visible refs (want-ref included; a push moves them), with
    the parents an unshallow adds, and the visible tags when include-tag may add them;
    the effective common set (haves we do not have change nothing), the shallow cut, the
    filter, and the capabilities that change the bytes (thin-pack, ofs-delta,
    include-tag). Side-band, progress and the protocol version only change the framing,
    applied per reader. Never who asks.

    The ref state goes in by value, not as the listing's state token: the token changes
    with every unrelated ref update, and once more when a fresh listing stops being racy
    (store/fscache.py), which would split one storm over two keys. Objects are immutable,
    so equal values mean equal packs: no stale pack is ever served.
    """
    req = plan.req
    parts = [
        ctx.repo.gitdir.encode(), ctx.object_format.encode(),
        _packs_digest(ctx.odb),
        b"w", *sorted(set(plan.wants) | set(plan.shallow.extra_wants)),
        b"c", *sorted(plan.common), b"s", *sorted(plan.shallow.cut),
        b"u", *sorted(plan.shallow.unshallow), b"g", *sorted(ctx.grafts),
        b"%d" % plan.shallow.sent, repr(req.filter).encode(),
        # thin-pack without a common object changes nothing: clones share with or without
        b"%d%d" % (req.thin_pack and bool(plan.common), req.ofs_delta),
        _tags_digest(ctx) if req.include_tag else b"",  # include-tag and no tag: the same
    ]
    return hashlib.sha256(b"\0".join(parts)).digest()


async def send_pack_cached(cache: PackCache | None, ctx: RequestContext, plan: FetchPlan,
                           writer: PktWriter, executor: Executor,
                           make_iter: Callable[[PackSource | None], Iterator[Any]],
                           keepalive: float) -> None:
    """Send a fetch's pack through the pack cache (or straight from its source when there
    is no cache or the entry is not to be cached). The one hook in the fetch path.
    ``make_iter(source)`` is the pack's items from ``source`` (None: decide it first)."""
    no_progress = plan.req.no_progress
    if cache is None:
        await pump_pack(writer, executor, lambda: make_iter(None), keepalive, no_progress)
        return
    key = await asyncio.get_running_loop().run_in_executor(executor, pack_key, ctx, plan)
    entry, result = cache.lookup(key, ctx.repo.url_path)
    if entry is None:
        await pump_pack(writer, executor, lambda: make_iter(None), keepalive, no_progress)
        return
    try:
        fd = cache.open_reader(entry)
    except OSError as exc:  # its file is gone (a cleaner of the temp dir?): not a client's
        log.warning("pack cache: cannot open %s: %s", entry.path, exc)  # problem
        if entry.done or result == "miss":  # in production: its readers have their fds
            cache.discard(entry)
        cache.stats.lookups[result] -= 1  # nothing came from the cache after all
        cache.stats.lookups["bypass"] += 1
        await pump_pack(writer, executor, lambda: make_iter(None), keepalive, no_progress)
        return
    if result == "miss":
        task = asyncio.get_running_loop().create_task(
            cache.produce(entry, ctx, plan, executor, make_iter))
        cache.producers.add(task)
        task.add_done_callback(cache.producers.discard)
    else:
        ctx.pack_stats = PackStats(kind=f"cache-{result}")  # objects sent from the cache
    stats = ctx.pack_stats
    sent = await cache.read(entry, fd, writer, keepalive, no_progress)
    if sent == WHOLE:
        await _send_whole(entry, ctx, writer, executor, make_iter, keepalive, no_progress)
    elif sent is not None:  # read() left fd open: the iterator closes it
        after = _After(fd, sent, lambda: make_iter(None))
        try:
            await pump_pack(writer, executor, lambda: after, keepalive, no_progress)
        finally:
            if after.it is None:  # never stepped (cancelled early): pump_pack won't close
                after.close()
    elif result != "miss" and stats is not None:
        stats.objects, stats.size = entry.objects, entry.size


class PackDiverged(Exception):
    """A regenerated pack does not begin with the bytes a client already got."""


class _After:
    """The cache file could not be written past ``skip`` bytes, which this client has:
    the pack generated here (``make()``, on the first step, in the pool), without its first
    ``skip`` bytes and the progress lines that came with them. Those bytes are compared
    with the file (``fd``): a pack made again is usually the same, but not always (new
    deltas have a CPU-time budget), and a difference ends the response in-band
    (:class:`PackDiverged`), never with a spliced pack. ``fd`` is closed by :meth:`close`,
    which ``pump_pack`` calls once no pool step is using it."""

    def __init__(self, fd: int, skip: int, make: Callable[[], Iterator[Any]]) -> None:
        self.fd, self.skip, self.seen = fd, skip, 0
        self.make = make
        self.it: Iterator[Any] | None = None

    def __iter__(self) -> _After:
        return self

    def __next__(self) -> Any:
        if self.fd < 0:  # closed before a step queued earlier ran
            raise StopIteration
        if self.it is None:
            self.it = self.make()
        while True:
            try:
                item = next(self.it)
            except StopIteration:
                if self.seen < self.skip:
                    raise PackDiverged("a regenerated pack is shorter than what was sent") from None
                raise
            if self.seen >= self.skip:
                return item
            if not isinstance(item, bytes | bytearray | memoryview):
                continue  # progress already shown
            take = min(len(item), self.skip - self.seen)
            if os.pread(self.fd, take, self.seen) != bytes(item[:take]):
                raise PackDiverged("a regenerated pack differs from the bytes already sent")
            self.seen += take
            if take < len(item):
                return bytes(item[take:])

    def close(self) -> None:
        try:
            close = getattr(self.it, "close", None)
            if close is not None:
                close()
        finally:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1


async def _send_whole(entry: _Entry, ctx: RequestContext, writer: PktWriter, executor: Executor,
                      make_iter: Callable[[PackSource | None], Iterator[Any]], keepalive: float,
                      no_progress: bool) -> None:
    """The entry names a pack sent whole: send it from this request's own lease of it (the
    key holds the pack set, so this request froze the same pack)."""
    pack = next((p for p in ctx.odb.packs if p.key == entry.verbatim), None)
    source = WholePackSource(pack) if pack is not None else None  # None: decide it here
    await pump_pack(writer, executor, lambda: make_iter(source), keepalive, no_progress)


class PackCacheCollector:
    """``gitspout_pack_cache_*``: lookups by result, bytes served and generated,
    evictions by reason, bytes and entries held."""

    def __init__(self, cache: PackCache) -> None:
        self.cache = cache

    def collect(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        c, st = self.cache, self.cache.stats
        lookups = CounterMetricFamily(
            "gitspout_pack_cache_lookups", "Pack cache lookups: hit (complete), joined "
            "(an in-flight producer), miss (generated here), bypass (not cached).",
            labels=["result"])
        for result, n in st.lookups.items():
            lookups.add_metric([result], n)
        yield lookups
        yield CounterMetricFamily("gitspout_pack_cache_served_bytes",
                                  "Pack bytes read from cache files and sent.",
                                  value=st.served_bytes)
        yield CounterMetricFamily("gitspout_pack_cache_generated_bytes",
                                  "Pack bytes producers wrote to the cache.",
                                  value=st.generated_bytes)
        evictions = CounterMetricFamily(
            "gitspout_pack_cache_evictions", "Entries removed: size (over the cap), ttl, "
            "failed (the producer failed or was abandoned).", labels=["reason"])
        for reason, n in st.evictions.items():
            evictions.add_metric([reason], n)
        yield evictions
        yield GaugeMetricFamily("gitspout_pack_cache_bytes",
                                "Bytes of the listed cache files.", value=c.bytes)
        yield GaugeMetricFamily("gitspout_pack_cache_limit_bytes",
                                "The --pack-cache-size cap.", value=c.max_bytes)
        yield GaugeMetricFamily("gitspout_pack_cache_entries", "Entries listed.",
                                value=len(c.entries))
