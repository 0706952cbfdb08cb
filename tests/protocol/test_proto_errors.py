"""protocol.errors: the client-fault types (docs/ARCHITECTURE.md "Errors")."""

from __future__ import annotations

from gitspout.protocol.errors import ClientError, ProtocolError, Refusal


def test_refusal_is_a_client_error_answered_with_200() -> None:
    exc = Refusal("upload-pack: not our ref 1111")
    assert isinstance(exc, ClientError) and isinstance(exc, ProtocolError)
    assert exc.http_status == 200
    assert exc.message == "upload-pack: not our ref 1111"
    assert repr(exc) == "Refusal('upload-pack: not our ref 1111')"


def test_client_error_defaults_to_400_and_keeps_utf8() -> None:
    exc = ClientError("bad \udcff line")
    assert exc.http_status == 400
    assert exc.message == "bad ? line"
    assert repr(exc) == "ClientError('bad ? line', http_status=400)"
