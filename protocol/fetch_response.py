"""Section payloads of a v2 ``fetch`` response (gitprotocol-v2 "fetch", output).

    [acknowledgments delim] [shallow-info delim] [wanted-refs delim] packfile flush

The order is the spec's. (C git 2.39 writes wanted-refs before shallow-info, which makes
``git fetch --depth=1 URL refs/heads/x`` die on the client.)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

__all__ = ["iter_shallow_lines", "iter_shallow_info", "iter_wanted_refs", "PACKFILE_HEADER"]

PACKFILE_HEADER = b"packfile\n"


def iter_shallow_lines(shallow: Iterable[bytes], unshallow: Iterable[bytes]) -> Iterator[bytes]:
    """``shallow <oid>`` then ``unshallow <oid>`` payloads (also the v0 shallow list).
    No trailing LF, byte for byte as upload-pack.c writes them."""
    for oid in shallow:
        yield b"shallow " + oid
    for oid in unshallow:
        yield b"unshallow " + oid


def iter_shallow_info(shallow: Iterable[bytes], unshallow: Iterable[bytes]) -> Iterator[bytes]:
    yield b"shallow-info\n"
    yield from iter_shallow_lines(shallow, unshallow)


def iter_wanted_refs(refs: Iterable[tuple[bytes, bytes]]) -> Iterator[bytes]:
    """``wanted-refs`` section: ``<oid> <refname>`` per requested ref."""
    yield b"wanted-refs\n"
    for name, oid in refs:
        yield oid + b" " + name + b"\n"
