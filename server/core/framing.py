"""A fetch response framed up to its pack (gitprotocol-v2 "fetch", gitprotocol-pack
"Packfile Negotiation"): the lines ``protocol/fetch_response.py`` lays out, as the 32 KiB
chunks the writer sends, made in the pool with the plan (many haves make megabytes of ACK
lines, seconds of Python), so that the event loop only writes them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from gitspout.protocol.fetch_request import Sideband
from gitspout.protocol.fetch_response import Mark, iter_v0_fetch_response, iter_v2_fetch_response
from gitspout.protocol.negotiate import V0Answer
from gitspout.protocol.pktline import DELIM_PKT, FLUSH_PKT, PktBuffer
from gitspout.protocol.sideband import BAND_DATA, band_payload

from .fetch import FetchPlan

__all__ = ["PktSection", "ResponseHead", "frame_fetch", "frame_empty_v0"]


class PktSection:
    """Pkt-lines framed ahead of time into the chunks a writer sends (``pkt``,
    ``flush_pkt``, ``delim_pkt``, then :meth:`take`): each of 32 KiB or more but the last.
    Under sideband-all, data lines go on band 1 (gitprotocol-v2 "fetch")."""

    def __init__(self, sideband_all: bool = False, chunk_size: int = 32 * 1024) -> None:
        self.sideband_all = sideband_all
        self.buf = PktBuffer(chunk_size)
        self.out: list[bytes] = []

    def _keep(self, chunk: bytes | None) -> None:
        if chunk:
            self.out.append(chunk)

    def pkt(self, payload: bytes) -> None:
        """One data pkt-line (band 1 under sideband-all)."""
        if self.sideband_all:
            payload = band_payload(BAND_DATA, payload)
        self._keep(self.buf.add(payload))

    def pkts(self, payloads: Iterable[bytes]) -> None:
        for payload in payloads:
            self.pkt(payload)

    def flush_pkt(self) -> None:
        self._keep(self.buf.add_raw(FLUSH_PKT))

    def delim_pkt(self) -> None:
        self._keep(self.buf.add_raw(DELIM_PKT))

    def frame(self, items: Iterator[bytes | Mark]) -> bool:
        """Frame a response laid out by protocol/fetch_response.py up to :data:`Mark.PACK`;
        True when the pack comes there (the rest of ``items`` follows it)."""
        for item in items:
            if isinstance(item, bytes):
                self.pkt(item)
            elif item is Mark.FLUSH:
                self.flush_pkt()
            elif item is Mark.DELIM:
                self.delim_pkt()
            else:
                return True
        return False

    def take(self) -> list[bytes]:
        """Every chunk so far, the last one possibly short (what a drain would write)."""
        self._keep(self.buf.take())
        out, self.out = self.out, []
        return out


@dataclass
class ResponseHead:
    """A fetch response framed up to the pack: the chunks before it, whether the pack
    comes, and the items after it (a flush at most: framed by the writer)."""

    before: list[bytes]
    pack: bool
    after: Iterator[bytes | Mark]

    @classmethod
    def of(cls, items: Iterator[bytes | Mark], sideband_all: bool = False) -> ResponseHead:
        section = PktSection(sideband_all=sideband_all)
        pack = section.frame(items)
        return cls(section.take(), pack, items)


def frame_fetch(plan: FetchPlan, packfile_uris: Sequence[bytes] = ()) -> ResponseHead:
    """The response to a planned fetch, up to its pack: v0's shallow list and ACK/NAK
    lines; v2's acknowledgments, shallow-info, wanted-refs, packfile-uris (``<pack-hash>
    <uri>`` lines) and the packfile line."""
    req, shallow = plan.req, plan.shallow
    lines: dict[str, Any] = {"shallow": shallow.shallow, "unshallow": shallow.unshallow,
                             "deepen": shallow.sent}
    if isinstance(plan.answer, V0Answer):
        return ResponseHead.of(iter_v0_fetch_response(
            plan.answer, **lines, sideband=req.sideband is not Sideband.NONE))
    items = iter_v2_fetch_response(plan.answer, **lines, client_shallow=bool(shallow.cut),
                                   wanted_refs=plan.wanted_refs, packfile_uris=packfile_uris)
    return ResponseHead.of(items, sideband_all=req.sideband_all)


def frame_empty_v0() -> ResponseHead:
    """A v0 request without wants: nothing to say (upload-pack ends at once)."""
    return ResponseHead.of(iter_v0_fetch_response(None))
