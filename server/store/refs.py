"""The refs of a repository as one request sees them (ARCHITECTURE.md I2).

Everything is read through the process-wide :class:`DirCache`: the git directory's listing
(one stat) gives the inodes of ``HEAD`` and ``packed-refs``, whose contents and parse are
reused while the inodes stay the same; loose refs are found with one walk of ``refs/``
(one stat per directory while nothing changed). A whole snapshot is reused while the state
key (every listing it came from) is unchanged. With caching off, everything is re-read.
"""

from __future__ import annotations

import os
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain

from gitspout.protocol.refs import HeadInfo, Ref, ref_is_hidden, ref_matches_prefixes

from .fscache import DirCache, Listing
from .fsops import FsOps
from .lru import ByteLRU

__all__ = ["RefSnapshot", "RefSegment", "RefCache", "read_ref_snapshot", "Peeler", "SEGMENT_REFS"]

Peeler = Callable[[bytes], bytes | None]
"""Given a hex object id, the hex id it peels to when it is a tag, else None."""

_MAX_SYMREF_DEPTH = 5


SEGMENT_REFS = 512
"""Refs per segment: about 32 KiB of encoded advertisement, the unit that one change
re-encodes (and the size of one write)."""

_CMP_CHUNK = 1 << 16  # bytes compared at a time when diffing packed-refs (below mmap size)


class RefSegment:
    """A run of refs, sorted by name, shared by every snapshot where it is unchanged.

    ``encoded`` holds what the answers made of these refs, by what they depend on (kind
    of answer, hideRefs): an advertisement after a change re-encodes only the segments
    that changed, since the others are the same objects as before."""

    __slots__ = ("refs", "encoded", "__weakref__")

    def __init__(self, refs: tuple[Ref, ...]) -> None:
        self.refs = refs
        self.encoded: dict[object, bytes] = {}

    def __repr__(self) -> str:
        return f"RefSegment({len(self.refs)} refs)"


_EMPTY_SEGMENT = RefSegment(())


@dataclass(frozen=True, slots=True)
class _PackedSegment:
    """Whole entries of packed-refs: bytes ``start``..``end`` of the file, and their refs."""

    start: int
    end: int
    names: list[bytes]
    segment: RefSegment

    def moved(self, delta: int) -> _PackedSegment:
        if not delta:
            return self
        return _PackedSegment(self.start + delta, self.end + delta, self.names, self.segment)


REF_BYTES = 250  # a Ref in a snapshot (--cache-memory): name, ids, the object itself


@dataclass(frozen=True)
class _PackedRefs:
    """A parsed packed-refs file, in segments of :data:`SEGMENT_REFS` entries.

    ``data`` is kept so that the next version of the file can be diffed against it: the
    segments entirely in the common prefix and suffix of the two files are reused as they
    are, and only the bytes between are parsed again (:func:`_reparse_packed_refs`)."""

    data: bytes
    header_end: int
    fully_peeled: bool
    segments: list[_PackedSegment]
    diffable: bool = True  # sorted as git writes it: segments follow byte offsets
    firsts: list[bytes] = field(default_factory=list)  # first name of each segment
    starts: list[int] = field(default_factory=list)  # first byte of each segment

    def __post_init__(self) -> None:
        self.firsts[:] = [s.names[0] for s in self.segments]
        self.starts[:] = [s.start for s in self.segments]

    def segment_of(self, name: bytes) -> int:
        """The index of the segment whose name range holds ``name`` (the first one for
        names before every segment)."""
        return max(0, bisect_right(self.firsts, name) - 1)

    def get(self, name: bytes) -> bytes | None:
        """The object id of a packed name, or None."""
        if not self.segments:
            return None
        seg = self.segments[self.segment_of(name)]
        i = bisect_left(seg.names, name)
        if i < len(seg.names) and seg.names[i] == name:
            return seg.segment.refs[i].oid
        return None

    def __len__(self) -> int:
        return sum(len(s.names) for s in self.segments)


_NO_PACKED = _PackedRefs(b"", 0, True, [])


# Budgets, per repository, of the caches below (docs/ARCHITECTURE.md, "Caches").
PACKED_ENTRIES = 1  # the packed-refs file as it is now
SNAPSHOT_ENTRIES = 8  # ref states (all refs, or those under some prefixes)
ENCODED_ENTRIES = 8  # encoded answers: advertisements and ls-refs, by kind and ref state
MERGED_ENTRIES = 1024  # segments of packed refs with loose refs in their range


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
    # (packed segment, loose refs in its range) -> the segments of both merged
    merged: ByteLRU[tuple[RefSegment, ...]] = field(
        default_factory=lambda: ByteLRU("merged_segments", MERGED_ENTRIES, unit="entries"))
    # the last packed-refs parsed, trusted or not: the next one is diffed against it
    last_packed: _LastPacked | None = None


@dataclass(frozen=True, slots=True)
class _LastPacked:
    hex_len: int
    parsed: _PackedRefs
    key: tuple[object, ...]  # of the packed cache


@dataclass(frozen=True)
class RefSnapshot:
    """HEAD plus every ref (sorted bytewise, symrefs resolved) at one moment.

    ``state`` identifies what it was read from; equal states mean equal snapshots. The refs
    are held in ``segments`` (:class:`RefSegment`, shared with the snapshots before it
    where nothing changed); ``refs`` is all of them in one tuple, made when asked for.
    """

    head: HeadInfo
    segments: tuple[RefSegment, ...]
    hex_len: int
    state: tuple[object, ...] = ()
    complete: bool = True  # False when only some ref prefixes were read
    cacheable: bool = False  # every listing it came from was trusted (not racy)
    # With prefixes, the segments may hold refs outside them too (whole packed segments
    # are shared): ``refs`` leaves those out, and so must whoever reads ``segments``.
    prefixes: tuple[bytes, ...] = ()

    @cached_property
    def refs(self) -> tuple[Ref, ...]:
        if self.prefixes:
            ps = self.prefixes
            return tuple(r for s in self.segments for r in s.refs
                         if ref_matches_prefixes(r.name, ps))
        if len(self.segments) == 1:
            return self.segments[0].refs
        return tuple(chain.from_iterable(s.refs for s in self.segments))

    def visible(self, hide: Iterable[bytes]) -> tuple[HeadInfo | None, list[Ref]]:
        """HEAD (None when hidden) and the refs hideRefs leaves visible."""
        patterns = list(hide)
        if not patterns:
            return self.head, list(self.refs)
        head = None if ref_is_hidden(b"HEAD", patterns) else self.head
        return head, [r for r in self.refs if not ref_is_hidden(r.name, patterns)]


def _header_end(data: bytes) -> tuple[int, bool]:
    """Where the entries of packed-refs start (after its ``#`` header line), and whether
    the header declares the file fully peeled."""
    if not data.startswith(b"#"):
        return 0, False
    nl = data.find(b"\n")
    end = len(data) if nl < 0 else nl + 1
    line = data[:end]
    fully = line.startswith(b"# pack-refs with:") and \
        b" fully-peeled " in line.split(b":", 1)[1].rstrip(b"\n") + b" "
    return end, fully


def _parse_entries(data: bytes, lo: int, hi: int, hex_len: int, fully: bool,
                   peel: Peeler) -> tuple[list[bytes], list[Ref], list[int]]:
    """The entries of ``data[lo:hi]`` (whole lines): names, refs and where each starts."""
    names: list[bytes] = []
    refs: list[Ref] = []
    offsets: list[int] = []
    peeled_of: dict[int, bytes] = {}
    pos = lo
    last = -1  # index of the entry a ``^`` line may follow
    for line in data[lo:hi].split(b"\n"):
        here = pos
        pos += len(line) + 1
        if not line or line.startswith(b"#"):
            last = -1
            continue
        if line.startswith(b"^"):
            if last >= 0 and len(line) == hex_len + 1:
                peeled_of[last] = line[1:]
            last = -1
            continue
        oid, _, name = line.partition(b" ")
        if len(oid) != hex_len or not name:
            last = -1
            continue
        names.append(name)
        refs.append(Ref(name, oid))
        offsets.append(here)
        last = len(names) - 1
    for i, ref in enumerate(refs):
        peeled = peeled_of.get(i)
        if peeled is None and not fully:
            peeled = peel(ref.oid)
        if peeled is not None:
            refs[i] = Ref(ref.name, ref.oid, peeled)
    return names, refs, offsets


def _segments(names: list[bytes], refs: list[Ref], offsets: list[int],
              end: int) -> list[_PackedSegment]:
    """Cut entries into segments of about :data:`SEGMENT_REFS` (a run a little longer
    stays whole, so that an insertion does not leave a segment of one ref behind)."""
    n = len(names)
    if not n:
        return []
    pieces = max(1, round(n / SEGMENT_REFS))
    out = []
    for k in range(pieces):
        a, b = n * k // pieces, n * (k + 1) // pieces
        stop = offsets[b] if b < n else end
        out.append(_PackedSegment(offsets[a], stop, names[a:b], RefSegment(tuple(refs[a:b]))))
    return out


def _is_sorted(names: list[bytes]) -> bool:
    return all(a < b for a, b in zip(names, names[1:], strict=False))


def _parse_packed_refs(data: bytes, hex_len: int, peel: Peeler) -> _PackedRefs:
    header_end, fully = _header_end(data)
    names, refs, offsets = _parse_entries(data, header_end, len(data), hex_len, fully, peel)
    if _is_sorted(names):
        return _PackedRefs(data, header_end, fully, _segments(names, refs, offsets, len(data)))
    # Not as git writes it (hand-edited, or from a very old git): sort by name, keep the
    # last of duplicate names, and diff nothing against it.
    by_name = dict(zip(names, refs, strict=True))
    order = sorted(by_name)
    srefs = [by_name[n] for n in order]
    return _PackedRefs(data, header_end, fully, _segments(order, srefs, [0] * len(order), 0),
                       diffable=False)


def _common_prefix(a: bytes, b: bytes, limit: int) -> int:
    """Length of the common prefix of ``a`` and ``b``, at most ``limit`` (memcmp in C)."""
    k = 0
    while k < limit:
        stop = min(k + _CMP_CHUNK, limit)
        if a[k:stop] != b[k:stop]:
            lo, hi = k, stop - 1  # the answer is in [k, stop)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if a[k:mid] == b[k:mid]:
                    lo = mid
                else:
                    hi = mid - 1
            return lo
        k = stop
    return limit


def _common_suffix(a: bytes, b: bytes, limit: int) -> int:
    """Length of the common suffix of ``a`` and ``b``, at most ``limit``."""
    la, lb = len(a), len(b)
    k = 0
    while k < limit:
        stop = min(k + _CMP_CHUNK, limit)
        if a[la - stop:la - k] != b[lb - stop:lb - k]:
            lo, hi = k, stop - 1
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if a[la - mid:la - k] == b[lb - mid:lb - k]:
                    lo = mid
                else:
                    hi = mid - 1
            return lo
        k = stop
    return limit


def _reparse_packed_refs(old: _PackedRefs, data: bytes, hex_len: int,
                         peel: Peeler) -> _PackedRefs:
    """The parse of ``data``, a new version of the packed-refs ``old`` was parsed from.

    The segments wholly inside the bytes both files share at their start and at their end
    are reused (the same objects, with their encodings); the entries between are parsed
    again. A rewrite by ``git pack-refs`` or a deletion costs a compare of the two files
    and the parse of the segments around the change, not the parse of every line."""
    if data == old.data:
        return old
    if not old.diffable or not old.segments:
        return _parse_packed_refs(data, hex_len, peel)
    la, lb = len(old.data), len(data)
    p = _common_prefix(old.data, data, min(la, lb))
    if p < old.header_end:  # the header (its traits) changed
        return _parse_packed_refs(data, hex_len, peel)
    s = _common_suffix(old.data, data, min(la, lb) - p)
    delta = lb - la
    # Segments before i end inside the common prefix. Segments from j on start after the
    # common suffix began, with the newline before them inside it too: in the new file
    # they start at a line boundary, with the same bytes, so they are the same entries.
    i = max(0, bisect_right(old.starts, p) - 1)
    j = bisect_left(old.starts, la - s + 1)
    lo = old.segments[i].start if i else old.header_end
    hi = old.segments[j].start + delta if j < len(old.segments) else lb
    names, refs, offsets = _parse_entries(data, lo, hi, hex_len, old.fully_peeled, peel)
    before, after = old.segments[:i], old.segments[j:]
    if not _is_sorted(names) or (names and before and before[-1].names[-1] >= names[0]) or \
            (names and after and names[-1] >= after[0].names[0]):
        return _parse_packed_refs(data, hex_len, peel)
    middle = _segments(names, refs, offsets, hi)
    return _PackedRefs(data, old.header_end, old.fully_peeled,
                       before + middle + [seg.moved(delta) for seg in after])


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

    def packed(self, top: Listing, peel: Peeler) -> _PackedRefs:
        entry = top.names().get("packed-refs")
        if entry is None:
            return _NO_PACKED
        key = (entry[1], top.key)
        cached = self.cache.packed.get(key) if self.dirs.enabled else None
        if cached is not None:
            return cached
        # Not through the small-file cache: the parse keeps these bytes (the next version
        # is diffed against them), and that cache would keep a second copy of every
        # version of a file of 60 MB at 1M refs.
        self.dirs.check_links(self.fs, self.gitdir, top, ("packed-refs",))
        data = self.fs.read_file_or_none(os.path.join(self.gitdir, "packed-refs")) or b""
        last = self.cache.last_packed if self.dirs.enabled else None
        if last is not None and last.hex_len == self.hex_len:
            # Validated by content: whatever the listing's stat says (racy or not), the
            # bytes just read are compared with the last parse's.
            parsed = _reparse_packed_refs(last.parsed, data, self.hex_len, peel)
        else:
            parsed = _parse_packed_refs(data, self.hex_len, peel)
        if self.dirs.enabled:
            if last is not None and last.key != key:
                # One parse held at a time: the trusted entry of an older version would
                # keep its bytes (60 MB at 1M refs) until the next trusted listing.
                self.cache.packed.pop(last.key)
            self.cache.last_packed = _LastPacked(self.hex_len, parsed, key)
            if top.trusted:
                # What it holds, for --cache-memory: the file, and a Ref per line.
                refs = sum(len(seg.names) for seg in parsed.segments)
                self.cache.packed.put(key, parsed, nbytes=3 * len(data) + 200 * refs)
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
            return packed.get(current), target
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


def _loose_refs(loose: dict[bytes, bytes], every: dict[bytes, bytes], packed: _PackedRefs,
                hex_len: int, peel: Peeler) -> dict[bytes, Ref | None]:
    """Each loose ref resolved (None: it hides nothing and shows nothing, as a broken or
    dangling one does; a packed value of the same name is shadowed all the same)."""
    out: dict[bytes, Ref | None] = {}
    for name in loose:
        oid, target = _resolve(name, every, packed, hex_len)
        out[name] = None if oid is None else Ref(name, oid, peel(oid), target)
    return out


def _chunked(refs: list[Ref]) -> tuple[RefSegment, ...]:
    if len(refs) <= 2 * SEGMENT_REFS:
        return (RefSegment(tuple(refs)),)
    return tuple(RefSegment(tuple(refs[i:i + SEGMENT_REFS]))
                 for i in range(0, len(refs), SEGMENT_REFS))


def _merge(base: tuple[Ref, ...], loose: Sequence[tuple[bytes, Ref | None]]) -> list[Ref]:
    """Packed refs with the loose ones of their range: loose names win, sorted by name."""
    shadowed = {name for name, _ in loose}
    out = [r for r in base if r.name not in shadowed]
    out.extend(r for _, r in loose if r is not None)
    out.sort(key=lambda r: r.name)
    return out


def _covering(packed: _PackedRefs, prefixes: Sequence[bytes]) -> set[int] | None:
    """The segments whose name ranges hold names starting with one of ``prefixes`` (a
    prefix's names are one interval: from it to it followed by 0xff, which no ref name
    holds since they are UTF-8)."""
    if not packed.segments:
        return None
    out: set[int] = set()
    for p in prefixes:
        out.update(range(packed.segment_of(p), packed.segment_of(p + b"\xff") + 1))
    return out


def _segments_of(packed: _PackedRefs, loose: dict[bytes, Ref | None],
                 cache: RefCache | None, only: set[int] | None = None) -> tuple[RefSegment, ...]:
    """Every ref, in segments: the packed ones as they are, those with loose refs in
    their name range merged once per distinct set of loose refs (and then reused).
    With ``only``, just those segments (loose refs must all fall in them)."""
    bases = [s.segment for s in packed.segments] or [_EMPTY_SEGMENT]
    if only is not None:
        bases = [b if k in only else _EMPTY_SEGMENT for k, b in enumerate(bases)]
    if not loose:
        return tuple(b for b in bases if b.refs)
    by_seg: dict[int, list[tuple[bytes, Ref | None]]] = {}
    for name in sorted(loose):
        by_seg.setdefault(packed.segment_of(name) if packed.segments else 0, []).append(
            (name, loose[name]))
    out: list[RefSegment] = []
    for k, base in enumerate(bases):
        mine = by_seg.get(k)
        if mine is None:
            if base.refs:
                out.append(base)
            continue
        key = (base, tuple(mine))
        merged = cache.merged.get(key) if cache is not None else None
        if merged is None:
            merged = _chunked(_merge(base.refs, mine))
            if cache is not None:
                # For --cache-memory: what the merged segments hold (an entry is ~512 refs).
                cache.merged.put(key, merged,
                                 nbytes=REF_BYTES * sum(len(seg.refs) for seg in merged))
        out.extend(merged)
    return tuple(out)


def _build(head_raw: bytes, loose: dict[bytes, bytes], packed: _PackedRefs, hex_len: int,
           peel: Peeler, prefixes: Sequence[bytes], targets: dict[bytes, bytes],
           cache: RefCache | None) -> tuple[HeadInfo, tuple[RefSegment, ...]]:
    """HEAD and the refs under ``prefixes``; ``targets`` holds loose symref targets read
    outside the prefixes: they resolve symrefs but are not listed themselves."""
    every = {**targets, **loose} if targets else loose
    head = _read_head(head_raw, every, packed, hex_len)
    resolved = _loose_refs(loose, every, packed, hex_len, peel)
    return head, _segments_of(packed, resolved, cache, _covering(packed, prefixes) if prefixes else None)


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
        cache.snapshots.put(state, snap,
                            nbytes=REF_BYTES * (1 + sum(len(seg.refs) for seg in segments)))
    return snap


def _top(fs: FsOps, dirs: DirCache, gitdir: str) -> Listing:
    top = dirs.listing(fs, gitdir)
    if top is None:
        raise FileNotFoundError(gitdir)
    return top

