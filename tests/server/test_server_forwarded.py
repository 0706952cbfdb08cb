"""The client address and request id rules of server/app/forwarded.py, case by case (the
live-server tests in test_server_logs.py go through real git clients)."""

from __future__ import annotations

import pytest
from gitspout.server.app.config import proxy_networks
from gitspout.server.app.forwarded import Forwarding

PROXIES = Forwarding(proxy_networks("127.0.0.1, 10.0.0.0/8, fd00::/8"))


@pytest.mark.parametrize(("peer", "xff", "client"), [
    ("192.0.2.1", ["198.51.100.7"], "192.0.2.1"),               # not a proxy: XFF ignored
    ("127.0.0.1", [], "127.0.0.1"),                              # a proxy that said nothing
    ("127.0.0.1", ["198.51.100.7"], "198.51.100.7"),
    ("127.0.0.1", ["198.51.100.7, 10.1.2.3"], "198.51.100.7"),   # through two proxies
    ("127.0.0.1", ["1.1.1.1, 198.51.100.7", "10.1.2.3"], "198.51.100.7"),  # two headers
    ("127.0.0.1", ["10.9.9.9, 10.1.2.3"], "10.9.9.9"),           # all proxies: the farthest
    ("127.0.0.1", ["198.51.100.7, junk, 10.1.2.3"], "10.1.2.3"),  # junk stops the walk
    ("127.0.0.1", ["198.51.100.7:5555"], "198.51.100.7"),        # a hop with a port
    ("127.0.0.1", ["[2001:db8::7]:443"], "2001:db8::7"),
    ("fd00::1", ["2001:db8::7"], "2001:db8::7"),
    ("::ffff:127.0.0.1", ["198.51.100.7"], "198.51.100.7"),      # a dual-stack socket's peer
    ("::ffff:192.0.2.1", ["198.51.100.7"], "192.0.2.1"),
])
def test_client_is_the_rightmost_untrusted_hop(peer: str, xff: list[str], client: str) -> None:
    assert PROXIES.client(peer, xff) == client


def test_request_id_only_from_a_trusted_peer() -> None:
    assert PROXIES.request_id("10.0.0.5", "req-1") == "req-1"
    assert PROXIES.request_id("192.0.2.1", "req-1") != "req-1"
    assert PROXIES.request_id("10.0.0.5", "req 1") != "req 1"
    assert PROXIES.request_id("10.0.0.5", "r" * 128) == "r" * 128
    assert PROXIES.request_id("10.0.0.5", "r" * 129) != "r" * 129
    assert PROXIES.request_id("10.0.0.5", "a\x1bb") != "a\x1bb"
    assert len({PROXIES.request_id("192.0.2.1", None) for _ in range(100)}) == 100
