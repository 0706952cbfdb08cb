"""What the pack producer reads from below: one request's objects (its frozen pack list),
its commit source, the process's caches and the budget of large objects. Never the
request itself: packgen knows nothing of requests, HTTP or the pack cache above it."""

from __future__ import annotations

from dataclasses import dataclass

from ..graph.commits import CommitSource
from ..store.bigobjects import ByteBudget
from ..store.odb import ObjectSnapshot
from ..store.packs import PackFile
from .caches import PackCaches

__all__ = ["ObjectAccess", "DEFAULT_COLD_WALK_ENTRIES", "objects_where"]

DEFAULT_COLD_WALK_ENTRIES = 16384  # --cold-walk-pack-entries (choose.py _cold_budget)


@dataclass(frozen=True)
class ObjectAccess:
    """The objects one pack is produced from, and what producing it may use."""

    odb: ObjectSnapshot
    src: CommitSource
    caches: PackCaches
    inflate: ByteBudget  # --inflate-memory (writer.py _write_spilled)
    cold_walk_entries: int = DEFAULT_COLD_WALK_ENTRIES  # 0: never walk to spare a .rev

    def packs(self) -> list[PackFile]:
        """The frozen packs objects are read from: this repository's, then each
        alternate's, in order (a selection of entries is valid for these alone)."""
        return _packs(self.odb)

    def where(self) -> bytes:
        """The object directory, its hash length and frozen pack set, then those of each
        alternate it reads, in order: a repack, or an alternates file changed, is a new
        value."""
        return _where(self.odb)


def _packs(odb: ObjectSnapshot) -> list[PackFile]:
    return odb.packs + [p for alt in odb.alternates for p in _packs(alt)]


def objects_where(odb: ObjectSnapshot) -> bytes:
    """:meth:`ObjectAccess.where` of ``odb``, without the rest of an ObjectAccess."""
    return _where(odb)


def _where(odb: ObjectSnapshot) -> bytes:
    alts = b"".join(b"\0a" + _where(alt) for alt in odb.alternates)
    return (odb.objects_dir.encode() + b"\0%d\0" % odb.hash_len
            + repr([p.key for p in odb.packs]).encode() + alts)
