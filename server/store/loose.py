"""Loose objects as one request sees them: each fan-out directory listed once per request
(one stat while unchanged) and only when a lookup gets that far, so a few haves cost a few
stats; a loose object read whole and kept in the process's objects cache.

:class:`LooseObjects` is a part of :class:`~.odb.ObjectSnapshot`.
"""

from __future__ import annotations

import os
import zlib
from typing import TYPE_CHECKING

from .errors import MissingObject, ObjectStoreError
from .fscache import DirCache, Listing
from .fsops import FsOps
from .objformat import EMPTY_TREE, OBJ_TREE, TYPE_NUMS
from .registry import LOOSE_ID_COST, PackRegistry

if TYPE_CHECKING:
    from .packs import PackedLocation, PackFile

__all__ = ["LooseObjects", "EMPTY_TREE_PATH"]

_HEX = "0123456789abcdef"
_FANOUT = frozenset(a + b for a in _HEX for b in _HEX)
_FANOUT_NAMES = [f"{i:02x}" for i in range(256)]  # a first byte -> its fan-out directory

EMPTY_TREE_PATH = "<the empty tree>"
"""Where :meth:`ObjectSnapshot.locate` says the empty tree is when no file holds it: read
as a loose object whose path no file has (objformat.EMPTY_TREE)."""


class LooseObjects:
    """The loose part of a request's object snapshot."""

    objects_dir: str
    hash_len: int
    registry: PackRegistry
    fs: FsOps
    dirs: DirCache
    _loose: dict[str, frozenset[bytes] | None] | None
    _loose_fresh: bool

    if TYPE_CHECKING:
        def _listing(self, path: str, fresh: bool = False) -> Listing | None: ...
        def locate(self, oid: bytes, needed: bool = True) -> PackedLocation | str | None: ...
        def read_packed(self, pack: PackFile, offset: int) -> tuple[int, bytes]: ...

    def _loose_ids(self, first: int) -> frozenset[bytes]:
        """The loose object ids whose first byte is ``first``: the fan-out directory is
        listed once per request (one stat while unchanged, through the listing cache), and
        only when asked for: a few haves cost a few stats, not one per fan-out directory
        (hundreds, in a repository pushed to often and not yet repacked)."""
        if self._loose is None:
            top = self._listing(self.objects_dir, self._loose_fresh)
            self._loose = {name: None for name, _, is_dir in (top.entries if top else ())
                           if is_dir and name in _FANOUT}
        name = _FANOUT_NAMES[first]
        if name not in self._loose:
            return frozenset()
        ids = self._loose[name]
        if ids is None:
            ids = self._loose[name] = self._fanout_ids(name, self._loose_fresh)
        return ids

    def _fanout_ids(self, name: str, fresh: bool) -> frozenset[bytes]:
        fanout = os.path.join(self.objects_dir, name)
        listing = self._listing(fanout, fresh)
        if listing is None:
            return frozenset()
        self.dirs.check_links(self.fs, fanout, listing)  # loose objects are read by name
        cache = self.registry.fanout_ids
        cached = cache.get((self.objects_dir, name), lambda c: c[0] == listing.key)
        if cached is not None:
            return cached[1]
        ids = set()
        for obj, _, _ in listing.entries:
            try:
                ids.add(bytes.fromhex(name + obj))
            except ValueError:
                continue  # temporary files such as tmp_obj_XXXX
        result = frozenset(ids)
        if listing.trusted:
            cache.put((self.objects_dir, name), (listing.key, result), LOOSE_ID_COST * (1 + len(result)))
        return result

    def _loose_path(self, oid: bytes) -> str:
        hx = oid.hex()
        return os.path.join(self.objects_dir, hx[:2], hx[2:])

    def _read_loose(self, path: str, oid: bytes) -> tuple[int, bytes]:
        if path == EMPTY_TREE_PATH:
            return OBJ_TREE, b""
        cache = self.registry.objects
        hit = cache.get(("loose", oid))
        if hit is not None:
            return hit  # objects are immutable: the id is the whole key
        try:
            raw = zlib.decompress(self.fs.read_file(path))
        except FileNotFoundError:
            # Packed away by a concurrent gc: look again (at the directories themselves,
            # not at this request's racy listings of them).
            self._loose = None
            self._loose_fresh = True
            loc = self.locate(oid, needed=True)
            if loc is None or isinstance(loc, str):
                raise MissingObject(oid) from None
            return self.read_packed(loc.pack, loc.offset)
        except zlib.error as exc:
            raise ObjectStoreError(f"corrupt loose object {oid.hex()}: {exc}") from None
        head, _, body = raw.partition(b"\0")
        type_name, _, size = head.partition(b" ")
        type_num = TYPE_NUMS.get(type_name)
        if type_num is None or not size.isdigit() or int(size) != len(body):
            raise ObjectStoreError(f"corrupt loose object {oid.hex()}")
        cache.put(("loose", oid), (type_num, body), len(body))
        return type_num, body

    def cached_loose(self, oid: bytes) -> tuple[int, bytes] | None:
        """A loose object from the process-wide objects cache, if it is there."""
        if oid == EMPTY_TREE[self.hash_len]:
            return OBJ_TREE, b""
        return self.registry.objects.get(("loose", oid))  # type: ignore[no-any-return]

    def keep_loose(self, oid: bytes, type_num: int, data: bytes) -> None:
        """Cache a loose object read elsewhere (store/bigobjects.py), as _read_loose does."""
        self.registry.objects.put(("loose", oid), (type_num, data), len(data))
