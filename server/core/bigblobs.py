"""Large blobs as packfile URIs to packs gitspout writes itself (``--blob-uri-threshold``;
gitprotocol-v2 "packfile-uris", Documentation/technical/packfile-uri).

A fetch whose client accepts the protocol gitspout was reached by (``packfile-uris
http``) leaves out of its pack every blob of at least the threshold that is stored whole
in a pack (the candidates: found once per pack, ``store/packscan.py``), and the app lists
a one-blob pack of each instead (``app/blobpacks.py``). The candidates are every such
blob of the repository; packgen takes out only those the pack would have held
(``packgen/choose.py`` ``_exclude``), which are reachable from the wants: nothing
reachable only from a hidden ref is ever named (I7). A blob stored as a delta, or loose,
stays in the pack: finding its size would cost a read of every delta's header.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..store.packs import PackFile
from ..store.packscan import large_whole_blobs

__all__ = ["BlobUriPolicy", "LargeBlob", "large_blobs"]


@dataclass(frozen=True)
class LargeBlob:
    """A blob stored whole at ``offset`` of ``pack``; its compressed data ends at ``end``."""

    oid: bytes
    pack: PackFile
    offset: int
    end: int
    size: int


@dataclass(frozen=True)
class BlobUriPolicy:
    """What the server allows (app/blobpacks.py): blobs of ``threshold`` bytes or more
    whose stored data fits ``max_bytes``, to a client that accepts ``scheme``; ``line``
    keeps the blob's pack and gives its ``<pack-hash> <uri>``, or None when it cannot."""

    threshold: int
    max_bytes: int
    scheme: bytes
    line: Callable[[LargeBlob], bytes | None]


def large_blobs(packs: list[PackFile], policy: BlobUriPolicy) -> dict[bytes, LargeBlob]:
    """Binary id -> the candidate blobs of the frozen ``packs`` (blocking)."""
    out: dict[bytes, LargeBlob] = {}
    for pack in packs:
        for blob in _of_pack(pack, policy.threshold):
            if blob.end - blob.offset <= policy.max_bytes:
                out.setdefault(blob.oid, blob)
    return out


def _of_pack(pack: PackFile, threshold: int) -> tuple[LargeBlob, ...]:
    def compute() -> tuple[tuple[LargeBlob, ...], int]:
        offs, order = pack.sorted_offsets, pack.pack_order
        found = tuple(LargeBlob(pack.oid_at(order[rank]), pack, offs[rank], offs[rank + 1],
                                size) for rank, size in large_whole_blobs(pack, threshold))
        return found, 150 * len(found)

    blobs: tuple[LargeBlob, ...] = pack.derived(f"large-blobs-{threshold}", compute)
    return blobs
