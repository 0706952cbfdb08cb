"""A protocol v2 command request, answered from ref state or turned into a fetch
(gitprotocol-v2 "Command Request"): ``ls-refs`` and ``object-info`` are answered whole
here, in one trip to the pool, so that a listing costs its writes and no extra event-loop
wake-ups; ``fetch`` goes on to :func:`.fetch.plan_fetch`."""

from __future__ import annotations

from dataclasses import dataclass

from gitspout.protocol.bundle_uri import check_bundle_uri_args, iter_bundle_list
from gitspout.protocol.command import parse_command_request
from gitspout.protocol.errors import ClientError
from gitspout.protocol.fetch_request import FetchRequest, parse_v2_fetch_args
from gitspout.protocol.ls_refs import parse_ls_refs_args
from gitspout.protocol.object_info import parse_object_info_args
from gitspout.protocol.pktline import PktBuffer

from . import answers
from .context import RequestContext

__all__ = ["Listing", "FetchCommand", "Command", "read_command"]


@dataclass(frozen=True)
class Listing:
    """An answer made whole: its 32 KiB chunks (``ls-refs``, ``object-info``)."""

    command: bytes
    agent: bytes | None
    chunks: list[bytes]


@dataclass(frozen=True)
class FetchCommand:
    """A ``fetch``, parsed: to be planned."""

    command: bytes
    agent: bytes | None
    req: FetchRequest


Command = Listing | FetchCommand | None  # None: a body of a flush alone (no command)


def bundle_list(ctx: RequestContext) -> list[tuple[bytes, bytes]]:
    """The bundle list a ``bundle-uri`` command answers: the repository's ``bundle.*``
    entries when ``uploadpack.advertiseBundleURIs`` is set (C git's answer, which the
    operator filled), else gitspout's own bundles when it has one for this client."""
    cfg = ctx.config
    if cfg.advertise_bundle_uris:
        return list(cfg.bundle_list)
    return ctx.own_bundle_list()


def read_command(ctx: RequestContext, body: bytes) -> Command:
    """Parse the command of a v2 POST and, unless it is a fetch, answer it (blocking)."""
    features = answers.v2_features(ctx)
    cmd = parse_command_request(body, features)
    if cmd is None:
        return None
    if cmd.command == b"ls-refs":
        ls = parse_ls_refs_args(cmd.args)
        chunks = answers.encoded(ctx, ("ls-refs", ls.peel, ls.symrefs, ls.unborn),
                                 lambda: answers.ls_refs(ctx, ls),
                                 segmented=lambda: answers.ls_refs_segmented(ctx, ls),
                                 prefixes=tuple(ls.prefixes))
        return Listing(cmd.command, cmd.agent, chunks)
    if cmd.command == b"object-info":
        oi = parse_object_info_args(cmd.args, ctx.hash_len * 2)
        buf = PktBuffer()
        # PktBuffer hands back a chunk every 32 KiB: keep each (an answer for a few
        # thousand ids used to lose all but its tail).
        chunks = [c for c in map(buf.add, answers.object_info(ctx, oi)) if c]
        chunks += [c for c in (buf.add_flush(), buf.take()) if c]
        return Listing(cmd.command, cmd.agent, chunks)
    if cmd.command == b"bundle-uri":
        # Refused by the parser unless advertised (serve.c); answered as bundle-uri.c
        # bundle_uri_command does: no argument, then the list as key=value lines.
        check_bundle_uri_args(cmd.args)
        buf = PktBuffer()
        chunks = [c for c in map(buf.add, iter_bundle_list(bundle_list(ctx))) if c]
        chunks += [c for c in (buf.add_flush(), buf.take()) if c]
        return Listing(cmd.command, cmd.agent, chunks)
    if cmd.command != b"fetch":
        raise ClientError(f"unsupported command {cmd.command.decode('ascii', 'replace')}")
    req = parse_v2_fetch_args(cmd.args, features, ctx.hash_len * 2)
    return FetchCommand(cmd.command, cmd.agent, req)
