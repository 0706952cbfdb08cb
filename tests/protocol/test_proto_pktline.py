"""protocol.pktline: framing, the incremental decoder, and PktBuffer chunking."""

from __future__ import annotations

import math

import pytest
from gitspout.protocol.errors import ClientError
from gitspout.protocol.pktline import (
    DEFAULT_CHUNK_SIZE,
    DELIM_PKT,
    FLUSH_PKT,
    MAX_PKT_LEN,
    MAX_PKT_PAYLOAD,
    MAX_REQUEST_PKTS,
    NEED_MORE,
    RESPONSE_END_PKT,
    Pkt,
    PktBuffer,
    PktKind,
    decode_pkt,
    encode_pkt,
    encode_text_pkt,
    iter_pkts,
)

# ------------------------------------------------------------------ encode


def test_constants() -> None:
    assert MAX_PKT_LEN == 65520 and MAX_PKT_PAYLOAD == 65516
    assert (FLUSH_PKT, DELIM_PKT, RESPONSE_END_PKT) == (b"0000", b"0001", b"0002")
    assert DEFAULT_CHUNK_SIZE == 32 * 1024


@pytest.mark.parametrize(
    ("payload", "framed"),
    [
        (b"a", b"0005a"),
        (b"a\n", b"0006a\n"),
        (b"hello\n", b"000ahello\n"),
        (b"\x00\xff", b"0006\x00\xff"),
        (b"x" * 12, b"0010" + b"x" * 12),  # lowercase hex length
    ],
)
def test_encode_pkt(payload: bytes, framed: bytes) -> None:
    assert encode_pkt(payload) == framed


def test_encode_text_pkt_adds_lf() -> None:
    assert encode_text_pkt(b"version 2") == b"000eversion 2\n"


def test_encode_pkt_largest_payload() -> None:
    framed = encode_pkt(b"x" * MAX_PKT_PAYLOAD)
    assert framed[:4] == b"fff0" and len(framed) == MAX_PKT_LEN


def test_encode_pkt_refuses_oversize_and_empty() -> None:
    with pytest.raises(ValueError):
        encode_pkt(b"x" * (MAX_PKT_PAYLOAD + 1))
    with pytest.raises(ValueError):
        encode_pkt(b"")  # never send 0004


# ------------------------------------------------------------------ decode


@pytest.mark.parametrize(
    ("raw", "kind"),
    [(b"0000", PktKind.FLUSH), (b"0001", PktKind.DELIM), (b"0002", PktKind.RESPONSE_END)],
)
def test_decode_special_packets_are_distinct(raw: bytes, kind: PktKind) -> None:
    res = decode_pkt(raw)
    assert res is not NEED_MORE
    pkt, used = res  # type: ignore[misc]
    assert pkt.kind is kind and pkt.payload == b"" and used == 4


def test_flush_delim_response_end_compare_unequal() -> None:
    pkts = [decode_pkt(x)[0] for x in (b"0000", b"0001", b"0002")]  # type: ignore[index]
    assert len(set(pkts)) == 3
    assert all(p.kind is not PktKind.DATA for p in pkts)


def test_decode_data() -> None:
    assert decode_pkt(b"0009hello") == (Pkt(PktKind.DATA, b"hello"), 9)


def test_decode_uppercase_hex_length() -> None:
    assert decode_pkt(b"000Ahello\n") == (Pkt(PktKind.DATA, b"hello\n"), 10)


def test_decode_0004_is_empty_data() -> None:
    """0004 must not be sent, but the decoder reports it as an empty data packet so the
    parsers can refuse it where C git does."""
    assert decode_pkt(b"0004") == (Pkt(PktKind.DATA, b""), 4)


@pytest.mark.parametrize("raw", [b"0003", b"0003abc"])
def test_decode_length_3_is_refused(raw: bytes) -> None:
    with pytest.raises(ClientError) as info:
        decode_pkt(raw)
    assert info.value.http_status == 400


@pytest.mark.parametrize(
    "raw",
    [b"00g1", b"zzzz", b" 001", b"+001", b"-001", b"0x10", b"\x00001", b"00\n0", b"\xff" * 4],
)
def test_decode_non_hex_length_is_refused(raw: bytes) -> None:
    with pytest.raises(ClientError):
        decode_pkt(raw + b"x" * 20)


@pytest.mark.parametrize("raw", [b"fff1", b"ffff", b"FFF1"])
def test_decode_length_over_65520_is_refused(raw: bytes) -> None:
    with pytest.raises(ClientError):
        decode_pkt(raw + b"x" * 70000)


def test_decode_length_65520_is_accepted() -> None:
    raw = b"fff0" + b"y" * MAX_PKT_PAYLOAD
    assert decode_pkt(raw) == (Pkt(PktKind.DATA, b"y" * MAX_PKT_PAYLOAD), MAX_PKT_LEN)


def test_oversize_length_is_refused_before_the_body_arrives() -> None:
    # A reader must not wait for 65535 bytes that can never be valid.
    with pytest.raises(ClientError):
        decode_pkt(b"ffff")


@pytest.mark.parametrize("raw", [b"", b"0", b"00", b"000", b"0009", b"0009hell"])
def test_decode_needs_more(raw: bytes) -> None:
    assert decode_pkt(raw) is NEED_MORE


def test_need_more_repr() -> None:
    assert repr(NEED_MORE) == "NEED_MORE"


def test_decode_at_position_and_trailing_bytes() -> None:
    buf = b"0006a\n0000trailing"
    pkt, used = decode_pkt(buf)  # type: ignore[misc]
    assert (pkt.payload, used) == (b"a\n", 6)
    pkt2, used2 = decode_pkt(buf, 6)  # type: ignore[misc]
    assert pkt2.kind is PktKind.FLUSH and used2 == 4
    with pytest.raises(ClientError):
        decode_pkt(buf, 10)  # "trai" is not a length


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_decode_accepts_buffer_types(wrap) -> None:
    pkt, used = decode_pkt(wrap(b"xx0007abc"), 2)  # type: ignore[misc]
    assert pkt == Pkt(PktKind.DATA, b"abc") and type(pkt.payload) is bytes and used == 7


def test_pkt_text_strips_one_lf() -> None:
    assert Pkt(PktKind.DATA, b"a\n\n").text == b"a\n"
    assert Pkt(PktKind.DATA, b"a").text == b"a"
    assert Pkt(PktKind.DATA, b"\n").text == b""


def test_pkt_is_frozen() -> None:
    with pytest.raises(AttributeError):
        Pkt(PktKind.DATA, b"a").payload = b"b"  # type: ignore[misc]


STREAM = (
    encode_pkt(b"command=fetch\n")
    + encode_pkt(b"agent=x\n")
    + DELIM_PKT
    + encode_pkt(b"want " + b"a" * 40 + b"\n")
    + encode_pkt(b"z" * 1000)
    + FLUSH_PKT
    + RESPONSE_END_PKT
)
STREAM_PKTS = [
    Pkt(PktKind.DATA, b"command=fetch\n"),
    Pkt(PktKind.DATA, b"agent=x\n"),
    Pkt(PktKind.DELIM),
    Pkt(PktKind.DATA, b"want " + b"a" * 40 + b"\n"),
    Pkt(PktKind.DATA, b"z" * 1000),
    Pkt(PktKind.FLUSH),
    Pkt(PktKind.RESPONSE_END),
]


def test_iter_pkts_whole() -> None:
    assert list(iter_pkts(STREAM)) == STREAM_PKTS
    assert list(iter_pkts(b"")) == []


def incremental(chunks: list[bytes]) -> list[Pkt]:
    """A reader that gets bytes in arbitrary pieces, as from a socket."""
    buf = bytearray()
    out = []
    for chunk in chunks:
        buf += chunk
        while True:
            res = decode_pkt(buf)
            if res is NEED_MORE:
                break
            pkt, used = res  # type: ignore[misc]
            out.append(pkt)
            del buf[:used]
    assert not buf
    return out


def test_decode_byte_by_byte() -> None:
    assert incremental([bytes([b]) for b in STREAM]) == STREAM_PKTS


def test_decode_byte_by_byte_reports_need_more_until_complete() -> None:
    one = encode_pkt(b"hello\n")
    for cut in range(len(one)):
        assert decode_pkt(one[:cut]) is NEED_MORE
    assert decode_pkt(one) == (Pkt(PktKind.DATA, b"hello\n"), len(one))


@pytest.mark.parametrize("size", [1, 3, 7, 64, 999])
def test_decode_in_chunks(size: int) -> None:
    chunks = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
    assert incremental(chunks) == STREAM_PKTS


@pytest.mark.parametrize("tail", [b"0", b"00", b"000", b"0009", b"0009abc"])
def test_iter_pkts_truncated_tail_is_client_error(tail: bytes) -> None:
    with pytest.raises(ClientError):
        list(iter_pkts(STREAM + tail))


@pytest.mark.parametrize("cut", [1, 5, 500, 1003])
def test_iter_pkts_cut_stream_is_client_error(cut: int) -> None:
    body = STREAM[: -(8 + cut)]  # inside the 1000-byte packet or its header
    with pytest.raises(ClientError):
        list(iter_pkts(body))


def test_iter_pkts_truncated_data() -> None:
    with pytest.raises(ClientError):
        list(iter_pkts(b"0000" + b"0010abc"))


def test_iter_pkts_trailing_garbage() -> None:
    it = iter_pkts(b"0006a\nxyzw")
    assert next(it) == Pkt(PktKind.DATA, b"a\n")
    with pytest.raises(ClientError):
        next(it)


# ------------------------------------------------------------------ PktBuffer


def test_pktbuffer_holds_until_chunk_size() -> None:
    buf = PktBuffer(chunk_size=20)
    assert buf.add(b"12345") is None  # 9 bytes
    assert len(buf) == 9
    assert buf.add_flush() is None  # 13
    assert buf.add_delim() is None  # 17
    chunk = buf.add(b"ab")  # 23 >= 20
    assert chunk == b"000912345" + b"0000" + b"0001" + b"0006ab"
    assert len(buf) == 0
    assert buf.take() == b""


def test_pktbuffer_add_raw_and_take() -> None:
    buf = PktBuffer()
    assert buf.add_raw(b"0005x") is None
    assert buf.take() == b"0005x"
    assert buf.take() == b""


def test_pktbuffer_default_chunk_is_at_least_32k() -> None:
    buf = PktBuffer()
    line = b"x" * 1000
    chunks = [c for c in (buf.add(line) for _ in range(100)) if c is not None]
    assert chunks and all(len(c) >= 32 * 1024 for c in chunks)
    # Never more than one line past the threshold.
    assert all(len(c) < 32 * 1024 + 1004 for c in chunks)


def test_pktbuffer_big_single_line_is_one_chunk() -> None:
    buf = PktBuffer()
    chunk = buf.add(b"y" * 60000)
    assert chunk is not None and len(chunk) == 60004


def test_pktbuffer_100k_refs_chunk_count() -> None:
    """The seed's lesson: a 100k-ref advertisement is ceil(bytes/32 KiB) writes, not 100k."""
    buf = PktBuffer()
    chunks: list[bytes] = []
    encoded: list[bytes] = []
    for i in range(100_000):
        payload = b"%040x refs/heads/branch-%06d\n" % (i * 7919, i)
        encoded.append(encode_pkt(payload))
        chunk = buf.add(payload)
        if chunk is not None:
            chunks.append(chunk)
    flushed = buf.add_flush()
    if flushed is not None:
        chunks.append(flushed)
    rest = buf.take()
    if rest:
        chunks.append(rest)
    total = sum(map(len, encoded)) + 4
    assert b"".join(chunks) == b"".join(encoded) + FLUSH_PKT
    assert len(chunks) <= math.ceil(total / DEFAULT_CHUNK_SIZE) + 1
    assert len(chunks) >= total // (DEFAULT_CHUNK_SIZE + 100)
    assert all(len(c) >= DEFAULT_CHUNK_SIZE for c in chunks[:-1])


# ------------------------------------------------------------------ pkt-line count


def test_iter_pkts_counts_exactly() -> None:
    body = b"0005a" * 3 + FLUSH_PKT
    assert len(list(iter_pkts(body, max_pkts=4))) == 4
    with pytest.raises(ClientError) as info:
        list(iter_pkts(body, max_pkts=3))
    assert info.value.http_status == 413
    assert info.value.message == "request has more than 3 pkt-lines"
    # Every kind counts, not only one-byte lines.
    with pytest.raises(ClientError):
        list(iter_pkts(FLUSH_PKT * 3 + DELIM_PKT + encode_pkt(b"x" * 100), max_pkts=4))


def test_request_parsers_cap_pkt_lines() -> None:
    """The cap is the parsers' (a 413 before anything acts on the request); what follows
    the end of the request is never decoded, so never counted."""
    from gitspout.protocol.capabilities import V2Features
    from gitspout.protocol.command import parse_command_request
    from gitspout.protocol.fetch_request import parse_v0_request

    assert MAX_REQUEST_PKTS == 1_000_000
    want = encode_pkt(b"want " + b"1" * 40 + b"\n")
    v0 = want + FLUSH_PKT + encode_pkt(b"have " + b"2" * 40 + b"\n") * 3 + FLUSH_PKT
    assert len(parse_v0_request(v0 + b"0005a" * 50, frozenset(), max_pkts=6).haves) == 3
    with pytest.raises(ClientError) as info:
        parse_v0_request(v0, frozenset(), max_pkts=5)
    assert info.value.http_status == 413
    v2 = encode_pkt(b"command=ls-refs\n") + DELIM_PKT + b"0005a" * 3 + FLUSH_PKT
    features = V2Features(agent=b"x")
    assert parse_command_request(v2 + b"0005a" * 50, features, max_pkts=6) is not None
    with pytest.raises(ClientError) as info:
        parse_command_request(v2, features, max_pkts=5)
    assert info.value.http_status == 413


@pytest.mark.parametrize("head", [b"+01f", b" 01f", b"0_1f", b"01f ", b"-001", b"0x1f",
                                  b"\xff001", b"0003", b"fff1", b"ffff"])
def test_iter_pkts_refuses_what_decode_pkt_refuses(head: bytes) -> None:
    """iter_pkts inlines decode_pkt's rules: a length int() would take but git would not
    ("+01f", " 01f", "0_1f"), 3 and anything over 65520 are the same errors in both."""
    body = b"0009done\n" + head + b"x" * 40
    with pytest.raises(ClientError):
        decode_pkt(body, 9)
    with pytest.raises(ClientError):
        list(iter_pkts(body))


def test_iter_pkts_equals_decode_pkt_loop() -> None:
    """Packet by packet the same as decode_pkt, specials and the empty data packet too."""
    body = STREAM + b"0004" + b"0001" + b"0002" + encode_pkt(b"x" * MAX_PKT_PAYLOAD) + b"0000"
    via_decode, pos = [], 0
    while pos < len(body):
        res = decode_pkt(body, pos)
        assert not isinstance(res, type(NEED_MORE))
        via_decode.append(res[0])
        pos += res[1]
    assert list(iter_pkts(body)) == via_decode
