"""A protocol v2 command request (gitprotocol-v2 "Command Request").

    request = empty-request | command-request
    command-request = command capability-list delim-pkt command-args flush-pkt
    command = PKT-LINE("command=" key LF)

The capability section may also end with a flush when there are no arguments. Over HTTP
every POST carries one command; anything after its closing flush is ignored, as C git's
stateless serve loop does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from .capabilities import V2Features
from .errors import ClientError
from .pktline import MAX_REQUEST_PKTS, Pkt, PktKind, iter_pkts

__all__ = ["CommandRequest", "parse_command_request", "KNOWN_COMMANDS"]

KNOWN_COMMANDS = frozenset({b"ls-refs", b"fetch", b"object-info", b"bundle-uri"})
_MAX_CAPABILITY_LINES = 1024


@dataclass(frozen=True, slots=True)
class CommandRequest:
    """The command, the client capabilities it sent, and the raw argument lines."""

    command: bytes
    agent: bytes | None
    object_format: bytes | None
    session_id: bytes | None
    server_options: tuple[bytes, ...]
    args: tuple[bytes, ...]


@dataclass
class _Caps:
    """The capability section of a request as it is read."""

    command: bytes | None = None
    agent: bytes | None = None
    object_format: bytes | None = None
    session_id: bytes | None = None
    server_options: list[bytes] = field(default_factory=list)


def _take_capabilities(pkts: list[Pkt], features: V2Features) -> tuple[_Caps, int]:
    caps = _Caps()
    i = 0
    while i < len(pkts):
        pkt = pkts[i]
        i += 1
        if pkt.kind is PktKind.DELIM:
            return caps, i
        if pkt.kind is PktKind.FLUSH:
            return caps, i - 1
        if pkt.kind is not PktKind.DATA:
            raise ClientError("protocol error: unexpected response-end packet in request")
        if i > _MAX_CAPABILITY_LINES:
            raise ClientError("protocol error: too many capability lines")
        _take_capability(pkt.text, caps, features)
    raise ClientError("protocol error: request ended before its flush")


def _take_capability(line: bytes, caps: _Caps, features: V2Features) -> None:
    key, eq, value = line.partition(b"=")
    if key == b"command" and eq:
        if caps.command is not None:
            raise ClientError("protocol error: command requested more than once")
        # A command not advertised is no command (serve.c: its advertise() said no).
        if value not in KNOWN_COMMANDS or (value == b"bundle-uri" and not features.bundle_uri):
            shown = value[:100].decode("utf-8", "replace")
            raise ClientError(f"invalid command '{shown}'")
        caps.command = value
    elif key == b"agent" and eq:
        caps.agent = value
    elif key == b"object-format" and eq:
        if value != features.object_format:
            raise ClientError(
                "mismatched object format: server "
                f"{features.object_format.decode()}; client {value[:20].decode('utf-8', 'replace')}"
            )
        caps.object_format = value
    elif key == b"session-id" and eq and features.session_id is not None:
        caps.session_id = value
    elif key == b"server-option" and eq:
        caps.server_options.append(value)
    else:
        shown = line[:100].decode("utf-8", "replace")
        raise ClientError(f"unknown capability '{shown}'")


def _take_args(pkts: list[Pkt], start: int, limit: int) -> tuple[bytes, ...]:
    args: list[bytes] = []
    for pkt in pkts[start:]:
        if pkt.kind is PktKind.FLUSH:
            return tuple(args)
        if pkt.kind is not PktKind.DATA:
            raise ClientError("protocol error: expected flush after command arguments")
        if len(args) >= limit:
            raise ClientError("protocol error: too many arguments")
        args.append(pkt.text)
    raise ClientError("protocol error: expected flush after command arguments")


def parse_command_request(
    body: bytes | Iterable[Pkt], features: V2Features, max_args: int = 1_000_000,
    max_pkts: int = MAX_REQUEST_PKTS,
) -> CommandRequest | None:
    """Parse one v2 request body. ``None`` means an empty request (a lone flush). More than
    ``max_pkts`` pkt-lines before the request's end is a 413 :class:`ClientError`."""
    pkts = _until_request_end(iter_pkts(body, max_pkts) if isinstance(body, bytes) else iter(body))
    if not pkts:
        raise ClientError("protocol error: empty request")
    if pkts[0].kind is PktKind.FLUSH:
        return None
    caps, pos = _take_capabilities(pkts, features)
    if caps.command is None:
        raise ClientError("no command requested")
    if caps.object_format is None and features.object_format != b"sha1":
        # serve.c: a client that names no object format means SHA-1.
        raise ClientError(
            f"mismatched object format: server {features.object_format.decode()}; client sha1"
        )
    args = _take_args(pkts, pos, max_args)
    return CommandRequest(
        command=caps.command,
        agent=caps.agent,
        object_format=caps.object_format,
        session_id=caps.session_id,
        server_options=tuple(caps.server_options),
        args=args,
    )


def _until_request_end(pkts: Iterator[Pkt]) -> list[Pkt]:
    """Packets up to and including the flush that ends the request; later bytes are never
    decoded (C git's stateless serve loop stops reading there)."""
    out: list[Pkt] = []
    for pkt in pkts:
        out.append(pkt)
        if pkt.kind is PktKind.FLUSH:
            break
    return out
