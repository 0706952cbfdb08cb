"""protocol.sideband: band framing, packet sizes for side-band and side-band-64k, keepalive."""

from __future__ import annotations

import math

import pytest
from gitspout.protocol.pktline import MAX_PKT_LEN, Pkt, PktKind, decode_pkt, iter_pkts
from gitspout.protocol.sideband import (
    BAND_DATA,
    BAND_ERROR,
    BAND_PROGRESS,
    MAX_ERROR_TEXT,
    SIDEBAND_64K_MAX_DATA,
    SIDEBAND_MAX_DATA,
    band_payload,
    encode_band,
    encode_band_error,
    encode_err_pkt,
    encode_keepalive,
    iter_band_packets,
    max_band_payload,
)


def test_constants() -> None:
    assert (BAND_DATA, BAND_PROGRESS, BAND_ERROR) == (1, 2, 3)
    assert SIDEBAND_64K_MAX_DATA == 65515 == MAX_PKT_LEN - 5
    assert SIDEBAND_MAX_DATA == 995  # a side-band packet is at most 1000 bytes
    assert max_band_payload(True) == SIDEBAND_64K_MAX_DATA
    assert max_band_payload(False) == SIDEBAND_MAX_DATA


def test_small_payload_is_one_packet() -> None:
    assert list(iter_band_packets(BAND_PROGRESS, b"Counting\r", 995)) == [b"000e\x02Counting\r"]
    assert encode_band(BAND_ERROR, b"boom\n", 995) == b"000a\x03boom\n"


@pytest.mark.parametrize("large", [True, False])
@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_packets_at_the_size_limit(large: bool, extra: int) -> None:
    limit = max_band_payload(large)
    data = bytes(range(256)) * ((3 * limit + extra) // 256 + 1)
    data = data[: 3 * limit + extra]
    packets = list(iter_band_packets(BAND_DATA, data, limit))
    assert len(packets) == math.ceil(len(data) / limit)
    cap = MAX_PKT_LEN if large else 1000
    assert all(len(p) <= cap for p in packets)
    assert all(len(p) == cap for p in packets[:3 if extra > 0 else 2])
    assert all(p[4] == BAND_DATA for p in packets)
    assert all(int(p[:4], 16) == len(p) for p in packets)
    assert b"".join(p[5:] for p in packets) == data


def test_packets_decode_as_pkt_lines() -> None:
    data = b"p" * 200_000
    body = encode_band(BAND_DATA, data, SIDEBAND_64K_MAX_DATA)
    pkts = list(iter_pkts(body))
    assert all(p.kind is PktKind.DATA and p.payload[0] == 1 for p in pkts)
    assert b"".join(p.payload[1:] for p in pkts) == data
    assert len(pkts) == 4  # ceil(200000 / 65515)


def test_empty_data_sends_nothing() -> None:
    # An empty band-1 packet is the keepalive; it must not appear by accident.
    assert list(iter_band_packets(BAND_DATA, b"", 995)) == []
    assert encode_band(BAND_PROGRESS, b"", 995) == b""


def test_memoryview_input() -> None:
    data = bytearray(b"abc" * 1000)
    out = encode_band(BAND_DATA, memoryview(data), 995)
    assert b"".join(p.payload[1:] for p in iter_pkts(out)) == bytes(data)


@pytest.mark.parametrize("band", [0, 4, 255, -1])
def test_bad_band(band: int) -> None:
    with pytest.raises(ValueError):
        list(iter_band_packets(band, b"x", 995))


def test_keepalive() -> None:
    ka = encode_keepalive()
    assert ka == b"0005\x01"
    assert decode_pkt(ka) == (Pkt(PktKind.DATA, b"\x01"), 5)


# ------------------------------------------------------------------ fatal errors


def test_err_pkt_line() -> None:
    assert encode_err_pkt("upload-pack: not our ref 1111") == (
        b"0026ERR upload-pack: not our ref 1111\n")


def test_err_pkt_line_is_utf8_and_fits_one_packet() -> None:
    assert encode_err_pkt("caf\u00e9 \udcff") == b"0010ERR caf\xc3\xa9 ?\n"
    long = encode_err_pkt("x" * 100_000)
    pkts = list(iter_pkts(long))
    assert pkts == [Pkt(PktKind.DATA, b"ERR " + b"x" * MAX_ERROR_TEXT + b"\n")]


@pytest.mark.parametrize("large", [True, False])
def test_band_error_is_band_3_split_at_the_packet_size(large: bool) -> None:
    framed = encode_band_error("e" * 3000, max_band_payload(large))
    pkts = list(iter_pkts(framed))
    assert all(p.payload[:1] == bytes((BAND_ERROR,)) for p in pkts)
    assert b"".join(p.payload[1:] for p in pkts) == b"e" * 3000 + b"\n"
    assert len(pkts) == (1 if large else 4)


def test_sideband_all_payload_carries_the_band_byte() -> None:
    assert band_payload(BAND_DATA, b"packfile\n") == b"\x01packfile\n"
