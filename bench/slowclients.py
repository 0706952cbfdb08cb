"""How long gitspout keeps the connections of clients that are slow to send.

Four clients at once, each on its own connection, watched until the server closes it or
``--limit`` seconds pass:

* ``silent``: connects and sends nothing;
* ``slow header``: a request head at one byte a second;
* ``slow body``: a complete head announcing 100,000 bytes of body, then a byte a second;
* ``idle keep-alive``: one request answered, then nothing.

Then, on a server of its own with ``--drain-timeout`` (``--drain``, 2 s by default): a
client that asks for a 16 MiB pack and never reads it, and SIGTERM; the figure is the time
from the signal to the exit, which should be the drain timeout and not twice it
(tests/server/test_server_drain.py checks only that the exit comes, and that the reader
was cut).

``--tree`` chooses the gitspout source tree to run (repeatable), as in bench/loopstall.py::

    git archive <commit> | tar -x -C /tmp/old
    .venv/bin/python -m bench.slowclients --tree /tmp/old --tree . --limit 300

Extra arguments after ``--`` go to ``gitspout serve`` (e.g. ``-- --header-timeout 5``).
Standard library only; the server runs with this interpreter.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
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


BIG_BLOB = 16 << 20


def _big_repo(repo: Path) -> None:
    """One commit holding a 16 MiB incompressible blob: more than socket buffers absorb."""
    blob = random.Random(20240611).randbytes(BIG_BLOB)
    msg = b"big\n"
    stream = (b"blob\nmark :1\ndata %d\n" % len(blob) + blob + b"\n"
              b"commit refs/heads/main\nmark :2\n"
              b"committer Bench <bench@example.com> 1600000000 +0000\n"
              b"data %d\n%s" % (len(msg), msg) + b"M 100644 :1 big.bin\n\n")
    _fast_import(repo, stream)


def drain_stalled(tree: Path, root: Path, work: Path, drain: float) -> float | None:
    """Seconds from SIGTERM to the exit of a server whose one client stopped reading its
    pack (None: still running after 4 x ``drain`` + 30 s)."""
    port = free_port()
    prefix, extra = gitspout_command(tree, work / f"import-{port}")
    argv = [*prefix, "--root", str(root), "--host", LOOPBACK, "--port", str(port),
            "--log-level", "warning", "--drain-timeout", str(drain)]
    server = ServerProcess(f"gitspout@{tree}", argv, log_path=work / f"drain-{port}.log",
                           cwd=tree, env={**os.environ, **extra}).start()
    try:
        wait_for_http(port, "/big.git/info/refs?service=git-upload-pack", procs=[server])
        tip = subprocess.run(["git", "--git-dir", str(root / "big.git"), "rev-parse", "main"],
                             capture_output=True, text=True, check=True).stdout.strip()
        body = (b"%04x" % (len(f"want {tip} side-band-64k\n") + 4)
                + f"want {tip} side-band-64k\n".encode() + b"0000" + b"0009done\n")
        with socket.create_connection((LOOPBACK, port), timeout=10) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(f"POST /big.git/git-upload-pack HTTP/1.1\r\nHost: {LOOPBACK}\r\n"
                         "Content-Type: application/x-git-upload-pack-request\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            sock.recv(4096)  # the head: the pack is under way; never read again
            time.sleep(0.5)  # let the server fill what the socket buffers take
            start = time.monotonic()
            assert server.proc is not None
            server.proc.send_signal(signal.SIGTERM)
            try:
                server.proc.wait(timeout=4 * drain + 30)
            except subprocess.TimeoutExpired:
                return None
            return time.monotonic() - start
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.slowclients", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", type=Path,
                        help="gitspout source tree to run (repeatable; default: this checkout)")
    parser.add_argument("--limit", type=float, default=120.0,
                        help="give up watching a connection after this many seconds")
    parser.add_argument("--drain", type=float, default=2.0,
                        help="--drain-timeout of the stalled-reader-at-SIGTERM case")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    parser.add_argument("serve_args", nargs="*", help="extra gitspout serve arguments")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    root = args.work / "slowclients"
    if not (root / "tiny.git").exists():
        root.mkdir(parents=True, exist_ok=True)
        _fast_import(root / "tiny.git", _chain(3))
    if not (root / "big.git").exists():
        _big_repo(root / "big.git")
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
        took = drain_stalled(tree, root, args.work, args.drain)
        shown = f"{took:.1f} s" if took is not None else "no exit (killed)"
        print(f"  {'stalled reader at SIGTERM':22s} exit after {shown} "
              f"(--drain-timeout {args.drain:g})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
