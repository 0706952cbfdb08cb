"""The tables of git's object format, written once: object type numbers and names, tree
entry modes, and the hash length of each object format.

Type numbers are those of pack entry headers (Documentation/gitformat-pack); names are
those of loose object headers and of a tag's ``type`` line. Hash lengths come from
``protocol.oid.HEX_LEN`` (the wire's table), halved.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from gitspout.protocol.oid import HEX_LEN

from .mapped import Mapped

__all__ = [
    "ids_digest",
    "OBJ_COMMIT",
    "OBJ_TREE",
    "OBJ_BLOB",
    "OBJ_TAG",
    "OFS_DELTA",
    "REF_DELTA",
    "TYPE_NAMES",
    "TYPE_NUMS",
    "MODE_TYPE",
    "MODE_TREE",
    "MODE_GITLINK",
    "HASH_LEN",
    "EMPTY_TREE",
    "HASH_ID_LEN",
    "new_hash",
    "trailer_matches",
]

OBJ_COMMIT, OBJ_TREE, OBJ_BLOB, OBJ_TAG, OFS_DELTA, REF_DELTA = 1, 2, 3, 4, 6, 7
TYPE_NAMES = {OBJ_COMMIT: b"commit", OBJ_TREE: b"tree", OBJ_BLOB: b"blob", OBJ_TAG: b"tag"}
TYPE_NUMS = {name: num for num, name in TYPE_NAMES.items()}

# A tree entry's mode: ``mode & MODE_TYPE`` is MODE_TREE for a subtree; a gitlink (a
# submodule's commit) names an object of another repository.
MODE_TYPE, MODE_TREE, MODE_GITLINK = 0o170000, 0o040000, 0o160000

HASH_LEN = {fmt: hex_len // 2 for fmt, hex_len in HEX_LEN.items()}
"""Binary id length by object format (``extensions.objectFormat``): sha1 20, sha256 32."""
HASH_ID_LEN = {1: HASH_LEN["sha1"], 2: HASH_LEN["sha256"]}
"""Binary id length by the hash id that git's binary files record (commit-graph, ...)."""
_HASH_NEW = {HASH_LEN["sha1"]: hashlib.sha1, HASH_LEN["sha256"]: hashlib.sha256}


# The empty tree is present in every repository, stored or not, as C git's object lookup
# has it built in (object-file.c find_cached_object): by id, per hash length.
EMPTY_TREE = {hash_len: new(b"tree 0\0").digest() for hash_len, new in _HASH_NEW.items()}


def new_hash(hash_len: int) -> hashlib._Hash:
    """A fresh hash object of the object format whose ids are ``hash_len`` bytes long."""
    return _HASH_NEW[hash_len]()


def ids_digest(*groups: Iterable[bytes]) -> bytes:
    """The one key of sets of object ids that caches are keyed by (closures of tips, pack
    orders): each group without duplicates and sorted, groups kept apart by their sizes.
    Objects are immutable, so what is computed from given ids never changes."""
    h = hashlib.sha256()
    for group in groups:
        ids = sorted(set(group))
        h.update(len(ids).to_bytes(8, "big"))
        h.update(b"".join(ids))
    return h.digest()


def trailer_matches(data: bytes | Mapped, hash_len: int) -> bool:
    """True when a git file's last ``hash_len`` bytes are the checksum of all before them
    (.idx, .rev, .bitmap, commit-graph), hashed through a view of ``data``, not a copy."""
    view = memoryview(data)
    try:
        digest = _HASH_NEW[hash_len](view[:-hash_len]).digest()
        return digest == view[len(view) - hash_len :].tobytes()
    finally:
        view.release()
