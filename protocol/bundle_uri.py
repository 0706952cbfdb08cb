"""The protocol v2 ``bundle-uri`` command (gitprotocol-v2 "bundle-uri";
Documentation/technical/bundle-uri): the client asks, the server answers its bundle list
as ``key=value`` lines.

    request  = command=bundle-uri, capabilities, [delim], flush   (no arguments)
    response = *PKT-LINE(key "=" value) flush-pkt

C git answers every ``bundle.*`` key of its config, as config callbacks name them (section
and variable in lower case, the bundle id as written), each line without a trailing LF
(bundle-uri.c ``config_to_packet_line``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from .errors import ClientError

__all__ = ["check_bundle_uri_args", "iter_bundle_list"]


def check_bundle_uri_args(args: Sequence[bytes]) -> None:
    """The command takes no argument; C git dies on one."""
    if args:
        shown = args[0][:100].decode("utf-8", "replace")
        raise ClientError(f"bundle-uri: unexpected argument: '{shown}'")


def iter_bundle_list(pairs: Iterable[tuple[bytes, bytes]]) -> Iterator[bytes]:
    """The payloads of the answer: ``key=value`` for each pair, in order; the flush is the
    caller's. A key or value holding a line break would break the framing: refused."""
    for key, value in pairs:
        if b"\n" in key or b"\n" in value or b"=" in key:
            raise ValueError(f"bundle list entry {key[:60]!r} cannot be sent")
        yield key + b"=" + value
