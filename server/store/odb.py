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

from dulwich.errors import ApplyDeltaError
from dulwich.pack import apply_delta

from .commitgraph import CommitGraph
from .errors import MissingObject, ObjectStoreError
from .faults import report_unusable
from .fscache import DirCache, Listing
from .fsops import FsOps
from .loose import EMPTY_TREE_PATH, LooseObjects
from .objformat import EMPTY_TREE, OBJ_COMMIT, OBJ_TAG, OBJ_TREE, OFS_DELTA, REF_DELTA
from .objsizes import MAX_CHAIN, ObjectSizes
from .packs import EntryHeader, PackedLocation, PackFile, PackFormatError, Windows
from .registry import Leased, PackRegistry, out_of_descriptors

__all__ = ["ObjectSnapshot", "PackRegistry", "PackedLocation"]

log = logging.getLogger("gitspout")

_MAX_ALTERNATE_DEPTH = 5
MANY_PACKS = 16  # from this many packs on, lookups try the pack of the last hit first
# Object directories one request reads at most, its own included. C git reads any number;
# each costs a listing and its packs on every request, and an alternates file is
# whatever its writer put there.
MAX_OBJECT_DIRS = 32


_SKIPPED = "skipped: requests needing an object it may hold fail"


class ObjectSnapshot(LooseObjects, ObjectSizes):
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
            self.alternates = self._load_alternates(_depth, _seen)
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
                self._unusable("io", os.path.join(pack_dir, stem), key, exc)
            except PackFormatError as exc:
                broken.append(exc)  # skipped, but a needed object missing then names it
                self._unusable(exc.kind, os.path.join(pack_dir, stem), key, exc)
            except ValueError as exc:  # an empty file (mmap of nothing)
                broken.append(_unopenable(stem, exc))
                self._unusable("pack", os.path.join(pack_dir, stem), key, exc)
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

    def _load_alternates(self, depth: int, seen: set[str] | None) -> list[ObjectSnapshot]:
        """The alternates as C git links them (object-file.c ``link_alt_odb_entry``): each
        real path once per request, the repository's own objects directory never, depth
        first, at most :data:`MAX_OBJECT_DIRS` directories in all. A file naming its own
        directory 12 times used to cost 12 + 12^2 + ... + 12^5 snapshots per request.
        ``seen``: the real paths of the object directories this request reads so far
        (None at the top: its own, found here only when it has alternates, and kept with
        them, since a ``realpath`` is an ``lstat`` of every component of the path)."""
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
        own, paths = self._alternate_paths(data)
        if seen is None:  # C git's alt_odb_usable skips its own directory, as one seen
            seen = {own}
        alts = self.alternates  # filled in place: close() sees what failed half-way took
        for line, path in paths:
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

    def _unusable(self, kind: str, path: str, key: tuple[object, ...], exc: Exception) -> None:
        report_unusable(self.registry.faults, kind, path, key, exc, _SKIPPED)

    def _too_many(self, line: str, data: bytes) -> None:
        """One line per alternates file version, not one per request."""
        if self.registry.faults.first_report(("alternates-cap", self.objects_dir, data)):
            log.warning("%s/info/alternates: more than %d object directories in all; "
                        "ignoring %s and the entries after it", self.objects_dir,
                        MAX_OBJECT_DIRS, line)

    def _alternate_paths(self, data: bytes) -> tuple[str, tuple[tuple[str, str], ...]]:
        """The real path of this objects directory, and (line, real path) of each object
        directory ``data`` (the alternates file) names.

        Resolved once per file content and kept: a request then reads the alternate by its
        real path and follows no symlink to get there, so a link on the way that is later
        retargeted cannot lead it outside the root (it keeps reading the directory that was
        checked, until the alternates file changes). A fork sharing its objects with a
        pool repository pays no ``lstat`` per component of the paths on every fetch."""
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
        self.fs.note("realpath")
        result = (os.path.realpath(self.objects_dir), tuple(out))
        cache.put(key, result)
        return result

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
        if oid == EMPTY_TREE[self.hash_len]:  # in every repository: no rescan for it
            return EMPTY_TREE_PATH
        if needed and self.rescans == 0:
            self.rescan()
            for snap in (self, *self.alternates):
                if snap is not self and snap.rescans == 0:
                    snap.rescan()
                loc = snap._find_local(oid)
                if loc is not None:
                    return loc
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

    def read_packed(self, pack: PackFile, offset: int) -> tuple[int, bytes]:
        """Read and resolve the entry at ``offset`` (following delta chains)."""
        cache = self.registry.objects
        chain: list[tuple[PackFile, int, EntryHeader, bytes | memoryview | None]] = []
        type_num, data = 0, b""
        for _ in range(MAX_CHAIN):
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

def _unopenable(stem: str, exc: Exception) -> PackFormatError:
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return PackFormatError(f"{stem}.pack: cannot open: {why}", pack=stem + ".pack")
