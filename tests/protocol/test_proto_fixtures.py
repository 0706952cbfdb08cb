"""protocol/ against byte-exact exchanges recorded from C git 2.39.5 (tests/fixtures/).

Only the agent string is substituted: C git says ``agent=git/2.39.5``; our formatters take
the agent as an argument, so the recorded value is passed in. Where C git advertises a
capability only when configured, the fixture was recorded with that config (see
``manifest.json``) and the same switches are passed to our formatters.
"""

from __future__ import annotations

import pytest
from gitspout.protocol.advertise import (
    format_service_header,
    format_v0_capabilities,
    iter_v0_advertisement,
)
from gitspout.protocol.capabilities import V2Features, iter_v2_capabilities
from gitspout.protocol.command import parse_command_request
from gitspout.protocol.errors import ClientError
from gitspout.protocol.fetch_request import (
    HavesEnd,
    Sideband,
    parse_v0_request,
    parse_v2_fetch_args,
)
from gitspout.protocol.fetch_response import (
    Mark,
    iter_shallow_lines,
    iter_v0_fetch_response,
    iter_v2_fetch_response,
)
from gitspout.protocol.ls_refs import LsRefsRequest, iter_ls_refs, parse_ls_refs_args
from gitspout.protocol.negotiate import negotiate_v0, negotiate_v2
from gitspout.protocol.object_info import iter_object_info, parse_object_info_args
from gitspout.protocol.oid import zero_oid
from gitspout.protocol.pktline import DELIM_PKT, FLUSH_PKT, encode_pkt
from protocol_testlib import (
    SERVER_AGENT,
    Exchange,
    GraphOracle,
    exchanges,
    facts,
    head_and_refs,
    label,
    names_of,
    recorded_agent,
    split_pkts,
)

EX = exchanges()


def frame(payloads) -> bytes:
    return b"".join(encode_pkt(p) for p in payloads)


def frame_response(items) -> tuple[bytes, bool]:
    """The bytes of a fetch response up to its pack, and whether a pack comes there."""
    out = []
    for item in items:
        if item is Mark.PACK:
            return b"".join(out), True
        out.append(FLUSH_PKT if item is Mark.FLUSH else DELIM_PKT if item is Mark.DELIM
                   else encode_pkt(item))
    return b"".join(out), False


def v0_caps(ex: Exchange, head_target: bytes | None) -> bytes:
    return format_v0_capabilities(
        object_format=b"sha1",
        agent=recorded_agent(ex.response) if b"agent=" in ex.response else SERVER_AGENT,
        head_target=head_target,
        allow_tip_sha1=ex.config_bool("uploadpack.allowTipSHA1InWant"),
        allow_reachable_sha1=ex.config_bool("uploadpack.allowReachableSHA1InWant"),
        no_done=True,  # upload-pack --advertise-refs always sets no_done
        allow_filter=ex.config_bool("uploadpack.allowFilter"),
    )


def v2_features(ex: Exchange, agent: bytes = SERVER_AGENT) -> V2Features:
    return V2Features(
        agent=agent,
        allow_filter=ex.config_bool("uploadpack.allowFilter"),
        allow_ref_in_want=ex.config_bool("uploadpack.allowRefInWant"),
        allow_sideband_all=ex.config_bool("uploadpack.allowSidebandAll"),
        advertise_unborn=ex.config_value("lsrefs.unborn") != "ignore",
    )


def test_fixtures_are_present_and_complete() -> None:
    kinds = {e.kind for e in EX.values()}
    assert kinds == {
        "v0-advertisement", "http-info-refs", "v2-capabilities", "v2-ls-refs",
        "v0-negotiation", "v2-fetch", "v2-object-info", "error",
    }
    for e in EX.values():
        assert (e.exit_code == 0) == (e.kind != "error"), e.name
    assert facts()["head"]["target"] == "refs/heads/main"


# ------------------------------------------------------------------ advertisements


def v0_advertisement_body(ex: Exchange) -> bytes:
    head, refs = head_and_refs(ex.repo)
    target = head.target if head.oid is not None else None
    version = 1 if ex.git_protocol == "version=1" else 0
    payloads = iter_v0_advertisement(head, refs, v0_caps(ex, target), zero_oid(), version)
    return frame(payloads) + FLUSH_PKT


@pytest.mark.parametrize(
    "name", ["v0-adv-default", "v0-adv-gitspout", "v0-adv-tip-reachable", "v1-adv-gitspout"]
)
def test_v0_advertisement_matches_c_git(name: str) -> None:
    ex = EX[name]
    assert v0_advertisement_body(ex) == ex.response


def test_http_info_refs_v0_matches_http_backend() -> None:
    ex = EX["http-info-refs-v0"]
    preamble = encode_pkt(format_service_header(b"git-upload-pack")) + FLUSH_PKT
    assert preamble == b"001e# service=git-upload-pack\n0000"
    assert preamble + v0_advertisement_body(ex) == ex.response


def test_http_info_refs_v2_has_no_service_preamble() -> None:
    ex = EX["http-info-refs-v2"]
    assert frame(iter_v2_capabilities(v2_features(ex, recorded_agent(ex.response)))) + (
        FLUSH_PKT
    ) == ex.response


def test_empty_repository_advertisement_differs_from_239_on_purpose() -> None:
    """git 2.39 sends only a flush for an empty repository; newer git (2.41, "upload-pack:
    advertise capabilities when cloning empty repos") and ARCHITECTURE.md P2 send
    ``<zero-oid> capabilities^{}\\0<caps>``, which lets the client learn object-format.
    Any git client accepts both."""
    ex = EX["v0-adv-empty"]
    assert ex.response == FLUSH_PKT
    head, refs = head_and_refs("empty")
    assert head.oid is None and refs == []
    caps = v0_caps(ex, None)
    got = frame(iter_v0_advertisement(head, refs, caps, zero_oid())) + FLUSH_PKT
    assert got == encode_pkt(b"0" * 40 + b" capabilities^{}\0" + caps + b"\n") + FLUSH_PKT
    assert b"symref=" not in caps


@pytest.mark.parametrize("name", names_of("v2-capabilities"))
def test_v2_capabilities_match_c_git(name: str) -> None:
    ex = EX[name]
    got = frame(iter_v2_capabilities(v2_features(ex, recorded_agent(ex.response))))
    assert got + FLUSH_PKT == ex.response


# ------------------------------------------------------------------ ls-refs


@pytest.mark.parametrize("name", names_of("v2-ls-refs"))
def test_ls_refs_matches_c_git(name: str) -> None:
    ex = EX[name]
    assert ex.request is not None
    features = v2_features(ex)
    cmd = parse_command_request(ex.request, features)
    assert cmd is not None and cmd.command == b"ls-refs"
    req = parse_ls_refs_args(cmd.args)
    if not features.advertise_unborn:
        # server/core/answers.py: lsrefs.unborn=ignore drops the argument (ls-refs.c does too).
        req = LsRefsRequest(req.peel, req.symrefs, False, req.prefixes)
    head, refs = head_and_refs(ex.repo)
    assert frame(iter_ls_refs(req, head, refs)) + FLUSH_PKT == ex.response


# ------------------------------------------------------------------ v0 negotiation


def advertised_names(ex: Exchange) -> frozenset[bytes]:
    caps = v0_caps(ex, b"refs/heads/main")
    return frozenset(c.partition(b"=")[0] for c in caps.split(b" "))


def _rejoin(pkts: list[bytes]) -> bytes:
    """Re-frame what :func:`split_pkts` split (special packets are kept as their 4 bytes)."""
    return b"".join(p if p in (FLUSH_PKT, DELIM_PKT) else encode_pkt(p) for p in pkts)


def take_shallow_section(pkts: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """The binary oids of the leading ``shallow`` lines (and drop their flush)."""
    oids = []
    while pkts and pkts[0].startswith(b"shallow "):
        oids.append(bytes.fromhex(pkts.pop(0)[8:48].decode()))
    assert pkts and pkts.pop(0) == FLUSH_PKT
    return oids, pkts


@pytest.mark.parametrize("name", names_of("v0-negotiation"))
def test_v0_negotiation_matches_c_git(name: str) -> None:
    ex = EX[name]
    assert ex.request is not None
    req = parse_v0_request(ex.request, advertised_names(ex))
    oracle = GraphOracle(req.wants)
    answer = negotiate_v0(req, oracle)
    response = ex.response
    shallow: list[bytes] = []
    if req.deepen:
        # The shallow list is the server's (graph/shallow.py) to compute; here we check
        # the section's framing and order: its lines, their flush, then the negotiation.
        shallow, _ = take_shallow_section(split_pkts(response))
    expected, pack = frame_response(iter_v0_fetch_response(
        answer, shallow=shallow, deepen=req.deepen, sideband=req.sideband is not Sideband.NONE))
    assert pack == answer.send_pack
    assert response[: len(expected)] == expected
    rest = response[len(expected) :]
    if pack:
        assert rest[4:9] == b"\x01PACK", "the pack (band 1) must follow the ACK/NAK lines"
    else:
        assert rest == b""


def test_v0_deepen_only_round_has_no_haves_section() -> None:
    ex = EX["v0-deepen-only"]
    assert ex.request is not None
    req = parse_v0_request(ex.request, advertised_names(ex))
    assert req.depth == 1 and req.haves_end is HavesEnd.NONE
    assert negotiate_v0(req, GraphOracle(req.wants)).lines == ()
    assert ex.response == encode_pkt(b"shallow " + label("E")) + FLUSH_PKT


def test_shallow_lines_match_c_git() -> None:
    """upload-pack.c send_shallow() writes ``shallow %s`` without LF (v0 and v2 alike)."""
    ex = EX["v0-deepen-2-two-wants"]
    c_lines = split_pkts(ex.response)[:-1]
    shallow = [bytes.fromhex(line.removeprefix(b"shallow ").decode()) for line in c_lines]
    assert list(iter_shallow_lines(shallow, [])) == c_lines


def test_v0_probe_flush_is_an_empty_request() -> None:
    ex = EX["v0-probe-flush"]
    assert ex.request == FLUSH_PKT and ex.response == b""
    req = parse_v0_request(ex.request, advertised_names(ex))
    assert req.wants == () and req.haves_end is HavesEnd.NONE
    answer = negotiate_v0(req, GraphOracle(()))
    assert answer.lines == () and not answer.send_pack


# ------------------------------------------------------------------ v2 fetch

# Where our bytes differ from C git 2.39 on purpose or by a reported bug: name -> reason.
V2_FETCH_DIVERGENCES = {
    "v2-fetch-duplicate-have": "C git 2.39 ACKs a repeated have once per line; negotiate_v2 "
    "ACKs each distinct have once, as C git 2.45+ does (test_proto_c_git_parity).",
}


def v2_fetch_expected(ex: Exchange) -> tuple[bytes, bool]:
    assert ex.request is not None
    features = v2_features(ex)
    cmd = parse_command_request(ex.request, features)
    assert cmd is not None and cmd.command == b"fetch"
    req = parse_v2_fetch_args(cmd.args, features)
    answer = negotiate_v2(req, GraphOracle(req.wants))
    return frame_response(iter_v2_fetch_response(answer))


@pytest.mark.parametrize(
    "name", [n for n in names_of("v2-fetch") if n not in V2_FETCH_DIVERGENCES]
)
def test_v2_fetch_acknowledgments_match_c_git(name: str) -> None:
    ex = EX[name]
    expected, send_pack = v2_fetch_expected(ex)
    assert ex.response[: len(expected)] == expected
    rest = ex.response[len(expected) :]
    if send_pack:
        assert expected.endswith(encode_pkt(b"packfile\n"))
        assert rest[4:9] == b"\x01PACK", "the pack (band 1) must follow the packfile line"
    else:
        assert rest == b""


def test_v2_fetch_duplicate_have_acks_each_distinct_have_once() -> None:
    ex = EX["v2-fetch-duplicate-have"]
    expected, send_pack = v2_fetch_expected(ex)
    assert not send_pack
    assert split_pkts(ex.response).count(b"ACK " + label("C") + b"\n") == 2
    assert split_pkts(expected).count(b"ACK " + label("C") + b"\n") == 1


def test_v2_fetch_done_leaves_out_acknowledgments() -> None:
    ex = EX["v2-fetch-done"]
    assert split_pkts(ex.response)[0] == b"packfile\n"
    assert v2_fetch_expected(ex) == (encode_pkt(b"packfile\n"), True)


# ------------------------------------------------------------------ object-info

# git 2.39 answers a request with ``size`` and no ``oid`` with a bare flush
# (protocol-caps.c send_info: "if (!oid_str_list->nr) return;"); iter_object_info still
# yields "size". Reported; the byte-exact test lives in pending_bugs.py until it is fixed.
# (object-info without "size" is not recorded: 2.39 reads an uninitialised flag there.)
OBJECT_INFO_DIVERGENCES = {"v2-object-info-no-oids"}


@pytest.mark.parametrize(
    "name", [n for n in names_of("v2-object-info") if n not in OBJECT_INFO_DIVERGENCES]
)
def test_object_info_matches_c_git(name: str) -> None:
    ex = EX[name]
    assert ex.request is not None
    cmd = parse_command_request(ex.request, v2_features(ex))
    assert cmd is not None and cmd.command == b"object-info"
    req = parse_object_info_args(cmd.args)
    objects = facts()["objects"]
    sizes = [
        (oid, objects[oid.hex()]["size"] if oid.hex() in objects else None)
        for oid in req.oids
    ]
    assert frame(iter_object_info(req, sizes)) + FLUSH_PKT == ex.response


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("name", names_of("error"))
def test_error_messages_match_c_git(name: str) -> None:
    """C git dies with a message on stderr; our ClientError carries the same text."""
    ex = EX[name]
    assert ex.request is not None and ex.stderr is not None
    c_message = ex.stderr.decode().strip().removeprefix("fatal: ")
    features = v2_features(ex)
    with pytest.raises(ClientError) as info:
        if ex.git_protocol == "version=2":
            cmd = parse_command_request(ex.request, features)
            assert cmd is not None
            if cmd.command == b"ls-refs":
                parse_ls_refs_args(cmd.args)
            elif cmd.command == b"fetch":
                parse_v2_fetch_args(cmd.args, features)
        else:
            parse_v0_request(ex.request, advertised_names(ex))
    assert info.value.message == c_message
    assert info.value.http_status == 400
