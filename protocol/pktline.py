"""pkt-line framing (gitprotocol-common "pkt-line Format", gitprotocol-v2 "Packet-Line Framing").

Four kinds of packet exist: data, flush ``0000``, delim ``0001`` and response-end ``0002``.
They stay distinct here, unlike servers that fold flush and delim into one ``None``.

The decoder is incremental: :func:`decode_pkt` answers either a complete packet and how many
bytes it consumed, or :data:`NEED_MORE`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass

from .errors import ClientError

__all__ = [
    "PktKind",
    "Pkt",
    "NEED_MORE",
    "MAX_PKT_LEN",
    "MAX_PKT_PAYLOAD",
    "FLUSH_PKT",
    "DELIM_PKT",
    "RESPONSE_END_PKT",
    "encode_pkt",
    "encode_text_pkt",
    "decode_pkt",
    "iter_pkts",
    "PktBuffer",
    "DEFAULT_CHUNK_SIZE",
    "MAX_REQUEST_PKTS",
]

# gitprotocol-common: "the maximum length of a pkt-line's data component is 65516 bytes",
# i.e. 65520 including the four-byte length prefix.
MAX_PKT_LEN = 65520
MAX_PKT_PAYLOAD = MAX_PKT_LEN - 4

FLUSH_PKT = b"0000"
DELIM_PKT = b"0001"
RESPONSE_END_PKT = b"0002"

DEFAULT_CHUNK_SIZE = 32 * 1024

# pkt-lines a request may hold, counted as they are decoded: a 100k-ref mirror clone sends
# about 100k; more is refused with 413 before the work of acting on them.
MAX_REQUEST_PKTS = 1_000_000

_HEX_DIGITS = b"0123456789abcdefABCDEF"
_HEX = frozenset(_HEX_DIGITS)


class PktKind(enum.Enum):
    DATA = "data"
    FLUSH = "flush"
    DELIM = "delim"
    RESPONSE_END = "response-end"


@dataclass(frozen=True, slots=True)
class Pkt:
    """One decoded packet. ``payload`` is empty for the three special packets."""

    kind: PktKind
    payload: bytes = b""

    @property
    def text(self) -> bytes:
        """The payload without one trailing LF (gitprotocol-common: LF is optional)."""
        p = self.payload
        return p[:-1] if p.endswith(b"\n") else p


FLUSH = Pkt(PktKind.FLUSH)
DELIM = Pkt(PktKind.DELIM)
RESPONSE_END = Pkt(PktKind.RESPONSE_END)
_SPECIAL = {0: FLUSH, 1: DELIM, 2: RESPONSE_END}


class _NeedMore:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_MORE"


NEED_MORE = _NeedMore()


def encode_pkt(payload: bytes) -> bytes:
    """Frame ``payload`` as one data pkt-line. Empty payloads are refused (never send 0004)."""
    n = len(payload)
    if n == 0:
        raise ValueError("an empty data pkt-line (0004) must not be sent")
    if n > MAX_PKT_PAYLOAD:
        raise ValueError(f"pkt-line payload of {n} bytes exceeds {MAX_PKT_PAYLOAD}")
    return b"%04x" % (n + 4) + payload


def encode_text_pkt(line: bytes) -> bytes:
    """Frame a text line, adding the conventional trailing LF."""
    return encode_pkt(line + b"\n")


def decode_pkt(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[Pkt, int] | _NeedMore:
    """Decode one packet from ``buf`` at ``pos``.

    Returns ``(pkt, consumed)`` or :data:`NEED_MORE`. Raises :class:`ClientError` for a
    non-hex length, a length of 3 (or 1-3 other than the specials), or one over 65520.
    """
    if len(buf) - pos < 4:
        return NEED_MORE
    head = bytes(buf[pos : pos + 4])
    if not _HEX.issuperset(head):
        raise ClientError(f"protocol error: bad pkt-line length {head!r}")
    length = int(head, 16)
    if length < 4:
        special = _SPECIAL.get(length)
        if special is None:
            raise ClientError(f"protocol error: bad pkt-line length {length}")
        return special, 4
    if length == 4:
        # "0004" is an empty data packet; gitprotocol-common says it should not be sent,
        # and C git treats it as an error on the v2 command path. We accept it as empty
        # data so that parsers can decide; it carries no payload.
        return Pkt(PktKind.DATA, b""), 4
    if length > MAX_PKT_LEN:
        raise ClientError(f"protocol error: pkt-line length {length} exceeds {MAX_PKT_LEN}")
    if len(buf) - pos < length:
        return NEED_MORE
    return Pkt(PktKind.DATA, bytes(buf[pos + 4 : pos + length])), length


def iter_pkts(buf: bytes, max_pkts: int | None = None) -> Iterator[Pkt]:
    """Decode every packet in a complete body; a truncated tail is a :class:`ClientError`.

    With ``max_pkts``, decoding more packets than that is a :class:`ClientError` with HTTP
    status 413 (only the packets a parser asks for are counted: it stops reading at the
    end of the request).

    The same rules as :func:`decode_pkt`, inlined: a mirror clone's request is one packet
    per ref, and a function call per packet was most of the cost of reading it.
    """
    pos = 0
    end = len(buf)
    count = 0
    limit = max_pkts if max_pkts is not None else end  # at most one packet per 4 bytes
    data, special = PktKind.DATA, _SPECIAL
    while pos < end:
        head = buf[pos : pos + 4]
        if len(head) < 4:
            raise ClientError("protocol error: truncated pkt-line")
        if head.translate(None, _HEX_DIGITS):  # int() would take "+1f", " 1f" or "1_f"
            raise ClientError(f"protocol error: bad pkt-line length {bytes(head)!r}")
        length = int(head, 16)
        count += 1
        if count > limit:
            raise ClientError(f"request has more than {max_pkts} pkt-lines", http_status=413)
        if length > 4:
            if length > MAX_PKT_LEN:
                raise ClientError(
                    f"protocol error: pkt-line length {length} exceeds {MAX_PKT_LEN}")
            if pos + length > end:
                raise ClientError("protocol error: truncated pkt-line")
            yield Pkt(data, bytes(buf[pos + 4 : pos + length]))
            pos += length
            continue
        pos += 4
        if length == 4:  # an empty data packet: see decode_pkt
            yield Pkt(data, b"")
            continue
        found = special.get(length)
        if found is None:
            raise ClientError(f"protocol error: bad pkt-line length {length}")
        yield found


class PktBuffer:
    """Gathers encoded pkt-lines and hands back chunks of at least ``chunk_size`` bytes.

    Pure: the caller writes each returned chunk to its transport. This keeps a 100k-ref
    advertisement at ceil(bytes / 32 KiB) writes instead of one write per ref.
    """

    __slots__ = ("_parts", "_size", "chunk_size")

    def __init__(self, chunk_size: int = DEFAULT_CHUNK_SIZE) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self.chunk_size = chunk_size

    def __len__(self) -> int:
        return self._size

    def add_raw(self, data: bytes) -> bytes | None:
        """Append already-framed bytes; return a chunk once ``chunk_size`` is reached."""
        self._parts.append(data)
        self._size += len(data)
        if self._size >= self.chunk_size:
            return self.take()
        return None

    def add(self, payload: bytes) -> bytes | None:
        """Append one data pkt-line."""
        return self.add_raw(encode_pkt(payload))

    def add_flush(self) -> bytes | None:
        return self.add_raw(FLUSH_PKT)

    def add_delim(self) -> bytes | None:
        return self.add_raw(DELIM_PKT)

    def take(self) -> bytes:
        """Return everything gathered so far (possibly empty) and reset."""
        out = b"".join(self._parts)
        self._parts = []
        self._size = 0
        return out
