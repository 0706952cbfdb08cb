"""The v0/v1 ref advertisement (gitprotocol-pack "Reference Discovery", gitprotocol-http
"Smart Clients").

HEAD comes first, capabilities follow a NUL on the first line only, each peeled
``<oid> <tag>^{}`` line comes right after its tag, and an empty repository sends
``<zero-oid> capabilities^{}\\0<caps>``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from .refs import HeadInfo, Ref

__all__ = [
    "V0_BASE_CAPABILITIES",
    "V0_REQUEST_CAPABILITIES",
    "v0_request_capabilities",
    "format_service_header",
    "format_v0_capabilities",
    "iter_v0_advertisement",
    "iter_v0_ref_lines",
    "sorted_refs",
]

# The fixed part of upload-pack.c's v0 list, in C git's order.
V0_BASE_CAPABILITIES: tuple[bytes, ...] = (
    b"multi_ack",
    b"thin-pack",
    b"side-band",
    b"side-band-64k",
    b"ofs-delta",
    b"shallow",
    b"deepen-since",
    b"deepen-not",
    b"deepen-relative",
    b"no-progress",
    b"include-tag",
    b"multi_ack_detailed",
)

# What a v0 client may name back in its first want line (ARCHITECTURE.md P12): what
# format_v0_capabilities offers, by name, except the facts a client has no use to repeat
# (allow-*-sha1-in-want, symref). ``filter`` only when it was offered.
V0_REQUEST_CAPABILITIES: frozenset[bytes] = frozenset(V0_BASE_CAPABILITIES) | {
    b"no-done",
    b"session-id",
    b"object-format",
    b"agent",
}


def v0_request_capabilities(allow_filter: bool) -> frozenset[bytes]:
    """The capability names a v0 request may use, given whether ``filter`` is offered."""
    return V0_REQUEST_CAPABILITIES | {b"filter"} if allow_filter else V0_REQUEST_CAPABILITIES


def format_service_header(service: bytes) -> bytes:
    """gitprotocol-http: the payload of the smart-HTTP preamble line; a flush follows it."""
    return b"# service=" + service + b"\n"


def format_v0_capabilities(
    *,
    object_format: bytes,
    agent: bytes,
    head_target: bytes | None,
    allow_tip_sha1: bool = False,
    allow_reachable_sha1: bool = False,
    no_done: bool = True,
    allow_filter: bool = True,
    session_id: bytes | None = None,
) -> bytes:
    """The capability string of the first advertised line, in C git's order."""
    caps = list(V0_BASE_CAPABILITIES)
    if allow_tip_sha1:
        caps.append(b"allow-tip-sha1-in-want")
    if allow_reachable_sha1:
        caps.append(b"allow-reachable-sha1-in-want")
    if no_done:
        caps.append(b"no-done")
    if head_target is not None:
        caps.append(b"symref=HEAD:" + head_target)
    if allow_filter:
        caps.append(b"filter")
    if session_id is not None:
        caps.append(b"session-id=" + session_id)
    caps.append(b"object-format=" + object_format)
    caps.append(b"agent=" + agent)
    return b" ".join(caps)


def iter_v0_advertisement(
    head: HeadInfo | None,
    refs: Iterable[Ref],
    capabilities: bytes,
    zero_oid: bytes,
    version: int = 0,
) -> Iterator[bytes]:
    """Yield the payloads of the advertisement (without the service header and final flush).

    ``head`` is advertised first when it resolves; ``refs`` must already be sorted and
    stripped of hidden refs.
    """
    if version == 1:
        yield b"version 1\n"
    first = True
    if head is not None and head.oid is not None:
        yield head.oid + b" HEAD\0" + capabilities + b"\n"
        first = False
    for ref in refs:
        if first:
            yield ref.oid + b" " + ref.name + b"\0" + capabilities + b"\n"
            first = False
        else:
            yield ref.oid + b" " + ref.name + b"\n"
        if ref.peeled is not None:
            yield ref.peeled + b" " + ref.name + b"^{}\n"
    if first:
        yield zero_oid + b" capabilities^{}\0" + capabilities + b"\n"


def iter_v0_ref_lines(refs: Iterable[Ref]) -> Iterator[bytes]:
    """The payloads of ``refs`` in an advertisement whose first line (HEAD's, with the
    capabilities) is already out: what :func:`iter_v0_advertisement` yields for them then."""
    for ref in refs:
        yield ref.oid + b" " + ref.name + b"\n"
        if ref.peeled is not None:
            yield ref.peeled + b" " + ref.name + b"^{}\n"


def sorted_refs(refs: Sequence[Ref]) -> list[Ref]:
    """Refs sorted bytewise by name, as C git's ref iteration yields them."""
    return sorted(refs, key=lambda r: r.name)
