"""Side-band multiplexing (gitprotocol-pack "Packfile Data", gitprotocol-capabilities
"side-band, side-band-64k").

Band 1 carries pack data, band 2 progress text, band 3 a fatal error. With ``side-band`` a
packet is at most 1000 bytes, with ``side-band-64k`` at most 65520, so one packet carries at
most 995 or 65515 data bytes after the length and the band byte.
"""

from __future__ import annotations

from collections.abc import Iterator

from .pktline import MAX_PKT_LEN

__all__ = [
    "BAND_DATA",
    "BAND_PROGRESS",
    "BAND_ERROR",
    "SIDEBAND_MAX_DATA",
    "SIDEBAND_64K_MAX_DATA",
    "max_band_payload",
    "encode_band",
    "iter_band_packets",
    "encode_keepalive",
]

BAND_DATA = 1
BAND_PROGRESS = 2
BAND_ERROR = 3

SIDEBAND_MAX_DATA = 1000 - 5
SIDEBAND_64K_MAX_DATA = MAX_PKT_LEN - 5


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


def encode_band(band: int, data: bytes | memoryview, max_data: int) -> bytes:
    """All of ``data`` on ``band`` as one byte string of framed packets."""
    return b"".join(iter_band_packets(band, data, max_data))


def encode_keepalive() -> bytes:
    """An empty band-1 packet: gitprotocol-v2 "packfile" keepalive (``0005\\x01``)."""
    return b"0005\x01"
