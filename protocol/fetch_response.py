"""The upload-pack response to a fetch, section by section (gitprotocol-v2 "fetch", output;
gitprotocol-pack "Packfile Negotiation").

v2::

    [acknowledgments (delim | flush)] [shallow-info delim] [wanted-refs delim] packfile flush

The order is the spec's. (C git 2.39 writes wanted-refs before shallow-info, which makes
``git fetch --depth=1 URL refs/heads/x`` die on the client.) Acknowledgments end with a
flush when no pack follows (another round), with a delim when one does.

v0/v1 (stateless)::

    [shallow/unshallow lines flush] ACK/NAK lines [pack [flush]]

The shallow list and its flush come first whenever a deepen was asked for, even empty;
after the pack, a flush only when side-band framed it.

:func:`iter_v2_fetch_response` and :func:`iter_v0_fetch_response` yield data payloads
(``bytes``) and :class:`Mark` items; the writer frames the one and writes the other, and
streams the pack where :data:`Mark.PACK` stands.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Sequence

from .negotiate import V0Answer, V2Answer
from .oid import oid_hex

__all__ = [
    "Mark",
    "iter_v0_fetch_response",
    "iter_v2_fetch_response",
    "iter_shallow_lines",
    "iter_shallow_info",
    "iter_wanted_refs",
    "PACKFILE_HEADER",
]

PACKFILE_HEADER = b"packfile\n"


class Mark(enum.Enum):
    """What a response holds besides data pkt-lines."""

    FLUSH = "flush"  # 0000
    DELIM = "delim"  # 0001
    PACK = "pack"  # the pack data: streamed by the caller, in side-band if negotiated


def iter_shallow_lines(shallow: Iterable[bytes], unshallow: Iterable[bytes]) -> Iterator[bytes]:
    """``shallow <oid>`` then ``unshallow <oid>`` payloads (also the v0 shallow list), from
    binary ids. No trailing LF, byte for byte as upload-pack.c writes them."""
    for oid in shallow:
        yield b"shallow " + oid_hex(oid)
    for oid in unshallow:
        yield b"unshallow " + oid_hex(oid)


def iter_shallow_info(shallow: Iterable[bytes], unshallow: Iterable[bytes]) -> Iterator[bytes]:
    yield b"shallow-info\n"
    yield from iter_shallow_lines(shallow, unshallow)


def iter_wanted_refs(refs: Iterable[tuple[bytes, bytes]]) -> Iterator[bytes]:
    """``wanted-refs`` section: ``<oid> <refname>`` per requested ref (``oid`` is the ref's
    value, hex as in :class:`.refs.Ref`)."""
    yield b"wanted-refs\n"
    for name, oid in refs:
        yield oid + b" " + name + b"\n"


def iter_v2_fetch_response(
    answer: V2Answer | None,
    *,
    shallow: Sequence[bytes] = (),
    unshallow: Sequence[bytes] = (),
    deepen: bool = False,
    client_shallow: bool = False,
    wanted_refs: Sequence[tuple[bytes, bytes]] = (),
    packfile_uris: Sequence[bytes] = (),
) -> Iterator[bytes | Mark]:
    """The v2 fetch response for ``answer`` (``None``: an empty response).

    ``packfile_uris`` are ``<pack hash> <uri>`` lines: packs the client downloads itself,
    in a section of their own before ``packfile`` (gitprotocol-v2 "packfile-uris").

    ``shallow``/``unshallow`` are binary ids. A shallow-info section is sent, even empty,
    when a deepen was asked for (``deepen``) or the client listed shallow commits we have
    (``client_shallow``), as upload-pack.c ``send_shallow_info`` does.
    """
    if answer is None:
        return
    if answer.ack_lines is not None:
        yield from answer.ack_lines
        yield Mark.DELIM if answer.send_pack else Mark.FLUSH
    if not answer.send_pack:
        return
    if deepen or client_shallow:
        yield from iter_shallow_info(shallow, unshallow)
        yield Mark.DELIM
    if wanted_refs:
        yield from iter_wanted_refs(wanted_refs)
        yield Mark.DELIM
    if packfile_uris:
        yield b"packfile-uris\n"
        yield from (line + b"\n" for line in packfile_uris)
        yield Mark.DELIM
    yield PACKFILE_HEADER
    yield Mark.PACK
    yield Mark.FLUSH


def iter_v0_fetch_response(
    answer: V0Answer | None,
    *,
    shallow: Sequence[bytes] = (),
    unshallow: Sequence[bytes] = (),
    deepen: bool = False,
    sideband: bool = True,
) -> Iterator[bytes | Mark]:
    """The v0/v1 response to one stateless POST (``answer`` ``None``: no wants, nothing).

    ``shallow``/``unshallow`` are binary ids, sent (with their flush) when ``deepen``.
    ``sideband``: side-band or side-band-64k frames the pack, and a flush ends it.
    """
    if answer is None:
        return
    if deepen:
        yield from iter_shallow_lines(shallow, unshallow)
        yield Mark.FLUSH
    yield from answer.lines
    if answer.send_pack:
        yield Mark.PACK
        if sideband:
            yield Mark.FLUSH
