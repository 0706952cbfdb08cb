"""Whether a request may be given a blob on its own: the one-blob pack of a large blob sent
as a packfile URI (core/bigblobs.py, app/blobpacks.py), fetched by URL outside the fetch
that named it. I7: the blob must be reachable from a ref this request sees now; under a
namespace never (no blob is offloaded there: the URI would name the whole repository).

Apart from core/bigblobs.py only because core/context.py imports that module: asking the
request's view from there would make an import cycle.
"""

from __future__ import annotations

from ..graph.reachability import check_wants
from .context import RequestContext

__all__ = ["may_have_blob"]


def may_have_blob(ctx: RequestContext, oid: bytes) -> bool:
    """May this request (its view: visible refs, namespace) have the blob ``oid`` (binary
    id)? Blocking: may walk the closure of its tips (kept across requests)."""
    if ctx.namespace:
        return False
    return check_wants(ctx.src, [oid], ctx.tips(), ctx.pack_caches.closures) is None
