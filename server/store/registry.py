"""Process-wide state of the object layer: every open pack and commit-graph, and the caches
of immutable facts (resolved objects, peeled tags, object sets, loose fan-out listings,
alternates, packs' derived data).

Open files are leased (docs/ARCHITECTURE.md I1; docs/operations.md "Repositories on NFS",
its "Open files" paragraph). Each request's
:class:`~.odb.ObjectSnapshot` takes a lease on every pack (and the commit-graph) it froze
and gives them back when the request ends. Descriptors are a budget of their own
(``max_open``, ``--max-open-packs``), whatever the number of packs a request froze: a
pack's files (its descriptor and its index map, two descriptors: Python's mmap keeps a
duplicate) are opened on demand and closed, least recently used first,

- when more than ``max_open`` descriptors and maps are open: files that no request holds
  go first, then files of packs a request holds but is not reading at this instant (a
  pack pins its files for each read, ``PackFile._pin``); they are opened again, their
  inodes checked, when next read. A repository of 5,000 packs is then cloned with a few
  descriptors more than the budget, as C git closes pack descriptors past its own limit;
- when the pack's directory no longer lists it (a repack replaced it, or the repository
  went away) and the last lease ends: its descriptor, its map and every cache entry keyed
  by it go at once, so no ``(deleted)`` file stays open and no NFS silly-rename file stays
  behind. A replaced pack a request still holds is never closed for the budget (it could
  not be opened again).

A closed pack nobody holds is remembered (``pack_files``, within --cache-memory) with what
was checked when it was first opened, so that a request freezing 5,000 packs does not
open and check each of them again. Commit-graphs are closed only when no request holds
them. Running out of descriptors (EMFILE) closes every file nobody reads and tries once
more; what a failed request took is given back (``ObjectSnapshot``).
"""

from __future__ import annotations

import errno
import os
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from .commitgraph import CommitGraph, CommitGraphError, open_commit_graph
from .faults import FaultCounts, report_unusable
from .fsops import FsOps
from .lru import ByteLRU, MemoryBudget
from .mapped import Mapped
from .objformat import trailer_matches
from .packs import PackFile, PackFormatError, close_files

__all__ = ["PackRegistry", "Leased", "DEFAULT_MAX_OPEN", "out_of_descriptors"]

T = TypeVar("T")

DEFAULT_MAX_OPEN = 256  # descriptors and maps; leaves most of ulimit -n 1024 to sockets

# Budgets of the caches below (docs/ARCHITECTURE.md, "Caches"); all of them together are
# held within --cache-memory (the registry's ``memory``).
OBJECTS_BUDGET = 16 << 20  # bytes of inflated commits, trees, tags and delta results
PEELED_BUDGET = 64 << 20  # bytes, at PEELED_COST a tag
PEELED_COST = 256  # a hex id, its hex target and the LRU's own bookkeeping
OBJECT_SETS_BUDGET = 64 << 20  # bytes of object sets and pack selections
LOOSE_IDS_BUDGET = 64 << 20  # bytes of loose object ids, at LOOSE_ID_COST an id
LOOSE_ID_COST = 64
ALTERNATES_ENTRIES = 10_000  # alternates files
PACK_DATA_BUDGET = 1 << 40  # derived data of packs: bounded by --cache-memory alone
CLOSED_PACKS = 65_536  # closed packs remembered (pack_files), each about PACK_FILE_BYTES
PACK_FILE_BYTES = 2048  # a PackFile: its fan-out table (1 KiB) and attributes


# An index larger than this is hashed by a background thread while requests use it; a
# smaller one before its first lookup (PackRegistry._verify_later).
VERIFY_INLINE_MAX = 8 << 20
_VERIFIER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gitspout-verify")


class Leased(Protocol):
    """What the registry keeps: a PackFile or a CommitGraph."""

    key: tuple[object, ...]
    leases: int
    retired: bool
    HANDLES: int

    @property
    def handles(self) -> int: ...

    def close(self) -> None: ...

    def files(self) -> tuple[tuple[str, object], ...]: ...


def out_of_descriptors(exc: BaseException) -> bool:
    """EMFILE or ENFILE: the process (or the system) has no descriptor left."""
    return isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)


_Victim = Leased | tuple[int, Mapped]  # a file to close whole, or a pack's detached files


def _stamp(base: str) -> tuple[tuple[int, int], ...]:
    """Sizes and mtimes of a pack's two files: a damaged pack rewritten in place (same
    inode, as ``cp`` over it does) is looked at again."""
    out = []
    for suffix in (".idx", ".pack"):
        st = os.stat(base + suffix)
        out.append((st.st_size, st.st_mtime_ns))
    return tuple(out)


class PackRegistry:
    """Every open :class:`PackFile` (key: pack directory, stem, idx inode, pack inode) and
    :class:`CommitGraph` (key: info directory, name, inode), least recently used first."""

    def __init__(self, cache_budget: int = OBJECTS_BUDGET, max_open: int = DEFAULT_MAX_OPEN,
                 memory: MemoryBudget | None = None) -> None:
        # Every cache of the object layer counts against ``memory`` (--cache-memory), and
        # every unusable file is counted in ``faults`` (store/faults.py, for /metrics).
        self.memory = memory
        self.faults = FaultCounts()
        # Files leased by a request or holding descriptors, by key.
        self._open: dict[tuple[object, ...], Leased] = {}
        # Files holding descriptors now (by id), least recently used first: the budget's.
        self._lru: OrderedDict[int, Leased] = OrderedDict()
        self._retired: dict[int, Leased] = {}  # retired files some request still leases
        self._lock = threading.Lock()
        self._pending: deque[list[Leased]] = deque()  # leases given back by finalizers
        self._bad_graphs: dict[tuple[object, ...], bool] = {}
        # packs found damaged when opened: (sizes and mtimes of .idx and .pack, the error)
        self._bad_packs: dict[tuple[object, ...], tuple[object, PackFormatError]] = {}
        self.max_open = max_open
        self.handles = 0  # descriptors and maps open now (leased, idle or retired)
        self.opened = 0  # opened, or opened again after they were closed
        self.evicted = 0  # closed to stay within max_open
        self.released = 0  # closed because their directory no longer lists them
        # (pack key, offset) or ("loose", id) -> (type, content)
        self.objects = ByteLRU[tuple[int, bytes]]("objects", cache_budget, parent=memory)
        # (pack key, kind) -> (data,): name prefixes, reverse index, base ranks, bitmaps
        self.pack_data = ByteLRU[tuple[object]]("pack_indexes", PACK_DATA_BUDGET,
                                                on_evict=self._pack_data_evicted, parent=memory)
        # hex id -> hex id it peels to, b"" when it is not a tag (immutable facts)
        self.peeled = ByteLRU[bytes]("peeled", PEELED_BUDGET, parent=memory)
        # (objects dir, fan-out name) -> (listing key, ids)
        self.fanout_ids = ByteLRU[tuple[object, frozenset[bytes]]](
            "loose_ids", LOOSE_IDS_BUDGET, parent=memory)
        # (objects dir, alternates file content) -> (its real path, ((line, real path), ...))
        self.alternates = ByteLRU[tuple[str, tuple[tuple[str, str], ...]]](
            "alternates", ALTERNATES_ENTRIES, unit="entries", parent=memory)
        # pack key -> a closed PackFile nobody leases: its facts, checked once
        self.closed_packs = ByteLRU[PackFile]("pack_files", CLOSED_PACKS, unit="entries",
                                              entry_bytes=PACK_FILE_BYTES, parent=memory)
        # Caches of the layers above keyed by pack keys (object sets, selections): their
        # entries naming a pack go with it (keyed_by_packs).
        self._by_pack: list[ByteLRU[Any]] = []

    # -- leases ----------------------------------------------------------------

    def get(self, base: str, hash_len: int, key: tuple[object, ...], fs: FsOps,
            verify: bool = True) -> PackFile:
        """The pack ``key`` names, open and leased: give it back with :meth:`release`.
        Raises FileNotFoundError when its files are gone or replaced since listed (not
        checked when ``verify`` is False: symlinks, listed with the link's inode)."""
        pack = self._acquire(key, lambda: self._new_pack(base, hash_len, key, verify), fs, 2)
        assert isinstance(pack, PackFile)
        return pack

    def with_descriptors(self, open_: Callable[[], T]) -> T:
        """``open_()``; when the process is out of descriptors, every file nobody is
        reading is closed (:meth:`shed`) and it is tried once more."""
        try:
            return open_()
        except OSError as exc:
            if not out_of_descriptors(exc):
                raise
        self.shed()
        return open_()

    def _new_pack(self, base: str, hash_len: int, key: tuple[object, ...],
                  verify: bool) -> PackFile:
        bad = self._bad_packs.get(key)
        if bad is not None:
            if _stamp(base) == bad[0]:
                raise PackFormatError(str(bad[1]), pack=bad[1].pack, kind=bad[1].kind)
            self._bad_packs.pop(key, None)  # rewritten in place: look again
        try:
            pack = PackFile(base, hash_len, key, verify)
            pack.data_cache = self.pack_data
            pack.memory, pack.faults = self.memory, self.faults
            pack.on_open = self._reopened
            pack.on_exhausted = self.shed
            try:
                if pack.index_size <= VERIFY_INLINE_MAX or pack.knows("verified"):
                    pack.verify_index()
                else:
                    try:
                        _VERIFIER.submit(self._verify_later, base, key, pack)
                    except RuntimeError:  # the interpreter is shutting down
                        pack.verify_index()
            except BaseException:
                pack.close()
                raise
        except PackFormatError as exc:
            # Not read again (an index is hashed whole) while its files stay as they were.
            if len(self._bad_packs) >= 10_000:
                self._bad_packs.clear()
            self._bad_packs[key] = (_stamp(base), exc)
            raise
        return pack

    def _verify_later(self, base: str, key: tuple[object, ...], pack: PackFile) -> None:
        """Hash an index larger than VERIFY_INLINE_MAX in the background, through the
        pack's files pinned (reopened if they were closed meanwhile), while requests use it: C git
        never hashes an index it opens, and git/git's 24 MB cost a cold request 14 ms
        (docs/performance.md "Cold path"). A mismatch retires the pack (requests holding
        it finish; later ones skip it, as they would have from the start) and is reported
        once; a match is remembered like an inline one."""
        try:
            # Through the pack's own view of it (a map, or its bytes read from a network
            # filesystem: mapped.py), held open for the hash: not read a second time.
            with pack.pinned() as (_fd, idx):
                ok = trailer_matches(idx, pack.hash_len)
        except OSError:
            return  # gone or replaced: a new key, looked at when listed
        if ok:
            pack.derived("verified", lambda: (True, 0))
            return
        exc = pack.corrupt("index checksum does not match its contents", ".idx")
        victims: list[_Victim] = []
        with self._lock:
            try:
                self._bad_packs[key] = (_stamp(base), exc)
            except OSError:
                pass
            if self._open.get(key) is pack:
                victims = self._retire_locked(key)
        self._close(victims)
        report_unusable(self.faults, "idx", base + ".idx", key, exc,
                        "the pack is skipped from now on")

    def _pack_data_evicted(self, key: object, _value: object) -> None:
        """The memory budget let a pack's derived data go: the open PackFile forgets it."""
        assert isinstance(key, tuple)
        pack = self._open.get(key[0])
        if isinstance(pack, PackFile):
            pack.forget_derived(key[1])

    def commit_graph(self, objects_dir: str, hash_len: int, inode: int,
                     fs: FsOps, verify: bool = True) -> CommitGraph | None:
        """The commit-graph with ``inode``, leased; None when absent or unusable. (A
        symlinked graph is listed with the link's inode: ``verify`` False.)"""
        info = os.path.join(objects_dir, "info")
        key: tuple[object, ...] = (info, "commit-graph", inode)
        if key in self._bad_graphs:
            return None
        self.forget_missing({key}, info)  # an older graph of this directory is retired
        try:
            graph = self._acquire(
                key, lambda: open_commit_graph(objects_dir, hash_len, inode, verify), fs, 1)
        except FileNotFoundError:
            return None
        except (OSError, CommitGraphError) as exc:
            if out_of_descriptors(exc):
                raise  # the process's fault, not the file's: the next request tries again
            if len(self._bad_graphs) >= 10_000:
                self._bad_graphs.clear()
            self._bad_graphs[key] = True
            report_unusable(self.faults, "commit-graph", os.path.join(info, "commit-graph"),
                            inode, exc, "parsing commits instead")
            return None
        assert isinstance(graph, CommitGraph)
        return graph

    def _acquire(self, key: tuple[object, ...], opener: Callable[[], Leased], fs: FsOps,
                 opens: int) -> Leased:
        with self._lock:
            self._drain_pending()
            item = self._open.get(key)
            if item is None:
                known = self.closed_packs.get(key)
                if known is not None:  # checked before, closed: opened when first read
                    self.closed_packs.pop(key)
                    item = self._open[key] = known
            if item is not None:
                item.leases += 1
                if id(item) in self._lru:
                    self._lru.move_to_end(id(item))
                return item
        # Opened outside the lock: on NFS an open costs round trips, and other requests
        # must not wait for them.
        fs.note("open", opens)
        fresh = self.with_descriptors(opener)
        victims: list[_Victim] = []
        with self._lock:
            item = self._open.get(key)
            if item is None:
                item = self._open[key] = fresh
                self._track(item)
                self.opened += 1
            else:
                victims.append(fresh)  # another request opened it meanwhile
            item.leases += 1
            victims += self._over_budget()
        self._close(victims)
        return item

    def _track(self, item: Leased) -> None:
        """``item`` holds descriptors now (under the lock)."""
        if id(item) not in self._lru:
            self._lru[id(item)] = item
            self.handles += item.HANDLES
        else:
            self._lru.move_to_end(id(item))

    def _untrack(self, item: Leased) -> None:
        """``item`` holds no descriptor any more, or is about to be closed (under the lock)."""
        if self._lru.pop(id(item), None) is not None:
            self.handles -= item.HANDLES

    def _reopened(self, pack: PackFile) -> None:
        """A pack closed for the budget was read again and opened (it is pinned now)."""
        with self._lock:
            self.opened += 1
            self._track(pack)
            victims = self._over_budget()
        self._close(victims)

    def release(self, items: Iterable[Leased]) -> None:
        """Give leases back: a retired file whose last lease this was is closed now."""
        victims: list[_Victim] = []
        with self._lock:
            self._drain_pending()
            victims += self._release_locked(items)
            victims += self._over_budget()
        self._close(victims)

    def release_later(self, items: list[Leased]) -> None:
        """:meth:`release` for finalizers (which may run inside a locked section): queued,
        and done by the next call that takes the lock."""
        self._pending.append(items)

    def _drain_pending(self) -> None:
        while self._pending:
            self._close(self._release_locked(self._pending.popleft()))

    def _release_locked(self, items: Iterable[Leased]) -> list[_Victim]:
        done: list[_Victim] = []
        for item in items:
            item.leases -= 1
            if item.leases:
                continue
            if isinstance(item, PackFile):
                item.drop_raw()  # nobody holds its descriptor any more
                if item.unkept:
                    item.drop_unkept()  # too large for the memory budget: not kept idle
            if self._retired.pop(id(item), None) is not None:
                self._untrack(item)
                self.released += 1
                done.append(item)
            elif id(item) not in self._lru:
                self._remember_closed(item)
        return done

    def _remember_closed(self, item: Leased) -> None:
        """A closed file nobody leases leaves ``_open``; a pack is kept in
        ``closed_packs`` (under the lock)."""
        if self._open.get(item.key) is not item:
            return
        del self._open[item.key]
        if isinstance(item, PackFile) and not item.retired:
            item.drop_derived()
            self.closed_packs.put(item.key, item)

    def _over_budget(self, limit: int | None = None) -> list[_Victim]:
        """Close least recently used files while over ``max_open`` (or ``limit``): those
        no request holds first, then packs leased but not read at this instant (never a
        retired one: it could not be opened again). Under the lock; what to close is
        returned, to be closed outside it."""
        limit = self.max_open if limit is None else limit
        victims: list[_Victim] = []
        for leased in (False, True):
            if self.handles <= limit:
                break
            chosen: list[tuple[Leased, tuple[int, Mapped] | None]] = []
            excess = self.handles - limit
            for item in self._lru.values():
                if excess <= 0:
                    break
                if (item.leases > 0) != leased or (leased and item.retired):
                    continue
                files = item.detach() if isinstance(item, PackFile) else None
                if files is None and (leased or isinstance(item, PackFile)):
                    continue  # being read now (or a commit-graph a request holds)
                chosen.append((item, files))
                excess -= item.HANDLES
            for item, files in chosen:
                self._untrack(item)
                self.evicted += 1
                victims.append(files if files is not None else item)
                if not item.leases:
                    self._remember_closed(item)
        return victims

    def shed(self) -> None:
        """Close every file nobody is reading now (the process ran out of descriptors)."""
        with self._lock:
            victims = self._over_budget(limit=0)
        self._close(victims)

    def _close(self, items: list[_Victim]) -> None:
        for item in items:
            if isinstance(item, tuple):
                close_files(item)
                continue
            item.close()
            if item.retired:
                self._drop_cached(item.key)

    def _drop_cached(self, key: tuple[object, ...]) -> None:
        """Cache entries keyed by a file that is gone (objects read from it, object sets
        of its bitmaps, selections naming it)."""
        def mentions(k: object) -> bool:
            return isinstance(k, tuple) and key in k
        self.objects.drop_where(mentions)
        self.pack_data.drop_where(mentions)
        for cache in self._by_pack:
            cache.drop_where(mentions)

    def keyed_by_packs(self, cache: ByteLRU[T]) -> ByteLRU[T]:
        """Register ``cache``, a cache of a layer above whose keys hold pack keys (as
        items of a tuple): the entries naming a pack are dropped when the pack goes."""
        self._by_pack.append(cache)
        return cache

    # -- retiring ----------------------------------------------------------------

    def forget_missing(self, live: set[tuple[object, ...]], prefix: str) -> None:
        """Retire the files of directory ``prefix`` whose keys are not in ``live`` (another
        process repacked, or the repository is gone): closed now when no request leases
        them, else when the last lease ends."""
        victims: list[_Victim] = []
        with self._lock:
            for key in [k for k in self._open if k[0] == prefix and k not in live]:
                victims += self._retire_locked(key)
        self._close(victims)

    def _retire_locked(self, key: tuple[object, ...]) -> list[_Victim]:
        item = self._open.pop(key)
        item.retired = True
        if item.leases == 0:
            self._untrack(item)
            self.released += 1
            return [item]
        self._retired[id(item)] = item
        return []

    def forget_repository(self, objects_dir: str) -> None:
        """The repository went away: retire its packs and commit-graph, forget its caches."""
        objects_dir = objects_dir.rstrip("/")
        for sub in ("pack", "info"):
            self.forget_missing(set(), os.path.join(objects_dir, sub))
        pack_dir = os.path.join(objects_dir, "pack")
        self.closed_packs.drop_where(lambda k: isinstance(k, tuple) and k[0] == pack_dir)
        def of_repo(k: object) -> bool:
            return isinstance(k, tuple) and k[0] == objects_dir
        self.fanout_ids.drop_where(of_repo)
        self.alternates.drop_where(of_repo)

    def sweep(self) -> int:
        """Retire open files that are no longer on disk as they were opened (same path,
        same inode), though no request has listed their directory since: a repack of a
        repository nobody asks for must not keep its old packs open. One ``stat`` per
        file that no request holds; returns how many were retired."""
        with self._lock:
            self._drain_pending()
            idle = [(item.key, item.files()) for item in self._lru.values() if item.leases == 0]
        gone = []
        for key, files in idle:
            for path, inode in files:
                try:
                    st = os.lstat(path)  # the inode a listing shows, also for a symlink
                except OSError:
                    gone.append(key)
                    break
                if inode is not None and st.st_ino != inode:
                    gone.append(key)
                    break
        victims: list[_Victim] = []
        with self._lock:
            for key in gone:
                if key in self._open:
                    victims += self._retire_locked(key)
        self._close(victims)
        return len(gone)

    # -- introspection --------------------------------------------------------------

    @property
    def open_files(self) -> int:
        """Files holding descriptors now (leased or idle, retired ones included)."""
        return len(self._lru)

    def __len__(self) -> int:
        return len(self._open)
