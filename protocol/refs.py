"""Typed ref values shared by the advertisement and ls-refs formatters, and hideRefs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Ref", "HeadInfo", "parse_hide_pattern", "ref_is_hidden", "ref_matches_prefixes"]


@dataclass(frozen=True, slots=True)
class Ref:
    """A ref as the server shows it: name, object id (hex), the peeled id for annotated tags,
    and the target's name when the ref is symbolic."""

    name: bytes
    oid: bytes
    peeled: bytes | None = None
    symref_target: bytes | None = None


@dataclass(frozen=True, slots=True)
class HeadInfo:
    """HEAD: its target ref name when symbolic, and its object id (None when unborn)."""

    target: bytes | None
    oid: bytes | None


def parse_hide_pattern(value: bytes) -> bytes:
    """Normalise one hideRefs value as C git does: trailing slashes are dropped."""
    return value.rstrip(b"/")


def ref_is_hidden(refname: bytes, patterns: Sequence[bytes], full_name: bytes | None = None) -> bool:
    """gitprotocol-common/git-config "transfer.hideRefs": the last matching pattern wins.

    A pattern matches a ref equal to it or below it (``refs/pull`` hides ``refs/pull/1/head``);
    ``!`` negates, and ``^`` matches the full (un-namespaced) name.
    """
    for pattern in reversed(patterns):
        neg = pattern.startswith(b"!")
        if neg:
            pattern = pattern[1:]
        subject = refname
        if pattern.startswith(b"^"):
            pattern = pattern[1:]
            subject = full_name if full_name is not None else refname
        if subject.startswith(pattern) and (
            len(subject) == len(pattern) or subject[len(pattern)] == 0x2F
        ):
            return not neg
    return False


def ref_matches_prefixes(refname: bytes, prefixes: Sequence[bytes]) -> bool:
    """True when no prefixes were given, or ``refname`` starts with one of them."""
    if not prefixes:
        return True
    return any(refname.startswith(p) for p in prefixes)
