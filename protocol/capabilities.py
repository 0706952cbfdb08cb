"""The protocol v2 capability advertisement (gitprotocol-v2 "Capability Advertisement")."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["V2Features", "iter_v2_capabilities", "fetch_features"]


@dataclass(frozen=True, slots=True)
class V2Features:
    """What this server offers a v2 client, decided from server and repository config."""

    agent: bytes
    object_format: bytes = b"sha1"
    allow_filter: bool = True
    allow_ref_in_want: bool = False
    allow_sideband_all: bool = False
    advertise_unborn: bool = True
    session_id: bytes | None = None
    bundle_uri: bool = False  # uploadpack.advertiseBundleURIs, or bundles of gitspout's own
    packfile_uris: bool = False  # uploadpack.blobPackfileUri, or large blobs by URI


def fetch_features(f: V2Features) -> list[bytes]:
    """The value of ``fetch=``: the fetch features, in C git's order."""
    feats = [b"shallow", b"wait-for-done"]
    if f.allow_filter:
        feats.append(b"filter")
    if f.allow_ref_in_want:
        feats.append(b"ref-in-want")
    if f.allow_sideband_all:
        feats.append(b"sideband-all")
    if f.packfile_uris:
        feats.append(b"packfile-uris")
    return feats


def iter_v2_capabilities(f: V2Features) -> Iterator[bytes]:
    """Payloads of ``version 2`` and one packet per ``key[=value]``; the flush is the caller's."""
    yield b"version 2\n"
    yield b"agent=" + f.agent + b"\n"
    yield (b"ls-refs=unborn\n" if f.advertise_unborn else b"ls-refs\n")
    yield b"fetch=" + b" ".join(fetch_features(f)) + b"\n"
    yield b"server-option\n"
    yield b"object-format=" + f.object_format + b"\n"
    if f.session_id is not None:
        yield b"session-id=" + f.session_id + b"\n"
    yield b"object-info\n"
    if f.bundle_uri:
        yield b"bundle-uri\n"  # serve.c lists it last
