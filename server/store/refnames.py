"""Ref names as C git checks them (refs.c ``check_refname_format``, no flags)."""

from __future__ import annotations

__all__ = ["refname_ok", "valid_component"]

_BAD_REFNAME_CHARS = frozenset(" ~^:?*[\\\x7f")


def valid_component(name: str) -> bool:
    """One ``/``-separated component: not empty, no leading ``.``, no ``.lock`` end."""
    return bool(name) and not name.startswith(".") and not name.endswith(".lock")


def refname_ok(name: str) -> bool:
    """Is ``name`` a ref name: a loose ref's, a packed one's, a symlink's target?"""
    if name == "@" or name.endswith((".", "/")) or "@{" in name or ".." in name:
        return False
    if any(c in _BAD_REFNAME_CHARS or ord(c) < 0x20 for c in name):
        return False
    return all(valid_component(part) for part in name.split("/"))
