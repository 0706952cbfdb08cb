"""Packfile URIs of configured objects (gitprotocol-v2 "packfile-uris",
Documentation/technical/packfile-uri): ``uploadpack.blobPackfileUri`` values
``<object-hash> <pack-hash> <uri>`` name objects the client downloads itself, as a pack at
``<uri>``, instead of receiving them in the fetch's pack.

C git checks the values only when pack-objects runs with ``--uri-protocol`` (its
``git_pack_config`` dies on a malformed or repeated one); so does this. An object is left
out when the client listed a protocol that the URI starts with, followed by ``:``
(pack-objects.c ``want_object_in_pack_mtime``), and only if the pack would have held it:
what the pack holds is reachable from the wants, so nothing reachable only from a hidden
ref is ever named (I7).

One difference, on purpose: C git 2.55 reaches that check only for objects stored loose
(an object found in a pack is wanted before it), so a packed repository sends no URI at
all; gitspout leaves the object out wherever it is stored, as the design document says
("Whenever the list of objects to be sent is assembled, all such blobs are excluded").
"""

from __future__ import annotations

import binascii
from collections.abc import Sequence

from ..store.gitconfig import ConfigFileError

__all__ = ["offload_lines"]


def offload_lines(values: Sequence[bytes], protocols: Sequence[bytes],
                  hash_len: int) -> dict[bytes, bytes]:
    """Binary object id -> its ``<pack-hash> <uri>`` line, for every configured object
    whose URI uses one of ``protocols``, in config order. Raises :class:`ConfigFileError`
    where pack-objects dies."""
    out: dict[bytes, bytes] = {}
    seen: set[bytes] = set()
    hex_len = 2 * hash_len
    for value in values:
        oid, pack_hash, uri = _parse(value, hex_len)
        if oid in seen:
            raise ConfigFileError("object already configured in another "
                                  f"uploadpack.blobpackfileuri (got '{_show(value)}')")
        seen.add(oid)
        if any(uri.startswith(p + b":") for p in protocols):
            out[oid] = pack_hash + b" " + uri
    return out


def _parse(value: bytes, hex_len: int) -> tuple[bytes, bytes, bytes]:
    oid_hex, pack_hash = value[:hex_len], value[hex_len + 1:2 * hex_len + 1]
    seps = value[hex_len:hex_len + 1] + value[2 * hex_len + 1:2 * hex_len + 2]
    try:
        if seps != b"  " or len(pack_hash) != hex_len:
            raise ValueError
        binascii.unhexlify(pack_hash)
        oid = binascii.unhexlify(oid_hex)
    except (ValueError, binascii.Error):
        raise ConfigFileError("value of uploadpack.blobpackfileuri must be of the form "
                              f"'<object-hash> <pack-hash> <uri>' (got '{_show(value)}')"
                              ) from None
    return oid, pack_hash, value[2 * hex_len + 2:]


def _show(value: bytes) -> str:
    return value[:300].decode("utf-8", "replace")
