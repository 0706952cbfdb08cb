"""Hypothesis properties for protocol/.

The fuzz invariant (docs/ARCHITECTURE.md "Errors"): any input either parses or raises
:class:`protocol.errors.ClientError`, never anything else. Inputs are drawn both as raw bytes
and from a vocabulary of plausible wire lines (then framed, truncated or corrupted), so that
the parsers get past their first check. Round trips cover the framing and filter specs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gitspout.protocol.capabilities import V2Features
from gitspout.protocol.command import parse_command_request
from gitspout.protocol.errors import ClientError
from gitspout.protocol.fetch_request import (
    FetchRequest,
    HavesEnd,
    MultiAck,
    parse_v0_request,
    parse_v2_fetch_args,
)
from gitspout.protocol.filters import (
    BlobLimit,
    BlobNone,
    Combine,
    ObjectType,
    SparseOid,
    TreeDepth,
    format_filter_spec,
    parse_filter_spec,
)
from gitspout.protocol.ls_refs import parse_ls_refs_args
from gitspout.protocol.negotiate import negotiate_v0, negotiate_v2
from gitspout.protocol.object_info import parse_object_info_args
from gitspout.protocol.pktline import (
    MAX_PKT_PAYLOAD,
    NEED_MORE,
    Pkt,
    PktBuffer,
    PktKind,
    decode_pkt,
    encode_pkt,
    iter_pkts,
)
from gitspout.protocol.sideband import iter_band_packets
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from protocol_testlib import GraphOracle, facts

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
QUICK = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def parses_or_client_error(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """Call ``fn``; a ClientError is fine (and must be well formed), anything else fails."""
    try:
        return fn(*args, **kw)
    except ClientError as exc:
        assert isinstance(exc.message, str) and exc.message
        assert isinstance(exc.http_status, int)
        return None


# ------------------------------------------------------------------ strategies

OID_BYTES = st.sampled_from(
    [b"1" * 40, b"a" * 40, b"AbCdEf0123" * 4, b"g" * 40, b"1" * 39, b"1" * 41, b"1" * 64, b""]
)
NUMBERS = st.sampled_from(
    [b"0", b"1", b"3", b"-1", b"+2", b"x", b"", b"2147483647", b"99999999999999999999", b"1 "]
)
FILTER_TEXT = st.one_of(
    st.sampled_from(
        [b"blob:none", b"blob:limit=1k", b"blob:limit=", b"tree:0", b"tree:x", b"object:type=tag",
         b"sparse:oid=main:x", b"combine:blob:none+tree:1", b"combine:blob%3Anone",
         b"combine:blob%ff", b"combine:%", b"combine:", b"combine:combine%3Atree%3A1",
         b"blob:limit=99999999999999999999999g", b"\xff\xfe"]
    ),
    st.binary(max_size=30),
)
CAP_WORDS = st.sampled_from(
    [b"multi_ack", b"multi_ack_detailed", b"side-band", b"side-band-64k", b"ofs-delta",
     b"thin-pack", b"no-progress", b"include-tag", b"no-done", b"deepen-relative", b"shallow",
     b"filter", b"agent=git/2.39.5", b"object-format=sha1", b"object-format=sha256",
     b"session-id=x", b"frobnicate", b"=", b""]
)


def _join(*parts: bytes) -> bytes:
    return b"".join(parts)


WIRE_LINE = st.one_of(
    st.builds(lambda o, c: b"want " + o + b"".join(b" " + w for w in c), OID_BYTES,
              st.lists(CAP_WORDS, max_size=4)),
    st.builds(lambda o: b"have " + o, OID_BYTES),
    st.builds(lambda o: b"shallow " + o, OID_BYTES),
    st.builds(lambda o: b"oid " + o, OID_BYTES),
    st.builds(lambda n: b"deepen " + n, NUMBERS),
    st.builds(lambda n: b"deepen-since " + n, NUMBERS),
    st.builds(lambda r: b"deepen-not " + r, st.binary(max_size=10)),
    st.builds(lambda f: b"filter " + f, FILTER_TEXT),
    st.builds(lambda r: b"want-ref " + r, st.sampled_from([b"refs/heads/main", b"", b"x"])),
    st.builds(lambda r: b"ref-prefix " + r, st.binary(max_size=10)),
    st.sampled_from(
        [b"done", b"thin-pack", b"ofs-delta", b"no-progress", b"include-tag", b"wait-for-done",
         b"deepen-relative", b"sideband-all", b"peel", b"symrefs", b"unborn", b"size",
         b"command=ls-refs", b"command=fetch", b"command=object-info", b"command=bogus",
         b"agent=git/2.39.5", b"object-format=sha1", b"object-format=sha256",
         b"server-option=x", b"session-id=s", b"command", b""]
    ),
    st.binary(max_size=20),
)
SPECIAL = st.sampled_from([b"0000", b"0001", b"0002", b"0004"])


@st.composite
def pkt_stream(draw: st.DrawFn) -> bytes:
    """A body of mostly well-formed pkt-lines, sometimes truncated or corrupted."""
    items = draw(st.lists(st.one_of(st.tuples(WIRE_LINE, st.booleans()), SPECIAL),
                          max_size=14))
    out = b""
    for item in items:
        if isinstance(item, tuple):
            line, lf = item
            out += encode_pkt(line + b"\n" if lf or not line else line)
        else:
            out += item
    mutation = draw(st.sampled_from(["none", "none", "none", "truncate", "insert", "flush"]))
    if mutation == "truncate" and out:
        out = out[: draw(st.integers(0, len(out) - 1))]
    elif mutation == "insert":
        pos = draw(st.integers(0, len(out)))
        out = out[:pos] + draw(st.binary(min_size=1, max_size=6)) + out[pos:]
    elif mutation == "flush":
        out += b"0000"
    return out


BODY = st.one_of(pkt_stream(), st.binary(max_size=200))
ARG_LISTS = st.lists(WIRE_LINE, max_size=12)
FEATURES = st.builds(
    V2Features,
    agent=st.just(b"t"),
    object_format=st.sampled_from([b"sha1", b"sha256"]),
    allow_filter=st.booleans(),
    allow_ref_in_want=st.booleans(),
    allow_sideband_all=st.booleans(),
    advertise_unborn=st.booleans(),
    session_id=st.sampled_from([None, b"srv"]),
)
ADVERTISED = st.frozensets(
    st.sampled_from(
        [b"multi_ack", b"multi_ack_detailed", b"side-band", b"side-band-64k", b"ofs-delta",
         b"thin-pack", b"no-progress", b"include-tag", b"no-done", b"deepen-relative",
         b"shallow", b"filter", b"agent", b"object-format", b"session-id"]
    )
)

# ------------------------------------------------------------------ fuzz invariant


@FUZZ
@given(st.binary(max_size=80), st.integers(0, 8))
def test_decode_pkt_total(buf: bytes, pos: int) -> None:
    res = parses_or_client_error(decode_pkt, buf, pos)
    if res is None or res is NEED_MORE:
        return
    pkt, used = res
    assert 4 <= used <= len(buf) - pos
    assert isinstance(pkt, Pkt) and isinstance(pkt.payload, bytes)
    if pkt.kind is PktKind.DATA:
        assert used == len(pkt.payload) + 4
    else:
        assert used == 4 and pkt.payload == b""


@FUZZ
@given(BODY)
def test_iter_pkts_total(body: bytes) -> None:
    parses_or_client_error(lambda: list(iter_pkts(body)))


@FUZZ
@given(BODY, ADVERTISED, st.sampled_from([(b"sha1", 40), (b"sha256", 64)]))
def test_parse_v0_request_total(body: bytes, advertised: frozenset[bytes], fmt) -> None:
    req = parses_or_client_error(parse_v0_request, body, advertised, fmt[0], fmt[1])
    if req is not None:
        assert isinstance(req, FetchRequest) and req.version == 0
        assert all(len(w) == fmt[1] // 2 for w in req.wants + req.haves + req.shallows)  # binary
        assert not (req.depth and req.deepen_rev_list)


@FUZZ
@given(BODY, FEATURES)
def test_parse_command_request_total(body: bytes, features: V2Features) -> None:
    parses_or_client_error(parse_command_request, body, features)


@FUZZ
@given(ARG_LISTS, FEATURES)
def test_parse_v2_fetch_args_total(args: list[bytes], features: V2Features) -> None:
    req = parses_or_client_error(parse_v2_fetch_args, args, features)
    if req is not None:
        assert req.version == 2 and not (req.depth and req.deepen_rev_list)
        assert not req.want_refs or features.allow_ref_in_want
        assert req.filter is None or features.allow_filter


@FUZZ
@given(ARG_LISTS)
def test_parse_ls_refs_args_total(args: list[bytes]) -> None:
    parses_or_client_error(parse_ls_refs_args, args)


@FUZZ
@given(ARG_LISTS)
def test_parse_object_info_args_total(args: list[bytes]) -> None:
    parses_or_client_error(parse_object_info_args, args)


@FUZZ
@given(st.one_of(FILTER_TEXT, st.binary(max_size=60)))
def test_parse_filter_spec_bytes_total(text: bytes) -> None:
    parses_or_client_error(parse_filter_spec, text)


@FUZZ
@given(st.text(max_size=60))
def test_parse_filter_spec_text_total(text: str) -> None:
    parses_or_client_error(parse_filter_spec, text)


@st.composite
def grammar_filter_text(draw: st.DrawFn, depth: int = 0) -> str:
    """Specs close to the grammar: sizes with suffixes, %-escapes of any case, nesting."""
    num = draw(st.sampled_from(["0", "1", "12", "7k", "3M", "2g", "", "x", "1t", "-1"]))
    leaf = draw(st.sampled_from(
        ["blob:none", f"blob:limit={num}", f"tree:{num}", "object:type=blob",
         "object:type=nope", "sparse:oid=HEAD:x", "combine:blob:none"]
    ))
    if depth == 0 and draw(st.booleans()):
        parts = draw(st.lists(grammar_filter_text(1), min_size=0, max_size=4))
        escaped = [
            "".join(f"%{ord(c):02{draw(st.sampled_from(['x', 'X']))}}"
                    if c in ":=+%" and draw(st.booleans()) else c for c in p)
            for p in parts
        ]
        return "combine:" + "+".join(escaped)
    return leaf


@FUZZ
@given(grammar_filter_text())
def test_parse_filter_spec_grammar_total_and_canonical(text: str) -> None:
    spec = parses_or_client_error(parse_filter_spec, text)
    if spec is not None:
        assert parse_filter_spec(format_filter_spec(spec)) == spec
        assert parse_filter_spec(format_filter_spec(spec).encode()) == spec


# ------------------------------------------------------------------ round trips


@FUZZ
@given(st.binary(min_size=1, max_size=3000))
@example(b"x" * MAX_PKT_PAYLOAD)
@example(b"\x00")
def test_encode_decode_round_trip(payload: bytes) -> None:
    framed = encode_pkt(payload)
    assert decode_pkt(framed) == (Pkt(PktKind.DATA, payload), len(framed))
    assert decode_pkt(framed + b"trailing") == (Pkt(PktKind.DATA, payload), len(framed))
    assert decode_pkt(framed[:-1]) is NEED_MORE


PKT_ITEMS = st.lists(
    st.one_of(
        st.binary(min_size=1, max_size=300).map(lambda p: Pkt(PktKind.DATA, p)),
        st.sampled_from([Pkt(PktKind.FLUSH), Pkt(PktKind.DELIM), Pkt(PktKind.RESPONSE_END)]),
    ),
    max_size=20,
)
SPECIAL_BYTES = {PktKind.FLUSH: b"0000", PktKind.DELIM: b"0001", PktKind.RESPONSE_END: b"0002"}


def encode_all(pkts: list[Pkt]) -> bytes:
    return b"".join(
        encode_pkt(p.payload) if p.kind is PktKind.DATA else SPECIAL_BYTES[p.kind] for p in pkts
    )


@FUZZ
@given(PKT_ITEMS)
def test_iter_pkts_round_trip(pkts: list[Pkt]) -> None:
    assert list(iter_pkts(encode_all(pkts))) == pkts


@FUZZ
@given(PKT_ITEMS, st.data())
def test_incremental_decoding_matches_whole(pkts: list[Pkt], data: st.DataObject) -> None:
    stream = encode_all(pkts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    buf = bytearray()
    out = []
    for chunk in chunks:
        buf += chunk
        while (res := decode_pkt(buf)) is not NEED_MORE:
            pkt, used = res  # type: ignore[misc]
            out.append(pkt)
            del buf[:used]
    assert out == pkts and not buf


@FUZZ
@given(st.binary(max_size=3000), st.integers(1, 3), st.sampled_from([1, 7, 995, 65515]))
def test_sideband_split_and_join(data: bytes, band: int, max_data: int) -> None:
    packets = list(iter_band_packets(band, data, max_data))
    assert all(5 < len(p) <= max_data + 5 and p[4] == band for p in packets)
    parsed = list(iter_pkts(b"".join(packets)))
    assert b"".join(p.payload[1:] for p in parsed) == data


@FUZZ
@given(st.lists(st.binary(min_size=1, max_size=200), max_size=40), st.integers(1, 600))
def test_pktbuffer_chunks(payloads: list[bytes], chunk_size: int) -> None:
    buf = PktBuffer(chunk_size)
    chunks = [c for c in (buf.add(p) for p in payloads) if c is not None]
    assert all(len(c) >= chunk_size for c in chunks)
    assert all(len(c) < chunk_size + 204 for c in chunks)
    assert b"".join(chunks) + buf.take() == b"".join(encode_pkt(p) for p in payloads)


LEAF_SPECS = st.one_of(
    st.just(BlobNone()),
    st.builds(BlobLimit, st.integers(0, 1 << 40)),
    st.builds(TreeDepth, st.integers(0, 1 << 20)),
    st.builds(ObjectType, st.sampled_from(["blob", "tree", "commit", "tag"])),
    st.builds(SparseOid, st.text(max_size=20)),
)
SPECS = st.one_of(LEAF_SPECS, st.builds(Combine, st.lists(LEAF_SPECS, min_size=1, max_size=6)
                                        .map(tuple)))


@FUZZ
@given(SPECS)
def test_format_parse_filter_round_trip(spec: Any) -> None:
    text = format_filter_spec(spec)
    assert parse_filter_spec(text) == spec
    assert parse_filter_spec(text.encode("utf-8")) == spec


# ------------------------------------------------------------------ negotiation model


def c_get_common_commits(req: FetchRequest, oracle: GraphOracle) -> tuple[list[bytes], bool]:
    """upload-pack.c get_common_commits() for one stateless round, transcribed line by line
    (it writes as it reads; negotiate_v0 collects first and decides after). The request's
    ids are binary; ACK lines carry them in hex (oid_to_hex)."""
    out: list[bytes] = []
    got_common = got_other = sent_ready = False
    last = b""
    for oid in req.haves:
        have = oid.hex().encode()
        if not oracle.note_have(oid):
            got_other = True
            if req.multi_ack and oracle.ok_to_give_up():
                if req.multi_ack is MultiAck.DETAILED:
                    sent_ready = True
                    out.append(b"ACK %s ready\n" % have)
                else:
                    out.append(b"ACK %s continue\n" % have)
            continue
        got_common, last = True, have
        if req.multi_ack is MultiAck.DETAILED:
            out.append(b"ACK %s common\n" % last)
        elif req.multi_ack:
            out.append(b"ACK %s continue\n" % last)
        elif oracle.have_count() == 1:
            out.append(b"ACK %s\n" % last)
    if req.haves_end is HavesEnd.DONE:
        if oracle.have_count() > 0:
            if req.multi_ack:
                out.append(b"ACK %s\n" % last)
            return out, True
        return [*out, b"NAK\n"], True
    if (req.multi_ack is MultiAck.DETAILED and got_common and not got_other
            and oracle.ok_to_give_up()):
        sent_ready = True
        out.append(b"ACK %s ready\n" % last)
    if oracle.have_count() == 0 or req.multi_ack:
        out.append(b"NAK\n")
    if req.no_done and sent_ready:
        out.append(b"ACK %s\n" % last)
        return out, True
    return out, False


def _fixture_ids() -> list[bytes]:
    """Binary ids, as parsed requests carry them: the fixture's objects and two unknowns."""
    f = facts()
    ids = [bytes.fromhex(o) for o in f["labels"].values()]
    ids += [bytes.fromhex(r["oid"]) for r in f["refs"]]
    return sorted(set(ids)) + [b"\xde\xad\xbe\xef" * 5, b"\0" * 20]


FIXTURE_IDS = st.sampled_from(_fixture_ids())
COMMIT_WANTS = st.lists(
    st.sampled_from(sorted({bytes.fromhex(r["oid"]) for r in facts()["refs"]})),
    min_size=1, max_size=3,
)


@QUICK
@given(COMMIT_WANTS, st.lists(FIXTURE_IDS, max_size=8), st.sampled_from(list(MultiAck)),
       st.booleans(), st.sampled_from([HavesEnd.FLUSH, HavesEnd.DONE]))
def test_negotiate_v0_matches_upload_pack_model(wants, haves, multi_ack, no_done, end) -> None:
    req = FetchRequest(version=0, wants=tuple(wants), haves=tuple(haves), multi_ack=multi_ack,
                       no_done=no_done, haves_end=end, done=end is HavesEnd.DONE)
    got = negotiate_v0(req, GraphOracle(wants))
    expected, send_pack = c_get_common_commits(req, GraphOracle(wants))
    # C git answers a repeated have again; each distinct answer line goes out once here.
    assert (list(got.lines), got.send_pack) == (list(dict.fromkeys(expected)), send_pack)


@QUICK
@given(COMMIT_WANTS, st.lists(FIXTURE_IDS, max_size=8), st.booleans(), st.booleans())
def test_negotiate_v2_shape(wants, haves, done, wait_for_done) -> None:
    req = FetchRequest(version=2, wants=tuple(wants), haves=tuple(haves), done=done,
                       wait_for_done=wait_for_done)
    answer = negotiate_v2(req, GraphOracle(wants))
    assert answer is not None
    if done or not haves:
        assert answer.ack_lines is None and answer.send_pack
        return
    lines = answer.ack_lines
    assert lines is not None and lines[0] == b"acknowledgments\n"
    body = [x for x in lines[1:] if x != b"ready\n"]
    assert body == [b"NAK\n"] or all(x.startswith(b"ACK ") for x in body)
    assert (lines[-1] == b"ready\n") == answer.send_pack
    assert not (wait_for_done and answer.send_pack)
