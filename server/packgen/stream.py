"""The one way out of packgen: a :class:`PackStream`, an order's pack as an iterator of
pack bytes and progress lines, with what producing it measured.

Blocking: it runs in the server's thread pool, pulled a batch at a time by the stream
writer or by the pack cache's producer (``app/``), so nothing is produced before it is
asked for. The first step decides (:meth:`PackStream.decide`: enumerate the objects,
choose the source), which a caller may also do ahead of the bytes: the pack cache does,
to learn whether the pack goes out whole as it is on disk.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Generator

from ..store.packs import PackFile
from .access import ObjectAccess
from .choose import choose_source
from .order import PackOrder
from .sources import PackSource, WholePackSource
from .stats import PackStats, Progress

__all__ = ["PackStream"]


class PackStream:
    """One pack to produce from ``objects``: iterate it for its items (``bytes`` of pack
    data and :class:`~.stats.Progress` lines). ``stats`` and ``phases`` (seconds spent
    enumerating and producing) are what it measured: final once the iterator is done.

    ``whole``: the key of a pack to send whole, as another request decided for the same
    order (the pack cache's verbatim entries); when this request's objects do not hold
    that pack, it decides for itself."""

    def __init__(self, order: PackOrder, objects: ObjectAccess,
                 whole: tuple[object, ...] | None = None) -> None:
        self.order = order
        self.objects = objects
        self.stats = PackStats()
        self.phases: dict[str, float] = {}
        self._whole = whole
        self._source: PackSource | None = None
        self._items: Generator[bytes | Progress, None, None] | None = None

    def key(self) -> bytes:
        """What the pack's bytes are a function of (blocking): the order, and where its
        objects are read from (the repository, its frozen pack set and its alternates')."""
        return hashlib.sha256(self.order.key + self.objects.where()).digest()

    def again(self, whole: tuple[object, ...] | None = None) -> PackStream:
        """The same order, produced anew (nothing decided yet)."""
        return PackStream(self.order, self.objects, whole)

    def decide(self) -> PackSource:
        """Enumerate the objects and choose the source (blocking), once."""
        if self._source is None:
            pack = None
            if self._whole is not None:
                pack = next((p for p in self.objects.odb.packs if p.key == self._whole), None)
            if pack is not None:
                self._source = WholePackSource(pack)
            else:
                start = time.monotonic()
                self._source = choose_source(self.order, self.objects)
                self.phases["enumerate"] = time.monotonic() - start
            self.stats = self._source.stats
        return self._source

    @property
    def whole(self) -> PackFile | None:
        """Once decided: the pack sent whole as it is on disk, or None."""
        source = self._source
        return source.pack if isinstance(source, WholePackSource) else None

    def __iter__(self) -> PackStream:
        return self

    def __next__(self) -> bytes | Progress:
        if self._items is None:
            self._items = self._produce()
        return next(self._items)

    def _produce(self) -> Generator[bytes | Progress, None, None]:
        source = self.decide()
        n = source.stats.objects
        yield Progress(b"Enumerating objects: %d, done.\n" % n)
        yield Progress(b"Counting objects: 100%% (%d/%d), done.\n" % (n, n))
        start = time.monotonic()
        yield from source.chunks()
        self.phases["pack"] = time.monotonic() - start

    def close(self) -> None:
        """Stop producing (the client went away): the source lets go of what it holds."""
        if self._items is not None:
            self._items.close()
