"""The pack cache: one generation per distinct pack, streamed to every identical request
(docs/ARCHITECTURE.md, "Pack cache").

A fetch whose pack is decided (``core/fetch.py`` ``plan_fetch``) comes as a
:class:`~..packgen.stream.PackStream`, whose key is what the pack's bytes are a function
of. The first request for a key *produces*: a task, not tied to any client, pulls the
stream in the pool and appends its bytes to a file in the cache directory
(``cachestore.py``), framed already as side-band-64k band-1 pkt-lines, the framing of
nearly every client (every v2 fetch). Every request for that key, the first one
included, is a *reader*: it reads the file from its own descriptor, at its own pace, up
to what the producer has written (``cacheread.py``): by ``sendfile``, the file's bytes as
they are with its own progress (or no-progress) and keepalives between regions, or
unframed and framed again for a client of another side-band (or none). A slow reader
holds back nobody; memory stays one chunk per reader (none by sendfile).

An identical request (the same body, repository, namespace, user and protocol, under the
same repository state) finds its entry without being parsed or planned again
(``samefetch.py``).

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

Everything but the pool steps of the producer runs on the event loop, so the store, the
byte counts and the entries need no lock. Reading the cache file happens on the loop too:
it is local disk written moments ago (page cache), and a pool round trip per region for
32 readers would queue other repositories' work behind a storm (the fairness target).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from gitspout.protocol.sideband import frame_data_packets
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..packgen import PackStats, PackStream, Progress
from ..store.faults import FaultCounts
from .cacheread import WHOLE, FilePayloads, read_entry, send_complete
from .cacheshare import wait_for_producer
from .cachestore import WRITE_COOLDOWN, CacheEntry, CacheStore, CacheWriteError, PackCacheLimits
from .errors import answer_for
from .metrics import RequestRecord
from .samefetch import SameFetches
from .scope import HeldExecutor
from .stream import PULL_END, PktWriter, pull_items, pump_pack

__all__ = ["PackCache", "PackCacheCollector", "SentPack"]

log = logging.getLogger("gitspout")

# A whole pack on disk larger than this, asked for by one client alone for the first time, is
# sent from the pack, not copied: the pack file already is the answer, and writing dulwich's
# 27 MB pack into the cache cost its cold clone about 30 ms of 300. Several clients, or the
# same key again, share a copy: a reader of a local file costs less than pool round trips
# (docs/ARCHITECTURE.md, "Pack cache").
WHOLE_COPY_MAX = 4 << 20


@dataclass
class SentPack:
    """What sending one pack measured: its totals (``kind`` ``cache-hit``/``cache-joined``
    for bytes read from the cache), the seconds its production took by phase, and what the
    cache's lookup said (``hit``, ``joined``, ``miss``, ``bypass``; empty: no cache)."""

    stats: PackStats
    phases: dict[str, float] = field(default_factory=dict)
    cache: str = ""


async def _pump(writer: PktWriter, executor: HeldExecutor, stream: Iterator[Any],
                keepalive: float, no_progress: bool, measured: PackStream) -> SentPack:
    await pump_pack(writer, executor, stream, keepalive, no_progress)
    return SentPack(measured.stats, measured.phases)


class PackCache:
    """Packs produced once per key, read by every request for that key (the module doc)."""

    def __init__(self, limits: PackCacheLimits, faults: FaultCounts | None = None) -> None:
        self.store = CacheStore(limits)
        self.faults = faults  # storage faults met by producers are counted there
        self.same: SameFetches | None = None  # identical requests' answers (samefetch.py)
        self.producers: set[asyncio.Task[None]] = set()  # referenced until they end

    def close(self) -> None:
        """Shutdown: forget every entry and remove the directory."""
        self.store.close()

    async def send(self, stream: PackStream, repo: str, writer: PktWriter,
                   executor: HeldExecutor, keepalive: float, no_progress: bool,
                   key: bytes | None = None) -> SentPack:
        """Send the pack of ``stream`` (a fetch of ``repo``) through the cache, or straight
        from the stream when it is not to be cached. ``key``: the stream's, when the
        caller has it (``PackStream.key`` in the pool otherwise)."""
        loop = asyncio.get_running_loop()
        if key is None:
            key = await loop.run_in_executor(executor, stream.key)
        store = self.store
        entry: CacheEntry | None = None
        fd = -1
        for again in (True, False):
            entry, result = store.lookup(key, repo)
            if result == "remote":  # another worker produces it (cacheshare.py)
                meta = await wait_for_producer(store.directory, key, keepalive,
                                               writer.keepalive)
                if meta is not None:
                    entry, result = store.adopt(key, repo, meta), "joined"
            if entry is None:
                sent = await _pump(writer, executor, stream, keepalive, no_progress, stream)
                sent.cache = "bypass" if result == "remote" else result
                return sent
            try:
                fd = store.open_reader(entry)
            except OSError as exc:
                if isinstance(exc, FileNotFoundError) and not entry.owned and again:
                    # Another worker's pack, evicted by it since this one listed it: the
                    # normal course of a shared directory. Forgotten here; the lookup
                    # again claims the key (produced here once, or joined).
                    store.stats.lookups[result] -= 1
                    store.forget(entry)
                    continue
                # Its own file gone (a cleaner of the temp dir?): not a client's problem.
                log.warning("pack cache: cannot open %s: %s", entry.path, exc)
                if entry.done or result == "miss":  # in production: readers have their fds
                    store.discard(entry)
                store.stats.lookups[result] -= 1  # nothing came from the cache after all
                store.stats.lookups["bypass"] += 1
                sent = await _pump(writer, executor, stream, keepalive, no_progress, stream)
                sent.cache = "bypass"
                return sent
            break
        assert entry is not None and fd >= 0
        if result == "miss":
            task = loop.create_task(self._produce(entry, stream, executor))
            self.producers.add(task)
            task.add_done_callback(self.producers.discard)

        async def same_stream() -> PackStream:
            return stream

        sent = await self._read_entry(entry, result, fd, writer, executor, same_stream,
                                      keepalive, no_progress,
                                      stream if result == "miss" else None)
        sent.cache = result
        return sent

    def open_found(self, key: bytes) -> tuple[CacheEntry, int, str] | None:
        """For an identical request (samefetch.py): the entry of ``key`` in this process's
        index, complete or being written, with a reader's descriptor on its file, and
        ``hit`` or ``joined``; None when there is nothing to read (never cached here,
        evicted, failed, or naming a pack to send whole). Counted as a lookup only when
        found. (An entry whose producer has not decided yet may still turn out to name a
        whole pack: its reader then plans its own stream, as ``send_found`` says.)"""
        entry = self.store.find(key)
        if entry is None or entry.verbatim is not None or entry.failed is not None:
            return None
        try:
            fd = self.store.open_reader(entry)
        except OSError:
            return None  # its file is gone: the full path finds out and says so
        result = "hit" if entry.done else "joined"
        self.store.stats.lookups[result] += 1
        return entry, fd, result

    def close_found(self, found: tuple[CacheEntry, int, str]) -> None:
        """An entry :meth:`open_found` gave that will not be read after all."""
        entry, fd, _ = found
        os.close(fd)
        entry.readers -= 1
        if entry.readers == 0 and not entry.done:
            entry.wake()

    async def send_complete(self, found: tuple[CacheEntry, int, str], request: web.BaseRequest,
                            record: RequestRecord, head: bytes, after: bytes, no_progress: bool,
                            start: Callable[[int], Awaitable[web.StreamResponse]],
                            ) -> tuple[web.StreamResponse, SentPack]:
        """Send a complete entry :meth:`open_found` gave, as the whole response, of known
        length (cacheread.py ``send_complete``)."""
        entry, fd, result = found
        resp = await send_complete(entry, fd, request, record, head, after, no_progress,
                                   self.store.stats, start)
        sent = SentPack(PackStats(kind=f"cache-{result}", objects=entry.objects,
                                  size=entry.pack_size), cache=result)
        return resp, sent

    async def send_found(self, found: tuple[CacheEntry, int, str], writer: PktWriter,
                         executor: HeldExecutor, stream_of: Callable[[], Awaitable[PackStream]],
                         keepalive: float, no_progress: bool) -> SentPack:
        """Send an entry :meth:`open_found` gave. ``stream_of`` makes this request's
        stream, should the rest have to be generated after all (the producer could not
        write the file)."""
        entry, fd, result = found
        sent = await self._read_entry(entry, result, fd, writer, executor, stream_of,
                                      keepalive, no_progress)
        sent.cache = result
        return sent

    async def _read_entry(self, entry: CacheEntry, result: str, fd: int, writer: PktWriter,
                          executor: HeldExecutor,
                          stream_of: Callable[[], Awaitable[PackStream]], keepalive: float,
                          no_progress: bool, produced: PackStream | None = None) -> SentPack:
        """Send ``entry`` (``result`` of its lookup: being produced, or complete) from its
        file ``fd`` (cacheread.py). ``produced``: the stream this request's producer
        pulls, whose measures are this request's."""
        sent = await read_entry(entry, fd, writer, keepalive, no_progress, self.store.stats)
        if sent == WHOLE:
            # The entry names a pack sent whole: send it from this request's own lease of
            # it (the key holds the pack set, so this request froze the same pack).
            whole = (await stream_of()).again(whole=entry.verbatim)
            return await _pump(writer, executor, whole, keepalive, no_progress, whole)
        if sent is not None:  # read_entry left fd open: _After closes it
            try:
                again = (await stream_of()).again()
            except BaseException:
                os.close(fd)
                raise
            return await _pump(writer, executor, _After(fd, sent, again), keepalive,
                               no_progress, again)
        if produced is not None:
            return SentPack(produced.stats, produced.phases)
        return SentPack(PackStats(kind=f"cache-{result}", objects=entry.objects,
                                  size=entry.pack_size))

    # -- producing ---------------------------------------------------------------

    async def _produce(self, entry: CacheEntry, stream: PackStream,
                       executor: HeldExecutor) -> None:
        """Decide the pack source in the pool; a whole pack on disk only marks the entry
        (see the module doc). Otherwise pull the stream in the pool and append its bytes,
        framed (:class:`_Framer`), to the entry's file, as fast as it goes, until it ends,
        fails, or nobody reads any more."""
        loop = asyncio.get_running_loop()
        store = self.store
        executor.hold()  # the packs it reads stay leased even once the first client is gone
        fd = -1
        step: asyncio.Future[Any] | None = None
        framer = _Framer()
        try:
            fd = os.open(entry.path, os.O_WRONLY | os.O_APPEND)
            await loop.run_in_executor(executor, stream.decide)
            whole = stream.whole
            if whole is not None and whole.pack_size > WHOLE_COPY_MAX:
                large = whole.pack_size > store.max_bytes // 8
                if large or (entry.readers <= 1 and store.first_alone(entry.key)):
                    entry.verbatim, entry.objects = whole.key, stream.stats.objects
                    entry.done = True
                    entry.completed = time.monotonic()
                    store.completed(entry)  # not published: each worker decides again
                    if not large:
                        store.drop(entry, None)  # the next request decides again
                    return
            while entry.readers and not entry.done:
                step = loop.run_in_executor(executor, _produce_step, stream, fd, framer)
                shown = len(entry.progress)
                for item in await step:
                    if item is PULL_END:
                        entry.done = True
                        entry.completed = time.monotonic()
                        entry.objects = stream.stats.objects
                        entry.pack_size = framer.pack_bytes
                        store.completed(entry)  # published for the other workers
                    elif isinstance(item, Progress):
                        entry.progress.append((entry.size, item.text))
                    else:
                        store.grew(entry, item)
                entry.wake(grown_only=not entry.done and len(entry.progress) == shown)
        except Exception as exc:  # every reader ends with it (or goes on without the cache)
            self._failed(entry, exc)
        finally:
            if not entry.done:
                entry.failed = entry.failed or "pack generation stopped"
                store.drop(entry, "failed")
            entry.wake()
            if fd >= 0:
                _release_when_done(step, stream, fd, executor, loop)
            executor.release()

    def _failed(self, entry: CacheEntry, exc: Exception) -> None:
        if isinstance(exc, CacheWriteError):
            # Not the client's fault nor the repository's: each reader generates the rest
            # itself, and new requests stream without the cache for a while.
            log.warning("pack cache: cannot write %s (%s); streaming without the cache "
                        "for %.0f s", entry.path, exc, WRITE_COOLDOWN)
            self.store.write_failed_at = time.monotonic()
            entry.resumable = True
            entry.failed = "pack cache write failed"
        else:  # in-band, as errors.py words it
            entry.failed = answer_for(exc, entry.repo, started=True, faults=self.faults).text


def _release_when_done(step: asyncio.Future[Any] | None, it: PackStream, fd: int,
                       executor: HeldExecutor, loop: asyncio.AbstractEventLoop) -> None:
    """Close the source and the file once no pool step uses them (a cancelled producer's
    last step may still be running: closing under it would be a write to a reused fd)."""
    def release() -> None:
        try:
            it.close()
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


class _Framer:
    """The producer's pack bytes as side-band-64k band-1 pkt-lines (what cache files hold:
    cacheread.py sends them as they are). Every packet is full but the last: bytes short
    of a packet wait for the next step (a reader following the producer is at most one
    packet behind it), and the end writes them. Used by one pool step at a time."""

    def __init__(self) -> None:
        self.carry = b""
        self.pack_bytes = 0  # pack bytes written (unframed)

    def write(self, fd: int, pieces: list[bytes], final: bool) -> int:
        """Frame ``pieces`` after what was carried and append the whole packets to ``fd``
        (all of it when ``final``); the bytes written. CacheWriteError when it cannot."""
        data = b"".join([self.carry, *pieces]) if pieces else self.carry
        parts, used = frame_data_packets(data, final)
        self.carry = data[used:]
        self.pack_bytes += used
        written = 0
        try:
            for at in range(0, len(parts), IOV_PARTS):
                group = parts[at:at + IOV_PARTS]
                want = sum(map(len, group))
                done = os.writev(fd, group)
                while done < want:  # a short write to a file: the rest, byte-exact
                    rest = memoryview(b"".join(group))[done:]
                    done += os.write(fd, rest)
                written += want
        except OSError as exc:
            raise CacheWriteError(exc.strerror or str(exc)) from exc
        return written


IOV_PARTS = 512  # parts per writev (IOV_MAX is 1024 on Linux)


def _produce_step(it: Iterator[Any], fd: int, framer: _Framer) -> list[object]:
    """In the pool: the next items (as :func:`~.stream.pull_items` pulls them, one pool
    round trip per 256 KiB), pack bytes framed and appended to the file and given as the
    count of file bytes written, progress lines as they are, ``PULL_END`` last at the end
    (after the last packet)."""
    out: list[object] = []
    pieces: list[bytes] = []
    for item in pull_items(it):
        if isinstance(item, bytes | bytearray | memoryview):
            pieces.append(bytes(item) if not isinstance(item, bytes) else item)
            continue
        final = item is PULL_END
        if pieces or final:
            out.append(framer.write(fd, pieces, final))
            pieces = []
        out.append(item)
    if pieces:
        out.append(framer.write(fd, pieces, False))
    return out


class PackDiverged(Exception):
    """A regenerated pack does not begin with the bytes a client already got."""


class _After:
    """The cache file could not be written past ``skip`` bytes, which this client has:
    the pack generated here (``stream``, from its first step, in the pool), without its first
    ``skip`` bytes and the progress lines that came with them. Those bytes are compared
    with the file (``fd``): a pack made again is usually the same, but not always (new
    deltas have a CPU-time budget), and a difference ends the response in-band
    (:class:`PackDiverged`), never with a spliced pack. ``fd`` is closed by :meth:`close`,
    which ``pump_pack`` calls once no pool step is using it."""

    def __init__(self, fd: int, skip: int, stream: PackStream) -> None:
        self.fd, self.skip, self.seen = fd, skip, 0
        self.it = stream
        self.sent = FilePayloads(fd)  # the file's pack bytes, unframed, in order

    def __iter__(self) -> _After:
        return self

    def __next__(self) -> Any:
        if self.fd < 0:  # closed before a step queued earlier ran
            raise StopIteration
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
            if self.sent.read(take) != bytes(item[:take]):
                raise PackDiverged("a regenerated pack differs from the bytes already sent")
            self.seen += take
            if take < len(item):
                return bytes(item[take:])

    def close(self) -> None:
        try:
            self.it.close()
        finally:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1


class PackCacheCollector:
    """``gitspout_pack_cache_*``: lookups by result, bytes served and generated,
    evictions by reason, bytes and entries held."""

    def __init__(self, cache: PackCache) -> None:
        self.cache = cache

    def collect(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        c = self.cache.store
        st = c.stats
        lookups = CounterMetricFamily(
            "gitspout_pack_cache_lookups", "Pack cache lookups: hit (complete), joined "
            "(an in-flight producer), miss (generated here), bypass (not cached).",
            labels=["result"])
        for result, n in st.lookups.items():
            lookups.add_metric([result], n)
        yield lookups
        served = CounterMetricFamily(
            "gitspout_pack_cache_served_bytes", "Bytes of cache files sent (pack data framed "
            "as side-band-64k): by sendfile, or read and framed again in Python (another "
            "side-band, none, or no socket).", labels=["path"])
        for path, n in st.served_bytes.items():
            served.add_metric([path], n)
        yield served
        yield CounterMetricFamily("gitspout_pack_cache_generated_bytes",
                                  "Bytes producers wrote to cache files (pack data framed "
                                  "as side-band-64k).", value=st.generated_bytes)
        same = self.cache.same
        if same is not None:
            results = CounterMetricFamily(
                "gitspout_pack_cache_same_requests", "Fetches whose body, repository, "
                "namespace, user and protocol were seen before: hit (answered without "
                "parsing or planning), stale (the repository changed since: planned again), "
                "gone (its pack no longer cached: planned again).", labels=["result"])
            for result, n in same.results.items():
                results.add_metric([result], n)
            yield results
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
        yield GaugeMetricFamily("gitspout_pack_cache_entries", "Entries whose files this "
                                "process produced and holds (with --workers, summed: the "
                                "files of the shared directory).",
                                value=sum(1 for e in c.entries.values() if e.owned))
