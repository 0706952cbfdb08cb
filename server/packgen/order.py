"""A pack order: what one fetch's pack holds and how its bytes are written, decided by the
core before the response starts (``core/fetch.py``) and frozen.

Its :attr:`PackOrder.key` is the one key of everything computed from an order: the object
walks, selections and filtered closures kept across requests (``choose.py``) and, with the
pack set the objects are read from, the pack cache's entries (:meth:`.stream.PackStream.key`).
Objects are immutable, so equal orders over equal pack sets give equal packs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

from gitspout.protocol.filters import FilterSpec

from ..store.objformat import ids_digest

__all__ = ["PackOrder"]


@dataclass(frozen=True)
class PackOrder:
    """What to send and how (gitprotocol-pack "Packfile Data", pack-objects' options)."""

    # Wants resolved against the visible refs (want-ref included), with the parents a
    # deepen adds: ``rev-list --objects`` starts here.
    wants: tuple[bytes, ...]
    # The haves found common (the negotiation's), and the client's shallow commits a
    # deepen unshallows: their trees are on the client, only their parents' history is new
    # (upload-pack.c send_unshallow passes them to pack-objects as edges).
    common: tuple[bytes, ...] = ()
    unshallow: tuple[bytes, ...] = ()
    shallow_cut: frozenset[bytes] = frozenset()  # commits whose parents are not sent
    deepen: bool = False  # a shallow list is part of the answer: no bitmaps
    grafts: frozenset[bytes] = frozenset()  # the repository's own shallow commits
    filter: FilterSpec | None = None
    thin: bool = False  # thin-pack, and the client has something to be thin against
    ofs_delta: bool = False
    # include-tag: (tag object, peeled target) of each visible annotated tag; () without it
    tags: tuple[tuple[bytes, bytes], ...] = ()
    # objects the client downloads by packfile URI instead (core/offload.py): left out
    exclude: frozenset[bytes] = frozenset()

    @property
    def haves(self) -> list[bytes]:
        """What the client has: the common haves, then the unshallowed commits."""
        return list(dict.fromkeys(self.common + self.unshallow))

    @property
    def shallow(self) -> bool:
        """The walk has a shallow boundary (bitmaps know none)."""
        return self.deepen or bool(self.shallow_cut)

    @cached_property
    def key(self) -> bytes:
        """What the pack's objects and bytes are a function of. Side-band, progress and the
        protocol version only change the framing; who asks changes nothing."""
        ids = ids_digest(self.wants, self.common, self.unshallow, self.shallow_cut,
                         self.grafts, (t for pair in self.tags for t in pair),
                         self.exclude)
        how = b"%d%d%d" % (self.deepen, self.thin, self.ofs_delta) + repr(self.filter).encode()
        return hashlib.sha256(ids + how).digest()
