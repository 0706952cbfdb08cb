"""protocol.object_info: the v2 ``object-info`` arguments and answer."""

from __future__ import annotations

import pytest
from gitspout.protocol.errors import ClientError
from gitspout.protocol.object_info import (
    MAX_OBJECT_INFO_OIDS,
    ObjectInfoRequest,
    iter_object_info,
    parse_object_info_args,
)

# Ids as the client writes them (hex), and as the parser hands them on (binary).
A = b"a" * 40
B = b"b" * 40
A_ID = b"\xaa" * 20
B_ID = b"\xbb" * 20


def test_parse() -> None:
    assert parse_object_info_args([b"size", b"oid " + A, b"oid " + B]) == ObjectInfoRequest(
        True, (A_ID, B_ID)
    )
    assert parse_object_info_args([]) == ObjectInfoRequest(False, ())
    assert parse_object_info_args([b"oid " + A.upper()]).oids == (A_ID,)


def test_parse_sha256() -> None:
    oid = b"c" * 64
    assert parse_object_info_args([b"oid " + oid], hex_len=64).oids == (b"\xcc" * 32,)
    with pytest.raises(ClientError):
        parse_object_info_args([b"oid " + A], hex_len=64)


@pytest.mark.parametrize("arg", [b"frobnicate", b"SIZE", b"size ", b"oid", b"", b"type"])
def test_parse_unexpected_line(arg: bytes) -> None:
    with pytest.raises(ClientError) as info:
        parse_object_info_args([arg])
    assert info.value.message == f"object-info: unexpected line: '{arg.decode()}'"


@pytest.mark.parametrize("arg", [b"oid 123", b"oid " + A + b"0", b"oid " + b"g" * 40])
def test_parse_bad_oid(arg: bytes) -> None:
    with pytest.raises(ClientError, match="expected an object id"):
        parse_object_info_args([arg])


def test_parse_too_many_oids() -> None:
    args = [b"oid " + A] * MAX_OBJECT_INFO_OIDS
    assert len(parse_object_info_args(args).oids) == MAX_OBJECT_INFO_OIDS
    with pytest.raises(ClientError, match="too many"):
        parse_object_info_args([*args, b"oid " + B])


def test_answer_with_size() -> None:
    req = ObjectInfoRequest(True, (A_ID, B_ID))
    assert list(iter_object_info(req, [(A_ID, 226), (B_ID, None)])) == [
        b"size", A + b" 226", B + b" "
    ]


def test_answer_without_size() -> None:
    req = ObjectInfoRequest(False, (A_ID, B_ID))
    assert list(iter_object_info(req, [(A_ID, 226), (B_ID, None)])) == [A, B]


def test_answer_zero_size() -> None:
    assert list(iter_object_info(ObjectInfoRequest(True, (A_ID,)), [(A_ID, 0)])) == [
        b"size", A + b" 0"]
