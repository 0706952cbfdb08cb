"""Side-band multiplexing (gitprotocol-pack "Packfile Data", gitprotocol-capabilities
"side-band, side-band-64k").

Band 1 carries pack data, band 2 progress text, band 3 a fatal error. With ``side-band`` a
packet is at most 1000 bytes, with ``side-band-64k`` at most 65520, so one packet carries at
most 995 or 65515 data bytes after the length and the band byte.

A fatal error goes on band 3 once the pack has started in side-band; before that, or
without side-band, it is an ``ERR <message>`` pkt-line (gitprotocol-pack, ``ERR``).
Under v2 ``sideband-all`` every pkt-line of the response travels on band 1.
"""

from __future__ import annotations

from collections.abc import Iterator

from .pktline import MAX_PKT_LEN, encode_pkt

__all__ = [
    "BAND_DATA",
    "BAND_PROGRESS",
    "BAND_ERROR",
    "SIDEBAND_MAX_DATA",
    "SIDEBAND_64K_MAX_DATA",
    "max_band_payload",
    "encode_band",
    "iter_band_packets",
    "frame_data_packets",
    "split_band_packets",
    "encode_keepalive",
    "band_payload",
    "encode_err_pkt",
    "encode_band_error",
    "MAX_ERROR_TEXT",
]

BAND_DATA = 1
BAND_PROGRESS = 2
BAND_ERROR = 3

SIDEBAND_MAX_DATA = 1000 - 5
SIDEBAND_64K_MAX_DATA = MAX_PKT_LEN - 5
MAX_ERROR_TEXT = 60000  # bytes of an error message kept (an ERR line must fit one pkt-line)


def max_band_payload(large: bool) -> int:
    """Data bytes per packet: ``side-band-64k`` when ``large`` else ``side-band``."""
    return SIDEBAND_64K_MAX_DATA if large else SIDEBAND_MAX_DATA


def iter_band_packets(band: int, data: bytes | memoryview, max_data: int) -> Iterator[bytes]:
    """Split ``data`` into framed side-band packets on ``band``."""
    if not 1 <= band <= 3:
        raise ValueError(f"bad side-band channel {band}")
    view = memoryview(data)
    prefix = bytes((band,))
    for start in range(0, len(view), max_data):
        piece = view[start : start + max_data]
        yield b"%04x" % (len(piece) + 5) + prefix + piece


def frame_data_packets(data: bytes, final: bool,
                       max_data: int = SIDEBAND_64K_MAX_DATA) -> tuple[list[bytes | memoryview], int]:
    """``data`` as band-1 packets of ``max_data`` bytes each, as (header, payload) parts for
    one ``writev``, and how many bytes of ``data`` they hold: whole packets only, unless
    ``final`` (then the rest too, in a shorter last packet). What is left over goes in
    front of the next call's data: a stream framed this way is the same packets however
    its bytes came, every one full but the last (the pack cache's files, app/packcache.py)."""
    view = memoryview(data)
    end = len(view) if final else len(view) - len(view) % max_data
    parts: list[bytes | memoryview] = []
    for start in range(0, end, max_data):
        piece = view[start : min(end, start + max_data)]
        parts.append(b"%04x\x01" % (len(piece) + 5))
        parts.append(piece)
    return parts, end


def split_band_packets(buf: bytes | memoryview) -> tuple[list[memoryview], list[int], int]:
    """The complete side-band packets at the start of ``buf``: their payloads (without the
    band byte), their bands, and how many bytes of ``buf`` they took; an incomplete packet
    at the end is left for the caller to read whole. ValueError on anything that is not a
    side-band data packet (a flush, a bad length, no band byte): ``buf`` is expected to
    hold what :func:`frame_data_packets` wrote."""
    view = memoryview(buf)
    payloads: list[memoryview] = []
    bands: list[int] = []
    pos, size = 0, len(view)
    while size - pos >= 4:
        head = bytes(view[pos : pos + 4])
        if head.translate(None, b"0123456789abcdefABCDEF"):
            raise ValueError(f"not a pkt-line length at {pos}: {head!r}")
        length = int(head, 16)
        if length < 5 or length > MAX_PKT_LEN:
            raise ValueError(f"not a side-band packet at {pos} (length {length})")
        if size - pos < length:
            break
        bands.append(view[pos + 4])
        payloads.append(view[pos + 5 : pos + length])
        pos += length
    return payloads, bands, pos


def encode_band(band: int, data: bytes | memoryview, max_data: int) -> bytes:
    """All of ``data`` on ``band`` as one byte string of framed packets."""
    return b"".join(iter_band_packets(band, data, max_data))


def band_payload(band: int, data: bytes) -> bytes:
    """One pkt-line's payload on ``band`` (the band byte, then ``data``): how ``sideband-all``
    sends the section lines of a v2 response on band 1."""
    return bytes((band,)) + data


def _error_text(message: str) -> bytes:
    return message.encode("utf-8", "replace")[:MAX_ERROR_TEXT] + b"\n"


def encode_err_pkt(message: str) -> bytes:
    """``ERR <message>\\n`` as one pkt-line: a fatal error outside the pack's side-band."""
    return encode_pkt(b"ERR " + _error_text(message))


def encode_band_error(message: str, max_data: int) -> bytes:
    """``<message>\\n`` on band 3: a fatal error once the pack is under way in side-band."""
    return encode_band(BAND_ERROR, _error_text(message), max_data)


def encode_keepalive() -> bytes:
    """An empty band-1 packet: gitprotocol-v2 "packfile" keepalive (``0005\\x01``)."""
    return b"0005\x01"
