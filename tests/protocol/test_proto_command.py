"""protocol.command: the v2 command request (capabilities, delim, arguments, flush)."""

from __future__ import annotations

import pytest
from gitspout.protocol.capabilities import V2Features
from gitspout.protocol.command import KNOWN_COMMANDS, CommandRequest, parse_command_request
from gitspout.protocol.errors import ClientError
from gitspout.protocol.pktline import DELIM_PKT, FLUSH_PKT, RESPONSE_END_PKT, Pkt, PktKind, encode_pkt

F = V2Features(agent=b"gitspout/test")
F256 = V2Features(agent=b"gitspout/test", object_format=b"sha256")
FSID = V2Features(agent=b"gitspout/test", session_id=b"srv-1")


def body(*items: bytes | str) -> bytes:
    """str items are text pkt-lines (LF added), bytes are passed through."""
    return b"".join(i if isinstance(i, bytes) else encode_pkt(i.encode() + b"\n") for i in items)


def test_known_commands() -> None:
    assert KNOWN_COMMANDS == {b"ls-refs", b"fetch", b"object-info", b"bundle-uri"}


def test_full_request() -> None:
    req = parse_command_request(
        body("command=ls-refs", "agent=git/2.39.5", "object-format=sha1", "server-option=a",
             "server-option=b=c", DELIM_PKT, "peel", "ref-prefix refs/heads/", FLUSH_PKT),
        F,
    )
    assert req == CommandRequest(
        command=b"ls-refs",
        agent=b"git/2.39.5",
        object_format=b"sha1",
        session_id=None,
        server_options=(b"a", b"b=c"),
        args=(b"peel", b"ref-prefix refs/heads/"),
    )


def test_lone_flush_is_an_empty_request() -> None:
    assert parse_command_request(FLUSH_PKT, F) is None


def test_empty_body_is_refused() -> None:
    with pytest.raises(ClientError, match="empty request"):
        parse_command_request(b"", F)


def test_flush_right_after_capabilities_means_no_args() -> None:
    req = parse_command_request(body("command=fetch", FLUSH_PKT), F)
    assert req is not None and req.command == b"fetch" and req.args == ()


def test_delim_then_flush_means_no_args() -> None:
    req = parse_command_request(body("command=object-info", DELIM_PKT, FLUSH_PKT), F)
    assert req is not None and req.args == ()


def test_lf_is_optional() -> None:
    raw = encode_pkt(b"command=ls-refs") + DELIM_PKT + encode_pkt(b"peel") + FLUSH_PKT
    req = parse_command_request(raw, F)
    assert req is not None and req.command == b"ls-refs" and req.args == (b"peel",)


def test_accepts_pkt_iterable() -> None:
    pkts = [Pkt(PktKind.DATA, b"command=fetch\n"), Pkt(PktKind.DELIM),
            Pkt(PktKind.DATA, b"done\n"), Pkt(PktKind.FLUSH)]
    req = parse_command_request(iter(pkts), F)
    assert req is not None and req.args == (b"done",)


def test_packets_after_the_closing_flush_are_ignored() -> None:
    req = parse_command_request(
        body("command=ls-refs", DELIM_PKT, "peel", FLUSH_PKT, "command=fetch", FLUSH_PKT), F
    )
    assert req is not None and req.command == b"ls-refs" and req.args == (b"peel",)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (body("command=ls-refs", "frobnicate", DELIM_PKT, FLUSH_PKT),
         "unknown capability 'frobnicate'"),
        (body("command=ls-refs", "agent", DELIM_PKT, FLUSH_PKT), "unknown capability 'agent'"),
        (body("command", DELIM_PKT, FLUSH_PKT), "unknown capability 'command'"),
        (body("command=frobnicate", DELIM_PKT, FLUSH_PKT), "invalid command 'frobnicate'"),
        (body("command=", DELIM_PKT, FLUSH_PKT), "invalid command ''"),
        (body("command=LS-REFS", DELIM_PKT, FLUSH_PKT), "invalid command 'LS-REFS'"),
        (body("agent=x", DELIM_PKT, FLUSH_PKT), "no command requested"),
        (body(DELIM_PKT, FLUSH_PKT), "no command requested"),
        (body("command=ls-refs", "command=fetch", DELIM_PKT, FLUSH_PKT),
         "protocol error: command requested more than once"),
        (body("command=ls-refs", "object-format=sha256", DELIM_PKT, FLUSH_PKT),
         "mismatched object format: server sha1; client sha256"),
        (body("command=ls-refs", "session-id=abc", DELIM_PKT, FLUSH_PKT),
         "unknown capability 'session-id=abc'"),
    ],
)
def test_refusals(raw: bytes, message: str) -> None:
    with pytest.raises(ClientError) as info:
        parse_command_request(raw, F)
    assert info.value.message == message
    assert info.value.http_status == 400


def test_object_format_sha256_server() -> None:
    ok = parse_command_request(body("command=fetch", "object-format=sha256", FLUSH_PKT), F256)
    assert ok is not None and ok.object_format == b"sha256"
    # serve.c: a client that names no object format means SHA-1.
    with pytest.raises(ClientError, match="server sha256; client sha1"):
        parse_command_request(body("command=fetch", FLUSH_PKT), F256)
    with pytest.raises(ClientError, match="mismatched object format"):
        parse_command_request(body("command=fetch", "object-format=sha1", FLUSH_PKT), F256)


def test_session_id_only_when_advertised() -> None:
    req = parse_command_request(body("command=fetch", "session-id=c-1", FLUSH_PKT), FSID)
    assert req is not None and req.session_id == b"c-1"


def test_empty_data_packet_in_capabilities_is_refused() -> None:
    with pytest.raises(ClientError, match="unknown capability ''"):
        parse_command_request(b"0004" + body("command=fetch", FLUSH_PKT), F)


def test_empty_data_packet_in_args_is_an_empty_arg() -> None:
    req = parse_command_request(body("command=fetch", DELIM_PKT) + b"0004" + FLUSH_PKT, F)
    assert req is not None and req.args == (b"",)


@pytest.mark.parametrize(
    "raw",
    [
        body("command=ls-refs"),  # no flush at all
        body("command=ls-refs", DELIM_PKT),  # no flush after the args
        body("command=ls-refs", DELIM_PKT, "peel"),
        body("command=ls-refs", DELIM_PKT, "peel", DELIM_PKT, FLUSH_PKT),  # second delim
        body("command=ls-refs", DELIM_PKT, RESPONSE_END_PKT),
        body("command=ls-refs", RESPONSE_END_PKT, FLUSH_PKT),
        body("command=ls-refs", DELIM_PKT, "peel") + b"00",  # truncated
        body("command=ls-refs", DELIM_PKT, "peel") + b"0009pe",
        b"zzzz",
    ],
)
def test_malformed_framing(raw: bytes) -> None:
    with pytest.raises(ClientError):
        parse_command_request(raw, F)


def test_max_args() -> None:
    raw = body("command=fetch", DELIM_PKT, *(["done"] * 5), FLUSH_PKT)
    req = parse_command_request(raw, F, max_args=5)
    assert req is not None and len(req.args) == 5
    with pytest.raises(ClientError, match="too many arguments"):
        parse_command_request(raw, F, max_args=4)


def test_too_many_capability_lines() -> None:
    ok = body("command=fetch", *(["server-option=x"] * 1023), FLUSH_PKT)
    assert parse_command_request(ok, F) is not None
    bad = body("command=fetch", *(["server-option=x"] * 1024), FLUSH_PKT)
    with pytest.raises(ClientError, match="too many capability lines"):
        parse_command_request(bad, F)


def test_error_text_is_bounded() -> None:
    with pytest.raises(ClientError) as info:
        parse_command_request(body("x" * 60000, FLUSH_PKT), F)
    assert len(info.value.message) < 200
