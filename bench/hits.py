"""Cache hits at the cost of their bytes (issue 28): the server CPU of warm blobless clones
of the dulwich history, one alone and 8 identical at once, and of one cache-hit fetch
against a bare ``sendfile`` of the same cache file.

    .venv/bin/python -m bench.hits [--repo bench/work/real/dulwich-gc.git] [--rounds 5]
        [--clients 8] [--filter blob:none] [--hits 5] [--server-arg=--pack-cache-size=0]

gitspout serves a copy of the repository (a real directory: a repository reached through
a symlink is resolved again by every request) with its pack cache in a directory of the
run and ``--pack-cache-ttl`` of :data:`TTL` seconds. After warm-up clones (the first one
cold), every round measures, with the process's CPU time (every thread's, in ns, from
``/proc``: bench/process.py ``process_cpu_ns``) from before the clients start until after
they end:

- **one**: one ``git clone --bare --filter=blob:none`` (info/refs, ls-refs, fetch), warm:
  every cache of the process is warm, but the pack cache's entry has expired (the round
  waits out the TTL first), so its pack is produced;
- **eight**: ``--clients`` such clones at once, after the TTL again: one produces the
  pack, the others read it (joined or hit). Target: eight/one <= 1.5;
- **hit**: one fetch with the body the clones send (recorded from a real clone with
  ``GIT_TRACE_PACKET``), answered from the complete entry, on a new connection;
- **bare**: the same cache file sent by ``os.sendfile`` on a blocking socket by a tiny
  sender process (it accepts, reads the file name, sends the file, closes), to a client
  reading as the hit's does: the kernel's cost of those bytes. Target: hit/bare <= 2;
- **back to back**: ``--burst`` hit fetches in a row, each on a new connection, and as
  many bare sends, measured as one window each and divided by their number: a reader's
  cost on a server that is serving hits (a storm's readers), where **hit** and **bare**
  are a lone request on an idle process, whose caches the other processes of the round
  have just used (every line of Python it runs comes back from memory);
- **floor**: ``GET /healthz`` on a new connection: what aiohttp costs per request before
  gitspout does anything (a part of hit that no pack path removes); a minimal aiohttp
  app (uvloop) that answers the same request with the same file by ``os.sendfile``, and
  nothing else: the least an aiohttp handler costs for these bytes; and the same answer
  from a bare asyncio protocol on uvloop, no web framework: the least Python and the event
  loop cost for them.

Every clone is checked (``git fsck --connectivity-only`` on one per round), and the table
shows medians over the rounds (``--hits`` samples of hit, bare and floor per round), with
what /metrics counted over the run: pack cache lookups, identical requests answered
without planning (``same_requests``) and the bytes sent by sendfile and by Python.
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.process import (  # noqa: E402
    LOOPBACK,
    ServerProcess,
    exit_on_sigterm,
    free_port,
    gitspout_command,
    process_cpu_ns,
    wait_for_http,
)
from bench.saturation import record_bodies  # noqa: E402

REPO_TOP = Path(__file__).resolve().parent.parent
DEFAULT_REPO = REPO_TOP / "bench" / "work" / "real" / "dulwich-gc.git"
UPLOAD_CT = "application/x-git-upload-pack-request"
TTL = 5.0  # --pack-cache-ttl: a round waits it out to measure a production again
SETTLE = 0.05  # seconds after a client ends before the server's CPU is read again

# The baseline: accept, read a file name, sendfile the file whole, close.
BARE_SENDER = r"""
import os, socket, sys
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(8)
print(ls.getsockname()[1], flush=True)
while True:
    conn, _ = ls.accept()
    path = conn.recv(4096).decode().strip()
    fd = os.open(path, os.O_RDONLY)
    size, off = os.fstat(fd).st_size, 0
    while off < size:
        off += os.sendfile(conn.fileno(), fd, off, size - off)
    os.close(fd)
    conn.close()
"""


# The file PATH by os.sendfile on a duplicate of a transport's socket (server/app/
# filesend.py's way), waiting for writability when the socket is full: both floors below.
SEND_PATH = r"""
async def send_path(transport, size):
    loop = asyncio.get_running_loop()
    out = os.dup(transport.get_extra_info("socket").fileno())
    fd = os.open(PATH, os.O_RDONLY)
    try:
        off = 0
        while off < size:
            try:
                off += os.sendfile(out, fd, off, size - off)
            except BlockingIOError:
                ready = loop.create_future()
                loop.add_writer(out, ready.set_result, None)
                try:
                    await ready
                finally:
                    loop.remove_writer(out)
    finally:
        os.close(fd)
        os.close(out)
"""

# The least an aiohttp server can do for the same answer (uvloop, as gitspout): read the
# request, send headers, then the file by SEND_PATH.
AIOHTTP_SENDFILE = r"""
import asyncio, os, sys
import uvloop
from aiohttp import web

PATH = sys.argv[1]
""" + SEND_PATH + r"""

async def handle(request):
    await request.read()
    size = os.stat(PATH).st_size
    resp = web.StreamResponse(headers={"Content-Type": "application/x-git-upload-pack-result"})
    resp.content_length = size
    await resp.prepare(request)
    request.writer.send_headers()
    await send_path(request.transport, size)
    await resp.write_eof()
    return resp

async def main():
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(site._server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()

uvloop.install()
asyncio.run(main())
"""


# The same answer without aiohttp: a bare asyncio protocol on uvloop reads the request
# head and its body (Content-Length), writes the status line and headers, sends the file
# by SEND_PATH, and closes. What Python and the event loop cost for these bytes before any
# web framework: the floor of a server that kept aiohttp off its hot path.
RAW_SENDFILE = r"""
import asyncio, os, sys
import uvloop

PATH = sys.argv[1]
""" + SEND_PATH + r"""

class Answer(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buf = transport, b""

    def data_received(self, data):
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        length = 0
        for line in self.buf[:end].split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(self.buf) - end - 4 >= length:
            self.transport.pause_reading()
            self.task = asyncio.ensure_future(self.send())  # kept: not collected mid-send

    async def send(self):
        size = os.stat(PATH).st_size
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: "
                             b"application/x-git-upload-pack-result\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n" % size)
        try:
            await send_path(self.transport, size)
        finally:
            self.transport.close()

async def main():
    server = await asyncio.get_running_loop().create_server(Answer, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()

uvloop.install()
asyncio.run(main())
"""


def _git(*args: str, env: dict[str, str] | None = None) -> str:
    full = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", **(env or {})}
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True,
                          env=full, timeout=600).stdout


def clone_args(filter_spec: str) -> list[str]:
    return ["-c", "protocol.version=2", "clone", "-q", "--bare",
            *([f"--filter={filter_spec}"] if filter_spec else [])]


def clones(url: str, dests: list[Path], filter_spec: str) -> None:
    """``len(dests)`` clones at once; raises if one fails."""
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1"}
    procs = [subprocess.Popen(["git", *clone_args(filter_spec), url, str(d)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
             for d in dests]
    errors = []
    for p in procs:
        _, err = p.communicate(timeout=600)
        if p.returncode:
            errors.append(err.decode(errors="replace")[-300:])
    if errors:
        raise RuntimeError(f"{len(errors)} clones failed: {errors[0]}")


def read_to_close(sock: socket.socket) -> int:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    buf = bytearray(1 << 20)
    n = 0
    while True:
        k = sock.recv_into(buf)
        if not k:
            return n
        n += k


def fetch_once(port: int, path: str, body: bytes) -> int:
    """One POST on a new connection (``Connection: close``), read whole; bytes read."""
    with socket.create_connection((LOOPBACK, port), timeout=60) as sock:
        head = (f"POST {path} HTTP/1.1\r\nHost: {LOOPBACK}:{port}\r\n"
                f"Content-Type: {UPLOAD_CT}\r\nGit-Protocol: version=2\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        sock.sendall(head + body)
        n = read_to_close(sock)
    if n < 1000:
        raise RuntimeError(f"the fetch answered {n} bytes only")
    return n


def get_once(port: int, path: str, headers: str = "") -> int:
    """One GET on a new connection, read whole; ``headers``: extra lines, each ending in
    CRLF."""
    with socket.create_connection((LOOPBACK, port), timeout=60) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n"
                     .encode())
        return read_to_close(sock)


def bare_once(port: int, path: Path) -> int:
    with socket.create_connection((LOOPBACK, port), timeout=60) as sock:
        sock.sendall(str(path).encode() + b"\n")
        return read_to_close(sock)


def measure(pid: int, run: Callable[[], object]) -> float:
    """Milliseconds of CPU the process ``pid`` spent while ``run()`` ran."""
    before = process_cpu_ns(pid)
    run()
    time.sleep(SETTLE)
    return (process_cpu_ns(pid) - before) / 1e6


def metrics(port: int) -> dict[str, float]:
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    out = {}
    for name, labels, value in re.findall(
            r'^gitspout_pack_cache_(lookups|same_requests|served_bytes)_total'
            r'\{\w+="(\w+)"\} (\S+)$', text, re.M):
        out[f"{name}.{labels}"] = float(value)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hits", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, default=DEFAULT_REPO)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--filter", default="blob:none")
    parser.add_argument("--hits", type=int, default=5, help="hit/bare/floor samples a round")
    parser.add_argument("--burst", type=int, default=20,
                        help="hits (and bare sends) back to back, once a round")
    parser.add_argument("--warmup", type=int, default=3, help="clones before the rounds")
    parser.add_argument("--server-arg", action="append", default=[])
    args = parser.parse_args(argv)
    if args.burst < 1 or args.hits < 1:
        parser.error("--burst and --hits must be 1 or more")
    exit_on_sigterm()
    if not (args.repo / "objects").is_dir():
        raise SystemExit(f"{args.repo}: no repository (python bench/prepare_real.py dulwich)")
    tmp = Path(tempfile.mkdtemp(prefix="gitspout-hits-"))
    root, cache, work = tmp / "root", tmp / "cache", tmp / "work"
    for d in (root, cache, work):
        d.mkdir()
    shutil.copytree(args.repo, root / "repo.git", symlinks=True)
    port = free_port()
    prefix, extra = gitspout_command(REPO_TOP, tmp / "import")
    server = ServerProcess("gitspout", [
        *prefix, "--root", str(root), "--host", LOOPBACK, "--port", str(port),
        "--log-level", "warning", "--pack-cache-dir", str(cache), "--pack-cache-ttl", str(TTL),
        *args.server_arg], log_path=tmp / "server.log", cwd=REPO_TOP,
        env={**os.environ, **extra}).start()
    sender = subprocess.Popen([sys.executable, "-c", BARE_SENDER], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert sender.stdout is not None
        bare_port = int(sender.stdout.readline())
        wait_for_http(port, "/repo.git/info/refs?service=git-upload-pack", procs=[server])
        url = f"http://{LOOPBACK}:{port}/repo.git"
        pid = server.pid
        trace = work / "trace"
        _git(*clone_args(args.filter), url, str(work / "traced.git"),
             env={"GIT_TRACE_PACKET": str(trace), "GIT_PROTOCOL_FROM_USER": "1"})
        body = next(b for b in record_bodies(trace) if b"command=fetch" in b)
        for i in range(args.warmup):
            clones(url, [work / f"warm{i}.git"], args.filter)
        start = metrics(port)
        rows: dict[str, list[float]] = {
            k: [] for k in ("one", "eight", "hit", "bare", "floor", "minimal", "raw", "hits",
                          "bares")}
        minimal: subprocess.Popen[str] | None = None
        raw: subprocess.Popen[str] | None = None
        size = 0
        for r in range(args.rounds):
            time.sleep(TTL + 0.5)  # the entry expires: this clone produces the pack
            dest = work / f"r{r}-one.git"
            rows["one"].append(measure(pid, lambda d=dest: clones(url, [d], args.filter)))
            _git("--git-dir", str(dest), "fsck", "--connectivity-only", "--no-dangling")
            time.sleep(TTL + 0.5)
            fetch_once(port, "/repo.git/git-upload-pack", body)  # produced: hits for a TTL
            (cached,) = [f for f in cache.rglob("*.pack")]
            baseline = work / "cached.pack"  # the same bytes, kept from eviction
            shutil.copyfile(cached, baseline)
            size = baseline.stat().st_size
            if minimal is None:
                minimal = subprocess.Popen([sys.executable, "-c", AIOHTTP_SENDFILE,
                                            str(baseline)], stdout=subprocess.PIPE, text=True)
                assert minimal.stdout is not None
                minimal_port = int(minimal.stdout.readline())
                raw = subprocess.Popen([sys.executable, "-c", RAW_SENDFILE, str(baseline)],
                                       stdout=subprocess.PIPE, text=True)
                assert raw.stdout is not None
                raw_port = int(raw.stdout.readline())
            assert raw is not None
            before = metrics(port)
            # First, while the entry is fresh: every one of them must be a hit (below).
            rows["hits"].append(measure(pid, lambda: [fetch_once(
                port, "/repo.git/git-upload-pack", body) for _ in range(args.burst)])
                / args.burst)
            rows["bares"].append(measure(sender.pid, lambda b=baseline: [
                bare_once(bare_port, b) for _ in range(args.burst)]) / args.burst)
            for _ in range(args.hits):
                rows["hit"].append(measure(pid, lambda: fetch_once(
                    port, "/repo.git/git-upload-pack", body)))
                rows["bare"].append(measure(sender.pid, lambda b=baseline: bare_once(bare_port, b)))
                rows["floor"].append(measure(pid, lambda: get_once(port, "/healthz")))
                rows["minimal"].append(measure(minimal.pid, lambda p=minimal_port: fetch_once(
                    p, "/repo.git/git-upload-pack", body)))
                rows["raw"].append(measure(raw.pid, lambda p=raw_port: fetch_once(
                    p, "/repo.git/git-upload-pack", body)))
            hits = metrics(port).get("lookups.hit", 0) - before.get("lookups.hit", 0)
            if hits != args.hits + args.burst:
                raise RuntimeError(f"{hits:.0f} of {args.hits + args.burst} hit fetches were "
                                   "cache hits")
            time.sleep(TTL + 0.5)
            before = metrics(port)
            dests = [work / f"r{r}-eight-{i}.git" for i in range(args.clients)]
            rows["eight"].append(measure(pid, lambda d=dests: clones(url, d, args.filter)))
            _git("--git-dir", str(dests[-1]), "fsck", "--connectivity-only", "--no-dangling")
            seen = {k: metrics(port).get(k, 0) - before.get(k, 0) for k in before}
            for d in [dest, *dests]:
                shutil.rmtree(d)
            print(f"round {r + 1}: one {rows['one'][-1]:.1f} ms, eight {rows['eight'][-1]:.1f}"
                  f" ms (misses {seen.get('lookups.miss', 0):.0f}, joined "
                  f"{seen.get('lookups.joined', 0):.0f}, hits {seen.get('lookups.hit', 0):.0f};"
                  f" same-request hits {seen.get('same_requests.hit', 0):.0f}), hit "
                  f"{statistics.median(rows['hit'][-args.hits:]):.2f} ms, bare "
                  f"{statistics.median(rows['bare'][-args.hits:]):.2f} ms; back to back: hit "
                  f"{rows['hits'][-1]:.2f} ms, bare {rows['bares'][-1]:.2f} ms; load "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
        end = metrics(port)
        print(table(rows, args, size))
        print("over the run: " + ", ".join(
            f"{k} {end.get(k, 0) - start.get(k, 0):.0f}" for k in sorted(end)))
    finally:
        for proc in (sender, minimal, raw):
            if proc is not None:
                proc.kill()
                proc.wait()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def table(rows: dict[str, list[float]], args: argparse.Namespace, size: int) -> str:
    med = {k: statistics.median(v) for k, v in rows.items()}
    lines = [
        f"{args.repo.name}, --filter={args.filter}, {args.rounds} rounds, medians; cache "
        f"file {size / 1e6:.1f} MB",
        "| case | server CPU (ms) | ratio | target |",
        "|---|---:|---:|---|",
        f"| (a) one warm clone (pack produced) | {med['one']:.1f} | 1.00 | |",
        f"| (b) {args.clients} identical clones at once | {med['eight']:.1f} | "
        f"{med['eight'] / med['one']:.2f} x (a) | <= 1.5 x (a) |",
        f"| (c) one cache-hit fetch | {med['hit']:.2f} | {med['hit'] / med['bare']:.2f} x bare |"
        " <= 2 x bare |",
        f"| bare sendfile of the cache file | {med['bare']:.2f} | 1.00 | |",
        f"| (c) back to back: {args.burst} cache-hit fetches in a row, each | {med['hits']:.2f} |"
        f" {med['hits'] / med['bares']:.2f} x bare | <= 2 x bare |",
        f"| bare sendfile back to back, each | {med['bares']:.2f} | 1.00 | |",
        f"| aiohttp floor: GET /healthz | {med['floor']:.2f} | "
        f"{med['floor'] / med['bare']:.2f} x bare | |",
        f"| aiohttp floor: a minimal app sending the file | {med['minimal']:.2f} | "
        f"{med['minimal'] / med['bare']:.2f} x bare | |",
        f"| floor without aiohttp: an asyncio protocol sending the file | {med['raw']:.2f} | "
        f"{med['raw'] / med['bare']:.2f} x bare | |",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
