"""Storage faults: one base type for everything wrong with a repository's files
(docs/ARCHITECTURE.md "Errors").

A :class:`StorageError` is never the client's fault. Before the response starts it is
answered 500; after that, in-band (``ERR`` or side-band 3). The client is told which
repository failed and ``what`` went wrong in a few words, never a file-system path; the
log line names the pack (``pack``) and carries the full message.

The subclasses keep the names their modules have always used:

- ``store.odb.ObjectStoreError``: the object store is damaged (a corrupt loose object, a
  delta chain too long, an object that is not what it should be); ``store.odb.MissingObject``
  below it.
- ``store.packs.PackFormatError``: a pack or index file cannot be read (truncated, foreign,
  an entry whose zlib data is garbage).
- ``store.bitmaps.BitmapFormatError``, ``store.commitgraph.CommitGraphError``: auxiliary
  files; their readers fall back (a walk, parsed commits) instead of failing the request.
- a ``StorageError`` of kind ``packed-refs`` (store/packedrefs.py): a line of packed-refs that is
  not one git writes.

``kind`` names the file at fault (``store/faults.py`` KINDS), for the metric.
"""

from __future__ import annotations

__all__ = ["StorageError", "ObjectStoreError", "MissingObject"]


class StorageError(Exception):
    """The repository's storage is damaged or unreadable.

    ``pack`` is the file name (``pack-<id>.pack``, no directory) of the pack at fault,
    when one is known; ``what`` is a short, path-free description for the client.
    """

    pack: str | None = None
    path: str | None = None  # the damaged file, when known (logged, never told the client)
    what = "storage fault"
    kind = "object"  # the file kind counted in gitspout_storage_faults_total (store/faults.py)

    def __init__(self, message: str = "", *, pack: str | None = None, kind: str | None = None,
                 what: str | None = None) -> None:
        super().__init__(message)
        if pack is not None:
            self.pack = pack
        if kind is not None:
            self.kind = kind
        if what is not None:
            self.what = what


class ObjectStoreError(StorageError):
    """The repository's object store is damaged or unreadable."""

    what = "damaged object store"


class MissingObject(ObjectStoreError):
    what = "missing object"

    def __init__(self, oid: bytes) -> None:
        super().__init__(f"missing object {oid.hex()}")
        self.oid = oid
