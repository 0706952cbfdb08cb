"""A network namespace of its own for a server, the way a container runs it, and a slow
reader in front of it (tests of the drain, issue 24).

:class:`NetNs` makes a namespace joined to the test's by a veth pair with a private /30
(127.0.0.1 does not cross namespaces) and deletes both at once, as a container runtime
tears a pod's network down when its last process exits. :class:`SlowProxy` listens on
127.0.0.1 and relays to an address in the namespace, passing the server's bytes at a
fixed rate through a small receive buffer, so that the server's own send queue holds
data while the response is in flight.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time

TIMEOUT = 30


def netns_usable() -> str | None:
    """Why namespaces cannot be made here (None: they can): root and ``ip`` needed."""
    if os.geteuid() != 0:
        return "needs root (ip netns)"
    if shutil.which("ip") is None:
        return "needs the ip command (iproute2)"
    return None


class NetNs:
    """``ip netns add``, a veth pair and a /30: the server side is :attr:`inner`, this side
    :attr:`outer`. Names and subnet derive from the process id, so that tests of other
    checkouts running at the same time do not collide."""

    def __init__(self) -> None:
        pid = os.getpid()
        self.name = f"gsns{pid}"
        self.host_if, self.ns_if = f"gsh{pid}"[:15], f"gsn{pid}"[:15]
        n = pid % (1 << 14)
        net = f"10.213.{n >> 6}"
        self.outer, self.inner = f"{net}.{((n & 63) << 2) + 1}", f"{net}.{((n & 63) << 2) + 2}"
        self._made = False

    def __enter__(self) -> NetNs:
        self.delete()  # left over by a killed run of the same pid
        self._made = True
        for cmd in (
            ["netns", "add", self.name],
            ["link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if],
            ["link", "set", self.ns_if, "netns", self.name],
            ["addr", "add", f"{self.outer}/30", "dev", self.host_if],
            ["link", "set", self.host_if, "up"],
            ["-n", self.name, "addr", "add", f"{self.inner}/30", "dev", self.ns_if],
            ["-n", self.name, "link", "set", self.ns_if, "up"],
            ["-n", self.name, "link", "set", "lo", "up"],
        ):
            subprocess.run(["ip", *cmd], check=True, capture_output=True, timeout=TIMEOUT)
        return self

    def exec_prefix(self) -> list[str]:
        """Run a command inside (``ip netns exec`` execs it: same process id)."""
        return ["ip", "netns", "exec", self.name]

    def delete(self) -> None:
        """The link first (both ends go, and with them every packet queued on them), then
        the namespace."""
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, timeout=TIMEOUT)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=TIMEOUT)

    def __exit__(self, *exc: object) -> None:
        if self._made:
            self.delete()


class SlowProxy:
    """127.0.0.1 to ``host:port``: the server's bytes pass at about ``rate`` bytes/s
    through an upstream receive buffer of ``rcvbuf`` bytes; ``relayed`` counts them. An
    upstream silent for ``stall`` seconds is given up (the client then sees a cut)."""

    def __init__(self, host: str, port: int, rate: int, rcvbuf: int = 64 << 10,
                 stall: float = 5.0) -> None:
        self.upstream = (host, port)
        self.rate, self.rcvbuf, self.stall = rate, rcvbuf, stall
        self.relayed = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.listener.settimeout(TIMEOUT)
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)
            server.settimeout(TIMEOUT)
            server.connect(self.upstream)
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, slow: bool) -> None:
        # The request side may stay silent for the whole response: it ends when the
        # response side shuts both sockets down.
        src.settimeout(self.stall if slow else None)
        try:
            while True:
                data = src.recv(16 << 10)
                if not data:
                    break
                dst.sendall(data)
                if slow:
                    self.relayed += len(data)
                    # The scenario: a client reading at ``rate`` (not a wait for anything).
                    time.sleep(len(data) / self.rate)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()
