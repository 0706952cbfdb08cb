"""protocol.oid: object ids are validated once, at parse time."""

from __future__ import annotations

import pytest
from gitspout.protocol.errors import ClientError
from gitspout.protocol.oid import HEX_LEN, ZERO_OID, is_oid, parse_oid, zero_oid

SHA1 = b"0123456789abcdef0123456789abcdef01234567"
SHA256 = b"0123456789abcdef" * 4


def test_hex_len_and_zero() -> None:
    assert HEX_LEN == {"sha1": 40, "sha256": 64}
    assert ZERO_OID == b"0" * 40 == zero_oid()
    assert zero_oid("sha256") == b"0" * 64


def test_parse_oid_ok() -> None:
    assert parse_oid(SHA1) == SHA1
    assert parse_oid(SHA256, 64) == SHA256


def test_parse_oid_lowercases() -> None:
    # C git's get_oid_hex accepts either case; ids are carried in lowercase from then on.
    assert parse_oid(SHA1.upper()) == SHA1


@pytest.mark.parametrize(
    "value",
    [b"", SHA1[:-1], SHA1 + b"0", SHA1[:-1] + b"g", SHA1[:-1] + b" ", b" " + SHA1[1:],
     SHA1[:-1] + b"\n", SHA1[:-1] + b"\x00", SHA256, b"z" * 40, "é".encode() * 20],
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
