"""New deltas, by lines, in time linear in the two objects.

A pack sometimes holds an object whose stored base is not sent (the tips of a ``--depth 1``
clone: each file's version is stored against an older one the client will not get). Sent
whole, it costs a zlib pass over all of it and the bytes of all of it. Against the version
of the same path that is sent (docs/performance.md, "New deltas and shallow clones"), a delta
is smaller and cheaper to compress, if making it is cheap. dulwich's ``create_delta`` is
not, for this use: its time grows with the product of the sizes of what differs (69 KB
with 5% of its lines changed: 17 ms; 200 KB unrelated: 1.3 s), where zlib takes 2-3 ms.

This encoder finds copies by whole lines, as a line diff would. What both versions begin
and end with is copied; the base's lines between go in a dict (first offset of each); a
line of the target found there starts a copy, which is then extended as far as the bytes
stay equal (slices compared, not lines), and what no copy covers is inserted. Unchanged
stretches cost a few steps each, changed ones a dict lookup per line, so two versions of
a 69 KB source file take about a millisecond. What it misses (a change inside a long
line, binary data without newlines) comes out as inserts, and the caller sends the object
whole when the delta is not much smaller.

The format is git's (``patch-delta.c``): the two sizes as 7-bit varints, then copy
instructions (``0x80`` with flag bits for the offset and size bytes present) and insert
instructions (1 to 127 literal bytes). Copies are cut at 64 KiB, as git's encoder does.
"""

from __future__ import annotations

from itertools import accumulate, count
from operator import add

from ..graph.commits import equal_run

__all__ = ["line_delta"]

_MAX_COPY = 0x10000  # bytes one copy instruction may take (0 encodes 0x10000)
_MAX_INSERT = 0x7F  # literal bytes one insert instruction may carry
_MIN_COPY = 8  # a shorter line is cheaper inserted than copied, unless it extends a copy


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _copy(out: bytearray, offset: int, size: int) -> None:
    while size > 0:
        n = min(size, _MAX_COPY)
        cmd = 0x80
        args = bytearray()
        for i in range(4):
            byte = (offset >> (8 * i)) & 0xFF
            if byte:
                cmd |= 1 << i
                args.append(byte)
        stored = n if n < _MAX_COPY else 0  # 0x10000 is written as no size bytes
        for i in range(3):
            byte = (stored >> (8 * i)) & 0xFF
            if byte:
                cmd |= 0x10 << i
                args.append(byte)
        out.append(cmd)
        out += args
        offset += n
        size -= n


def _insert(out: bytearray, data: bytes | memoryview) -> None:
    for at in range(0, len(data), _MAX_INSERT):
        piece = data[at:at + _MAX_INSERT]
        out.append(len(piece))
        out += piece


def _common(a: bytes, i: int, b: bytes, j: int) -> int:
    """How many bytes from ``a[i:]`` and ``b[j:]`` on are equal: the tree diff's
    :func:`~..graph.commits.equal_run` over growing pieces, so that a copy costs what it
    covers, not what is left of the objects."""
    n = max(0, min(len(a) - i, len(b) - j))
    run, piece = 0, 4096
    while run < n:
        k = equal_run(a, i + run, b, j + run, min(piece, n - run))
        run += k
        if k < piece:
            break
        piece *= 4
    return run


def _common_tail(a: bytes, b: bytes, most: int) -> int:
    """How many bytes ``a`` and ``b`` end with in common, at most ``most``: suffixes
    compared by doubling lengths, then halving (equal_run reads forward only)."""
    lo, step = 0, 64
    while lo + step <= most and a[len(a) - lo - step:len(a) - lo] == b[len(b) - lo - step:len(b) - lo]:
        lo += step
        step *= 2
    hi = min(most, lo + step)
    if a[len(a) - hi:len(a) - lo] == b[len(b) - hi:len(b) - lo]:
        return hi
    while hi - lo > 1:  # the last lo bytes are equal, the last hi are not
        mid = (lo + hi) // 2
        if a[len(a) - mid:len(a) - lo] == b[len(b) - mid:len(b) - lo]:
            lo = mid
        else:
            hi = mid
    return lo


def line_delta(base: bytes, target: bytes, limit: int, sep: bytes = b"\n") -> bytes | None:
    """A delta that makes ``target`` from ``base``, or None once it would exceed ``limit``
    bytes (the caller sends ``target`` whole then). Lines end at ``sep``: a tree's entries
    end at the NUL after their names (each piece is then an id and the next mode and name).

    What both begin and end with is copied first; only the base's lines between go in
    the dict (two versions of a file usually differ in a few places, and indexing all of
    a large base was most of the time)."""
    size, end = len(base), len(target)
    head = _common(target, 0, base, 0)
    tail = _common_tail(target, base, min(size, end) - head)
    out = bytearray(_varint(size) + _varint(end))
    if head:
        _copy(out, 0, head)
    lines = base[head:size - tail].split(sep)
    # Line (without its newline) -> offset of its first occurrence, built at C speed: the
    # later of two equal keys wins in a dict, so the lines go in from the last.
    starts = list(map(add, accumulate(map(len, lines[:-1]), initial=head), count()))
    first = dict(zip(reversed(lines), reversed(starts), strict=True))
    middle = end - tail  # the target's bytes before the common tail
    pos = pending = head  # the line looked at; where the bytes still to insert begin
    while pos < middle:
        nl = target.find(sep, pos, middle)
        stop = middle if nl < 0 else nl
        found = first.get(target[pos:stop], -1) if stop - pos >= _MIN_COPY else -1
        if found < 0:
            pos = stop + 1
            if len(out) + pos - pending > limit:  # the inserts alone are too many
                return None
            continue
        if pending < pos:
            _insert(out, memoryview(target)[pending:pos])
        run = _common(target, pos, base, found)
        _copy(out, found, run)
        pos = pending = pos + run
        if len(out) > limit:
            return None
        if pos < middle and target[pos - 1] != sep[0]:  # the copy ended inside a line
            nl = target.find(sep, pos, middle)
            pos = middle if nl < 0 else nl + 1
    if pending < middle:
        _insert(out, memoryview(target)[pending:middle])
    rest = end - max(pending, middle)  # a copy in the middle may have run into the tail
    if rest:
        _copy(out, size - rest, rest)
    return bytes(out) if len(out) <= limit else None
