"""Peak and after RSS of gitspout under many fetches of a large blob and many slow readers
(issue 13, "Memory caps"; docs/ARCHITECTURE.md "Memory caps").

Fixtures, built once into ``--work`` (default bench/work/memcap): ``blob.git``, a few small
commits then one adding a 24 MB random (incompressible) blob, in three shapes:

* ``blob-gc.git``: one pack with a bitmap (a clone goes out verbatim, a fetch copies
  the blob's entry from the pack);
* ``blob-loose.git``: the same objects, the blob as a loose object (inflated and deflated
  again on the way out);
* ``blob-deep.git``: a 24 MB blob, then a 23 MB variant of it stored as a delta against
  it: a fetch of the variant by a client without the blob (no thin pack) must resolve it
  and send it whole.

Cases (each against a fresh server; the RSS of the server process is sampled every 20 ms):

* ``fetch``: ``--fetches`` concurrent v2 fetches of the blob commit by clients that have
  its parent, on each shape, read as fast as the client goes;
* ``slow``: ``--slow`` concurrent clones of blob-gc.git by clients reading ``--slow-rate``
  bytes/s for ``--slow-seconds`` and then hanging up.

Each line prints the baseline RSS (after one warm-up fetch), the peak, the RSS 2 s after
the clients ended, and how many responses were whole (ending in a flush after the pack)::

    .venv/bin/python -m bench.memcap                      # 60 fetches x 3 shapes, 200 slow
    .venv/bin/python -m bench.memcap --fetches 10 --slow 20 -- --max-packs 0

Extra arguments after ``--`` go to ``gitspout serve``. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.process import LOOPBACK, ServerProcess, exit_on_sigterm, free_port, gitspout_command, wait_for_http

REPO_TOP = Path(__file__).resolve().parent.parent
DEFAULT_WORK = REPO_TOP / "bench" / "work" / "memcap"
BLOB_BYTES = 24 << 20
SHAPES = ("blob-gc.git", "blob-loose.git", "blob-deep.git")


# -- fixtures -------------------------------------------------------------------------------

def _git(*args: str, cwd: Path | None = None, stdin: bytes | None = None) -> str:
    env = {**os.environ, "GIT_AUTHOR_DATE": "1600000000 +0000",
           "GIT_COMMITTER_DATE": "1600000000 +0000", "GIT_AUTHOR_NAME": "b",
           "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@x"}
    return subprocess.run(["git", *args], cwd=cwd, input=stdin, check=True, env=env,
                          capture_output=True).stdout.decode().strip()


def _commit(gd: list[str], files: dict[str, str], parent: str | None, msg: str) -> str:
    tree_in = "".join(f"100644 blob {oid}\t{name}\n" for name, oid in sorted(files.items()))
    tree = _git(*gd, "mktree", stdin=tree_in.encode())
    return _git(*gd, "commit-tree", tree, *(["-p", parent] if parent else []), "-m", msg)


def build(work: Path) -> dict[str, tuple[str, str]]:
    """The three shapes; per shape (base commit, tip commit): a fetch wants tip, has base."""
    work.mkdir(parents=True, exist_ok=True)
    marker = work / "commits.txt"
    if marker.exists():
        out = {}
        for line in marker.read_text().splitlines():
            name, base, tip = line.split()
            out[name] = (base, tip)
        return out
    rnd = random.Random(13)
    blob = rnd.randbytes(BLOB_BYTES)
    # Shorter than blob, so that git keeps blob whole and stores variant as a delta on it.
    variant = bytearray(blob[: BLOB_BYTES - (1 << 20)])
    for _ in range(64):  # a few scattered edits: a small delta against blob
        at = rnd.randrange(len(variant) - 8)
        variant[at:at + 8] = rnd.randbytes(8)
    out = {}
    for shape in SHAPES:
        repo = work / shape
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(repo)], check=True)
        gd = ["--git-dir", str(repo)]
        files: dict[str, str] = {}
        parent = None
        for i in range(5):
            files[f"f{i}.txt"] = _git(*gd, "hash-object", "-w", "--stdin",
                                      stdin=f"small file {i}\n".encode() * 50)
            parent = _commit(gd, files, parent, f"c{i}")
        if shape == "blob-loose.git":
            _git(*gd, "repack", "-adq")  # the small objects; the big blob stays loose
        if shape == "blob-deep.git":
            (work / "blob.bin").write_bytes(blob)
            files["big.bin"] = _git(*gd, "hash-object", "-w", str(work / "blob.bin"))
            parent = _commit(gd, files, parent, "big")
            (work / "blob.bin").write_bytes(bytes(variant))
            files["big.bin"] = _git(*gd, "hash-object", "-w", str(work / "blob.bin"))
        else:
            (work / "blob.bin").write_bytes(blob)
            files["big.bin"] = _git(*gd, "hash-object", "-w", str(work / "blob.bin"))
        (work / "blob.bin").unlink()
        base = parent
        tip = _commit(gd, files, parent, "tip")
        _git(*gd, "update-ref", "refs/heads/main", tip)
        if shape == "blob-loose.git":
            big = files["big.bin"]
            loose = repo / "objects" / big[:2] / big[2:]
            if not loose.exists():
                raise SystemExit("expected the blob to stay loose")
        else:
            _git(*gd, "repack", "-adq", "--write-bitmap-index", "--window=10", "--depth=5")
        assert base is not None
        out[shape] = (base, tip)
    marker.write_text("".join(f"{k} {b} {t}\n" for k, (b, t) in out.items()))
    return out


# -- clients --------------------------------------------------------------------------------

def _pkt(line: str) -> bytes:
    data = line.encode() + b"\n"
    return b"%04x" % (len(data) + 4) + data


def fetch_request(repo: str, want: str, have: str | None) -> bytes:
    body = (_pkt("command=fetch") + _pkt("object-format=sha1") + b"0001" + _pkt("ofs-delta")
            + _pkt(f"want {want}") + (_pkt(f"have {have}") if have else b"") + _pkt("done")
            + b"0000")
    head = (f"POST /{repo}/git-upload-pack HTTP/1.1\r\nHost: {LOOPBACK}\r\n"
            "Content-Type: application/x-git-upload-pack-request\r\nGit-Protocol: version=2\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


def run_client(port: int, req: bytes, rate: int = 0, seconds: float = 0.0) -> str:
    """'whole', 'cut' (ended mid-response), '503', 'hung up' (a slow reader that left
    on purpose) or 'error ...'."""
    try:
        sock = socket.create_connection((LOOPBACK, port), timeout=120)
    except OSError as exc:
        return f"error {exc}"
    try:
        if rate:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
        sock.sendall(req)
        tail = b""
        head = b""
        start = time.monotonic()
        while True:
            chunk = sock.recv(16 << 10 if rate else 1 << 20)
            if not chunk:
                break
            if len(head) < 64:
                head += chunk[:64]
            tail = (tail + chunk)[-64:]
            if rate:
                if time.monotonic() - start > seconds:
                    return "hung up"
                time.sleep(len(chunk) / rate)
        if head.startswith(b"HTTP/1.1 503"):
            return "503"
        # A whole chunked v2 response: its pack section ends in a flush, then the last chunk.
        return "whole" if tail.endswith(b"0000\r\n0\r\n\r\n") else "cut"
    except OSError as exc:
        return f"error {exc}"
    finally:
        sock.close()


# -- measuring ------------------------------------------------------------------------------

def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    return 0


class Sampler:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss(self.pid))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def measure(pid: int, port: int, clients: list[Callable[[], str]]) -> dict[str, object]:
    base = rss(pid)
    sampler = Sampler(pid)
    start = time.monotonic()
    with ThreadPoolExecutor(len(clients)) as pool:
        results = list(pool.map(lambda f: f(), clients))
    wall = time.monotonic() - start
    time.sleep(2.0)
    peak = sampler.stop()
    after = rss(pid)
    counts: dict[str, int] = {}
    for r in results:
        key = r if not r.startswith("error") else "error"
        counts[key] = counts.get(key, 0) + 1
    return {"base": base, "peak": peak, "after": after, "wall": wall, "results": counts,
            "errors": sorted({r for r in results if r.startswith("error")})[:3]}


def _mb(n: int) -> str:
    return f"{n / 1e6:7.0f} MB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memcap", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, default=REPO_TOP, help="gitspout source tree")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    parser.add_argument("--fetches", type=int, default=60)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--slow", type=int, default=200)
    parser.add_argument("--slow-rate", type=int, default=256 << 10, help="bytes/s per reader")
    parser.add_argument("--slow-seconds", type=float, default=10.0)
    parser.add_argument("serve_args", nargs="*", help="extra gitspout serve arguments")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    commits = build(args.work)
    tree = args.tree.resolve()
    cases: list[tuple[str, str, list[Callable[[], str]]]] = []
    for shape in [s for s in args.shapes.split(",") if s] if args.fetches else []:
        base, tip = commits[shape]
        req = fetch_request(shape, tip, base)
        cases.append((f"fetch x{args.fetches} {shape}", shape,
                      [lambda req=req: run_client(port, req)] * args.fetches))
    if args.slow:
        base, tip = commits["blob-gc.git"]
        req = fetch_request("blob-gc.git", tip, None)
        cases.append((f"slow x{args.slow} blob-gc.git", "blob-gc.git",
                      [lambda: run_client(port, req, args.slow_rate, args.slow_seconds)]
                      * args.slow))
    print(f"gitspout {tree}; serve args: {' '.join(args.serve_args) or '(defaults)'}", flush=True)
    for name, shape, clients in cases:
        port = free_port()
        prefix, extra = gitspout_command(tree, args.work / f"import-{port}")
        argv_ = [*prefix, "--root", str(args.work), "--host", LOOPBACK, "--port", str(port),
                 "--log-level", "warning", *args.serve_args]
        server = ServerProcess(f"gitspout-{port}", argv_, log_path=args.work / f"memcap-{port}.log",
                               cwd=tree, env={**os.environ, **extra}).start()
        try:
            wait_for_http(port, f"/{shape}/info/refs?service=git-upload-pack", procs=[server])
            base, tip = commits[shape]
            run_client(port, fetch_request(shape, tip, base))  # warm-up
            got = measure(server.pid, port, clients)
        finally:
            server.stop()
        b, p, a = got["base"], got["peak"], got["after"]
        assert isinstance(b, int) and isinstance(p, int) and isinstance(a, int)
        print(f"{name:32s} base {_mb(b)}  peak {_mb(p)} (+{(p - b) / 1e6:.0f})  "
              f"after {_mb(a)} (+{(a - b) / 1e6:.0f})  wall {got['wall']:.1f} s  "
              f"{got['results']} {got['errors'] or ''}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
