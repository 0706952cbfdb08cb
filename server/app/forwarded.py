"""Who the client is, and which request id it goes by, behind trusted reverse proxies
(``--trusted-proxies``; docs/operations.md "Logs").

A proxy appends the address it received a request from to ``X-Forwarded-For``, so the list
grows left to right, from the client to the last proxy; everything left of the first hop a
trusted proxy wrote is what the client itself sent, and may be anything. So the client is
found from the right: starting at the peer (only a trusted peer's header is read at all),
each hop is believed while the address before it is a trusted proxy; the first address
that is not one is the client (nginx's ``real_ip_recursive on``). A hop that is not an
address stops the walk at the last address believed.

``X-Request-Id`` from a trusted peer is kept when it is 1 to 128 characters of
``[A-Za-z0-9._:=+/-]`` (uuids, nginx's ``$request_id``, base64 ids); any other value, or
one from any other peer, is replaced by a fresh id, so that a client cannot write into the
log under another request's id or inject text into it.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
from collections.abc import Iterable

__all__ = ["Forwarding", "new_request_id", "REQUEST_ID_HEADER"]

REQUEST_ID_HEADER = "X-Request-Id"
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:=+/-]{1,128}")
# A host name or address with an optional port (RFC 9110 7.2 Host), nothing else
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,253})|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?")
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def new_request_id() -> str:
    """16 hex digits, fresh."""
    return os.urandom(8).hex()


@functools.lru_cache(maxsize=1024)  # a peer asks many times: parsed once
def _address(text: str) -> _Address | None:
    """An address as a hop or a peer may carry it (``[v6]``, ``v4:port``), or None."""
    text = text.strip()
    if text.startswith("[") and "]" in text:
        text = text[1:text.index("]")]
    elif text.count(":") == 1:  # IPv4 with a port
        text = text.split(":")[0]
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped  # a dual-stack socket's view of an IPv4 peer
    return addr


class Forwarding:
    """The trusted proxies, and what they let us believe about a request."""

    def __init__(self, networks: Iterable[_Network]) -> None:
        self.networks = tuple(networks)

    def trusts(self, addr: _Address | None) -> bool:
        return addr is not None and any(addr in net for net in self.networks)

    def trusts_peer(self, peer: str | None) -> bool:
        """Is the peer address (text) one of the trusted proxies?"""
        return self.trusts(_address(peer)) if peer else False

    def client(self, peer: str | None, forwarded_for: Iterable[str]) -> str:
        """The client's address: the peer's, unless the peer is a trusted proxy; then the
        right-most ``X-Forwarded-For`` hop that is not one (the module doc)."""
        addr = _address(peer) if peer else None
        if addr is None:
            return peer or ""
        if not self.trusts(addr):
            return str(addr)
        hops = [hop for value in forwarded_for for hop in value.split(",") if hop.strip()]
        for hop in reversed(hops):
            found = _address(hop)
            if found is None:
                break  # not an address: the last hop believed stands
            addr = found
            if not self.trusts(addr):
                break
        return str(addr)

    def base_url(self, peer: str | None, scheme: str, host: str, proto: str | None,
                 forwarded_host: str | None) -> str:
        """Scheme and host as the client addressed us, for the URLs we hand out (bundles,
        blob packs): the request's own, or, from a trusted proxy, its
        ``X-Forwarded-Proto`` (``http`` or ``https``) and ``X-Forwarded-Host``, the first
        of a list (the client-facing proxy's). A TLS proxy otherwise got ``http://`` URLs
        to its TLS port."""
        if (proto or forwarded_host) and self.trusts(_address(peer) if peer else None):
            first = (proto or "").split(",")[0].strip().lower()
            if first in ("http", "https"):
                scheme = first
            named = (forwarded_host or "").split(",")[0].strip()
            if _HOST.fullmatch(named):
                host = named
        return f"{scheme}://{host}"

    def request_id(self, peer: str | None, header: str | None) -> str:
        """The request's id: the trusted peer's ``X-Request-Id`` when it is a safe one, else
        a fresh one."""
        if header is not None and _REQUEST_ID.fullmatch(header) \
                and self.trusts(_address(peer) if peer else None):
            return header
        return new_request_id()
