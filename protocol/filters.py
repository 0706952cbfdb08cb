"""Object filter specs (git rev-list "--filter", gitprotocol-v2 "fetch" ``filter``).

``parse_filter_spec`` turns the text a client sends into a typed tree:

    blob:none | blob:limit=<n>[kmg] | tree:<depth> | object:type=<type>
    | sparse:oid=<blob-ish> | combine:<spec>+<spec>...

Sub-specs of ``combine:`` are percent-encoded (list-objects-filter-options.c). Any malformed
spec raises :class:`ClientError`, so the server can refuse it before the response starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ClientError
from .numbers import OutOfRange, git_number

__all__ = [
    "FilterSpec",
    "BlobNone",
    "BlobLimit",
    "TreeDepth",
    "ObjectType",
    "SparseOid",
    "Combine",
    "parse_filter_spec",
    "format_filter_spec",
    "filter_config_name",
    "iter_filter_leaves",
]

_OBJECT_TYPES = frozenset({"blob", "tree", "commit", "tag"})
# Characters C git percent-encodes inside combine: sub-specs (RESERVED_NON_WS plus space
# and control characters); we decode any %XX and only insist the result is sane.
_MAX_SPEC_LEN = 4096
_HEX = frozenset(b"0123456789abcdefABCDEF")
_MAX_COMBINE = 64


@dataclass(frozen=True, slots=True)
class BlobNone:
    """``blob:none``: omit every blob."""


@dataclass(frozen=True, slots=True)
class BlobLimit:
    """``blob:limit=<n>``: omit blobs of ``limit`` bytes or more."""

    limit: int


@dataclass(frozen=True, slots=True)
class TreeDepth:
    """``tree:<depth>``: omit trees and blobs deeper than ``depth`` (0 = no trees at all)."""

    depth: int


@dataclass(frozen=True, slots=True)
class ObjectType:
    """``object:type=<type>``: send only objects of this type (plus what the walk needs)."""

    type_name: str


@dataclass(frozen=True, slots=True)
class SparseOid:
    """``sparse:oid=<blob-ish>``: parsed so it can be refused with a clear message."""

    value: str


@dataclass(frozen=True, slots=True)
class Combine:
    """``combine:a+b``: an object is sent only if every sub-filter keeps it."""

    filters: tuple[FilterSpec, ...]


FilterSpec = BlobNone | BlobLimit | TreeDepth | ObjectType | SparseOid | Combine


_ULONG_MAX = (1 << 64) - 1


def _parse_ulong(text: str, what: str) -> int:
    """A number as C git's ``git_parse_ulong`` reads it (numbers.py): at most 2^64 - 1."""
    try:
        return git_number(text, _ULONG_MAX)
    except OutOfRange:
        raise ClientError(f"invalid filter-spec '{what}': out of range") from None
    except ValueError:
        raise ClientError(f"invalid filter-spec '{what}': expected a number") from None


def _percent_decode(text: str) -> str:
    out = bytearray()
    raw = text.encode("utf-8", "surrogateescape")
    i = 0
    while i < len(raw):
        c = raw[i]
        if c == 0x25:  # '%'
            pair = raw[i + 1 : i + 3]
            if len(pair) != 2 or not _HEX.issuperset(pair):
                raise ClientError("invalid filter-spec: bad %-escape in combine:")
            out.append(int(pair, 16))
            i += 3
        else:
            out.append(c)
            i += 1
    return out.decode("utf-8", "surrogateescape")


def _parse_combine(rest: str, depth: int) -> Combine:
    parts = rest.split("+")
    if len(parts) < 1 or any(p == "" for p in parts):
        raise ClientError("invalid filter-spec: expected something after combine:")
    if len(parts) > _MAX_COMBINE:
        raise ClientError("invalid filter-spec: too many filters in combine:")
    subs: list[FilterSpec] = []
    for part in parts:
        sub = _parse(_percent_decode(part), depth + 1)
        subs.append(sub)
    return Combine(tuple(subs))


def _parse(spec: str, depth: int) -> FilterSpec:
    if depth > 1:
        # C git rejects combine: nested inside combine: after decoding.
        if spec.startswith("combine:"):
            raise ClientError("invalid filter-spec: nested combine: is not allowed")
    if spec == "blob:none":
        return BlobNone()
    if spec.startswith("blob:limit="):
        return BlobLimit(_parse_ulong(spec[len("blob:limit=") :], spec))
    if spec.startswith("tree:"):
        return TreeDepth(_parse_ulong(spec[len("tree:") :], spec))
    if spec.startswith("object:type="):
        name = spec[len("object:type=") :]
        if name not in _OBJECT_TYPES:
            raise ClientError(f"invalid filter-spec: '{name}' is not a valid object type")
        return ObjectType(name)
    if spec.startswith("sparse:oid="):
        return SparseOid(spec[len("sparse:oid=") :])
    if spec.startswith("combine:") and depth == 0:
        return _parse_combine(spec[len("combine:") :], depth)
    shown = spec[:100]
    raise ClientError(f"invalid filter-spec '{shown}'")


def parse_filter_spec(text: bytes | str) -> FilterSpec:
    """Parse a client's filter spec or raise :class:`ClientError`."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise ClientError("invalid filter-spec: not UTF-8") from None
    if len(text) > _MAX_SPEC_LEN:
        raise ClientError("invalid filter-spec: too long")
    return _parse(text, 0)


def format_filter_spec(spec: FilterSpec) -> str:
    """The canonical text of ``spec`` (sizes fully expanded, as gitprotocol-v2 asks)."""
    match spec:
        case BlobNone():
            return "blob:none"
        case BlobLimit(limit):
            return f"blob:limit={limit}"
        case TreeDepth(depth):
            return f"tree:{depth}"
        case ObjectType(name):
            return f"object:type={name}"
        case SparseOid(value):
            return f"sparse:oid={value}"
        case Combine(subs):
            return "combine:" + "+".join(_percent_encode(format_filter_spec(s)) for s in subs)
    raise TypeError(spec)


def _percent_encode(text: str) -> str:
    keep = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:=/")
    return "".join(c if c in keep else "".join(f"%{b:02x}" for b in c.encode()) for c in text)


def filter_config_name(spec: FilterSpec) -> str:
    """The name ``uploadpackfilter.<name>.allow`` uses for this kind of filter."""
    match spec:
        case BlobNone():
            return "blob:none"
        case BlobLimit():
            return "blob:limit"
        case TreeDepth():
            return "tree"
        case ObjectType():
            return "object:type"
        case SparseOid():
            return "sparse:oid"
        case Combine():
            return "combine"
    raise TypeError(spec)


def iter_filter_leaves(spec: FilterSpec) -> list[FilterSpec]:
    """``spec`` itself, or the sub-filters of a ``combine:``."""
    return list(spec.filters) if isinstance(spec, Combine) else [spec]
