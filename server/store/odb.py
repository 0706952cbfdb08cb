"""The object database as one request sees it (ARCHITECTURE.md I1).

An :class:`ObjectSnapshot` freezes the pack list when it is made. Per-pack data comes from
the process-wide :class:`PackRegistry`, keyed by pack name and inode, so a request opens no
pack that an earlier request already opened. Lookups of objects the client merely *might*
share (haves) never rescan and never stat loose paths: loose objects are found by listing
the fan-out directories once, and only when a lookup gets that far. A miss of an object the
request needs rescans ``objects/pack`` at most once per request.
"""

from __future__ import annotations

import logging
import os
import weakref
import zlib
from typing import NamedTuple

from dulwich.errors import ApplyDeltaError
from dulwich.pack import apply_delta

from .commitgraph import CommitGraph
from .errors import StorageError
from .faults import FAULTS, report_unusable
from .fscache import DirCache, Listing
from .fsops import FsOps
from .objformat import EMPTY_TREE, OBJ_COMMIT, OBJ_TAG, OBJ_TREE, OFS_DELTA, REF_DELTA, TYPE_NUMS
from .packs import EntryHeader, PackFile, PackFormatError, Windows
from .registry import LOOSE_ID_COST, Leased, PackRegistry, out_of_descriptors

__all__ = ["ObjectSnapshot", "PackRegistry", "MissingObject", "PackedLocation", "ObjectStoreError"]

log = logging.getLogger("gitspout")

_MAX_CHAIN = 10_000
_MAX_ALTERNATE_DEPTH = 5
MANY_PACKS = 16  # from this many packs on, lookups try the pack of the last hit first
# Object directories one request reads at most, its own included. C git reads any number;
# each costs a listing and its packs on every request, and an alternates file is
# whatever its writer put there.
MAX_OBJECT_DIRS = 32
_HEX = "0123456789abcdef"
_FANOUT = frozenset(a + b for a in _HEX for b in _HEX)
_FANOUT_NAMES = [f"{i:02x}" for i in range(256)]  # a first byte -> its fan-out directory


_SKIPPED = "skipped: requests needing an object it may hold fail"


class ObjectStoreError(StorageError):
    """The repository's object store is damaged or unreadable."""

    what = "damaged object store"


class MissingObject(ObjectStoreError):
    what = "missing object"

    def __init__(self, oid: bytes) -> None:
        super().__init__(f"missing object {oid.hex()}")
        self.oid = oid


EMPTY_TREE_PATH = "<the empty tree>"
"""Where :meth:`ObjectSnapshot.locate` says the empty tree is when no file holds it: read
as a loose object whose path no file has (objformat.EMPTY_TREE)."""


class PackedLocation(NamedTuple):
    """Where a packed object is (a tuple: one is made per object read)."""

    pack: PackFile
    pos: int
    offset: int


class ObjectSnapshot:
    """One request's view of ``objects/``: frozen pack list, lazy loose listing."""

    def __init__(
        self,
        objects_dir: str,
        hash_len: int,
        registry: PackRegistry,
        fs: FsOps,
        _depth: int = 0,
        dirs: DirCache | None = None,
        _seen: set[str] | None = None,
    ) -> None:
        self.objects_dir = objects_dir
        self.hash_len = hash_len
        self.registry = registry
        self.fs = fs
        self.dirs = dirs if dirs is not None else DirCache(enabled=False)
        self.rescans = 0
        # fan-out directory name -> its ids (None until listed), from objects/'s listing
        self._loose: dict[str, frozenset[bytes] | None] | None = None
        self._loose_fresh = False
        self._info_names: dict[str, tuple[str, int, bool]] | None = None
        self._info_listing: Listing | None = None
        self._graph: CommitGraph | None | bool = False
        self.packs: list[PackFile] = []
        self._last_pack: PackFile | None = None  # with MANY_PACKS: the last hit's pack
        self.windows = Windows()  # of the packs, for reading many small entries
        self.broken: list[PackFormatError] = []  # packs listed that cannot be read
        # Every pack and graph this snapshot froze, leased until close() (registry.py).
        self._leases: list[Leased] = []
        self._finalizer = weakref.finalize(self, registry.release_later, self._leases)
        self.alternates: list[ObjectSnapshot] = []
        try:
            self._scan_packs()
            # Real paths of the object directories this request reads so far: its own
            # first (C git's alt_odb_usable skips it and any directory seen already).
            seen = _seen if _seen is not None else {os.path.realpath(objects_dir)}
            self.alternates = self._load_alternates(_depth, seen)
        except BaseException:
            # Whatever failed (EMFILE included), what was taken is given back now, not
            # when a traceback holding this half-made snapshot is collected.
            self.close()
            raise

    def close(self) -> None:
        """End of the request: give back the leases on packs and commit-graph (also those
        of the alternates). Nothing read through this snapshot may be used afterwards."""
        for alt in self.alternates:
            alt.close()
        if self._finalizer.detach() is not None:
            leases, self._leases = self._leases, []
            self.registry.release(leases)

    def __enter__(self) -> ObjectSnapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- pack list -------------------------------------------------------------

    def _scan_packs(self, fresh: bool = False) -> None:
        pack_dir = os.path.join(self.objects_dir, "pack")
        listing = self._listing(pack_dir, fresh)
        if listing is not None:
            self.dirs.check_links(self.fs, pack_dir, listing)  # before any pack is opened
        inodes = {name: ino for name, ino, _ in (listing.entries if listing else ())}
        packs: list[PackFile] = []
        broken: list[PackFormatError] = []
        live: set[tuple[object, ...]] = set()
        for name, ino in inodes.items():
            if not (name.startswith("pack-") and name.endswith(".idx")):
                continue
            stem = name[:-4]
            pack_ino = inodes.get(stem + ".pack")
            if pack_ino is None:
                continue
            key = (pack_dir, stem, ino, pack_ino)
            live.add(key)
            try:
                linked = listing is not None and (name in listing.links
                                                  or stem + ".pack" in listing.links)
                pack = self.registry.get(os.path.join(pack_dir, stem), self.hash_len, key,
                                         self.fs, verify=not linked)
                self._leases.append(pack)
                packs.append(pack)
            except FileNotFoundError:
                continue  # removed between listing and opening: a repack is under way
            except OSError as exc:
                if out_of_descriptors(exc):
                    raise  # not the pack's fault: the request fails, the next one works
                broken.append(_unopenable(stem, exc))
                report_unusable("io", os.path.join(pack_dir, stem), key, exc, _SKIPPED)
            except PackFormatError as exc:
                broken.append(exc)  # skipped, but a needed object missing then names it
                report_unusable(exc.kind, os.path.join(pack_dir, stem), key, exc, _SKIPPED)
            except ValueError as exc:  # an empty file (mmap of nothing)
                broken.append(_unopenable(stem, exc))
                report_unusable("pack", os.path.join(pack_dir, stem), key, exc, _SKIPPED)
        self.broken = broken
        self.registry.forget_missing(live, pack_dir)
        # Largest packs first: most lookups hit the main pack.
        packs.sort(key=lambda p: p.count, reverse=True)
        self.packs = packs
        self._last_pack = None

    def commit_graph(self) -> CommitGraph | None:
        """The commit-graph of this object directory, by the inode ``objects/info`` lists."""
        if self._graph is False:
            entry = self._info().get("commit-graph")
            if entry is not None:
                assert self._info_listing is not None
                self.dirs.check_links(self.fs, os.path.join(self.objects_dir, "info"),
                                      self._info_listing, ("commit-graph",))
            graph = None
            if entry is not None:
                assert self._info_listing is not None
                graph = self.registry.commit_graph(
                    self.objects_dir, self.hash_len, entry[1], self.fs,
                    verify="commit-graph" not in self._info_listing.links)
                if graph is not None:
                    self._leases.append(graph)
            else:  # removed: a graph mapped earlier is retired
                self.registry.forget_missing(set(), os.path.join(self.objects_dir, "info"))
            self._graph = graph
        return self._graph  # type: ignore[return-value]

    def _listing(self, path: str, fresh: bool = False) -> Listing | None:
        if fresh:
            # A true miss: look at the directory itself, whatever the cache holds.
            self.dirs.forget(path, self.fs)
        # lstat, not stat: objects/pack and objects/info are listed without their parent,
        # so this is where a symlink in their place is seen (and checked).
        return self.dirs.listing(self.fs, path, nofollow=True)

    def _info(self) -> dict[str, tuple[str, int, bool]]:
        if self._info_names is None:
            self._info_listing = self._listing(os.path.join(self.objects_dir, "info"))
            self._info_names = self._info_listing.names() if self._info_listing else {}
        return self._info_names

    def rescan(self) -> None:
        """List ``objects/pack`` again and forget the loose listing (counted)."""
        self.rescans += 1
        self.fs.note("rescan")
        self._loose = None
        self._loose_fresh = True
        self._scan_packs(fresh=True)

    def _load_alternates(self, depth: int, seen: set[str]) -> list[ObjectSnapshot]:
        """The alternates as C git links them (object-file.c ``link_alt_odb_entry``): each
        real path once per request, the repository's own objects directory never, depth
        first, at most :data:`MAX_OBJECT_DIRS` directories in all. A file naming its own
        directory 12 times used to cost 12 + 12^2 + ... + 12^5 snapshots per request."""
        if depth >= _MAX_ALTERNATE_DEPTH:
            return []
        entry = self._info().get("alternates")
        if entry is None:
            return []
        assert self._info_listing is not None
        data = self.dirs.file(self.fs, os.path.join(self.objects_dir, "info", "alternates"),
                              self._info_listing)
        if not data:
            return []
        alts = []
        for line, path in self._alternate_paths(data):
            if path in seen:
                continue
            if len(seen) >= MAX_OBJECT_DIRS:
                self._too_many(line, data)
                break
            if self.dirs.guard is not None:
                self.dirs.guard.check_real(f"{self.objects_dir}/info/alternates: {line}", path)
            seen.add(path)
            alts.append(ObjectSnapshot(path, self.hash_len, self.registry, self.fs, depth + 1,
                                       self.dirs, seen))
        return alts

    def _too_many(self, line: str, data: bytes) -> None:
        """One line per alternates file version, not one per request."""
        if FAULTS.first_report(("alternates-cap", self.objects_dir, data)):
            log.warning("%s/info/alternates: more than %d object directories in all; "
                        "ignoring %s and the entries after it", self.objects_dir,
                        MAX_OBJECT_DIRS, line)

    def _alternate_paths(self, data: bytes) -> tuple[tuple[str, str], ...]:
        """(line, real path) of each object directory ``data`` (the alternates file) names.

        Resolved once per file content and kept: a request then reads the alternate by its
        real path and follows no symlink to get there, so a link on the way that is later
        retargeted cannot lead it outside the root (it keeps reading the directory that was
        checked, until the alternates file changes)."""
        key = (self.objects_dir, data)
        cache = self.registry.alternates
        hit = cache.get(key)
        if hit is not None:
            return hit
        out = []
        for line in data.decode("utf-8", "replace").splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            self.fs.note("realpath")
            out.append((line, os.path.realpath(os.path.join(self.objects_dir, line))))
        result = tuple(out)
        cache.put(key, result)
        return result

    # -- loose objects ----------------------------------------------------------

    def _loose_ids(self, first: int) -> frozenset[bytes]:
        """The loose object ids whose first byte is ``first``: the fan-out directory is
        listed once per request (one stat while unchanged, through the listing cache), and
        only when asked for: a few haves cost a few stats, not one per fan-out directory
        (hundreds, in a repository pushed to often and not yet repacked)."""
        if self._loose is None:
            top = self._listing(self.objects_dir, self._loose_fresh)
            self._loose = {name: None for name, _, is_dir in (top.entries if top else ())
                           if is_dir and name in _FANOUT}
        name = _FANOUT_NAMES[first]
        if name not in self._loose:
            return frozenset()
        ids = self._loose[name]
        if ids is None:
            ids = self._loose[name] = self._fanout_ids(name, self._loose_fresh)
        return ids

    def _fanout_ids(self, name: str, fresh: bool) -> frozenset[bytes]:
        fanout = os.path.join(self.objects_dir, name)
        listing = self._listing(fanout, fresh)
        if listing is None:
            return frozenset()
        self.dirs.check_links(self.fs, fanout, listing)  # loose objects are read by name
        cache = self.registry.fanout_ids
        cached = cache.get((self.objects_dir, name), lambda c: c[0] == listing.key)
        if cached is not None:
            return cached[1]
        ids = set()
        for obj, _, _ in listing.entries:
            try:
                ids.add(bytes.fromhex(name + obj))
            except ValueError:
                continue  # temporary files such as tmp_obj_XXXX
        result = frozenset(ids)
        if listing.trusted:
            cache.put((self.objects_dir, name), (listing.key, result), LOOSE_ID_COST * (1 + len(result)))
        return result

    def _loose_path(self, oid: bytes) -> str:
        hx = oid.hex()
        return os.path.join(self.objects_dir, hx[:2], hx[2:])

    # -- lookups -----------------------------------------------------------------

    def _find_local(self, oid: bytes) -> PackedLocation | str | None:
        last = self._last_pack
        if last is not None:
            # Many packs: the pack of the last hit first, as C git's packed_git_mru (a
            # commit's tree and blobs came with it, in the same push's pack). A hint:
            # any copy of an object is the object.
            pos = last.find(oid)
            if pos >= 0:
                return PackedLocation(last, pos, last.offset_at(pos))
        for pack in self.packs:
            pos = pack.find(oid)
            if pos >= 0:
                if len(self.packs) >= MANY_PACKS:
                    self._last_pack = pack
                return PackedLocation(pack, pos, pack.offset_at(pos))
        if oid and oid in self._loose_ids(oid[0]):
            return self._loose_path(oid)
        return None

    def locate(self, oid: bytes, needed: bool = True) -> PackedLocation | str | None:
        """Where ``oid`` lives: a packed location, a loose path, or None.

        ``needed`` marks a true miss: the request cannot go on without the object, so the
        pack directory is listed again (once per request). Expected misses pass False.
        """
        loc = self._find_local(oid)
        if loc is not None:
            return loc
        for alt in self.alternates:
            loc = alt.locate(oid, needed=False)
            if loc is not None:
                return loc
        if needed and self.rescans == 0:
            self.rescan()
            for snap in (self, *self.alternates):
                if snap is not self and snap.rescans == 0:
                    snap.rescan()
                loc = snap._find_local(oid)
                if loc is not None:
                    return loc
        if oid == EMPTY_TREE[self.hash_len]:
            return EMPTY_TREE_PATH
        if needed:
            self._raise_if_broken(oid)
        return None

    def _raise_if_broken(self, oid: bytes) -> None:
        """A needed object is nowhere to be found while a pack could not be read: that
        pack may well hold it, so the answer is a storage fault naming it, not a miss."""
        for snap in (self, *self.alternates):
            if snap.broken:
                exc = snap.broken[0]
                raise PackFormatError(f"{exc}; needed object {oid.hex()} is in no other pack",
                                      pack=exc.pack, kind=exc.kind)

    def contains(self, oid: bytes) -> bool:
        """Expected-miss lookup (a client's have): never rescans."""
        return self.locate(oid, needed=False) is not None

    # -- reading -------------------------------------------------------------------

    def read(self, oid: bytes) -> tuple[int, bytes]:
        """Type number and content of ``oid``; raises :class:`MissingObject`."""
        loc = self.locate(oid, needed=True)
        if loc is None:
            raise MissingObject(oid)
        if isinstance(loc, str):
            return self._read_loose(loc, oid)
        return self.read_packed(loc.pack, loc.offset)

    def _read_loose(self, path: str, oid: bytes) -> tuple[int, bytes]:
        if path == EMPTY_TREE_PATH:
            return OBJ_TREE, b""
        cache = self.registry.objects
        hit = cache.get(("loose", oid))
        if hit is not None:
            return hit  # objects are immutable: the id is the whole key
        try:
            raw = zlib.decompress(self.fs.read_file(path))
        except FileNotFoundError:
            # Packed away by a concurrent gc: look again (at the directories themselves,
            # not at this request's racy listings of them).
            self._loose = None
            self._loose_fresh = True
            loc = self.locate(oid, needed=True)
            if loc is None or isinstance(loc, str):
                raise MissingObject(oid) from None
            return self.read_packed(loc.pack, loc.offset)
        except zlib.error as exc:
            raise ObjectStoreError(f"corrupt loose object {oid.hex()}: {exc}") from None
        head, _, body = raw.partition(b"\0")
        type_name, _, size = head.partition(b" ")
        type_num = TYPE_NUMS.get(type_name)
        if type_num is None or not size.isdigit() or int(size) != len(body):
            raise ObjectStoreError(f"corrupt loose object {oid.hex()}")
        cache.put(("loose", oid), (type_num, body), len(body))
        return type_num, body

    def cached_loose(self, oid: bytes) -> tuple[int, bytes] | None:
        """A loose object from the process-wide objects cache, if it is there."""
        if oid == EMPTY_TREE[self.hash_len]:
            return OBJ_TREE, b""
        return self.registry.objects.get(("loose", oid))  # type: ignore[no-any-return]

    def keep_loose(self, oid: bytes, type_num: int, data: bytes) -> None:
        """Cache a loose object read elsewhere (store/bigobjects.py), as _read_loose does."""
        self.registry.objects.put(("loose", oid), (type_num, data), len(data))

    def read_packed(self, pack: PackFile, offset: int) -> tuple[int, bytes]:
        """Read and resolve the entry at ``offset`` (following delta chains)."""
        cache = self.registry.objects
        chain: list[tuple[PackFile, int, EntryHeader, bytes | memoryview | None]] = []
        type_num, data = 0, b""
        for _ in range(_MAX_CHAIN):
            hit = cache.get((pack.key, offset))
            if hit is not None:
                type_num, data = hit
                break
            hdr, buf = pack.read_entry(offset, self.windows)
            if hdr.type_num == OFS_DELTA:
                chain.append((pack, offset, hdr, buf))
                offset = hdr.base_offset  # type: ignore[assignment]
                continue
            if hdr.type_num == REF_DELTA:
                chain.append((pack, offset, hdr, buf))
                assert hdr.base_oid is not None
                loc = self.locate(hdr.base_oid, needed=True)
                if loc is None:
                    raise MissingObject(hdr.base_oid)
                if isinstance(loc, str):
                    type_num, data = self._read_loose(loc, hdr.base_oid)
                    break
                pack, offset = loc.pack, loc.offset
                continue
            type_num, data = hdr.type_num, pack.inflate_entry(hdr, buf, offset)
            if chain or type_num in (OBJ_COMMIT, OBJ_TREE, OBJ_TAG):
                cache.put((pack.key, offset), (type_num, data), len(data))
            break
        else:
            raise ObjectStoreError("delta chain too long")
        for p, off, hdr, buf in reversed(chain):
            try:
                data = b"".join(apply_delta(data, p.inflate_entry(hdr, buf, off)))
            except ApplyDeltaError as exc:
                raise p.corrupt(f"bad delta in entry at {off}: {exc}") from None
            cache.put((p.key, off), (type_num, data), len(data))
        return type_num, data

    def object_size(self, oid: bytes) -> tuple[int, int] | None:
        """(type number, size) of ``oid`` without inflating whole deltas, or None.

        Every caller asks about an object the request needs (a want being peeled, a blob
        named by a tree), so a miss is a true one: a concurrent ``git gc`` may have packed
        the loose file into a pack listed after this request froze its list.
        """
        loc = self.locate(oid, needed=True)
        if loc is None:
            return None
        if isinstance(loc, str):
            type_num, data = self._read_loose(loc, oid)
            return type_num, len(data)
        return self.packed_size(loc.pack, loc.offset)

    def packed_size(self, pack: PackFile, offset: int) -> tuple[int, int]:
        hdr = pack.read_header(offset)
        if hdr.type_num not in (OFS_DELTA, REF_DELTA):
            return hdr.type_num, hdr.size
        return self._base_type(pack, hdr), self._delta_result_size(pack, hdr)

    def packed_object_size(self, pack: PackFile, offset: int) -> int:
        """The size of the object at ``offset``, as git's ``packed_object_info`` gives it:
        the header's size for a whole object, the delta header's result size for a delta
        (the start of the delta inflated, its base never read)."""
        hdr = pack.read_header(offset)
        if hdr.type_num not in (OFS_DELTA, REF_DELTA):
            return hdr.size
        return self._delta_result_size(pack, hdr)

    @staticmethod
    def _delta_result_size(pack: PackFile, hdr: EntryHeader) -> int:
        # The target size is the second varint of the delta; its type is the base's.
        d = zlib.decompressobj()
        head = b""
        pos = hdr.data_offset
        while len(head) < 20 and not d.eof:
            data = pack.read_raw(pos, pos + 256)
            if not data:
                raise pack.corrupt(f"truncated delta at {hdr.data_offset}")
            pos += len(data)
            try:
                head += d.decompress(data, 32 - len(head))
            except zlib.error as exc:
                raise pack.corrupt(f"bad zlib data in entry at {hdr.data_offset}: {exc}") from None
        try:
            _, at = _varint(head, 0)
            size, _ = _varint(head, at)
        except IndexError:
            raise pack.corrupt(f"truncated delta at {hdr.data_offset}") from None
        return size

    def _base_type(self, pack: PackFile, hdr: object) -> int:
        for _ in range(_MAX_CHAIN):
            assert hasattr(hdr, "type_num")
            if hdr.type_num == OFS_DELTA:  # type: ignore[attr-defined]
                hdr = pack.read_header(hdr.base_offset)  # type: ignore[attr-defined]
            elif hdr.type_num == REF_DELTA:  # type: ignore[attr-defined]
                loc = self.locate(hdr.base_oid, needed=True)  # type: ignore[attr-defined]
                if loc is None:
                    raise MissingObject(hdr.base_oid)  # type: ignore[attr-defined]
                if isinstance(loc, str):
                    return self._read_loose(loc, hdr.base_oid)[0]  # type: ignore[attr-defined]
                pack, hdr = loc.pack, loc.pack.read_header(loc.offset)
            else:
                return hdr.type_num  # type: ignore[attr-defined,no-any-return]
        raise ObjectStoreError("delta chain too long")


def _unopenable(stem: str, exc: Exception) -> PackFormatError:
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return PackFormatError(f"{stem}.pack: cannot open: {why}", pack=stem + ".pack")


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        c = buf[pos]
        pos += 1
        value |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return value, pos
