"""The v2 ``object-info`` command (gitprotocol-v2 "object-info")."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from .errors import ClientError
from .oid import oid_hex, parse_oid

__all__ = ["ObjectInfoRequest", "parse_object_info_args", "iter_object_info"]

# Ids per object-info request. git's own client (cat-file remote-object-info) sends at
# most 10,000 per request (builtin/cat-file.c MAX_ALLOWED_OBJ_LIMIT); more is refused.
MAX_OBJECT_INFO_OIDS = 10_000


@dataclass(frozen=True, slots=True)
class ObjectInfoRequest:
    """``oids`` are binary object ids, in the order asked (converted once by the parser)."""

    size: bool
    oids: tuple[bytes, ...]


def parse_object_info_args(args: Sequence[bytes], hex_len: int = 40) -> ObjectInfoRequest:
    size = False
    oids: list[bytes] = []
    for arg in args:
        if arg == b"size":
            size = True
        elif arg.startswith(b"oid "):
            if len(oids) >= MAX_OBJECT_INFO_OIDS:
                raise ClientError(
                    f"object-info: too many object ids (at most {MAX_OBJECT_INFO_OIDS:,} per request)")
            oids.append(parse_oid(arg[4:], hex_len))
        else:
            shown = arg[:100].decode("utf-8", "replace")
            raise ClientError(f"object-info: unexpected line: '{shown}'")
    return ObjectInfoRequest(size, tuple(oids))


def iter_object_info(
    req: ObjectInfoRequest, sizes: Iterable[tuple[bytes, int | None]]
) -> Iterator[bytes]:
    """Payloads of the answer: ``size`` then ``<oid> <size>`` per id (empty when unknown).
    ``sizes`` pairs binary ids with their sizes; the ids are written in hex here.
    Without ids the answer is empty (protocol-caps.c sends only the flush)."""
    if not req.oids:
        return
    if req.size:
        yield b"size"
    for oid, size in sizes:
        if not req.size:
            yield oid_hex(oid)
        elif size is None:
            yield oid_hex(oid) + b" "
        else:
            yield oid_hex(oid) + b" %d" % size
