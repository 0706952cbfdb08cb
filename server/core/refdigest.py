"""A small digest of a request's ref state, for answers kept across requests under a key
that must not pin the refs themselves (app/bundles.py keeps one verdict per repository).

A request's visible refs are a function of its ref segments (immutable), HEAD and the
hideRefs. A key holding the segments, compared by identity, is cheap (one compare per
segment, about 200 for 100k refs) but keeps every segment alive for as long as the key is
kept, outside any budget; hashing the refs' bytes would cost a pass over all of them per
request.

Here the digest hashes each segment's serial (``RefSegment.serial``, drawn from one
counter when the segment is made), HEAD, the hideRefs and the namespace. That is sound
where ``id()`` is not: CPython reuses an object's address once the object is freed, so a
new segment holding other refs could carry a dead one's ``id``; a serial is never handed
out twice in a process. Segments never change after they are made, so equal serials are
equal refs; a ref that moves, appears or goes lives in a segment made anew (store/refs.py),
which has a new serial, and so a new digest. Two states with the same refs in different
segment objects get different digests: a recomputation, never a wrong answer.
"""

from __future__ import annotations

import hashlib
import struct

from .context import RequestContext

__all__ = ["ref_state_digest", "DIGEST_BYTES"]

DIGEST_BYTES = 32


def ref_state_digest(ctx: RequestContext) -> bytes:
    """:data:`DIGEST_BYTES` that change whenever the refs ``ctx`` sees (their segments,
    HEAD), its hideRefs or its namespace do (blocking: reads the refs once per request).
    Equal digests, equal visible refs; holding one keeps nothing of the refs alive."""
    snap = ctx.refs
    hide = ctx.hide_refs
    serials = [seg.serial for seg in snap.segments]
    h = hashlib.sha256(struct.pack(f"<Q{len(serials)}Q", len(serials), *serials))
    # Length-prefixed fields: no two different states hash the same bytes.
    h.update(struct.pack("<I", len(hide)))
    for part in (snap.head.oid or b"", ctx.namespace, *hide):
        h.update(struct.pack("<I", len(part)) + part)
    return h.digest()
