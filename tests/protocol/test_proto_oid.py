"""protocol.oid: object ids are validated once, at parse time."""

from __future__ import annotations

import pytest
from gitspout.protocol.errors import ClientError
from gitspout.protocol.oid import HEX_LEN, ZERO_OID, is_oid, oid_hex, parse_oid, zero_oid

SHA1 = b"0123456789abcdef0123456789abcdef01234567"
SHA256 = b"0123456789abcdef" * 4


def test_hex_len_and_zero() -> None:
    assert HEX_LEN == {"sha1": 40, "sha256": 64}
    assert ZERO_OID == b"0" * 40 == zero_oid()
    assert zero_oid("sha256") == b"0" * 64


SHA1_ID = b"\x01\x23\x45\x67\x89\xab\xcd\xef" * 2 + b"\x01\x23\x45\x67"
SHA256_ID = b"\x01\x23\x45\x67\x89\xab\xcd\xef" * 4


def test_parse_oid_ok() -> None:
    # Validated and converted to binary once, here.
    assert len(SHA1_ID) == 20 and len(SHA256_ID) == 32
    assert parse_oid(SHA1) == SHA1_ID
    assert parse_oid(SHA256, 64) == SHA256_ID


def test_parse_oid_accepts_either_case() -> None:
    # C git's get_oid_hex accepts either case; both name the same binary id.
    assert parse_oid(SHA1.upper()) == SHA1_ID
    assert parse_oid(b"AbCdEf" + SHA1[6:]) == bytes.fromhex("abcdef" + SHA1[6:].decode())


def test_oid_hex_round_trip() -> None:
    assert oid_hex(parse_oid(SHA1)) == SHA1
    assert oid_hex(parse_oid(SHA1.upper())) == SHA1
    assert oid_hex(parse_oid(SHA256, 64)) == SHA256


@pytest.mark.parametrize(
    "value",
    [b"", SHA1[:-1], SHA1 + b"0", SHA1[:-1] + b"g", SHA1[:-1] + b" ", b" " + SHA1[1:],
     SHA1[:-1] + b"\n", SHA1[:-1] + b"\x00", SHA256, b"z" * 40, "é".encode() * 20,
     b"+" + SHA1[1:], b"-" + SHA1[1:], SHA1[:-2] + b"\t0", b"0x" + SHA1[2:], SHA1[:-1] + b"\xff"],
)
def test_parse_oid_refuses(value: bytes) -> None:
    with pytest.raises(ClientError) as info:
        parse_oid(value)
    assert info.value.http_status == 400
    assert "expected an object id" in info.value.message


def test_parse_oid_sha1_length_under_sha256() -> None:
    with pytest.raises(ClientError):
        parse_oid(SHA1, 64)


def test_parse_oid_message_is_bounded_and_printable() -> None:
    with pytest.raises(ClientError) as info:
        parse_oid(b"\xff" * 10_000)
    assert len(info.value.message) < 200
    info.value.message.encode("utf-8")


def test_is_oid() -> None:
    assert is_oid(SHA1)
    assert not is_oid(SHA1.upper())
    assert not is_oid(SHA1[:-1])
    assert is_oid(SHA256, 64) and not is_oid(SHA256)


def test_parse_oid_accepts_exactly_the_hex_digits() -> None:
    """Every byte value in every position: accepted iff it is 0-9, a-f or A-F (the rule
    before ids became binary), and then it is the digit's value."""
    digits = b"0123456789abcdefABCDEF"
    for pos in (0, 1, 38, 39):
        for byte in range(256):
            value = bytearray(SHA1)
            value[pos] = byte
            if byte in digits:
                assert parse_oid(bytes(value)) == bytes.fromhex(bytes(value).decode())
            else:
                with pytest.raises(ClientError):
                    parse_oid(bytes(value))
