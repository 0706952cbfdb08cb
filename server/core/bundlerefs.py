"""What gitspout's own bundles may hold and whom they may be offered to (ARCHITECTURE.md
I7): a bundle holds the visible branches and tags at the time it was written; a client is
offered one only if no ref it names is hidden now and every tip in it is reachable from a
ref that client sees now, so a bundle never hands out what only a hidden ref (or another
namespace) reaches, nor the name of a ref hidden since (a client stores every ref of a
bundle it downloads, as ``refs/bundles/*``)."""

from __future__ import annotations

from collections.abc import Sequence

from gitspout.protocol.refs import ref_is_hidden

from ..graph.reachability import check_wants
from ..packgen import PackOrder
from .context import RequestContext

__all__ = ["bundle_refs", "bundle_order", "may_offer", "refs_moved", "stale_after"]

BUNDLED_PREFIXES = (b"refs/heads/", b"refs/tags/")  # what a default clone fetches


def bundle_refs(ctx: RequestContext) -> list[tuple[bytes, bytes]]:
    """(name, hex id) of the visible branches and tags, in ref order (blocking)."""
    _head, refs = ctx.visible()
    return [(r.name, r.oid) for r in refs if r.name.startswith(BUNDLED_PREFIXES)]


def bundle_order(refs: Sequence[tuple[bytes, bytes]]) -> PackOrder:
    """A full clone of ``refs``, as its pack goes into the bundle: no haves, no thin."""
    return PackOrder(wants=tuple(dict.fromkeys(bytes.fromhex(o.decode()) for _, o in refs)),
                     ofs_delta=True)


def may_offer(ctx: RequestContext, refs: Sequence[tuple[bytes, bytes]]) -> bool:
    """No ref of the bundle is hidden from this client and every tip of the bundle is
    reachable from its visible refs (blocking). A hidden name withdraws the bundle
    whatever its tip: even one that a visible ref reaches would be stored by the client
    under its name. Under a namespace never: the bundle was written from the whole
    repository."""
    if ctx.namespace or not refs:
        return False
    hide = list(ctx.hide_refs)
    if hide and any(ref_is_hidden(name, hide) for name, _ in refs):
        return False
    wants = [bytes.fromhex(o.decode()) for _, o in refs]
    tips = ctx.tips()
    if all(w in tips for w in wants):
        return True
    return check_wants(ctx.src, wants, tips) is None


def refs_moved(old: Sequence[tuple[bytes, bytes]], new: Sequence[tuple[bytes, bytes]]) -> int:
    """How many refs were added, removed or moved between two lists."""
    a, b = dict(old), dict(new)
    return sum(1 for n in a.keys() | b.keys() if a.get(n) != b.get(n))


def stale_after(refresh_refs: int, held: int) -> int:
    """How many moved refs make a bundle of ``held`` refs stale: ``--bundle-refresh-refs``,
    or a quarter of the refs it holds (rounded up, at least one) when that is fewer, so a
    repository of a few branches, which may never have 16 refs to move, still gets a
    newer bundle once a good part of its refs moved."""
    return max(1, min(refresh_refs, (held + 3) // 4))
