"""ACK/NAK decisions (gitprotocol-pack "Packfile Negotiation", gitprotocol-v2 "fetch").

Pure: repository facts arrive through :class:`HaveOracle`. The rules follow upload-pack.c's
``get_common_commits`` for a stateless (HTTP) round and ``process_haves_and_send_acks`` for v2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .fetch_request import FetchRequest, HavesEnd, MultiAck
from .oid import oid_hex

__all__ = ["HaveOracle", "V0Answer", "V2Answer", "negotiate_v0", "negotiate_v2"]


class HaveOracle(Protocol):
    """What negotiation needs to know about the repository."""

    def note_have(self, oid: bytes) -> bool:
        """Record a client have (a binary id); True when we have that object (it is common)."""

    def have_count(self) -> int:
        """How many distinct haves were recorded as common so far (``have_obj.nr``)."""

    def ok_to_give_up(self) -> bool:
        """True when every want reaches a common commit, so a pack can be cut now."""


@dataclass(frozen=True, slots=True)
class V0Answer:
    """Payloads to send (ACK/NAK lines) and whether the pack follows them."""

    lines: tuple[bytes, ...]
    send_pack: bool


@dataclass(frozen=True, slots=True)
class V2Answer:
    """``ack_lines`` is the acknowledgments section (None when it is left out)."""

    ack_lines: tuple[bytes, ...] | None
    send_pack: bool


def _ack(oid: bytes, suffix: bytes = b"") -> bytes:
    """An ACK line for the binary id ``oid``: the wire carries it in hex."""
    return b"ACK " + oid_hex(oid) + suffix + b"\n"


def negotiate_v0(req: FetchRequest, oracle: HaveOracle) -> V0Answer:
    """One stateless v0 round: the answer to the haves in ``req`` and what comes next.

    upload-pack.c answers every have line, repeats included; a repeat changes nothing it
    knows, so here each distinct answer line goes out once (600k copies of one have would
    otherwise cost 600k ACK lines and as many lookups). Flags and "last common have" still
    follow every line, so what the round decides (ready, NAK, the pack) is C git's.
    """
    if not req.wants or req.haves_end is HavesEnd.NONE:
        return V0Answer((), False)
    out: list[bytes] = []
    sent: set[bytes] = set()
    known: dict[bytes, bool] = {}  # have -> we have it (the oracle is asked once per id)
    got_common = got_other = sent_ready = False
    last: bytes | None = None

    def say(line: bytes) -> None:
        if line not in sent:
            sent.add(line)
            out.append(line)

    for have in req.haves:
        common = known.get(have)
        if common is None:
            common = known[have] = oracle.note_have(have)
        if common:
            got_common, last = True, have
            if req.multi_ack is MultiAck.DETAILED:
                say(_ack(have, b" common"))
            elif req.multi_ack is MultiAck.MULTI_ACK:
                say(_ack(have, b" continue"))
            elif oracle.have_count() == 1:
                say(_ack(have))
            continue
        got_other = True
        if req.multi_ack and oracle.ok_to_give_up():
            if req.multi_ack is MultiAck.DETAILED:
                sent_ready = True
                say(_ack(have, b" ready"))
            else:
                say(_ack(have, b" continue"))
    if req.haves_end is HavesEnd.DONE:
        if oracle.have_count() > 0:
            if req.multi_ack and last is not None:
                out.append(_ack(last))
        else:
            out.append(b"NAK\n")
        return V0Answer(tuple(out), True)
    # A flush: end of this round.
    if (
        req.multi_ack is MultiAck.DETAILED
        and got_common
        and not got_other
        and last is not None
        and oracle.ok_to_give_up()
    ):
        sent_ready = True
        out.append(_ack(last, b" ready"))
    if oracle.have_count() == 0 or req.multi_ack:
        out.append(b"NAK\n")
    if req.no_done and sent_ready and last is not None:
        out.append(_ack(last))
        return V0Answer(tuple(out), True)
    return V0Answer(tuple(out), False)


def negotiate_v2(req: FetchRequest, oracle: HaveOracle) -> V2Answer | None:
    """The v2 decision; ``None`` means the response is empty (no wants, nothing to say)."""
    if not req.wants and not req.want_refs and not req.wait_for_done:
        return None
    # One ACK per distinct common have. upload-pack.c before 2.45 repeated the ACK for
    # each repeated have line; since 2.45 (fae9627470) it ACKs its have_obj list, where
    # each object is once. Repeats tell the client nothing new.
    common = [have for have in dict.fromkeys(req.haves) if oracle.note_have(have)]
    if not req.haves or req.done:
        return V2Answer(None, True)
    lines = [b"acknowledgments\n"]
    if common:
        lines.extend(_ack(oid) for oid in common)
    else:
        lines.append(b"NAK\n")
    if not req.wait_for_done and oracle.ok_to_give_up():
        lines.append(b"ready\n")
        return V2Answer(tuple(lines), True)
    return V2Answer(tuple(lines), False)
