"""Regression tests for bugs and C git 2.39 divergences found by the fixture suite:
encodable error texts, object-info without ids, shallow lines without LF, one ACK per
distinct have, and bytes after the end of a request left undecoded."""

from __future__ import annotations

import pytest
from gitspout.protocol.capabilities import V2Features
from gitspout.protocol.command import parse_command_request
from gitspout.protocol.errors import ClientError
from gitspout.protocol.fetch_request import parse_v0_request, parse_v2_fetch_args
from gitspout.protocol.fetch_response import iter_shallow_lines
from gitspout.protocol.filters import parse_filter_spec
from gitspout.protocol.negotiate import negotiate_v2
from gitspout.protocol.object_info import iter_object_info, parse_object_info_args
from gitspout.protocol.pktline import FLUSH_PKT, encode_pkt
from protocol_testlib import GraphOracle, exchanges, split_pkts

EX = exchanges()
F = V2Features(agent=b"git/2.39.5")
W = b"1" * 40


# 1. A ClientError message must be encodable: it becomes an ERR pkt-line or an HTTP body
#    (server/http.py dispatch: web.Response(text=exc.message) raises UnicodeEncodeError on a
#    lone surrogate, so the client gets a 500 instead of a 400).
@pytest.mark.parametrize(
    "call",
    [
        lambda: parse_filter_spec(b"combine:blob%ff"),
        lambda: parse_filter_spec(b"combine:tree%3a%c3"),
        lambda: parse_v2_fetch_args([b"want " + W, b"filter combine:blob%ff"], F),
        lambda: parse_v0_request(
            encode_pkt(b"want " + W + b" filter\n") + encode_pkt(b"filter combine:x%80\n")
            + FLUSH_PKT + encode_pkt(b"done\n"),
            frozenset({b"filter"}),
        ),
    ],
)
def test_client_error_message_is_utf8(call) -> None:
    with pytest.raises(ClientError) as info:
        call()
    info.value.message.encode("utf-8")


# 2. object-info with "size" and no "oid": C git sends a bare flush
#    (protocol-caps.c send_info: "if (!oid_str_list->nr) return;"); we send "size".
def test_object_info_without_oids_matches_c_git() -> None:
    ex = EX["v2-object-info-no-oids"]
    cmd = parse_command_request(ex.request, F)
    req = parse_object_info_args(cmd.args)
    body = b"".join(encode_pkt(p) for p in iter_object_info(req, [])) + FLUSH_PKT
    assert body == ex.response == FLUSH_PKT


# 3. shallow/unshallow lines: C git writes "shallow %s" without LF (upload-pack.c
#    send_shallow/send_unshallow, v0 and v2 shallow-info alike).
def test_shallow_lines_byte_exact() -> None:
    ex = EX["v0-deepen-2-two-wants"]
    c_lines = split_pkts(ex.response)[:-1]
    shallow = [bytes.fromhex(line.removeprefix(b"shallow ").decode()) for line in c_lines]
    assert list(iter_shallow_lines(shallow, [])) == c_lines


# 4. v2 acknowledgments: C git 2.39 sends one ACK per have line, repeats included (since
#    2.45, fae9627470, one per distinct object, as its have_obj list holds each once).
#    negotiate_v2 ACKs each distinct common have once (600k copies of one have cost 29 MB
#    of ACKs otherwise): C git 2.39's answer with its repeated lines dropped.
def test_v2_duplicate_have_acked_once() -> None:
    ex = EX["v2-fetch-duplicate-have"]
    cmd = parse_command_request(ex.request, F)
    req = parse_v2_fetch_args(cmd.args, F)
    answer = negotiate_v2(req, GraphOracle(req.wants))
    assert answer is not None and answer.ack_lines is not None
    c_lines = split_pkts(ex.response)[:-1]
    assert len(c_lines) == 3  # acknowledgments, then the same ACK twice
    assert list(answer.ack_lines) == list(dict.fromkeys(c_lines))


# 5. Bytes after the request's end: C git stops reading at the closing flush (v2) or at
#    "done" (v0) and never looks at the rest; we parse the whole body first, so trailing
#    bytes that are not pkt-lines fail the request (command.py's docstring says they are
#    ignored).
def test_v2_trailing_bytes_after_flush_are_ignored() -> None:
    req = parse_command_request(b"0014command=ls-refs\n0000garbage", F)
    assert req is not None and req.command == b"ls-refs"


def test_v0_trailing_bytes_after_done_are_ignored() -> None:
    body = encode_pkt(b"want " + W + b"\n") + FLUSH_PKT + encode_pkt(b"done\n") + b"xyz"
    assert parse_v0_request(body, frozenset()).done
