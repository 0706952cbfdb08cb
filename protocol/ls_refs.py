"""The v2 ``ls-refs`` command (gitprotocol-v2 "ls-refs")."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from .errors import ClientError
from .refs import HeadInfo, Ref, ref_matches_prefixes

__all__ = ["LsRefsRequest", "parse_ls_refs_args", "iter_ls_refs", "TOO_MANY_PREFIXES"]

# ls-refs.c: past this many prefixes the list is ignored and every ref is shown.
TOO_MANY_PREFIXES = 65536


@dataclass(frozen=True, slots=True)
class LsRefsRequest:
    peel: bool = False
    symrefs: bool = False
    unborn: bool = False
    prefixes: tuple[bytes, ...] = ()


def parse_ls_refs_args(args: Sequence[bytes]) -> LsRefsRequest:
    """Parse the argument lines of ``ls-refs``; an unknown line is a :class:`ClientError`."""
    peel = symrefs = unborn = False
    prefixes: list[bytes] = []
    for arg in args:
        if arg == b"peel":
            peel = True
        elif arg == b"symrefs":
            symrefs = True
        elif arg == b"unborn":
            unborn = True
        elif arg.startswith(b"ref-prefix "):
            if len(prefixes) < TOO_MANY_PREFIXES:
                prefixes.append(arg[len(b"ref-prefix ") :])
        else:
            shown = arg[:100].decode("utf-8", "replace")
            raise ClientError(f"unexpected line: '{shown}'")
    if len(prefixes) >= TOO_MANY_PREFIXES:
        prefixes = []
    return LsRefsRequest(peel, symrefs, unborn, tuple(prefixes))


def _format_head(req: LsRefsRequest, head: HeadInfo) -> bytes | None:
    if head.oid is None and not (req.unborn and req.symrefs and head.target is not None):
        return None
    line = (head.oid if head.oid is not None else b"unborn") + b" HEAD"
    if req.symrefs and head.target is not None:
        line += b" symref-target:" + head.target
    return line + b"\n"


def iter_ls_refs(
    req: LsRefsRequest, head: HeadInfo | None, refs: Iterable[Ref]
) -> Iterator[bytes]:
    """Yield the payload lines of the answer (the closing flush is the caller's).

    ``refs`` must be sorted and free of hidden refs; prefixes are applied here too, so a
    caller that narrowed ``refs`` by prefix already gives the same answer.
    """
    if head is not None and ref_matches_prefixes(b"HEAD", req.prefixes):
        line = _format_head(req, head)
        if line is not None:
            yield line
    for ref in refs:
        if not ref_matches_prefixes(ref.name, req.prefixes):
            continue
        line = ref.oid + b" " + ref.name
        if req.symrefs and ref.symref_target is not None:
            line += b" symref-target:" + ref.symref_target
        if req.peel and ref.peeled is not None:
            line += b" peeled:" + ref.peeled
        yield line + b"\n"
