"""The upload request: v0/v1 (gitprotocol-pack "Packfile Negotiation") and the v2 ``fetch``
arguments (gitprotocol-v2 "fetch") both become one typed :class:`FetchRequest`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from .capabilities import V2Features
from .errors import ClientError
from .filters import FilterSpec, parse_filter_spec
from .oid import parse_oid
from .pktline import MAX_REQUEST_PKTS, Pkt, PktKind, iter_pkts

__all__ = [
    "MultiAck",
    "Sideband",
    "HavesEnd",
    "FetchRequest",
    "parse_v0_request",
    "parse_v2_fetch_args",
    "INFINITE_DEPTH",
    "MAX_WANTS",
    "MAX_HAVES",
    "MAX_SHALLOWS",
    "MAX_DEEPEN_NOT",
]

# fetch-pack sends this depth for --unshallow (shallow.h INFINITE_DEPTH).
INFINITE_DEPTH = 0x7FFFFFFF

# Caps on what one fetch request may list (distinct entries; repeats cost nothing more).
# What real clients send: fetch-pack asks for one want (or, with ref-in-want, one want-ref)
# per distinct ref tip it lacks, so a mirror fetch of N refs sends up to N; it resends its
# whole shallow file (one line per boundary commit, at most about one per ref after a
# --depth clone); in a stateless round it sends the haves found common so far plus one
# batch (16, 32, ... 16384, then +10% a round), so haves grow with the client's history.
# A million each is more than the HTTP layer lets through anyway (its cap on pkt-lines
# per body), so no real client meets these; they bound the work of a request on any
# transport. deepen-not lines come from --shallow-exclude arguments typed by a person.
MAX_WANTS = 1_000_000  # want and want-ref lines together
MAX_HAVES = 1_000_000
MAX_SHALLOWS = 1_000_000
MAX_DEEPEN_NOT = 10_000


def _too_many(what: str, cap: int) -> ClientError:
    return ClientError(f"git upload-pack: too many {what} lines (at most {cap:,} per request)")


class MultiAck(enum.IntEnum):
    NONE = 0
    MULTI_ACK = 1
    DETAILED = 2


class Sideband(enum.IntEnum):
    NONE = 0
    SMALL = 1  # side-band: 1000-byte packets
    LARGE = 2  # side-band-64k, and always in v2


class HavesEnd(enum.Enum):
    """How a v0 body ends after its want section."""

    NONE = "none"  # EOF right after the wants' flush (a stateless "shallow only" round)
    FLUSH = "flush"  # a negotiation round: answer ACK/NAK and stop
    DONE = "done"  # the final round: answer, then send the pack


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """Everything a client asked for in one fetch, in either protocol version.

    ``wants``, ``haves`` and ``shallows`` are binary object ids (converted once, from hex,
    by the parser); ``want_refs`` and ``deepen_not`` are ref names as sent.
    """

    version: int
    wants: tuple[bytes, ...] = ()
    want_refs: tuple[bytes, ...] = ()
    haves: tuple[bytes, ...] = ()
    shallows: tuple[bytes, ...] = ()
    depth: int = 0
    deepen_since: int | None = None
    deepen_not: tuple[bytes, ...] = ()
    deepen_relative: bool = False
    filter: FilterSpec | None = None
    done: bool = False
    thin_pack: bool = False
    ofs_delta: bool = False
    no_progress: bool = False
    include_tag: bool = False
    wait_for_done: bool = False
    sideband_all: bool = False
    multi_ack: MultiAck = MultiAck.NONE
    no_done: bool = False
    sideband: Sideband = Sideband.LARGE
    haves_end: HavesEnd = HavesEnd.DONE
    agent: bytes | None = None
    session_id: bytes | None = None
    # packfile-uris: the URI protocols the client takes (empty without sideband-all, as
    # upload-pack.c drops them: the section is written in sideband-all framing)
    uri_protocols: tuple[bytes, ...] = ()

    @property
    def deepen_rev_list(self) -> bool:
        """deepen-since or deepen-not was asked for (upload-pack.c ``deepen_rev_list``)."""
        return self.deepen_since is not None or bool(self.deepen_not)

    @property
    def deepen(self) -> bool:
        """Any form of deepen was asked for."""
        return self.depth > 0 or self.deepen_rev_list


@dataclass
class _Builder:
    """Collects one request's lines. Wants, want-refs and shallows are kept in dicts used
    as ordered sets: a repeated line costs one hash lookup, never a scan of the list."""

    hex_len: int
    wants: dict[bytes, None] = field(default_factory=dict)
    want_refs: dict[bytes, None] = field(default_factory=dict)
    haves: list[bytes] = field(default_factory=list)
    shallows: dict[bytes, None] = field(default_factory=dict)
    depth: int = 0
    deepen_since: int | None = None
    deepen_not: list[bytes] = field(default_factory=list)
    filter: FilterSpec | None = None
    flags: dict[str, object] = field(default_factory=dict)

    def add_want(self, oid: bytes) -> None:
        if oid not in self.wants:
            if len(self.wants) + len(self.want_refs) >= MAX_WANTS:
                raise _too_many("want", MAX_WANTS)
            self.wants[oid] = None

    def add_want_ref(self, ref: bytes) -> None:
        if ref in self.want_refs:
            raise ClientError(f"duplicate want-ref {ref.decode('utf-8', 'replace')}")
        if len(self.wants) + len(self.want_refs) >= MAX_WANTS:
            raise _too_many("want", MAX_WANTS)
        self.want_refs[ref] = None

    def add_have(self, oid: bytes) -> None:
        # Repeats are kept (negotiation answers each distinct have once); the cap counts
        # lines, which is what parsing them costs.
        if len(self.haves) >= MAX_HAVES:
            raise _too_many("have", MAX_HAVES)
        self.haves.append(oid)

    def shallow_or_deepen(self, line: bytes) -> bool:
        """Consume a shallow/deepen line shared by both versions; False if it is not one."""
        if line.startswith(b"shallow "):
            oid = parse_oid(line[8:], self.hex_len)
            if oid not in self.shallows:
                if len(self.shallows) >= MAX_SHALLOWS:
                    raise _too_many("shallow", MAX_SHALLOWS)
                self.shallows[oid] = None
        elif line.startswith(b"deepen "):
            self.depth = _parse_positive(line[7:], "deepen")
        elif line.startswith(b"deepen-since "):
            self.deepen_since = _parse_positive(line[13:], "deepen-since")
        elif line.startswith(b"deepen-not "):
            ref = line[11:]
            if not ref or len(ref) > 4096:
                raise ClientError("git upload-pack: deepen-not is not a ref")
            if len(self.deepen_not) >= MAX_DEEPEN_NOT:
                raise _too_many("deepen-not", MAX_DEEPEN_NOT)
            self.deepen_not.append(ref)
        else:
            return False
        return True

    def take_filter(self, spec: bytes) -> None:
        if self.filter is not None:
            raise ClientError("multiple filter-specs cannot be combined")
        self.filter = parse_filter_spec(spec)

    def check_deepen(self) -> None:
        if self.depth > 0 and (self.deepen_since is not None or self.deepen_not):
            raise ClientError(
                "git upload-pack: deepen and deepen-since (or deepen-not) cannot be used together"
            )

    def build(self, **kw: object) -> FetchRequest:
        self.check_deepen()
        return FetchRequest(
            wants=tuple(self.wants),
            want_refs=tuple(self.want_refs),
            haves=tuple(self.haves),
            shallows=tuple(self.shallows),
            depth=self.depth,
            deepen_since=self.deepen_since,
            deepen_not=tuple(self.deepen_not),
            filter=self.filter,
            **kw,  # type: ignore[arg-type]
        )


def _parse_positive(text: bytes, what: str) -> int:
    if not text.isdigit() or len(text) > 19:
        shown = text[:40].decode("utf-8", "replace")
        raise ClientError(f"Invalid {what}: {shown}")
    value = int(text)
    if value <= 0:
        raise ClientError(f"Invalid {what}: {value}")
    return value


# ---------------------------------------------------------------- v0 / v1


def _split_want(line: bytes, hex_len: int) -> tuple[bytes, list[bytes]]:
    rest = line[len(b"want ") :]
    oid, _, features = rest.partition(b" ")
    return parse_oid(oid, hex_len), [f for f in features.split(b" ") if f]


def _check_v0_caps(features: Iterable[bytes], advertised: frozenset[bytes]) -> dict[bytes, bytes]:
    """Map requested capability names to values; refuse any we did not advertise."""
    caps: dict[bytes, bytes] = {}
    for feature in features:
        name, _, value = feature.partition(b"=")
        if name not in advertised:
            shown = feature[:100].decode("utf-8", "replace")
            raise ClientError(f"git upload-pack: capability '{shown}' was not advertised")
        caps[name] = value
    if b"side-band" in caps and b"side-band-64k" in caps:
        raise ClientError("git upload-pack: side-band and side-band-64k exclude each other")
    return caps


def _v0_flags(caps: dict[bytes, bytes], object_format: bytes) -> dict[str, object]:
    fmt = caps.get(b"object-format")
    if fmt is not None and fmt != object_format:
        raise ClientError(
            f"git upload-pack: mismatched object format: server {object_format.decode()}"
        )
    if b"multi_ack_detailed" in caps:
        multi_ack = MultiAck.DETAILED
    elif b"multi_ack" in caps:
        multi_ack = MultiAck.MULTI_ACK
    else:
        multi_ack = MultiAck.NONE
    if b"side-band-64k" in caps:
        sideband = Sideband.LARGE
    elif b"side-band" in caps:
        sideband = Sideband.SMALL
    else:
        sideband = Sideband.NONE
    return {
        "multi_ack": multi_ack,
        "sideband": sideband,
        "no_done": b"no-done" in caps,
        "thin_pack": b"thin-pack" in caps,
        "ofs_delta": b"ofs-delta" in caps,
        "no_progress": b"no-progress" in caps,
        "include_tag": b"include-tag" in caps,
        "deepen_relative": b"deepen-relative" in caps,
        "agent": caps.get(b"agent"),
        "session_id": caps.get(b"session-id"),
    }


def _read_v0_wants(
    pkts: Sequence[Pkt], b: _Builder, advertised: frozenset[bytes], object_format: bytes
) -> int:
    features: list[bytes] = []
    for i, pkt in enumerate(pkts):
        if pkt.kind is PktKind.FLUSH:
            b.flags = _v0_flags(_check_v0_caps(features, advertised), object_format)
            if b.filter is not None and b"filter" not in _names(features):
                raise ClientError("git upload-pack: filtering capability not negotiated")
            return i + 1
        if pkt.kind is not PktKind.DATA:
            raise ClientError("protocol error: unexpected special packet in want list")
        line = pkt.text
        if b.shallow_or_deepen(line):
            continue
        if line.startswith(b"filter "):
            b.take_filter(line[7:])
            continue
        if not line.startswith(b"want "):
            shown = line[:100].decode("utf-8", "replace")
            raise ClientError(
                f"git upload-pack: protocol error, expected to get object ID, not '{shown}'"
            )
        oid, feats = _split_want(line, b.hex_len)
        b.add_want(oid)
        features.extend(feats)
    raise ClientError("protocol error: want list ended without a flush")


def _names(features: Iterable[bytes]) -> set[bytes]:
    return {f.partition(b"=")[0] for f in features}


def _read_v0_haves(pkts: Sequence[Pkt], start: int, b: _Builder) -> HavesEnd:
    if start >= len(pkts):
        return HavesEnd.NONE
    for pkt in pkts[start:]:
        if pkt.kind is PktKind.FLUSH:
            return HavesEnd.FLUSH
        if pkt.kind is not PktKind.DATA:
            raise ClientError("protocol error: unexpected special packet in have list")
        line = pkt.text
        if line == b"done":
            return HavesEnd.DONE
        if not line.startswith(b"have "):
            shown = line[:100].decode("utf-8", "replace")
            raise ClientError(f"git upload-pack: expected SHA1 list, got '{shown}'")
        b.add_have(parse_oid(line[5:], b.hex_len))
    raise ClientError("protocol error: have list ended without flush or done")


def _until_v0_end(pkts: Iterator[Pkt]) -> list[Pkt]:
    """Packets of the want section and of the have section (up to its flush or ``done``);
    upload-pack stops reading there, so later bytes are never decoded."""
    out: list[Pkt] = []
    flushes = 0
    for pkt in pkts:
        out.append(pkt)
        if pkt.kind is PktKind.FLUSH:
            flushes += 1
            if flushes == 2:
                break
        elif flushes == 1 and pkt.kind is PktKind.DATA and pkt.text == b"done":
            break
    return out


def parse_v0_request(
    body: bytes | Sequence[Pkt],
    advertised: frozenset[bytes],
    object_format: bytes = b"sha1",
    hex_len: int = 40,
    max_pkts: int = MAX_REQUEST_PKTS,
) -> FetchRequest:
    """Parse a stateless v0/v1 upload-pack POST body.

    ``advertised`` holds the capability names we offered (``agent``, ``filter``...).
    A body that is only a flush (git's probe POST) yields a request with no wants. More
    than ``max_pkts`` pkt-lines before the request's end is a 413 :class:`ClientError`.
    """
    pkts = _until_v0_end(iter_pkts(body, max_pkts) if isinstance(body, bytes) else iter(body))
    b = _Builder(hex_len)
    pos = _read_v0_wants(pkts, b, advertised, object_format)
    haves_end = _read_v0_haves(pkts, pos, b) if b.wants else HavesEnd.NONE
    flags = b.flags
    return b.build(
        version=0,
        haves_end=haves_end,
        done=haves_end is HavesEnd.DONE,
        **flags,
    )


# ---------------------------------------------------------------- v2

_V2_FLAGS = {
    b"thin-pack": "thin_pack",
    b"ofs-delta": "ofs_delta",
    b"no-progress": "no_progress",
    b"include-tag": "include_tag",
    b"done": "done",
    b"wait-for-done": "wait_for_done",
    b"deepen-relative": "deepen_relative",
}


def _take_v2_line(line: bytes, b: _Builder, features: V2Features) -> None:
    flag = _V2_FLAGS.get(line)
    if flag is not None:
        b.flags[flag] = True
    elif line.startswith(b"want "):
        b.add_want(parse_oid(line[5:], b.hex_len))
    elif line.startswith(b"have "):
        b.add_have(parse_oid(line[5:], b.hex_len))
    elif b.shallow_or_deepen(line):
        pass
    elif features.allow_ref_in_want and line.startswith(b"want-ref "):
        b.add_want_ref(line[9:])
    elif features.allow_filter and line.startswith(b"filter "):
        b.take_filter(line[7:])
    elif features.allow_sideband_all and line == b"sideband-all":
        b.flags["sideband_all"] = True
    elif features.packfile_uris and line.startswith(b"packfile-uris "):
        if "uri_protocols" in b.flags:
            raise ClientError("multiple packfile-uris lines forbidden")
        b.flags["uri_protocols"] = tuple(p for p in line[14:].split(b",") if p)
    else:
        shown = line[:100].decode("utf-8", "replace")
        raise ClientError(f"unexpected line: '{shown}'")


def parse_v2_fetch_args(
    args: Sequence[bytes], features: V2Features, hex_len: int = 40
) -> FetchRequest:
    """Parse the argument lines of a v2 ``fetch`` command."""
    b = _Builder(hex_len)
    for line in args:
        _take_v2_line(line, b, features)
    if not b.flags.get("sideband_all"):
        b.flags.pop("uri_protocols", None)
    return b.build(version=2, sideband=Sideband.LARGE, **b.flags)
