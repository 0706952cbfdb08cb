"""How long gitspout keeps the connections of clients that are slow to send.

Four clients at once, each on its own connection, watched until the server closes it or
``--limit`` seconds pass:

* ``silent``: connects and sends nothing;
* ``slow header``: a request head at one byte a second;
* ``slow body``: a complete head announcing 100,000 bytes of body, then a byte a second;
* ``idle keep-alive``: one request answered, then nothing.

``--tree`` chooses the gitspout source tree to run (repeatable), as in bench/loopstall.py::

    git archive <commit> | tar -x -C /tmp/old
    .venv/bin/python -m bench.slowclients --tree /tmp/old --tree . --limit 300

Extra arguments after ``--`` go to ``gitspout serve`` (e.g. ``-- --header-timeout 5``).
Standard library only; the server runs with this interpreter.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from pathlib import Path

from bench.loopstall import DEFAULT_WORK, REPO_TOP, _chain, _fast_import, describe
from bench.process import (
    LOOPBACK,
    ServerProcess,
    exit_on_sigterm,
    free_port,
    gitspout_command,
    wait_for_http,
)

INFO_REFS = "/tiny.git/info/refs?service=git-upload-pack"
HEAD = (f"GET {INFO_REFS} HTTP/1.1\r\nHost: {LOOPBACK}\r\n".encode()
        + b"X-Pad: " + b"p" * 400 + b"\r\n\r\n")
POST_HEAD = (f"POST /tiny.git/git-upload-pack HTTP/1.1\r\nHost: {LOOPBACK}\r\n"
             "Content-Type: application/x-git-upload-pack-request\r\n"
             "Content-Length: 100000\r\n\r\n").encode()


def watch(sock: socket.socket, limit: float, drip: bytes = b"") -> float | None:
    """Seconds until the server closes ``sock``, sending ``drip`` a byte a second
    meanwhile and dropping what the server sends; None if still open after ``limit``."""
    start = time.monotonic()
    sent = 0
    sock.settimeout(1.0)
    while time.monotonic() - start < limit:
        if sent < len(drip):
            try:
                sock.send(drip[sent:sent + 1])
                sent += 1
            except OSError:
                return time.monotonic() - start
        try:
            if not sock.recv(1 << 16):
                return time.monotonic() - start
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - start
    return None


def measure(port: int, limit: float) -> dict[str, float | None]:
    def connect() -> socket.socket:
        return socket.create_connection((LOOPBACK, port), timeout=10)

    keep = connect()
    keep.sendall(HEAD)
    time.sleep(0.5)
    keep.recv(1 << 16)  # the answer (small): the connection is now idle
    body = connect()
    body.sendall(POST_HEAD)
    clients = {
        "silent": (connect(), b""),
        "slow header (1 B/s)": (connect(), HEAD),
        "slow body (1 B/s)": (body, b"0" * 100_000),
        "idle keep-alive": (keep, b""),
    }
    results: dict[str, float | None] = {}

    def run(name: str, sock: socket.socket, drip: bytes) -> None:
        try:
            results[name] = watch(sock, limit, drip)
        finally:
            sock.close()

    threads = [threading.Thread(target=run, args=(name, sock, drip))
               for name, (sock, drip) in clients.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(limit + 30)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.slowclients", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", type=Path,
                        help="gitspout source tree to run (repeatable; default: this checkout)")
    parser.add_argument("--limit", type=float, default=120.0,
                        help="give up watching a connection after this many seconds")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    parser.add_argument("serve_args", nargs="*", help="extra gitspout serve arguments")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    root = args.work / "slowclients"
    if not (root / "tiny.git").exists():
        root.mkdir(parents=True, exist_ok=True)
        _fast_import(root / "tiny.git", _chain(3))
    for tree in args.tree or [REPO_TOP]:
        tree = tree.resolve()
        port = free_port()
        prefix, extra = gitspout_command(tree, args.work / f"import-{port}")
        argv_ = [*prefix, "--root", str(root), "--host",
                 LOOPBACK, "--port", str(port), "--log-level", "warning", *args.serve_args]
        server = ServerProcess(f"gitspout@{tree}", argv_, log_path=args.work / f"slow-{port}.log",
                               cwd=tree, env={**os.environ, **extra}).start()
        try:
            wait_for_http(port, INFO_REFS, procs=[server])
            print(f"\n{tree}: {describe(tree)}", flush=True)
            for name, seconds in measure(port, args.limit).items():
                shown = f"{seconds:.1f} s" if seconds is not None else f">= {args.limit:.0f} s (open)"
                print(f"  {name:22s} closed after {shown}", flush=True)
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
