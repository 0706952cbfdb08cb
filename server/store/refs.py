"""The refs of a repository as one request sees them (ARCHITECTURE.md I2).

Everything is read through the process-wide :class:`DirCache`: the git directory's listing
(one stat) gives the inodes of ``HEAD`` and ``packed-refs``, whose contents and parse are
reused while the inodes stay the same; loose refs are found with one walk of ``refs/``
(one stat per directory while nothing changed). A whole snapshot is reused while the state
key (every listing it came from) is unchanged. With caching off, everything is re-read.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from gitspout.protocol.refs import HeadInfo, Ref, ref_is_hidden, ref_matches_prefixes

from .fscache import DirCache, Listing
from .fsops import FsOps
from .lru import ByteLRU

__all__ = ["RefSnapshot", "RefCache", "read_ref_snapshot", "Peeler"]

Peeler = Callable[[bytes], bytes | None]
"""Given a hex object id, the hex id it peels to when it is a tag, else None."""

_MAX_SYMREF_DEPTH = 5


REF_BYTES = 250  # a Ref in a snapshot (--cache-memory): name, ids, the object itself


@dataclass(frozen=True)
class _PackedRefs:
    values: dict[bytes, bytes]
    peeled: dict[bytes, bytes]
    fully_peeled: bool
    names: list[bytes] = field(default_factory=list)  # sorted
    refs: dict[bytes, Ref] = field(default_factory=dict)  # built once, reused by snapshots

    def ref(self, name: bytes, peel: Peeler) -> Ref:
        """The Ref of a packed name (peeled from the file's traits, or by ``peel``)."""
        ref = self.refs.get(name)
        if ref is None:
            oid = self.values[name]
            peeled = self.peeled.get(name)
            if peeled is None and not self.fully_peeled:
                peeled = peel(oid)
            ref = self.refs[name] = Ref(name, oid, peeled)
        return ref

    def names_under(self, prefixes: Sequence[bytes]) -> list[bytes]:
        """Sorted names starting with one of ``prefixes`` (bisection, not a scan)."""
        out: set[bytes] = set()
        for p in prefixes:
            i = bisect_left(self.names, p)
            while i < len(self.names) and self.names[i].startswith(p):
                out.add(self.names[i])
                i += 1
        return sorted(out)


_NO_PACKED = _PackedRefs({}, {}, True)


# Budgets, per repository, of the caches below (docs/ARCHITECTURE.md, "Caches").
PACKED_ENTRIES = 1  # the packed-refs file as it is now
SNAPSHOT_ENTRIES = 8  # ref states (all refs, or those under some prefixes)
ENCODED_ENTRIES = 8  # encoded answers: advertisements and ls-refs, by kind and ref state


@dataclass
class RefCache:
    """Cross-request ref state of one repository (shared by threads)."""

    # (packed-refs inode, git dir listing key) -> parsed packed-refs
    packed: ByteLRU[_PackedRefs] = field(
        default_factory=lambda: ByteLRU("packed_refs", PACKED_ENTRIES, unit="entries"))
    # state key (every listing read) -> snapshot
    snapshots: ByteLRU[RefSnapshot] = field(
        default_factory=lambda: ByteLRU("ref_snapshots", SNAPSHOT_ENTRIES, unit="entries"))
    # (kind, ref state, config key) -> the answer's 32 KiB chunks
    encoded: ByteLRU[list[bytes]] = field(
        default_factory=lambda: ByteLRU("advertisements", ENCODED_ENTRIES, unit="entries"))


@dataclass(frozen=True)
class RefSnapshot:
    """HEAD plus every ref (sorted bytewise, symrefs resolved) at one moment.

    ``state`` identifies what it was read from; equal states mean equal snapshots.
    """

    head: HeadInfo
    refs: tuple[Ref, ...]
    hex_len: int
    state: tuple[object, ...] = ()
    complete: bool = True  # False when only some ref prefixes were read
    cacheable: bool = False  # every listing it came from was trusted (not racy)

    def visible(self, hide: Iterable[bytes]) -> tuple[HeadInfo | None, list[Ref]]:
        """HEAD (None when hidden) and the refs hideRefs leaves visible."""
        patterns = list(hide)
        if not patterns:
            return self.head, list(self.refs)
        head = None if ref_is_hidden(b"HEAD", patterns) else self.head
        return head, [r for r in self.refs if not ref_is_hidden(r.name, patterns)]


def _parse_packed_refs(data: bytes, hex_len: int) -> _PackedRefs:
    values: dict[bytes, bytes] = {}
    peeled: dict[bytes, bytes] = {}
    fully = False
    last: bytes | None = None
    for line in data.splitlines():
        if not line:
            continue
        if line.startswith(b"#"):
            if line.startswith(b"# pack-refs with:"):
                fully = b" fully-peeled" in line.split(b":", 1)[1] + b" "
            continue
        if line.startswith(b"^"):
            if last is not None and len(line) == hex_len + 1:
                peeled[last] = line[1:]
            continue
        oid, _, name = line.partition(b" ")
        if len(oid) != hex_len or not name:
            last = None
            continue
        values[name] = oid
        last = name
    return _PackedRefs(values, peeled, fully, sorted(values))


def _valid_component(name: str) -> bool:
    return bool(name) and not name.startswith(".") and not name.endswith(".lock")


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

    def packed(self, top: Listing) -> _PackedRefs:
        entry = top.names().get("packed-refs")
        if entry is None:
            return _NO_PACKED
        key = (entry[1], top.key)
        cached = self.cache.packed.get(key) if self.dirs.enabled else None
        if cached is not None:
            return cached
        data = self.dirs.file(self.fs, os.path.join(self.gitdir, "packed-refs"), top) or b""
        parsed = _parse_packed_refs(data, self.hex_len)
        if top.trusted:
            # What it holds, for --cache-memory: the file, and a Ref per line once built.
            self.cache.packed.put(key, parsed, nbytes=3 * len(data) + 200 * len(parsed.values))
        return parsed

    def _wanted(self, dirname: str, prefixes: Sequence[bytes]) -> bool:
        """Can refs under ``dirname/`` match one of the prefixes (or contain a prefix)?"""
        if not prefixes:
            return True
        d = dirname.encode("utf-8", "surrogateescape") + b"/"
        return any(p.startswith(d) or d.startswith(p) for p in prefixes)

    def loose(self, prefixes: Sequence[bytes]) -> dict[bytes, bytes]:
        """Raw contents of the loose ref files under ``refs/`` whose names start with one of
        ``prefixes`` (all of them when there are none), by ref name.

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
            for name, _ino, is_dir in listing.entries:
                if not _valid_component(name):
                    continue
                full = prefix + "/" + name
                if is_dir:
                    if self._wanted(full, prefixes):
                        stack.append(full)
                    continue
                ref = full.encode("utf-8", "surrogateescape")
                if not ref_matches_prefixes(ref, prefixes):
                    continue
                data = self.dirs.file(self.fs, os.path.join(self.gitdir, full), listing)
                if data is not None:
                    out[ref] = data.strip()
        return out

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
    name: bytes, loose: dict[bytes, bytes], packed: _PackedRefs, hex_len: int
) -> tuple[bytes | None, bytes | None]:
    """Follow symrefs: (object id or None when unborn/broken, immediate symref target)."""
    target: bytes | None = None
    current = name
    for depth in range(_MAX_SYMREF_DEPTH):
        content = loose.get(current)
        if content is None:
            return packed.values.get(current), target
        if content.startswith(b"ref:"):
            current = content[4:].strip()
            if depth == 0:
                target = current
            continue
        return (content if len(content) == hex_len else None), target
    return None, target


def _read_head(raw: bytes, loose: dict[bytes, bytes], packed: _PackedRefs, hex_len: int) -> HeadInfo:
    if raw.startswith(b"ref:"):
        target = raw[4:].strip()
        oid, _ = _resolve(target, loose, packed, hex_len)
        return HeadInfo(target, oid)
    if len(raw) == hex_len:
        return HeadInfo(None, raw)
    return HeadInfo(None, None)


def _build(head_raw: bytes, loose: dict[bytes, bytes], packed: _PackedRefs, hex_len: int,
           peel: Peeler, prefixes: Sequence[bytes],
           targets: dict[bytes, bytes]) -> tuple[HeadInfo, tuple[Ref, ...]]:
    """HEAD and the refs under ``prefixes``; ``targets`` holds loose symref targets read
    outside the prefixes: they resolve symrefs but are not listed themselves."""
    packed_names = packed.names_under(prefixes) if prefixes else packed.names
    names: Iterable[bytes] = sorted(set(packed_names) | set(loose)) if loose else packed_names
    every = {**targets, **loose} if targets else loose
    refs: list[Ref] = []
    for name in names:
        if name not in loose:
            refs.append(packed.ref(name, peel))
            continue
        oid, target = _resolve(name, every, packed, hex_len)
        if oid is not None:
            refs.append(Ref(name, oid, peel(oid), target))
    return _read_head(head_raw, every, packed, hex_len), tuple(refs)


def read_ref_snapshot(
    gitdir: str, fs: FsOps, dirs: DirCache, cache: RefCache, hex_len: int, peel: Peeler,
    prefixes: Sequence[bytes] = (),
) -> RefSnapshot:
    """Read HEAD, packed-refs and loose refs once. With ``prefixes`` only refs whose names
    start with one of them (plus HEAD, and the loose targets of symrefs among them) are
    read, and only those are in the answer, which is then marked incomplete."""
    # Loose refs first, then packed-refs, as refs/files-backend.c does: `git pack-refs`
    # writes the new packed-refs before it deletes the loose files, so a ref that moves
    # from one to the other is seen in at least one of them, never lost or rolled back.
    reader = _Reader(gitdir, fs, dirs, cache, hex_len)
    loose = reader.loose(prefixes)
    top = _top(fs, dirs, gitdir)
    head_raw = (dirs.file(fs, os.path.join(gitdir, "HEAD"), top) or b"").strip() \
        if "HEAD" in top.names() else b""
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
    packed = reader.packed(top)
    state = tuple(reader.state) + (tuple(prefixes),)
    hit = cache.snapshots.get(state) if dirs.enabled else None
    if hit is not None:
        return hit
    head, refs = _build(head_raw, loose, packed, hex_len, peel, prefixes, targets)
    trusted = dirs.enabled and reader.trusted
    snap = RefSnapshot(head, refs, hex_len, state, complete=not prefixes, cacheable=trusted)
    if trusted:
        cache.snapshots.put(state, snap, nbytes=REF_BYTES * (1 + len(refs)))
    return snap


def _top(fs: FsOps, dirs: DirCache, gitdir: str) -> Listing:
    top = dirs.listing(fs, gitdir)
    if top is None:
        raise FileNotFoundError(gitdir)
    return top

