"""The refs of a repository as one request sees them (ARCHITECTURE.md I2).

Everything is read through the process-wide :class:`DirCache`: the git directory's listing
(one stat) gives the inodes of ``HEAD`` and ``packed-refs``, whose contents and parse are
reused while the inodes stay the same; loose refs are found with one walk of ``refs/``
(one stat per directory while nothing changed). A whole snapshot is reused while the state
key (every listing it came from) is unchanged. With caching off, everything is re-read.
"""


from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gitspout.protocol.refs import HeadInfo, Ref, ref_matches_prefixes

from .errors import StorageError
from .fscache import DirCache, Listing
from .fsops import FsOps
from .packedrefs import (
    BLOCK,
    EMPTY_SEGMENT,
    NO_PACKED,
    PackedFile,
    PackedRefs,
    Peeler,
    RefSegment,
    parse_packed_refs,
    reparse_packed_refs,
    segments_of_refs,
)
from .refcache import LastPacked, RefCache
from .refnames import refname_ok, valid_component
from .refsnapshot import RefSnapshot
from .reftable import ReftableError, Table, merge_stack, parse_table

__all__ = ["read_ref_snapshot"]

_MAX_SYMREF_DEPTH = 5



@dataclass
class _Reader:
    gitdir: str
    fs: FsOps
    dirs: DirCache
    cache: RefCache
    hex_len: int
    state: list[tuple[str, object]] = field(default_factory=list)
    trusted: bool = True  # every listing in ``state`` was trusted (not racy)

    def saw(self, prefix: str, listing: Listing) -> None:
        """Add a listing the snapshot depends on to its state key."""
        self.state.append((prefix, listing.key))
        self.trusted = self.trusted and listing.trusted

    def packed(self, top: Listing, peel: Peeler) -> PackedRefs:
        entry = top.names().get("packed-refs")
        if entry is None and top.trusted:
            return NO_PACKED
        # An untrusted (racy) listing may be the one this request took before it walked
        # the loose refs (fs.racy): packed-refs is then opened by path all the same, after
        # them, and compared by content with the last parse (never taken from the cache,
        # whose keys are trusted listings).
        # git renames a new packed-refs into place (a new inode in a new listing); any
        # other writer may rewrite it in place, which only its stat shows. So it is
        # stat'ed, as C git's stat_validity_check does, and the stat is part of the
        # state key of the snapshot as well as of the parse.
        sig = self.fs.version(os.path.join(self.gitdir, "packed-refs")) \
            if entry is not None else None
        self.state.append(("packed-refs", sig))
        key = (sig, top.key)
        cached = self.cache.packed.get(key) if self.dirs.enabled and top.trusted else None
        if cached is not None:
            return cached
        # Not through the small-file cache: the parse keeps these bytes (the next version
        # is diffed against them), and that cache would keep a second copy of every
        # version of a file of 60 MB at 1M refs.
        self.dirs.check_links(self.fs, self.gitdir, top, ("packed-refs",))
        fd = self.fs.open_or_none(os.path.join(self.gitdir, "packed-refs"))
        if fd is None:
            return NO_PACKED
        last = self.cache.last_packed if self.dirs.enabled else None
        try:
            f = PackedFile(fd, self.fs)
            # A small file in one read; a large one by blocks (see PackedFile).
            data: bytes | PackedFile = f.read(0, f.size) if f.size <= BLOCK else f
            if last is not None and last.hex_len == self.hex_len:
                # Validated by content: whatever the listing's stat says (racy or not),
                # the file is compared with the last parse's segments.
                parsed = reparse_packed_refs(last.parsed, data, self.hex_len, peel)
            else:
                parsed = parse_packed_refs(data, self.hex_len, peel)
        finally:
            os.close(fd)
        if self.dirs.enabled:
            if last is not None and last.key != key:
                # One parse held at a time: the trusted entry of an older version would
                # keep its segments (60 MB at 1M refs) until the next trusted listing.
                self.cache.packed.pop(last.key)
            # Counted in --cache-memory as the last parse; the packed entry is the same
            # object and costs its key.
            self.cache.keep_packed(LastPacked(self.hex_len, parsed, key))
            if top.trusted:
                self.cache.packed.put(key, parsed, nbytes=200)
        return parsed

    def _wanted(self, dirname: str, prefixes: Sequence[bytes]) -> bool:
        """Can refs under ``dirname/`` match one of the prefixes (or contain a prefix)?"""
        if not prefixes:
            return True
        d = dirname.encode("utf-8", "surrogateescape") + b"/"
        return any(p.startswith(d) or d.startswith(p) for p in prefixes)

    def loose(self, prefixes: Sequence[bytes]) -> dict[bytes, bytes]:
        """Raw contents of the loose ref files under ``refs/`` whose names start with one of
        ``prefixes`` (all of them when there are none), by ref name. A file whose name is
        no ref name (``check_refname_format``: ``a..b``, a space, ``x.lock``) is no ref:
        C git gives it a null id (never a tip), which makes clients fail; it is left out.

        Directories are walked when a prefix can reach into them; files are kept only when
        their whole name matches, since a prefix need not end at a ``/`` (``refs/heads/ma``
        matches ``refs/heads/main`` but not ``refs/heads/next``)."""
        out: dict[bytes, bytes] = {}
        stack = ["refs"]
        while stack:
            prefix = stack.pop()
            path = os.path.join(self.gitdir, prefix)
            listing = self.dirs.listing(self.fs, path)
            if listing is None:
                continue
            self.saw(prefix, listing)
            if self._whole(prefix, prefixes):
                # Every ref below matches: this directory's refs as the last request read
                # them, while its listing holds (the same validity as DirCache.file's).
                known = self._directory(prefix, path, listing)
                if known is not None:
                    subdirs, refs = known
                    stack.extend(subdirs)
                    out.update(refs)
                    continue
            for name, _ino, is_dir in listing.entries:
                if not valid_component(name):
                    continue
                full = prefix + "/" + name
                if is_dir:
                    if self._wanted(full, prefixes):
                        stack.append(full)
                    continue
                ref = full.encode("utf-8", "surrogateescape")
                if not ref_matches_prefixes(ref, prefixes) or not refname_ok(full):
                    continue
                data = self.dirs.file(self.fs, os.path.join(self.gitdir, full), listing)
                if data is not None:
                    out[ref] = data.strip()
        return out

    @staticmethod
    def _whole(dirname: str, prefixes: Sequence[bytes]) -> bool:
        """Does every ref under ``dirname/`` match one of the prefixes?"""
        if not prefixes:
            return True
        d = dirname.encode("utf-8", "surrogateescape") + b"/"
        return any(d.startswith(p) for p in prefixes)

    def _directory(self, prefix: str, path: str, listing: Listing
                   ) -> tuple[tuple[str, ...], tuple[tuple[bytes, bytes], ...]] | None:
        """The subdirectories and the loose refs (name, stripped content) of one directory,
        all of them, kept on its listing while that holds. None when they cannot be kept:
        a racy listing, a symlink among the entries (the guard looks at it every time), a
        file gone since the listing, or the caches off."""
        if not (listing.trusted and self.dirs.enabled) or listing.links:
            return None
        known = listing.derived.get("loose-refs")
        if known is None:
            subdirs: list[str] = []
            refs: list[tuple[bytes, bytes]] = []
            for name, _ino, is_dir in listing.entries:
                if not valid_component(name):
                    continue
                full = prefix + "/" + name
                if is_dir:
                    subdirs.append(full)
                    continue
                if not refname_ok(full):
                    continue
                data = self.dirs.file(self.fs, os.path.join(path, name), listing)
                if data is None:
                    return None
                refs.append((full.encode("utf-8", "surrogateescape"), data.strip()))
            known = listing.derived["loose-refs"] = (tuple(subdirs), tuple(refs))
        return known  # type: ignore[return-value]

    def symref_targets(self, starts: Iterable[bytes], loose: dict[bytes, bytes],
                       prefixes: Sequence[bytes]) -> dict[bytes, bytes]:
        """Loose refs that symrefs point to outside ``prefixes``, followed to the end.

        A prefix-limited walk does not read them, yet a symref it did read (``HEAD``,
        ``refs/remotes/origin/HEAD``) must resolve to the loose value, which wins over a
        packed one. Only the directories on the way to each target are listed (and join the
        state key), so this costs nothing when every target is under the prefixes."""
        found: dict[bytes, bytes] = {}
        pending = [t for t in starts if not ref_matches_prefixes(t, prefixes)]
        for _ in range(_MAX_SYMREF_DEPTH):
            pending = [t for t in dict.fromkeys(pending) if t not in found and t not in loose]
            if not pending:
                break
            read = self.loose(pending)
            nxt: list[bytes] = []
            for target in pending:
                content = read.get(target)
                if content is None:
                    continue
                found[target] = content
                if content.startswith(b"ref:"):
                    nxt.append(content[4:].strip())
            pending = [t for t in nxt if not ref_matches_prefixes(t, prefixes)]
        return found


def _resolve(
    name: bytes, loose: dict[bytes, bytes], packed: PackedRefs, hex_len: int
) -> tuple[bytes | None, bytes | None]:
    """Follow symrefs: (object id or None when unborn/broken, immediate symref target)."""
    target: bytes | None = None
    current = name
    for depth in range(_MAX_SYMREF_DEPTH):
        content = loose.get(current)
        if content is None:
            return packed.get(current), target
        if content.startswith(b"ref:"):
            current = content[4:].strip()
            if depth == 0:
                target = current
            continue
        return (content if len(content) == hex_len else None), target
    return None, target


def _read_head(raw: bytes, loose: dict[bytes, bytes], packed: PackedRefs, hex_len: int) -> HeadInfo:
    if raw.startswith(b"ref:"):
        target = raw[4:].strip()
        oid, _ = _resolve(target, loose, packed, hex_len)
        return HeadInfo(target, oid)
    if len(raw) == hex_len:
        return HeadInfo(None, raw)
    return HeadInfo(None, None)


def _loose_refs(loose: dict[bytes, bytes], every: dict[bytes, bytes], packed: PackedRefs,
                hex_len: int, peel: Peeler) -> dict[bytes, Ref | None]:
    """Each loose ref resolved (None: it hides nothing and shows nothing, as a broken or
    dangling one does; a packed value of the same name is shadowed all the same)."""
    out: dict[bytes, Ref | None] = {}
    for name in loose:
        oid, target = _resolve(name, every, packed, hex_len)
        out[name] = None if oid is None else Ref(name, oid, peel(oid), target)
    return out


def _merge(base: Sequence[Ref], loose: Sequence[tuple[bytes, Ref | None]]) -> list[Ref]:
    """Packed refs with the loose ones of their range: loose names win, sorted by name."""
    shadowed = {name for name, _ in loose}
    out = [r for r in base if r.name not in shadowed]
    out.extend(r for _, r in loose if r is not None)
    out.sort(key=lambda r: r.name)
    return out


def _covering(packed: PackedRefs, prefixes: Sequence[bytes]) -> set[int] | None:
    """The segments whose name ranges hold names starting with one of ``prefixes`` (a
    prefix's names are one interval: from it to it followed by 0xff, which no ref name
    holds since they are UTF-8)."""
    if not packed.segments:
        return None
    out: set[int] = set()
    for p in prefixes:
        out.update(range(packed.segment_of(p), packed.segment_of(p + b"\xff") + 1))
    return out


def _segments_of(packed: PackedRefs, loose: dict[bytes, Ref | None], cache: RefCache | None,
                 only: set[int] | None = None, hex_len: int = 40) -> tuple[RefSegment, ...]:
    """Every ref, in segments: the packed ones as they are, those with loose refs in
    their name range merged once per distinct set of loose refs (and then reused).
    With ``only``, just those segments (loose refs must all fall in them)."""
    bases = list(packed.segments) or [EMPTY_SEGMENT]
    if only is not None:
        bases = [b if k in only else EMPTY_SEGMENT for k, b in enumerate(bases)]
    if not loose:
        return tuple(b for b in bases if b.raw)
    by_seg: dict[int, list[tuple[bytes, Ref | None]]] = {}
    for name in sorted(loose):
        by_seg.setdefault(packed.segment_of(name) if packed.segments else 0, []).append(
            (name, loose[name]))
    out: list[RefSegment] = []
    for k, base in enumerate(bases):
        mine = by_seg.get(k)
        if mine is None:
            if base.raw:
                out.append(base)
            continue
        key = (base, tuple(mine))
        merged = cache.merged.get(key) if cache is not None else None
        if merged is None:
            merged = segments_of_refs(_merge(base.refs(), mine), hex_len)
            if cache is not None:
                # For --cache-memory: what the merged segments hold (an entry is ~500 refs).
                cache.merged.put(key, merged, nbytes=sum(seg.nbytes for seg in merged))
        out.extend(merged)
    return tuple(out)


def _build(head_raw: bytes, loose: dict[bytes, bytes], packed: PackedRefs, hex_len: int,
           peel: Peeler, prefixes: Sequence[bytes], targets: dict[bytes, bytes],
           cache: RefCache | None) -> tuple[HeadInfo, tuple[RefSegment, ...]]:
    """HEAD and the refs under ``prefixes``; ``targets`` holds loose symref targets read
    outside the prefixes: they resolve symrefs but are not listed themselves."""
    every = {**targets, **loose} if targets else loose
    head = _read_head(head_raw, every, packed, hex_len)
    resolved = _loose_refs(loose, every, packed, hex_len, peel)
    return head, _segments_of(packed, resolved, cache,
                              _covering(packed, prefixes) if prefixes else None, hex_len)


def read_ref_snapshot(
    gitdir: str, fs: FsOps, dirs: DirCache, cache: RefCache, hex_len: int, peel: Peeler,
    prefixes: Sequence[bytes] = (), storage: str = "files",
) -> RefSnapshot:
    """Read HEAD, packed-refs and loose refs once. With ``prefixes`` only refs whose names
    start with one of them (plus HEAD, and the loose targets of symrefs among them) are
    read, and only those are in the answer, which is then marked incomplete.

    ``storage`` is the repository's ``extensions.refStorage``: a reftable stack is read
    whole (store/reftable.py), and a format gitspout cannot read is refused, never read
    as loose refs (where ``refs/heads`` is a file saying it is not)."""
    if storage == "reftable":
        return read_reftable_snapshot(gitdir, fs, dirs, cache, hex_len, peel)
    if storage != "files":
        raise StorageError(f"unsupported ref storage format {storage!r}", kind="refs",
                           what="unsupported ref storage")
    # Loose refs first, then packed-refs, as refs/files-backend.c does: `git pack-refs`
    # writes the new packed-refs before it deletes the loose files, so a ref that moves
    # from one to the other is seen in at least one of them, never lost or rolled back.
    reader = _Reader(gitdir, fs, dirs, cache, hex_len)
    loose = reader.loose(prefixes)
    top = _top(fs, dirs, gitdir)
    head_raw = _head_raw(fs, dirs, gitdir, top)
    targets: dict[bytes, bytes] = {}
    if prefixes:
        starts = [v[4:].strip() for v in loose.values() if v.startswith(b"ref:")]
        if head_raw.startswith(b"ref:") and ref_matches_prefixes(b"HEAD", prefixes):
            starts.append(head_raw[4:].strip())
        walked = len(reader.state)
        targets = reader.symref_targets(starts, loose, prefixes)
        if len(reader.state) > walked:
            # More loose refs were read: list the git directory again, so that
            # packed-refs is still read after every loose ref (see above). HEAD stays
            # the one whose target was just read.
            top = _top(fs, dirs, gitdir)
    reader.saw("", top)
    packed = reader.packed(top, peel)
    state = tuple(reader.state) + (tuple(prefixes),)
    hit = cache.snapshots.get(state) if dirs.enabled else None
    if hit is not None:
        return hit
    head, segments = _build(head_raw, loose, packed, hex_len, peel, prefixes, targets,
                            cache if dirs.enabled else None)
    trusted = dirs.enabled and reader.trusted
    snap = RefSnapshot(head, segments, hex_len, state, complete=not prefixes, cacheable=trusted,
                       prefixes=tuple(prefixes))
    if trusted:
        # What it holds beyond the packed parse's segments (counted there): merged ones
        # (counted in merged_segments too, but they may leave it first).
        base = {id(s) for s in packed.segments}
        cache.snapshots.put(state, snap, nbytes=200 + 8 * len(segments) + sum(
            s.nbytes for s in segments if id(s) not in base))
    return snap


def _head_raw(fs: FsOps, dirs: DirCache, gitdir: str, top: Listing) -> bytes:
    """HEAD's contents. A symlink HEAD that names a ref (``HEAD -> refs/heads/main``, as
    ``core.preferSymlinkRefs`` made them) is a symref to that ref, read from the link
    itself as refs/files-backend.c does: its target may well be packed (the link then
    dangles). Any other symlink is read through (within the root: DirCache.file)."""
    if "HEAD" not in top.names():
        return b""
    path = os.path.join(gitdir, "HEAD")
    if "HEAD" in top.links:
        try:
            target = os.readlink(path)
        except OSError:  # replaced by a file meanwhile: read it
            target = ""
        if target.startswith("refs/") and refname_ok(target):
            return b"ref: " + target.encode("utf-8", "surrogateescape")
    return (dirs.file(fs, path, top) or b"").strip()


def _top(fs: FsOps, dirs: DirCache, gitdir: str) -> Listing:
    top = dirs.listing(fs, gitdir)
    if top is None:
        raise FileNotFoundError(gitdir)
    return top


_STACK_RETRIES = 3  # a compaction may remove tables between tables.list and their open


def read_reftable_snapshot(gitdir: str, fs: FsOps, dirs: DirCache, cache: RefCache,
                           hex_len: int, peel: Peeler) -> RefSnapshot:
    """Every ref of a reftable stack: ``tables.list`` read per request (through its
    directory's listing), each table parsed once per (name, inode) and kept, the newer
    tables merged into the segments of the oldest as loose refs are into packed ones."""
    rdir = os.path.join(gitdir, "reftable")
    for attempt in range(_STACK_RETRIES):
        listing = dirs.listing(fs, rdir)
        if listing is None:
            err = ReftableError("reftable: no reftable directory")
            err.path = rdir
            raise err
        dirs.check_links(fs, rdir, listing)
        names = [n.decode("utf-8", "surrogateescape")
                 for n in (dirs.file(fs, os.path.join(rdir, "tables.list"), listing) or b"").split()]
        entries = listing.names()
        state = (("reftable", listing.key), *((n, entries[n][1] if n in entries else None)
                                               for n in names))
        hit = cache.snapshots.get(state) if dirs.enabled else None
        if hit is not None:
            return hit
        try:
            tables = [_table(fs, rdir, name, key, cache, hex_len // 2) for name, key in state[1:]]
        except FileNotFoundError:
            if attempt + 1 == _STACK_RETRIES:
                raise
            dirs.forget(rdir, fs)  # compacted meanwhile: read the new list
            continue
        head, base, top = merge_stack(tables, peel)
        segments = _segments_of(base, top, cache if dirs.enabled else None, None, hex_len)
        trusted = dirs.enabled and listing.trusted
        snap = RefSnapshot(head, segments, hex_len, state, complete=True, cacheable=trusted)
        if trusted:
            cache.snapshots.put(state, snap, nbytes=200 + sum(s.nbytes for s in segments))
        return snap
    raise AssertionError("unreachable")


def _table(fs: FsOps, rdir: str, name: str, ino: object, cache: RefCache,
           hash_len: int) -> Table:
    """One table of the stack, parsed once per (name, inode): tables never change."""
    if ino is None or "/" in name or name.startswith("."):
        raise FileNotFoundError(os.path.join(rdir, name))
    key = (name, ino)
    table = cache.tables.get(key)
    if table is None:
        path = os.path.join(rdir, name)
        try:
            table = parse_table(fs.read_file(path, limit=1 << 32), hash_len)
        except ReftableError as exc:
            exc.path = path
            raise
        cache.tables.put(key, table, nbytes=table.nbytes)
    return table
