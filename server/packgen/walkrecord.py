"""An object walk kept on the local cache disk for the next process (store/closurestore.py).

A clone the bitmaps cannot answer (a repository without them, a shallow clone, a
``tree:<depth>`` filter) walks history (graph/enumeration.py): every commit, and every tree
the filter keeps, read and diffed. That walk is the most of such a cold clone's cost (the
unmaintained dulwich copy's blob:none clone: 1.4 s of 1.8), and it is the same walk in
every new process. Its result is a function of immutable objects, of the walk's inputs
(wants, haves, shallow boundaries, the repository's grafts, include-tag's tags, filter: the
pack order's key without what only the writing uses) and of the code that walked (which
the store puts in every identity); it is kept here under that key, and a process that
finds it reads it instead of walking. Where the objects stand in the packs is not part of
it: the selection is made afresh from the packs of the moment.

Only clones are kept (no haves: a fetch's haves are its own, seldom asked again by another
process), and only walks of at least :data:`DISK_WALK_OBJECTS` objects: a smaller one costs
less than a file. A clone's tips move with every push, so each repository keeps its
:data:`WALKS_KEPT` most recently used walks, the older ones removed as a new one is kept.
A walk may take up to half the store (:data:`STORE_SHARE`), where other records take a
quarter: git/git's full clone without bitmaps, 21 MB, fits the default 64 MiB store.

The record holds the objects in the walk's order with their types, what the client was
found to have, and the delta hints (each object's version at the same path in the parent
commit, and a deepen's newer versions), ids at the repository's hash length; a hint between
two of the walk's objects, nearly all of a clone's, as an index (:func:`encode_walk`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
import sys
from array import array

from ..graph.enumeration import Enumeration
from ..store.closurestore import ClosureStore
from ..store.objformat import OBJ_BLOB, OBJ_COMMIT, OBJ_TAG, OBJ_TREE
from ..store.odb import ObjectSnapshot
from .order import PackOrder

__all__ = ["DISK_WALK_OBJECTS", "STORE_SHARE", "WALKS_KEPT", "kept", "load_walk", "save_walk",
           "touch_walk", "encode_walk", "decode_walk"]

DISK_WALK_OBJECTS = 4096
WALKS_KEPT = 8  # per repository
# A walk may take half the store, where other records take a quarter: it is the costliest
# to redo (git/git's full clone without bitmaps: 31 s of CPU, a 21 MB record).
STORE_SHARE = 2
TOUCH_EVERY = 30.0
FORMAT = b"walk2"
PREFIX = "walk-"
_HEAD = struct.Struct("<6Q")  # hash length, objects, haves, other bases, spilled hints, newer
_NO_BASE = 0xFFFFFFFF
if array("I").itemsize != 4:
    raise ImportError("walk records need a four-byte array type")
_TYPES = frozenset((OBJ_COMMIT, OBJ_TREE, OBJ_BLOB, OBJ_TAG))
_RECORD_SLACK = 1024  # the store's header, checksum and code digest around a payload


def kept(order: PackOrder) -> bool:
    """Whether the walk of ``order`` may be kept: a clone's (no haves)."""
    return not order.common and not order.unshallow


def _where(odb: ObjectSnapshot, order: PackOrder) -> tuple[str, str, bytes]:
    """(scope, name, identity): the repository's objects directory (a scope of its own,
    apart from the bitmaps', which are swept when their pack goes), the key of the walk's
    inputs (the order's, without what only the writing uses: thin, ofs-delta, packfile-URI
    exclusions), the hash length and the record's format."""
    walk = dataclasses.replace(order, exclude=frozenset(), thin=False, ofs_delta=False)
    scope = hashlib.sha256(odb.objects_dir.encode() + b"\0walks").hexdigest()[:20]
    name = f"{PREFIX}{walk.key.hex()[:40]}"
    identity = b"|".join((FORMAT, walk.key, str(odb.hash_len).encode()))
    return scope, name, identity


def _u32(values: array) -> bytes:
    if sys.byteorder != "little":
        values = array("I", values)
        values.byteswap()
    return values.tobytes()


def encode_walk(enum: Enumeration, hash_len: int) -> bytes:
    """The record's payload: counts; the objects' ids and types; for each object the index
    of its hint's base (among the objects, else among the other bases that follow the
    haves; none: all ones); the haves; the other bases; the hints of ids that are not
    objects (id, base, id, base...); the newer versions' objects, then their bases. A
    clone's hints join two of its objects: four bytes each, where two ids took 40
    (git/git's full clone: 841,300 objects, 559,603 hints, 21 MB where it took 40)."""
    oids = [oid for oid, _ in enum.objects]
    types = bytes(t for _, t in enum.objects)
    n = len(oids)
    index = {oid: i for i, oid in enumerate(oids)}
    extra: dict[bytes, int] = {}
    bases = array("I", [_NO_BASE]) * n
    spill: list[bytes] = []
    for oid, base in enum.hints.items():
        i = index.get(oid)
        if i is None:
            spill += (oid, base)
            continue
        at = index.get(base)
        if at is None:
            at = extra.setdefault(base, n + len(extra))
        if at >= _NO_BASE:
            raise ValueError("too many objects for a walk record")
        bases[i] = at
    parts = [_HEAD.pack(hash_len, n, len(enum.have_objects), len(extra), len(spill) // 2,
                        len(enum.newer)),
             *oids, types, _u32(bases), *enum.have_objects, *extra, *spill,
             *enum.newer, *enum.newer.values()]
    data = b"".join(parts)
    ids = n + len(enum.have_objects) + len(extra) + len(spill) + 2 * len(enum.newer)
    if len(data) != _HEAD.size + ids * hash_len + 5 * n:
        raise ValueError("an object id of the walk is not of the repository's length")
    return data


def decode_walk(data: bytes, hash_len: int) -> Enumeration | None:
    """The walk :func:`encode_walk` wrote, or None when ``data`` is not one."""
    if len(data) < _HEAD.size:
        return None
    width, n, n_have, n_extra, n_spill, n_newer = _HEAD.unpack_from(data)
    ids = n + n_have + n_extra + 2 * n_spill + 2 * n_newer
    if width != hash_len or len(data) != _HEAD.size + ids * width + 5 * n:
        return None
    at = _HEAD.size

    def take(count: int) -> list[bytes]:
        nonlocal at
        out = [data[i:i + width] for i in range(at, at + count * width, width)]
        at += count * width
        return out

    oids = take(n)
    types, at = data[at:at + n], at + n
    if not set(types) <= _TYPES:
        return None
    bases = array("I")
    bases.frombytes(data[at:at + 4 * n])
    if sys.byteorder != "little":
        bases.byteswap()
    at += 4 * n
    haves = take(n_have)
    known = oids + take(n_extra)
    hints = {}
    for i, b in enumerate(bases):
        if b != _NO_BASE:
            if b >= len(known) or b == i:
                return None  # a base past the ids, or an object its own base
            hints[oids[i]] = known[b]
    spill = take(2 * n_spill)
    hints.update(zip(spill[::2], spill[1::2], strict=True))
    newer, newer_bases = take(n_newer), take(n_newer)
    return Enumeration(list(zip(oids, types, strict=True)), set(haves), hints,
                       dict(zip(newer, newer_bases, strict=True)))


def load_walk(disk: ClosureStore, odb: ObjectSnapshot, order: PackOrder) -> Enumeration | None:
    """The walk of ``order`` kept by an earlier process, or None. A walk not found is not
    counted as a closure missed: most walks are too small, or not a clone's."""
    if not disk.enabled or not kept(order):
        return None
    scope, name, identity = _where(odb, order)
    data = disk.load(scope, name, identity, count_miss=False, count_hit=False)
    if data is None:
        return None
    enum = decode_walk(data, odb.hash_len)
    if enum is None:
        disk.refuse(scope, name)
    else:
        disk.accept(scope, name)
    return enum


def touch_walk(disk: ClosureStore, odb: ObjectSnapshot, order: PackOrder,
               enum: Enumeration) -> None:
    """A walk used from memory is used: its file is evicted last (at most every
    :data:`TOUCH_EVERY` seconds, a syscall)."""
    if disk.enabled and kept(order) and len(enum.objects) >= DISK_WALK_OBJECTS:
        disk.touch(*_where(odb, order)[:2], every=TOUCH_EVERY)


def save_walk(disk: ClosureStore, odb: ObjectSnapshot, order: PackOrder,
              enum: Enumeration) -> None:
    """Keep a large clone's walk for the next process (written in the store's background),
    and no more than :data:`WALKS_KEPT` of the repository's."""
    n = len(enum.objects)
    if not disk.enabled or not kept(order) or n < DISK_WALK_OBJECTS:
        return
    # One that cannot fit in what the store takes of a walk (:data:`STORE_SHARE`) is not
    # even encoded: at least its ids and types, four bytes an object for its hint.
    most = disk.max_bytes // STORE_SHARE - _RECORD_SLACK
    least = _HEAD.size + n * (odb.hash_len + 5) + len(enum.have_objects) * odb.hash_len
    if least > most:
        return
    try:
        data = encode_walk(enum, odb.hash_len)
    except ValueError:  # not a walk of this repository's ids: nothing kept, nothing lost
        return
    if len(data) > most:
        return
    scope, name, identity = _where(odb, order)
    disk.trim(scope, PREFIX, WALKS_KEPT - 1)
    disk.save(scope, name, identity, data, share=STORE_SHARE)
