"""protocol.fetch_request: the v0/v1 upload request and the v2 fetch arguments."""

from __future__ import annotations

import pytest
from gitspout.protocol.capabilities import V2Features
from gitspout.protocol.errors import ClientError
from gitspout.protocol.fetch_request import (
    INFINITE_DEPTH,
    MAX_DEEPEN_NOT,
    MAX_SHALLOWS,
    MAX_WANTS,
    FetchRequest,
    HavesEnd,
    MultiAck,
    Sideband,
    parse_v0_request,
    parse_v2_fetch_args,
)
from gitspout.protocol.filters import BlobLimit, BlobNone, Combine, TreeDepth
from gitspout.protocol.pktline import DELIM_PKT, FLUSH_PKT, RESPONSE_END_PKT, Pkt, PktKind, encode_pkt

# Ids as the client writes them (hex), and as the parser hands them on (binary).
W1 = b"1" * 40
W2 = b"2" * 40
H1 = b"a" * 40
H2 = b"b" * 40
S1 = b"5" * 40
W1_ID = b"\x11" * 20
W2_ID = b"\x22" * 20
H1_ID = b"\xaa" * 20
H2_ID = b"\xbb" * 20
S1_ID = b"\x55" * 20

ADVERTISED = frozenset(
    b"multi_ack thin-pack side-band side-band-64k ofs-delta shallow deepen-since deepen-not "
    b"deepen-relative no-progress include-tag multi_ack_detailed allow-reachable-sha1-in-want "
    b"no-done symref filter object-format agent session-id".split()
)


def body(*items: bytes | str) -> bytes:
    return b"".join(i if isinstance(i, bytes) else encode_pkt(i.encode() + b"\n") for i in items)


def v0(*items: bytes | str, advertised: frozenset[bytes] = ADVERTISED) -> FetchRequest:
    return parse_v0_request(body(*items), advertised)


def w(oid: bytes, caps: str = "") -> str:
    return f"want {oid.decode()}" + (f" {caps}" if caps else "")


def h(oid: bytes) -> str:
    return f"have {oid.decode()}"


# ------------------------------------------------------------------ v0: wants and caps


def test_v0_minimal() -> None:
    req = v0(w(W1), FLUSH_PKT, "done")
    assert req == FetchRequest(
        version=0, wants=(W1_ID,), sideband=Sideband.NONE, haves_end=HavesEnd.DONE, done=True
    )


def test_v0_every_capability() -> None:
    caps = ("multi_ack_detailed side-band-64k thin-pack ofs-delta no-progress include-tag "
            "deepen-relative no-done agent=git/2.39.5 session-id=s1 object-format=sha1")
    req = v0(w(W1, caps), w(W2), FLUSH_PKT, h(H1), FLUSH_PKT)
    assert req.wants == (W1_ID, W2_ID) and req.haves == (H1_ID,)
    assert req.multi_ack is MultiAck.DETAILED and req.sideband is Sideband.LARGE
    assert req.thin_pack and req.ofs_delta and req.no_progress and req.include_tag
    assert req.deepen_relative and req.no_done
    assert req.agent == b"git/2.39.5" and req.session_id == b"s1"
    assert req.haves_end is HavesEnd.FLUSH and not req.done
    assert req.version == 0


def test_v0_defaults_without_capabilities() -> None:
    req = v0(w(W1), FLUSH_PKT, "done")
    assert req.multi_ack is MultiAck.NONE and req.sideband is Sideband.NONE
    assert not (req.thin_pack or req.ofs_delta or req.no_progress or req.include_tag)
    assert not (req.no_done or req.deepen_relative) and req.agent is None


@pytest.mark.parametrize(
    ("caps", "level"),
    [
        ("multi_ack", MultiAck.MULTI_ACK),
        ("multi_ack_detailed", MultiAck.DETAILED),
        ("multi_ack multi_ack_detailed", MultiAck.DETAILED),
        ("", MultiAck.NONE),
    ],
)
def test_v0_multi_ack_levels(caps: str, level: MultiAck) -> None:
    assert v0(w(W1, caps), FLUSH_PKT, "done").multi_ack is level


@pytest.mark.parametrize(
    ("caps", "band"),
    [("side-band", Sideband.SMALL), ("side-band-64k", Sideband.LARGE), ("", Sideband.NONE)],
)
def test_v0_sideband_levels(caps: str, band: Sideband) -> None:
    assert v0(w(W1, caps), FLUSH_PKT, "done").sideband is band


def test_v0_side_band_and_side_band_64k_exclude_each_other() -> None:
    with pytest.raises(ClientError, match="exclude each other"):
        v0(w(W1, "side-band side-band-64k"), FLUSH_PKT, "done")


def test_v0_capabilities_on_later_want_lines_count_too() -> None:
    req = v0(w(W1, "ofs-delta"), w(W2, "side-band-64k"), FLUSH_PKT, "done")
    assert req.ofs_delta and req.sideband is Sideband.LARGE


@pytest.mark.parametrize("cap", ["frobnicate", "allow-tip-sha1-in-want", "filter=x", "Ofs-Delta"])
def test_v0_capability_not_advertised_is_refused(cap: str) -> None:
    adv = ADVERTISED - {b"allow-tip-sha1-in-want"}
    with pytest.raises(ClientError, match="was not advertised"):
        v0(w(W1, cap), FLUSH_PKT, "done", advertised=adv - {b"filter"})


def test_v0_capability_refused_when_left_out_of_the_advertisement() -> None:
    with pytest.raises(ClientError, match="'no-done' was not advertised"):
        v0(w(W1, "no-done"), FLUSH_PKT, "done", advertised=ADVERTISED - {b"no-done"})


def test_v0_object_format() -> None:
    assert v0(w(W1, "object-format=sha1"), FLUSH_PKT, "done").wants == (W1_ID,)
    with pytest.raises(ClientError, match="mismatched object format"):
        v0(w(W1, "object-format=sha256"), FLUSH_PKT, "done")


def test_v0_sha256() -> None:
    oid = b"c" * 64
    raw = body(f"want {oid.decode()} object-format=sha256", FLUSH_PKT, f"have {oid.decode()}",
               "done")
    req = parse_v0_request(raw, ADVERTISED, object_format=b"sha256", hex_len=64)
    assert req.wants == (b"\xcc" * 32,) and req.haves == (b"\xcc" * 32,)
    with pytest.raises(ClientError):
        parse_v0_request(body(w(W1), FLUSH_PKT, "done"), ADVERTISED, b"sha256", 64)


def test_v0_duplicate_wants_are_merged_in_order() -> None:
    assert v0(w(W2), w(W1), w(W2), FLUSH_PKT, "done").wants == (W2_ID, W1_ID)


def test_v0_want_ids_accept_either_case() -> None:
    # C git's get_oid_hex accepts either case; both name the same binary id.
    assert v0(w(b"A" * 40), FLUSH_PKT, "done").wants == (b"\xaa" * 20,)
    assert v0(w(b"A" * 40), w(b"a" * 40), FLUSH_PKT, "done").wants == (b"\xaa" * 20,)


@pytest.mark.parametrize(
    "line",
    ["want", "want ", "want 123", f"want {'g' * 40}", f"want  {W1.decode()}",
     f"WANT {W1.decode()}", f"{W1.decode()}"],
)
def test_v0_bad_want(line: str) -> None:
    with pytest.raises(ClientError):
        v0(line, FLUSH_PKT, "done")


def test_v0_non_want_line_message() -> None:
    with pytest.raises(ClientError) as info:
        v0("frobnicate", FLUSH_PKT)
    assert info.value.message == (
        "git upload-pack: protocol error, expected to get object ID, not 'frobnicate'"
    )


def test_v0_have_in_want_list_is_refused() -> None:
    with pytest.raises(ClientError, match="expected to get object ID"):
        v0(w(W1), h(H1), FLUSH_PKT, "done")


@pytest.mark.parametrize("special", [DELIM_PKT, RESPONSE_END_PKT])
def test_v0_special_packet_in_want_list(special: bytes) -> None:
    with pytest.raises(ClientError):
        v0(w(W1), special, FLUSH_PKT, "done")


def test_v0_empty_data_packet_in_want_list() -> None:
    with pytest.raises(ClientError):
        parse_v0_request(body(w(W1)) + b"0004" + FLUSH_PKT, ADVERTISED)


def test_v0_want_list_without_flush() -> None:
    with pytest.raises(ClientError, match="without a flush"):
        v0(w(W1))


def test_v0_accepts_pkt_sequence() -> None:
    pkts = [Pkt(PktKind.DATA, (w(W1) + "\n").encode()), Pkt(PktKind.FLUSH),
            Pkt(PktKind.DATA, b"done\n")]
    assert parse_v0_request(pkts, ADVERTISED).wants == (W1_ID,)


def test_v0_truncated_body() -> None:
    with pytest.raises(ClientError):
        parse_v0_request(body(w(W1)) + b"00", ADVERTISED)


# ------------------------------------------------------------------ v0: how the body ends


def test_v0_probe_flush_has_no_wants() -> None:
    req = parse_v0_request(FLUSH_PKT, ADVERTISED)
    assert req.wants == () and req.haves_end is HavesEnd.NONE and not req.done


def test_v0_no_wants_ignores_the_rest() -> None:
    req = v0(FLUSH_PKT, "garbage that is never read")
    assert req.wants == () and req.haves_end is HavesEnd.NONE


def test_v0_eof_after_wants_flush() -> None:
    req = v0(w(W1), "deepen 1", FLUSH_PKT)
    assert req.haves_end is HavesEnd.NONE and req.depth == 1 and not req.done


def test_v0_flush_round() -> None:
    req = v0(w(W1), FLUSH_PKT, h(H1), h(H2), FLUSH_PKT)
    assert req.haves == (H1_ID, H2_ID) and req.haves_end is HavesEnd.FLUSH


def test_v0_empty_flush_round() -> None:
    req = v0(w(W1), FLUSH_PKT, FLUSH_PKT)
    assert req.haves == () and req.haves_end is HavesEnd.FLUSH


def test_v0_done_round_ignores_what_follows() -> None:
    req = v0(w(W1), FLUSH_PKT, h(H1), "done", "anything")
    assert req.haves == (H1_ID,) and req.haves_end is HavesEnd.DONE and req.done


def test_v0_haves_keep_duplicates_and_order() -> None:
    assert v0(w(W1), FLUSH_PKT, h(H2), h(H1), h(H2), "done").haves == (H2_ID, H1_ID, H2_ID)


def test_v0_bad_have_line_message() -> None:
    with pytest.raises(ClientError) as info:
        v0(w(W1), FLUSH_PKT, "frobnicate", FLUSH_PKT)
    assert info.value.message == "git upload-pack: expected SHA1 list, got 'frobnicate'"


@pytest.mark.parametrize("line", ["have", "have 12", f"have {'x' * 40}", "done now", "DONE"])
def test_v0_bad_have(line: str) -> None:
    with pytest.raises(ClientError):
        v0(w(W1), FLUSH_PKT, line, FLUSH_PKT)


def test_v0_have_list_without_end() -> None:
    with pytest.raises(ClientError, match="without flush or done"):
        v0(w(W1), FLUSH_PKT, h(H1))


@pytest.mark.parametrize("special", [DELIM_PKT, RESPONSE_END_PKT])
def test_v0_special_packet_in_have_list(special: bytes) -> None:
    with pytest.raises(ClientError):
        v0(w(W1), FLUSH_PKT, h(H1), special, FLUSH_PKT)


# ------------------------------------------------------------------ v0: shallow, deepen, filter


def test_v0_shallow_and_depth() -> None:
    req = v0(w(W1, "shallow"), f"shallow {S1.decode()}", f"shallow {S1.decode()}", "deepen 3",
             FLUSH_PKT)
    assert req.shallows == (S1_ID,) and req.depth == 3 and req.deepen and not req.deepen_rev_list


def test_v0_unshallow_depth() -> None:
    assert v0(w(W1), f"deepen {INFINITE_DEPTH}", FLUSH_PKT).depth == INFINITE_DEPTH == 0x7FFFFFFF


def test_v0_deepen_since_and_not() -> None:
    req = v0(w(W1, "deepen-since deepen-not"), "deepen-since 1700000000",
             "deepen-not refs/heads/old", "deepen-not v1.0", FLUSH_PKT)
    assert req.deepen_since == 1700000000 and req.deepen_not == (b"refs/heads/old", b"v1.0")
    assert req.deepen and req.deepen_rev_list and req.depth == 0


def test_v0_deepen_relative() -> None:
    assert v0(w(W1, "deepen-relative"), "deepen 1", FLUSH_PKT).deepen_relative


@pytest.mark.parametrize(
    "lines",
    [("deepen 1", "deepen-since 5"), ("deepen-since 5", "deepen 1"), ("deepen 2", "deepen-not x")],
)
def test_v0_deepen_with_deepen_since_or_not_is_refused(lines: tuple[str, str]) -> None:
    with pytest.raises(ClientError) as info:
        v0(w(W1), *lines, FLUSH_PKT)
    assert info.value.message == (
        "git upload-pack: deepen and deepen-since (or deepen-not) cannot be used together"
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("deepen 0", "Invalid deepen: 0"),
        ("deepen -1", "Invalid deepen: -1"),
        ("deepen +1", "Invalid deepen: +1"),
        ("deepen x", "Invalid deepen: x"),
        ("deepen ", "Invalid deepen: "),
        ("deepen 1 ", "Invalid deepen: 1 "),
        ("deepen 12345678901234567890", "Invalid deepen: 12345678901234567890"),
        ("deepen-since 0", "Invalid deepen-since: 0"),
        ("deepen-since yesterday", "Invalid deepen-since: yesterday"),
        ("deepen-not ", "git upload-pack: deepen-not is not a ref"),
        ("deepen-not " + "r" * 4097, "git upload-pack: deepen-not is not a ref"),
    ],
)
def test_v0_bad_deepen(line: str, message: str) -> None:
    with pytest.raises(ClientError) as info:
        v0(w(W1), line, FLUSH_PKT)
    assert info.value.message == message


def test_v0_bad_shallow() -> None:
    with pytest.raises(ClientError):
        v0(w(W1), "shallow 1234", FLUSH_PKT)


def test_v0_filter() -> None:
    req = v0(w(W1, "filter"), "filter blob:limit=1k", FLUSH_PKT, "done")
    assert req.filter == BlobLimit(1024)


def test_v0_filter_needs_the_capability() -> None:
    with pytest.raises(ClientError, match="filtering capability not negotiated"):
        v0(w(W1), "filter blob:none", FLUSH_PKT, "done")


def test_v0_filter_capability_not_advertised() -> None:
    with pytest.raises(ClientError, match="not advertised"):
        v0(w(W1, "filter"), "filter blob:none", FLUSH_PKT, "done",
           advertised=ADVERTISED - {b"filter"})


def test_v0_two_filters_are_refused() -> None:
    with pytest.raises(ClientError, match="cannot be combined"):
        v0(w(W1, "filter"), "filter blob:none", "filter tree:0", FLUSH_PKT, "done")


def test_v0_bad_filter() -> None:
    with pytest.raises(ClientError, match="filter-spec"):
        v0(w(W1, "filter"), "filter blob:bogus", FLUSH_PKT, "done")


# ------------------------------------------------------------------ v2

F = V2Features(agent=b"t")
F_ALL = V2Features(agent=b"t", allow_ref_in_want=True, allow_sideband_all=True)
F_NOFILTER = V2Features(agent=b"t", allow_filter=False)


def v2(*lines: str, features: V2Features = F) -> FetchRequest:
    return parse_v2_fetch_args([x.encode() for x in lines], features)


def test_v2_minimal() -> None:
    assert v2(w(W1), "done") == FetchRequest(
        version=2, wants=(W1_ID,), done=True, sideband=Sideband.LARGE, haves_end=HavesEnd.DONE
    )


def test_v2_every_flag() -> None:
    req = v2("thin-pack", "ofs-delta", "no-progress", "include-tag", "done", "wait-for-done",
             "deepen-relative", w(W1), h(H1), "deepen 1")
    assert req.thin_pack and req.ofs_delta and req.no_progress and req.include_tag
    assert req.done and req.wait_for_done and req.deepen_relative
    assert req.version == 2 and req.sideband is Sideband.LARGE
    assert req.multi_ack is MultiAck.NONE and not req.no_done


def test_v2_no_args() -> None:
    req = v2()
    assert req.wants == () and req.haves == () and not req.done


def test_v2_wants_haves_shallows() -> None:
    req = v2(w(W1), w(W2), w(W1), h(H1), h(H1), f"shallow {S1.decode()}",
             f"shallow {S1.decode()}")
    assert req.wants == (W1_ID, W2_ID) and req.haves == (H1_ID, H1_ID) and req.shallows == (S1_ID,)


@pytest.mark.parametrize(
    "line", [f"want {W1.decode()} thin-pack", "want", f"have {W1.decode()[:-1]}", "shallow x"]
)
def test_v2_bad_ids(line: str) -> None:
    with pytest.raises(ClientError):
        v2(line)


def test_v2_deepen_forms() -> None:
    assert v2(w(W1), "deepen 2").depth == 2
    req = v2(w(W1), "deepen-since 10", "deepen-not main")
    assert req.deepen_since == 10 and req.deepen_not == (b"main",)


@pytest.mark.parametrize("other", ["deepen-since 10", "deepen-not main"])
def test_v2_deepen_with_deepen_since_or_not_is_refused(other: str) -> None:
    with pytest.raises(ClientError, match="cannot be used together"):
        v2(w(W1), "deepen 1", other)


def test_v2_filter() -> None:
    assert v2(w(W1), "filter combine:blob:none+tree:0").filter == Combine(
        (BlobNone(), TreeDepth(0))
    )
    with pytest.raises(ClientError, match="cannot be combined"):
        v2(w(W1), "filter blob:none", "filter blob:none")


def test_v2_filter_refused_when_not_advertised() -> None:
    with pytest.raises(ClientError) as info:
        v2(w(W1), "filter blob:none", features=F_NOFILTER)
    assert info.value.message == "unexpected line: 'filter blob:none'"


def test_v2_want_ref() -> None:
    req = v2("want-ref refs/heads/main", "want-ref refs/tags/v1", features=F_ALL)
    assert req.want_refs == (b"refs/heads/main", b"refs/tags/v1") and req.wants == ()
    with pytest.raises(ClientError, match="duplicate want-ref refs/heads/main"):
        v2("want-ref refs/heads/main", "want-ref refs/heads/main", features=F_ALL)


def test_v2_want_ref_refused_when_not_advertised() -> None:
    with pytest.raises(ClientError, match="unexpected line: 'want-ref refs/heads/main'"):
        v2("want-ref refs/heads/main")


def test_v2_sideband_all() -> None:
    assert v2(w(W1), "sideband-all", features=F_ALL).sideband_all
    with pytest.raises(ClientError, match="unexpected line: 'sideband-all'"):
        v2(w(W1), "sideband-all")


@pytest.mark.parametrize(
    "line",
    ["frobnicate", "multi_ack_detailed", "side-band-64k", "no-done", "thin-pack ", "Done", "",
     "agent=git/2.39.5", "packfile-uris https"],
)
def test_v2_unknown_argument(line: str) -> None:
    with pytest.raises(ClientError) as info:
        v2(w(W1), line)
    assert info.value.message == f"unexpected line: '{line}'"


def test_v2_sha256() -> None:
    oid = b"d" * 64
    req = parse_v2_fetch_args([b"want " + oid], F, hex_len=64)
    assert req.wants == (b"\xdd" * 32,)
    with pytest.raises(ClientError):
        parse_v2_fetch_args([b"want " + W1], F, hex_len=64)


def test_fetch_request_properties() -> None:
    assert not FetchRequest(version=2).deepen
    assert FetchRequest(version=2, depth=1).deepen
    assert FetchRequest(version=2, deepen_since=1).deepen_rev_list
    assert FetchRequest(version=2, deepen_not=(b"x",)).deepen
    with pytest.raises(AttributeError):
        FetchRequest(version=2).depth = 3  # type: ignore[misc]


# ------------------------------------------------------------------ caps on line counts

REF_IN_WANT = V2Features(agent=b"x", allow_ref_in_want=True)


def test_v2_repeated_shallows_and_want_refs_scale_linearly() -> None:
    """80k shallow lines (half repeats) parse in one pass: a list lookup per line made
    this quadratic (40k lines took 14 s)."""
    shallows = [b"shallow %040x" % (k % 40_000) for k in range(80_000)]
    req = parse_v2_fetch_args([b"want " + W1, *shallows], F)
    assert req.shallows == tuple(k.to_bytes(20, "big") for k in range(40_000))
    refs = [b"want-ref refs/heads/b%06d" % k for k in range(40_000)]
    assert len(parse_v2_fetch_args(refs, REF_IN_WANT).want_refs) == 40_000
    with pytest.raises(ClientError, match="duplicate want-ref refs/heads/b000007"):
        parse_v2_fetch_args([*refs, b"want-ref refs/heads/b000007"], REF_IN_WANT)


def test_deepen_not_cap() -> None:
    lines = [b"deepen-not refs/heads/x%d" % k for k in range(MAX_DEEPEN_NOT)]
    assert len(parse_v2_fetch_args([b"want " + W1, *lines], F).deepen_not) == MAX_DEEPEN_NOT
    with pytest.raises(ClientError, match="too many deepen-not lines"):
        parse_v2_fetch_args([b"want " + W1, *lines, b"deepen-not refs/heads/y"], F)


def test_wants_and_want_refs_share_one_cap() -> None:
    wants = [b"want %040x" % k for k in range(MAX_WANTS - 1)]
    req = parse_v2_fetch_args([*wants, b"want-ref refs/heads/main"], REF_IN_WANT)
    assert len(req.wants) + len(req.want_refs) == MAX_WANTS
    with pytest.raises(ClientError, match="too many want lines"):
        # Repeats of listed wants are not counted; one more distinct one is.
        parse_v2_fetch_args([*wants, wants[0], b"want-ref refs/heads/main", b"want " + W1],
                            REF_IN_WANT)


def test_shallow_cap_counts_distinct_ids() -> None:
    assert MAX_SHALLOWS >= 100_000  # a --depth clone of a many-ref mirror sends one per tip
    many = [b"shallow %040x" % k for k in range(MAX_SHALLOWS)]
    with pytest.raises(ClientError, match="too many shallow lines"):
        parse_v2_fetch_args([b"want " + W1, *many, b"shallow " + W1], F)
