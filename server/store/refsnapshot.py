"""One request's view of a repository's refs: HEAD and every ref at one moment, held as
shared segments (docs/ARCHITECTURE.md, "Ref state"). Read by store/refs.py, kept across
requests by store/refcache.py."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gitspout.protocol.refs import HeadInfo, Ref, ref_is_hidden, ref_matches_prefixes

from .packedrefs import RefSegment

__all__ = ["RefSnapshot"]


@dataclass(frozen=True)
class RefSnapshot:
    """HEAD plus every ref (sorted bytewise, symrefs resolved) at one moment.

    ``state`` identifies what it was read from; equal states mean equal snapshots. The refs
    are held in ``segments`` (:class:`RefSegment`, shared with the snapshots before it
    where nothing changed); ``refs`` makes Ref objects of all of them when asked for.
    """

    head: HeadInfo
    segments: tuple[RefSegment, ...]
    hex_len: int
    state: tuple[object, ...] = ()
    complete: bool = True  # False when only some ref prefixes were read
    cacheable: bool = False  # every listing it came from was trusted (not racy)
    # With prefixes, the segments may hold refs outside them too (whole packed segments
    # are shared): ``refs`` leaves those out, and so must whoever reads ``segments``.
    prefixes: tuple[bytes, ...] = ()

    @property
    def refs(self) -> tuple[Ref, ...]:
        """Every ref as a Ref (made now, not kept: at 1M refs, seconds and 200 MB)."""
        return tuple(self.select(self.prefixes))

    def select(self, prefixes: Sequence[bytes]) -> list[Ref]:
        """The refs under ``prefixes`` (all when empty), decoding only the segments
        whose name ranges can hold them."""
        out: list[Ref] = []
        for seg in self.segments:
            if prefixes and not any(_may_hold(seg, p) for p in prefixes):
                continue
            refs = seg.refs()
            if prefixes:
                refs = [r for r in refs if ref_matches_prefixes(r.name, prefixes)]
            out.extend(refs)
        if self.prefixes and prefixes != self.prefixes:
            out = [r for r in out if ref_matches_prefixes(r.name, self.prefixes)]
        return out

    def get(self, name: bytes) -> Ref | None:
        """The ref called ``name``, or None."""
        if self.prefixes and not ref_matches_prefixes(name, self.prefixes):
            return None
        for seg in self.segments:
            if seg.first <= name <= seg.last and seg.get(name) is not None:
                return next(r for r in seg.refs() if r.name == name)
        return None

    def visible(self, hide: Iterable[bytes]) -> tuple[HeadInfo | None, list[Ref]]:
        """HEAD (None when hidden) and the refs hideRefs leaves visible."""
        patterns = list(hide)
        if not patterns:
            return self.head, list(self.refs)
        head = None if ref_is_hidden(b"HEAD", patterns) else self.head
        return head, [r for r in self.refs if not ref_is_hidden(r.name, patterns)]

    def visible_oids(self, hide: Iterable[bytes]) -> set[bytes]:
        """The distinct hex ids of the refs hideRefs leaves visible (HEAD not included),
        without making Ref objects where nothing is hidden (many refs share an id: 100k
        branches of a mirror may name a few hundred commits)."""
        patterns = list(hide)
        if patterns or self.prefixes:
            return {r.oid for r in self.visible(patterns)[1]}
        out: set[bytes] = set()
        for seg in self.segments:
            out.update(seg.oids())
        return out


def _may_hold(seg: RefSegment, prefix: bytes) -> bool:
    """Can a name starting with ``prefix`` lie in the segment's name range?"""
    return seg.first[:len(prefix)] <= prefix <= seg.last[:len(prefix)]
