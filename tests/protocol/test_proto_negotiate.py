"""protocol.negotiate: the ACK/NAK rules of upload-pack.c, one stateless round at a time.

``ScriptedOracle`` answers by hand: which ids are common, and after how many distinct
common haves ``ok_to_give_up`` becomes true. The fixture tests replay C git's own answers.
"""

from __future__ import annotations

from gitspout.protocol.fetch_request import FetchRequest, HavesEnd, MultiAck, Sideband
from gitspout.protocol.negotiate import V0Answer, V2Answer, negotiate_v0, negotiate_v2
from protocol_testlib import GraphOracle, ScriptedOracle, label_id

# Binary ids, as parsed requests carry them; ACK lines carry them in hex.
W = b"\xff" * 20
C1 = b"\x11" * 20
C2 = b"\x22" * 20
U1 = b"\xaa" * 20
U2 = b"\xbb" * 20


def ack(oid: bytes, suffix: bytes = b"") -> bytes:
    return b"ACK " + oid.hex().encode() + suffix + b"\n"


NAK = b"NAK\n"


def v0(haves: tuple[bytes, ...], end: HavesEnd, multi_ack: MultiAck = MultiAck.DETAILED,
       no_done: bool = False, wants: tuple[bytes, ...] = (W,)) -> FetchRequest:
    return FetchRequest(version=0, wants=wants, haves=haves, haves_end=end,
                        done=end is HavesEnd.DONE, multi_ack=multi_ack, no_done=no_done,
                        sideband=Sideband.LARGE)


def run0(req: FetchRequest, common=(C1, C2), ready_after: int | None = 1) -> V0Answer:
    return negotiate_v0(req, ScriptedOracle(set(common), ready_after))


# ------------------------------------------------------------------ v0: nothing to say


def test_v0_no_wants() -> None:
    assert run0(v0((C1,), HavesEnd.FLUSH, wants=())) == V0Answer((), False)


def test_v0_shallow_only_round() -> None:
    assert run0(v0((), HavesEnd.NONE)) == V0Answer((), False)


# ------------------------------------------------------------------ v0: multi_ack_detailed


def test_detailed_unknown_only() -> None:
    assert run0(v0((U1, U2), HavesEnd.FLUSH)) == V0Answer((NAK,), False)


def test_detailed_empty_round() -> None:
    assert run0(v0((), HavesEnd.FLUSH)) == V0Answer((NAK,), False)


def test_detailed_common_and_ready_at_flush() -> None:
    assert run0(v0((C1,), HavesEnd.FLUSH)) == V0Answer(
        (ack(C1, b" common"), ack(C1, b" ready"), NAK), False
    )


def test_ack_lines_carry_lowercase_hex() -> None:
    assert run0(v0((b"\xab" * 20,), HavesEnd.FLUSH), common=(b"\xab" * 20,)).lines == (
        b"ACK " + b"ab" * 20 + b" common\n", b"ACK " + b"ab" * 20 + b" ready\n", NAK
    )
    answer = run2(v2((b"\xab" * 20,)), common=(b"\xab" * 20,))
    assert answer is not None and answer.ack_lines == (ACKS, b"ACK " + b"ab" * 20 + b"\n", b"ready\n")


def test_detailed_common_not_ready() -> None:
    assert run0(v0((C1, C2), HavesEnd.FLUSH), ready_after=None) == V0Answer(
        (ack(C1, b" common"), ack(C2, b" common"), NAK), False
    )


def test_detailed_ready_on_the_last_common() -> None:
    assert run0(v0((C1, C2), HavesEnd.FLUSH), ready_after=2).lines == (
        ack(C1, b" common"), ack(C2, b" common"), ack(C2, b" ready"), NAK
    )


def test_detailed_unknown_after_give_up_is_acked_ready() -> None:
    """An unknown have once ok_to_give_up holds is answered ``ACK <it> ready``; then, since
    got_other is set, no second ready comes at the flush."""
    assert run0(v0((C1, U1, U2), HavesEnd.FLUSH)).lines == (
        ack(C1, b" common"), ack(U1, b" ready"), ack(U2, b" ready"), NAK
    )


def test_detailed_unknown_before_common_blocks_ready_at_flush() -> None:
    assert run0(v0((U1, C1), HavesEnd.FLUSH)).lines == (ack(C1, b" common"), NAK)


def test_detailed_no_done_after_ready_sends_final_ack_and_pack() -> None:
    assert run0(v0((C1,), HavesEnd.FLUSH, no_done=True)) == V0Answer(
        (ack(C1, b" common"), ack(C1, b" ready"), NAK, ack(C1)), True
    )


def test_detailed_no_done_after_ready_on_unknown_have() -> None:
    assert run0(v0((C2, U1), HavesEnd.FLUSH, no_done=True)) == V0Answer(
        (ack(C2, b" common"), ack(U1, b" ready"), NAK, ack(C2)), True
    )


def test_detailed_no_done_without_ready_waits() -> None:
    assert run0(v0((C1,), HavesEnd.FLUSH, no_done=True), ready_after=None) == V0Answer(
        (ack(C1, b" common"), NAK), False
    )


def test_detailed_done_with_common() -> None:
    assert run0(v0((C1, U1, C2), HavesEnd.DONE), ready_after=None) == V0Answer(
        (ack(C1, b" common"), ack(C2, b" common"), ack(C2)), True
    )


def test_detailed_done_with_ready_in_the_haves() -> None:
    assert run0(v0((C1, U1), HavesEnd.DONE)) == V0Answer(
        (ack(C1, b" common"), ack(U1, b" ready"), ack(C1)), True
    )


def test_detailed_done_without_common() -> None:
    assert run0(v0((U1,), HavesEnd.DONE)) == V0Answer((NAK,), True)
    assert run0(v0((), HavesEnd.DONE)) == V0Answer((NAK,), True)


# ------------------------------------------------------------------ v0: plain multi_ack


def test_multi_ack_continue() -> None:
    assert run0(v0((C1, U1), HavesEnd.FLUSH, MultiAck.MULTI_ACK)) == V0Answer(
        (ack(C1, b" continue"), ack(U1, b" continue"), NAK), False
    )


def test_multi_ack_never_says_ready() -> None:
    out = run0(v0((C1,), HavesEnd.FLUSH, MultiAck.MULTI_ACK, no_done=True))
    assert out == V0Answer((ack(C1, b" continue"), NAK), False)


def test_multi_ack_unknown_before_give_up_is_silent() -> None:
    assert run0(v0((U1, C1), HavesEnd.FLUSH, MultiAck.MULTI_ACK)).lines == (
        ack(C1, b" continue"), NAK
    )


def test_multi_ack_done() -> None:
    assert run0(v0((C1, C2), HavesEnd.DONE, MultiAck.MULTI_ACK), ready_after=None) == V0Answer(
        (ack(C1, b" continue"), ack(C2, b" continue"), ack(C2)), True
    )
    assert run0(v0((U1,), HavesEnd.DONE, MultiAck.MULTI_ACK)) == V0Answer((NAK,), True)


# ------------------------------------------------------------------ v0: no multi_ack


def test_none_acks_only_the_first_common() -> None:
    assert run0(v0((U1, C1, C2), HavesEnd.FLUSH, MultiAck.NONE)) == V0Answer(
        (ack(C1),), False
    )


def test_none_acks_a_repeated_have_once() -> None:
    """have_obj.nr == 1 is what C checks, so C git acks a repeat of the first have again;
    the repeat says nothing new, and each distinct answer line goes out once."""
    assert run0(v0((C1, C1), HavesEnd.FLUSH, MultiAck.NONE)).lines == (ack(C1),)


def test_repeated_haves_are_answered_once_but_still_count() -> None:
    """A repeat is not answered again, yet it still moves "last common" (the final ACK)
    and an unknown repeat can still say ready once giving up became possible."""
    answer = run0(v0((C1, C2, C1), HavesEnd.DONE, MultiAck.DETAILED))
    assert answer.lines == (ack(C1, b" common"), ack(C2, b" common"), ack(C1))
    answer = run0(v0((U1, C1, U1, U1), HavesEnd.FLUSH, MultiAck.DETAILED))
    assert answer.lines == (ack(C1, b" common"), ack(U1, b" ready"), NAK)


def test_none_unknown_only_is_nak() -> None:
    assert run0(v0((U1,), HavesEnd.FLUSH, MultiAck.NONE)) == V0Answer((NAK,), False)


def test_none_done() -> None:
    assert run0(v0((C1, C2), HavesEnd.DONE, MultiAck.NONE)) == V0Answer((ack(C1),), True)
    assert run0(v0((U1,), HavesEnd.DONE, MultiAck.NONE)) == V0Answer((NAK,), True)


def test_none_ignores_no_done() -> None:
    assert run0(v0((C1,), HavesEnd.FLUSH, MultiAck.NONE, no_done=True)) == V0Answer(
        (ack(C1),), False
    )


def test_v0_asks_the_oracle_in_order() -> None:
    oracle = GraphOracle([label_id("E")])
    negotiate_v0(v0((U1, label_id("C"), label_id("B")), HavesEnd.FLUSH), oracle)
    assert [oid for _, oid in oracle.calls] == [U1, label_id("C"), label_id("B")]


# ------------------------------------------------------------------ v2


def v2(haves: tuple[bytes, ...] = (), wants: tuple[bytes, ...] = (W,), done: bool = False,
       wait_for_done: bool = False, want_refs: tuple[bytes, ...] = ()) -> FetchRequest:
    return FetchRequest(version=2, wants=wants, want_refs=want_refs, haves=haves, done=done,
                        wait_for_done=wait_for_done)


def run2(req: FetchRequest, common=(C1, C2), ready_after: int | None = 1) -> V2Answer | None:
    return negotiate_v2(req, ScriptedOracle(set(common), ready_after))


ACKS = b"acknowledgments\n"


def test_v2_nothing_wanted_is_an_empty_response() -> None:
    assert run2(v2((C1,), wants=())) is None


def test_v2_want_ref_counts_as_a_want() -> None:
    assert run2(v2(wants=(), want_refs=(b"refs/heads/main",))) == V2Answer(None, True)


def test_v2_no_haves_goes_straight_to_the_pack() -> None:
    assert run2(v2()) == V2Answer(None, True)


def test_v2_done_leaves_out_acknowledgments() -> None:
    oracle = ScriptedOracle({C1}, None)
    assert negotiate_v2(v2((C1, U1), done=True), oracle) == V2Answer(None, True)
    assert oracle.seen == [C1]  # haves were still processed: the pack builder needs them


def test_v2_nak() -> None:
    assert run2(v2((U1, U2))) == V2Answer((ACKS, NAK), False)


def test_v2_acks_without_ready() -> None:
    assert run2(v2((U1, C1, C2)), ready_after=None) == V2Answer(
        (ACKS, ack(C1), ack(C2)), False
    )


def test_v2_ready() -> None:
    assert run2(v2((C1, U1))) == V2Answer((ACKS, ack(C1), b"ready\n"), True)


def test_v2_wait_for_done_never_ready() -> None:
    assert run2(v2((C1,), wait_for_done=True)) == V2Answer((ACKS, ack(C1)), False)


def test_v2_wait_for_done_without_wants_still_acknowledges() -> None:
    assert run2(v2((C1, U1), wants=(), wait_for_done=True)) == V2Answer((ACKS, ack(C1)), False)


def test_v2_wait_for_done_with_done() -> None:
    assert run2(v2((C1,), wait_for_done=True, done=True)) == V2Answer(None, True)
