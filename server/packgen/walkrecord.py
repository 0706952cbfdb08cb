"""An object walk kept on the local cache disk for the next process (store/closurestore.py).

A repository without bitmaps is cloned by walking its history (graph/enumeration.py): every
commit, and every tree the filter keeps, read and diffed. That walk is the most of a
cold clone's cost (the dulwich history's blob:none clone: 1.4 s of 1.8), and it is the same
walk in every new process. Its result is a function of immutable objects and the pack
order's key alone (wants, haves, shallow boundaries, the repository's grafts, filter:
``PackOrder.key``), as the process's own cache of walks (``PackCaches.walks``) already
relies on; it is kept here under that key, and a process that finds it reads it instead of
walking. Where the objects stand in the packs is not part of it: the selection is made
afresh from the packs of the moment.

The record holds the objects in the walk's order with their types, what the client was
found to have, and the delta hints (each object's version at the same path in the parent
commit, and a deepen's newer versions), ids at the repository's hash length. Only walks of
at least :data:`DISK_WALK_OBJECTS` objects are kept: a smaller one costs less than a file.
"""

from __future__ import annotations

import hashlib
import struct

from ..graph.enumeration import Enumeration
from ..store.closurestore import ClosureStore
from ..store.odb import ObjectSnapshot
from .order import PackOrder

__all__ = ["DISK_WALK_OBJECTS", "load_walk", "save_walk", "touch_walk", "encode_walk",
           "decode_walk"]

DISK_WALK_OBJECTS = 4096
TOUCH_EVERY = 30.0
FORMAT = b"walk1"
_HEAD = struct.Struct("<5Q")  # hash length, objects, haves, hints, newer


def _where(odb: ObjectSnapshot, order: PackOrder) -> tuple[str, str, bytes]:
    """(scope, name, identity): the repository's objects directory (its own scope, apart
    from the bitmaps', which are swept when their pack goes), the order's key, and the
    hash length and the record's format."""
    scope = hashlib.sha256(odb.objects_dir.encode() + b"\0walks").hexdigest()[:20]
    name = f"walk-{order.key.hex()[:40]}"
    identity = b"|".join((FORMAT, order.key, str(odb.hash_len).encode()))
    return scope, name, identity


def encode_walk(enum: Enumeration, hash_len: int) -> bytes:
    """The record's payload: counts, then the ids and types of the objects, the haves, the
    hints' objects and bases, the newer versions' objects and bases."""
    oids = [oid for oid, _ in enum.objects]
    types = bytes(t for _, t in enum.objects)
    parts = [_HEAD.pack(hash_len, len(oids), len(enum.have_objects), len(enum.hints),
                        len(enum.newer)),
             *oids, types, *enum.have_objects, *enum.hints, *enum.hints.values(),
             *enum.newer, *enum.newer.values()]
    data = b"".join(parts)
    ids = len(oids) + len(enum.have_objects) + 2 * len(enum.hints) + 2 * len(enum.newer)
    if len(data) != _HEAD.size + ids * hash_len + len(types):
        raise ValueError("an object id of the walk is not of the repository's length")
    return data


def decode_walk(data: bytes, hash_len: int) -> Enumeration | None:
    """The walk :func:`encode_walk` wrote, or None when ``data`` is not one."""
    if len(data) < _HEAD.size:
        return None
    width, n, n_have, n_hints, n_newer = _HEAD.unpack_from(data)
    ids = n + n_have + 2 * n_hints + 2 * n_newer
    if width != hash_len or len(data) != _HEAD.size + ids * width + n:
        return None
    at = _HEAD.size

    def take(count: int) -> list[bytes]:
        nonlocal at
        out = [data[i:i + width] for i in range(at, at + count * width, width)]
        at += count * width
        return out

    oids = take(n)
    types = data[at:at + n]
    at += n
    haves = take(n_have)
    hinted, bases = take(n_hints), take(n_hints)
    newer, newer_bases = take(n_newer), take(n_newer)
    return Enumeration(list(zip(oids, types, strict=True)), set(haves),
                       dict(zip(hinted, bases, strict=True)),
                       dict(zip(newer, newer_bases, strict=True)))


def load_walk(disk: ClosureStore, odb: ObjectSnapshot, order: PackOrder) -> Enumeration | None:
    """The walk of ``order`` kept by an earlier process, or None. A walk not found is not
    counted as a closure missed: most walks are too small to be kept."""
    data = disk.load(*_where(odb, order), count_miss=False)
    return decode_walk(data, odb.hash_len) if data is not None else None


def touch_walk(disk: ClosureStore, odb: ObjectSnapshot, order: PackOrder,
               enum: Enumeration) -> None:
    """A walk used from memory is used: its file is evicted last (at most every
    :data:`TOUCH_EVERY` seconds, a syscall)."""
    if len(enum.objects) >= DISK_WALK_OBJECTS:
        disk.touch(*_where(odb, order)[:2], every=TOUCH_EVERY)


def save_walk(disk: ClosureStore, odb: ObjectSnapshot, order: PackOrder,
              enum: Enumeration) -> None:
    """Keep a large walk for the next process (written in the store's background)."""
    n = len(enum.objects)
    ids = n + len(enum.have_objects) + 2 * len(enum.hints) + 2 * len(enum.newer)
    # One larger than the store takes a record (a quarter of it) is not even encoded.
    if n >= DISK_WALK_OBJECTS and _HEAD.size + ids * odb.hash_len + n <= disk.max_bytes // 4:
        disk.save(*_where(odb, order), encode_walk(enum, odb.hash_len))
