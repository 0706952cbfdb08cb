"""packed-refs as segments: its parse, and the parse of its next version against the
last (docs/ARCHITECTURE.md, "Ref state").

A :class:`RefSegment` is a run of about 32 KiB of packed-refs lines, held as the file's own
bytes and shared by every snapshot where it is unchanged; a new version of the file is
compared with the old segments by memcmp, and only what lies between the common start and
the common end is parsed again. Loose refs are merged into segments by store/refs.py.
"""

from __future__ import annotations

import binascii
import itertools
import os
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter

from gitspout.protocol.refs import Ref

from .errors import StorageError
from .fsops import FsOps
from .refnames import refname_ok

__all__ = ["RefSegment", "PackedRefs", "PackedFile", "PackedRefsError", "Peeler",
           "parse_packed_refs", "reparse_packed_refs", "segment_of_refs", "segments_of_refs",
           "cut_segments",
           "EMPTY_SEGMENT", "NO_PACKED", "BLOCK", "SEGMENT_REFS", "SEGMENT_BYTES"]

Peeler = Callable[[bytes], bytes | None]
"""Given a hex object id, the hex id it peels to when it is a tag, else None."""


SEGMENT_BYTES = 32 << 10
"""Bytes of packed-refs lines per segment (about 500 refs): about 32 KiB of encoded
advertisement, the unit that one change re-encodes (and the size of one write)."""

SEGMENT_REFS = 512
"""Refs per segment when refs are cut by count (segments merged with loose refs)."""

_SEGMENT_OVERHEAD = 400  # a RefSegment beside its raw bytes: the object, first/last names
_SERIALS = itertools.count(1)  # RefSegment.serial (next() on a count is atomic in CPython)


class RefSegment:
    """A run of refs sorted by name, shared by every snapshot where it is unchanged.

    The refs are held in packed-refs form, as one bytes object: ``raw`` is whole lines
    ``<oid> <name>\\n``, each followed by ``^<peeled>\\n`` when the ref peels (every peeled
    value is there, as in a fully-peeled file). A segment parsed from packed-refs holds the
    file's own bytes, so the next version of the file is diffed against it by memcmp.
    ``targets`` names the targets of symbolic (loose) refs in it; usually None. Ref objects
    are made only when asked for (:meth:`refs`): 1M of them cost 200 MB and seconds, the
    bytes 60 MB and nothing (docs/ARCHITECTURE.md, "Caches")."""

    __slots__ = ("raw", "targets", "first", "last", "plain", "hex_len", "checked", "serial",
                 "__weakref__")

    def __init__(self, raw: bytes, hex_len: int,
                 targets: dict[bytes, bytes] | None = None, checked: bool = True) -> None:
        self.raw = raw
        self.hex_len = hex_len
        self.targets = targets or None
        # No peeled line (``^`` is in no valid ref name) and no symref: the v0 and the
        # ls-refs lines of these refs are the same bytes.
        self.plain = not self.targets and b"^" not in raw
        # Bytes read from packed-refs are checked (:func:`_check_lines`) the first time
        # they are split into lines: the split that encodes or decodes them anyway.
        self.checked = checked
        # Never another segment's in this process, unlike id() (reused once an object is
        # freed): a key of serials names these refs and keeps none alive (core/refdigest.py).
        self.serial = next(_SERIALS)
        if raw:
            self.first = raw[hex_len + 1:raw.find(b"\n")]
            k = raw.rfind(b"\n", 0, len(raw) - 1) + 1
            if raw[k] == 0x5E:  # ^: the last ref is the line before
                k = raw.rfind(b"\n", 0, k - 1) + 1
            self.last = raw[k + hex_len + 1:raw.find(b"\n", k)]
        else:
            self.first = self.last = b""

    def lines(self) -> list[bytes]:
        """The lines of ``raw`` (without their newlines), checked the first time: a line
        that is no entry raises :class:`PackedRefsError`."""
        lines = self.raw.split(b"\n")
        lines.pop()
        if not self.checked:
            _check_lines(lines, self.hex_len, self.plain)
            self.checked = True
        return lines

    def refs(self) -> list[Ref]:
        """The refs, made now (not kept)."""
        h = self.hex_len
        lines = self.lines()
        if self.plain:
            return [Ref(ln[h + 1:], ln[:h]) for ln in lines]
        targets = self.targets or {}
        out: list[Ref] = []
        for ln in lines:
            if ln[:1] == b"^":
                r = out[-1]
                out[-1] = Ref(r.name, r.oid, ln[1:], r.symref_target)
            else:
                name = ln[h + 1:]
                out.append(Ref(name, ln[:h], None, targets.get(name)))
        return out

    def oids(self) -> Iterable[bytes]:
        """The (hex) object ids of the refs, in order (made at C speed when plain)."""
        h = self.hex_len
        if self.plain:
            return map(itemgetter(slice(0, h)), self.lines())
        return [ln[:h] for ln in self.lines() if ln[:1] != b"^"]

    def get(self, name: bytes) -> bytes | None:
        """The object id of ``name`` in this segment, or None."""
        if not self.checked:
            self.lines()
        raw, h = self.raw, self.hex_len
        i = raw.find(b" " + name + b"\n")
        # A ref line's first space is at hex_len: the line starts hex_len bytes before it.
        while i >= 0 and not (i == h or (i > h and raw[i - h - 1] == 0x0A)):
            i = raw.find(b" " + name + b"\n", i + 1)
        return None if i < 0 else raw[i - h:i]

    @property
    def nbytes(self) -> int:
        return len(self.raw) + _SEGMENT_OVERHEAD

    def __len__(self) -> int:
        return self.raw.count(b"\n") - self.raw.count(b"\n^")

    def __repr__(self) -> str:
        return f"RefSegment({len(self)} refs)"


def segment_of_refs(refs: Sequence[Ref], hex_len: int) -> RefSegment:
    parts: list[bytes] = []
    targets: dict[bytes, bytes] = {}
    for r in refs:
        parts.append(r.oid + b" " + r.name + b"\n")
        if r.peeled is not None:
            parts.append(b"^" + r.peeled + b"\n")
        if r.symref_target is not None:
            targets[r.name] = r.symref_target
    return RefSegment(b"".join(parts), hex_len, targets)


EMPTY_SEGMENT = RefSegment(b"", 40)


def segments_of_refs(refs: Sequence[Ref], hex_len: int) -> tuple[RefSegment, ...]:
    """``refs`` (sorted) as segments of :data:`SEGMENT_REFS` refs; a run of up to twice
    that stays one segment."""
    if len(refs) <= 2 * SEGMENT_REFS:
        return (segment_of_refs(refs, hex_len),)
    return tuple(segment_of_refs(refs[i:i + SEGMENT_REFS], hex_len)
                 for i in range(0, len(refs), SEGMENT_REFS))


class PackedRefsError(StorageError):
    """packed-refs holds a line that is no entry (C git dies on it too)."""

    what = "corrupt packed-refs"
    kind = "packed-refs"


def _check_lines(lines: list[bytes], hex_len: int, plain: bool) -> None:
    """Raise :class:`PackedRefsError` unless ``lines`` are entries: ``<hex id> <name>``,
    each optionally followed by ``^<hex id>`` (C git dies on anything else too). Without
    peeled lines, at C speed: the ids joined and unhexlified, the byte after each."""
    h1 = hex_len + 1
    bad = not lines
    if plain and not bad:
        try:
            binascii.unhexlify(b"".join(map(itemgetter(slice(0, hex_len)), lines)))
            bad = bytes(map(itemgetter(hex_len), lines)) != b" " * len(lines) or \
                min(map(len, lines)) <= h1
        except (binascii.Error, IndexError):
            bad = True
    elif not bad:
        after_ref = False
        for ln in lines:
            if ln[:1] == b"^":
                bad = not after_ref or len(ln) != h1 or not _is_hex(ln[1:])
                after_ref = False
            else:
                bad = ln[hex_len:h1] != b" " or len(ln) <= h1 or not _is_hex(ln[:hex_len])
                after_ref = True
            if bad:
                break
    if bad:
        after_ref = False
        for ln in lines:  # name the first bad line (a few words of it)
            if ln[:1] == b"^" and after_ref and len(ln) == h1 and _is_hex(ln[1:]):
                after_ref = False
                continue
            after_ref = ln[hex_len:h1] == b" " and _is_hex(ln[:hex_len]) and len(ln) > h1
            if not after_ref:
                raise PackedRefsError(f"packed-refs: unexpected line {ln[:80]!r}")
        raise PackedRefsError("packed-refs: no entries where entries should be")


def _is_hex(b: bytes) -> bool:
    try:
        binascii.unhexlify(b)
    except binascii.Error:
        return False
    return True


def _cut(data: bytes, lo: int, hi: int, hex_len: int) -> list[RefSegment]:
    """``data[lo:hi]`` (whole lines) in segments of about :data:`SEGMENT_BYTES` (checked
    when first split: :meth:`RefSegment.lines`). A peeled line stays with its ref."""
    out: list[RefSegment] = []
    pos = lo
    while pos < hi:
        end = hi if hi - pos <= SEGMENT_BYTES * 3 // 2 else data.find(b"\n", pos + SEGMENT_BYTES)
        if end < 0 or end >= hi - 1:
            end = hi
        else:
            end += 1
            while data.startswith(b"^", end) and end < hi:
                nl = data.find(b"\n", end)
                end = hi if nl < 0 or nl >= hi else nl + 1
        raw = _without_bad_names(data[pos:end], hex_len)
        if raw:
            out.append(RefSegment(raw, hex_len, checked=False))
        pos = end
    return out


# The bytes no ref name holds (refnames.py) besides the space and ``^``, which are
# counted: a segment's bytes are looked at at C speed (three counts and a translate, 0.3 s
# for 1M refs); a segment with none of them (every segment git writes) is kept as it is.
# Names bad only by a sequence (``..``, ``@{``, ``.lock``) are left to C git's clients,
# which skip them ("funny refs"): looking for each costs as much again.
_BAD_BYTES = bytes(c for c in range(0x20) if c != 0x0A) + b"~:?*[\\\x7f"


def _suspect(raw: bytes) -> bool:
    # Each line is a ref (one space) or a peeled line (one ^, first): more of either is a
    # name holding one.
    if raw.count(b" ") + raw.count(b"^") != raw.count(b"\n"):
        return True
    return len(raw.translate(None, _BAD_BYTES)) != len(raw)


def _without_bad_names(raw: bytes, hex_len: int) -> bytes:
    """``raw`` (packed-refs lines) without the refs whose names are no ref names, and
    their peeled lines: C git gives them a null id (never a tip; clients skip them), and
    advertised with their ids they made a v0 clone fail. A line that is no entry at all
    is kept, for the check that refuses the file (:func:`_check_lines`)."""
    if not _suspect(raw):
        return raw
    out: list[bytes] = []
    keep = True
    for line in raw.split(b"\n")[:-1]:
        if line.startswith(b"^"):
            if keep:
                out.append(line)
            continue
        keep = line[hex_len : hex_len + 1] != b" " or refname_ok(
            line[hex_len + 1 :].decode("utf-8", "surrogateescape"))
        if keep:
            out.append(line)
    return b"\n".join(out) + b"\n" if out else b""


def cut_segments(data: bytes, hex_len: int) -> list[RefSegment]:
    """Packed-refs lines (sorted, each peeled line after its ref) in segments."""
    return _cut(data, 0, len(data), hex_len)


BLOCK = 1 << 20  # bytes of packed-refs read at a time


class PackedFile:
    """packed-refs read by blocks (``pread``), so that neither a parse nor a diff holds
    the whole file beside its segments (60 MB more at 1M refs)."""

    def __init__(self, fd: int, fs: FsOps) -> None:
        self.fd, self.fs = fd, fs
        self.size = os.lseek(fd, 0, os.SEEK_END)

    @staticmethod
    def of(data: bytes | PackedFile) -> PackedFile | _Bytes:
        return _Bytes(data) if isinstance(data, bytes) else data

    def read(self, off: int, n: int) -> bytes:
        if n <= 0:
            return b""
        parts: list[bytes] = []
        while n > 0:
            self.fs.note("read")
            part = os.pread(self.fd, min(n, 1 << 24), off)
            if not part:
                raise PackedRefsError("packed-refs: shrank while it was read")
            parts.append(part)
            off += len(part)
            n -= len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)


class _Bytes:
    """A file's bytes already in memory, read as :class:`PackedFile` is."""

    def __init__(self, data: bytes) -> None:
        self.data, self.size = data, len(data)

    def read(self, off: int, n: int) -> bytes:
        return self.data[off:off + n]


def _cut_file(f: PackedFile | _Bytes, lo: int, hi: int, hex_len: int) -> list[RefSegment]:
    """:func:`_cut` of the file's bytes ``lo``..``hi`` (whole lines), a block at a time."""
    out: list[RefSegment] = []
    pos, want = lo, BLOCK
    while pos < hi:
        block = f.read(pos, min(want, hi - pos))
        k = len(block)
        if pos + k < hi:
            # Whole entries only: up to a line start that is not a peeled line.
            k = block.rfind(b"\n", 0, k - 1) + 1
            while k > 0 and block[k] == 0x5E:
                k = block.rfind(b"\n", 0, k - 1) + 1
            if k == 0:  # one entry longer than the block
                want *= 2
                continue
        out.extend(_cut(block, 0, k, hex_len))
        pos += k
    return out


@dataclass(frozen=True)
class PackedRefs:
    """A parsed packed-refs file, in segments of about :data:`SEGMENT_BYTES`.

    When ``diffable``, the segments' bytes are the file's, in order after its header: the
    next version of the file is diffed against them (:func:`reparse_packed_refs`), and
    the whole file is not kept besides them."""

    header: bytes
    fully_peeled: bool
    segments: list[RefSegment]
    diffable: bool = True
    firsts: list[bytes] = field(default_factory=list)  # first name of each segment

    def __post_init__(self) -> None:
        self.firsts[:] = [s.first for s in self.segments]

    def segment_of(self, name: bytes) -> int:
        """The index of the segment whose name range holds ``name`` (the first one for
        names before every segment)."""
        return max(0, bisect_right(self.firsts, name) - 1)

    def get(self, name: bytes) -> bytes | None:
        """The object id of a packed name, or None."""
        if not self.segments:
            return None
        return self.segments[self.segment_of(name)].get(name)

    @property
    def nbytes(self) -> int:
        """What it holds (for --cache-memory)."""
        return len(self.header) + sum(s.nbytes + 80 for s in self.segments) + 200

    def __len__(self) -> int:
        return sum(len(s) for s in self.segments)


NO_PACKED = PackedRefs(b"", True, [])


def _header_end(data: bytes) -> tuple[int, bool, bool]:
    """Where the entries of packed-refs start (after its ``#`` header line), whether the
    header declares the file fully peeled, and whether it declares it sorted."""
    if not data.startswith(b"#"):
        return 0, False, False
    nl = data.find(b"\n")
    end = len(data) if nl < 0 else nl + 1
    line = data[:end]
    traits = line.split(b":", 1)[1].rstrip(b"\n") + b" " \
        if line.startswith(b"# pack-refs with:") else b""
    return end, b" fully-peeled " in traits, b" sorted " in traits


def _read_header(f: PackedFile | _Bytes) -> tuple[bytes, bool, bool]:
    head = f.read(0, min(f.size, 4096))
    end, fully, is_sorted = _header_end(head)
    if f.size and f.read(f.size - 1, 1) != b"\n":
        raise PackedRefsError("packed-refs: unterminated line")
    return head[:end], fully, is_sorted


def parse_packed_refs(data: bytes | PackedFile, hex_len: int, peel: Peeler) -> PackedRefs:
    if isinstance(data, bytes):
        header_end, fully, is_sorted = _header_end(data)
        if data and not data.endswith(b"\n"):
            raise PackedRefsError("packed-refs: unterminated line")
        header = data[:header_end]
        segs = _cut(data, header_end, len(data), hex_len)
    else:
        header, fully, is_sorted = _read_header(data)
        segs = _cut_file(data, len(header), data.size, hex_len)
    if fully and (is_sorted and _in_order(segs) or _sorted_refs(segs)):
        return PackedRefs(header, fully, segs)
    # Not as git writes it (hand-edited, not fully peeled, or from a very old git): sort
    # by name, keep the last of duplicate names, peel what the file does not, and diff
    # nothing against it.
    by_name: dict[bytes, Ref] = {}
    for seg in segs:
        for r in seg.refs():
            by_name[r.name] = r
    refs = [by_name[n] for n in sorted(by_name)]
    if not fully:
        refs = [r if r.peeled is not None else Ref(r.name, r.oid, peel(r.oid)) for r in refs]
    return PackedRefs(header, fully, list(segments_of_refs(refs, hex_len)), diffable=False)


def _in_order(segs: Sequence[RefSegment]) -> bool:
    """Segments follow each other by name (their insides are as the file says: sorted)."""
    return all(a.last < b.first for a, b in zip(segs, segs[1:], strict=False))


def _sorted_refs(segs: Sequence[RefSegment]) -> bool:
    names = [r.name for s in segs for r in s.refs()]
    return all(a < b for a, b in zip(names, names[1:], strict=False))


def reparse_packed_refs(old: PackedRefs, data: bytes | PackedFile, hex_len: int,
                         peel: Peeler) -> PackedRefs:
    """The parse of ``data``, a new version of the packed-refs ``old`` was parsed from.

    Old segments found unchanged at the start of the new file, one after the other, and
    at its end, are reused (the same objects, with their encodings); the bytes between
    are parsed again. A rewrite by ``git pack-refs`` or a deletion costs a memcmp of the
    file against the old segments (read a block at a time) and the parse of those around
    the change, not a parse of every line; the old file is not kept for this, only its
    segments, and the new one is not read whole."""
    f = PackedFile.of(data)
    if not old.diffable or f.size < len(old.header) or \
            f.read(0, len(old.header)) != old.header or \
            _header_end(f.read(0, min(f.size, len(old.header) + 1)))[0] != len(old.header):
        return parse_packed_refs(data, hex_len, peel)
    if f.size and f.read(f.size - 1, 1) != b"\n":
        raise PackedRefsError("packed-refs: unterminated line")
    segs = old.segments
    # The common start: segments equal to the next bytes, from a block.
    pos, i = len(old.header), 0
    lo, block = pos, b""
    while i < len(segs):
        raw = segs[i].raw
        if pos + len(raw) > f.size:
            break
        if pos + len(raw) > lo + len(block):
            lo, block = pos, f.read(pos, min(f.size - pos, max(BLOCK, len(raw))))
        if not block.startswith(raw, pos - lo):
            break
        pos += len(raw)
        i += 1
    if i == len(segs) and pos == f.size:
        return old
    # The common end, from blocks ending where the last reused segment starts.
    end, j = f.size, len(segs)
    lo, block = end, b""
    while j > i:
        raw = segs[j - 1].raw
        start = end - len(raw)
        if start < pos:
            break
        # A reused segment starts at a line of the new file: at ``pos``, or after a
        # newline (else the bytes before it end in the middle of a line).
        first = start - 1 if start > pos else start
        if first < lo:
            lo = max(pos, min(first, end - BLOCK))
            block = f.read(lo, end - lo)
        if not block.endswith(raw, 0, end - lo) or \
                (start > pos and block[start - 1 - lo] != 0x0A):
            break
        end = start
        j -= 1
    del block
    middle = _cut_file(f, pos, end, hex_len)
    out = segs[:i] + middle + segs[j:]
    k0, k1 = max(0, i - 1), min(len(out), i + len(middle) + 1)
    if not _in_order(out[k0:k1]):
        return parse_packed_refs(data, hex_len, peel)
    return PackedRefs(old.header, old.fully_peeled, out)

