"""A namespace of a repository's refs, as C git serves one under ``GIT_NAMESPACE``
(gitnamespaces(7)).

The namespace ``a/b`` holds the refs under ``refs/namespaces/a/refs/namespaces/b/``; they
are served with that prefix stripped, HEAD is the namespace's own ``HEAD``
(``refs/namespaces/a/refs/namespaces/b/HEAD``), and nothing outside it is seen: not in
the advertisement, not as a root of what a client may fetch (ARCHITECTURE.md I7: its refs
are the only visible ones). hideRefs apply as in C git: a pattern to the stripped name,
one starting with ``^`` to the full name; they are applied here, so the view holds only
visible refs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gitspout.protocol.refs import HeadInfo, Ref, ref_is_hidden

from .packedrefs import segments_of_refs
from .refcache import RefCache
from .refsnapshot import RefSnapshot

__all__ = ["namespace_prefix", "namespaced", "valid_namespace"]


def valid_namespace(name: bytes) -> bool:
    """Components as a ref's (no empty one, none starting with a dot or ending in .lock)."""
    parts = name.split(b"/")
    return bool(name) and all(p and not p.startswith(b".") and not p.endswith(b".lock")
                              and not any(c < 0x21 or c in b"~^:?*[\\\x7f" for c in p)
                              for p in parts)


def namespace_prefix(name: bytes) -> bytes:
    """``a/b`` -> ``refs/namespaces/a/refs/namespaces/b/`` (git's expand_namespace)."""
    return b"".join(b"refs/namespaces/" + part + b"/" for part in name.split(b"/") if part)


_MAX_HOPS = 5  # refs.c follows a symref chain this far (SYMREF_MAXDEPTH)


def _strip(prefix: bytes, name: bytes | None) -> bytes | None:
    return name[len(prefix):] if name is not None and name.startswith(prefix) else name


def _stays_inside(ref: Ref, prefix: bytes, by_name: Mapping[bytes, Ref]) -> bool:
    """Does every hop of ``ref``'s symref chain (none for a plain ref) stay under
    ``prefix``? The snapshot records one hop per ref; the next is that target's own."""
    for _ in range(_MAX_HOPS):
        target = ref.symref_target
        if target is None:
            return True
        if not target.startswith(prefix):
            return False
        nxt = by_name.get(target)
        if nxt is None:
            return True  # a dangling symref (unborn): it names nothing outside
        ref = nxt
    return False  # a loop, or a chain longer than C git follows


def namespaced(snap: RefSnapshot, name: bytes, hide: Sequence[bytes],
               cache: RefCache | None) -> RefSnapshot:
    """The refs of namespace ``name`` in ``snap``, stripped, with the hidden ones left out
    (kept in ``cache`` by the snapshot's state, the namespace and hideRefs)."""
    prefix = namespace_prefix(name)
    key = ("namespace", snap.state, prefix, tuple(hide))
    hit = cache.snapshots.get(key) if cache is not None and snap.cacheable else None
    if hit is not None:
        return hit
    patterns = list(hide)
    refs: list[Ref] = []
    head = HeadInfo(None, None)
    ours = list(snap.select((prefix,)))
    by_name = {ref.name: ref for ref in ours}
    for ref in ours:
        if not _stays_inside(ref, prefix, by_name):
            # A symref out of the namespace (its HEAD into another's), directly or through
            # another symref: left out, as if it were not there. Shown, it would name the
            # other namespace's ref and make its tip one of this view's (C git 2.39's
            # upload-pack crashes on it).
            continue
        short = ref.name[len(prefix):]
        hidden = ref_is_hidden(short, patterns, ref.name)
        if short == b"HEAD":
            if not hidden:
                head = HeadInfo(_strip(prefix, ref.symref_target), ref.oid)
        elif not hidden:
            refs.append(Ref(short, ref.oid, ref.peeled, _strip(prefix, ref.symref_target)))
    view = RefSnapshot(head, segments_of_refs(refs, snap.hex_len) if refs else (), snap.hex_len,
                       (*snap.state, ("namespace", prefix)), complete=True,
                       cacheable=snap.cacheable)
    if cache is not None and snap.cacheable:
        cache.snapshots.put(key, view, nbytes=200 + sum(s.nbytes for s in view.segments))
    return view

