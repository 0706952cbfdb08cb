"""Fairness under a clone storm: how long a small fetch on another repository takes while
``--clients`` identical clones of a big one run (issue 12: p99 <= 100 ms with 32).

A storm is ``--clients`` processes, each sending the v2 fetch a ``git clone --mirror``
sends (every ref tip, ``thin-pack``, ``ofs-delta``, ``no-progress``; ``--filter`` adds a
filter line) for the storm repository at the same moment and reading the whole answer.
With ``--client git`` they are real ``git clone --mirror`` processes instead (their
index-pack competes with the server for the CPUs; they run at nice 19). Meanwhile this
process fetches the tip of ``tiny.git`` (a 3-commit pack, v2) again and again and times
each fetch. ``--storms`` storms run one after the other; the figures are over all of them.

    .venv/bin/python -m bench.storm [--repo bench/work/real/dulwich-gc.git] [--clients 32]
        [--storms 3] [--filter blob:none] [--client raw|git] [--server-arg=--pack-cache-size=0]

The storm repository and ``tiny.git`` (bench/work/loopstall) are served through symlinks
(``--allow-symlinks-outside-root``). Prints p50/p99/max of the small fetch, the storm's
wall time, and the server's pack cache lookups from /metrics.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loopstall import DEFAULT_WORK, build_fixtures, percentile, pkt, post  # noqa: E402
from bench.process import (  # noqa: E402
    LOOPBACK,
    ServerProcess,
    exit_on_sigterm,
    free_port,
    gitspout_command,
    wait_for_http,
)

REPO_TOP = Path(__file__).resolve().parent.parent
DEFAULT_REPO = REPO_TOP / "bench" / "work" / "real" / "dulwich-gc.git"


def fetch_body(tips: list[str], filter_spec: str | None) -> bytes:
    parts = [pkt("command=fetch\n"), pkt("object-format=sha1\n"), b"0001",
             pkt("thin-pack\n"), pkt("no-progress\n"), pkt("ofs-delta\n")]
    if filter_spec:
        parts.append(pkt(f"filter {filter_spec}\n"))
    parts += [pkt(f"want {t}\n") for t in tips] + [pkt("done\n"), b"0000"]
    return b"".join(parts)


def _raw_clone(port: int, repo: str, body: bytes, start: Any, out: Any) -> None:
    os.nice(19)  # the clients share the CPUs with the server and the timed fetch
    start.wait()
    t0 = time.perf_counter()
    status, size = post(port, repo, body, {"Git-Protocol": "version=2"})
    out.put((status, size, time.perf_counter() - t0))


def _git_clone(url: str, dest: str, filter_spec: str | None, start: Any, out: Any) -> None:
    os.nice(19)
    start.wait()
    t0 = time.perf_counter()
    extra = [f"--filter={filter_spec}"] if filter_spec else []
    proc = subprocess.run(["git", "-c", "protocol.version=2", "clone", "--mirror", "-q",
                           *extra, url, dest], capture_output=True)
    out.put((200 if proc.returncode == 0 else 500, 0, time.perf_counter() - t0))
    shutil.rmtree(dest, ignore_errors=True)


def storm(port: int, args: argparse.Namespace, body: bytes, small: bytes,
          scratch: Path) -> tuple[list[float], float]:
    """One storm; the small fetch's latencies (ms) during it, and the storm's wall (s)."""
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.SimpleQueue()
    procs = []
    for i in range(args.clients):
        if args.client == "git":
            target: Any = _git_clone
            a: tuple[Any, ...] = (f"http://{LOOPBACK}:{port}/storm.git",
                                  str(scratch / f"c{i}.git"), args.filter, start, out)
        else:
            target, a = _raw_clone, (port, "storm.git", body, start, out)
        procs.append(ctx.Process(target=target, args=a, daemon=True))
    for p in procs:
        p.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    t0p = time.perf_counter()
    start.set()
    lat: list[float] = []
    while any(p.is_alive() for p in procs):
        s = time.perf_counter()
        status, size = post(port, "tiny.git", small, {"Git-Protocol": "version=2"})
        lat.append((time.perf_counter() - s) * 1000)
        if args.verbose and lat[-1] > 50:
            print(f"  slow small fetch at +{s - t0p:.2f} s: {lat[-1]:.0f} ms", flush=True)
        if status != 200 or size < 200:
            raise RuntimeError(f"small fetch answered {status} with {size} bytes")
        time.sleep(args.gap)
    wall = time.monotonic() - t0
    for p in procs:
        p.join(30)
    results = [out.get() for _ in procs]
    bad = [r for r in results if r[0] != 200]
    if bad:
        raise RuntimeError(f"{len(bad)} storm clients failed: {bad[0]}")
    return lat, wall


def cache_lookups(port: int) -> str:
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    found = re.findall(r'gitspout_pack_cache_lookups_total\{result="(\w+)"\} (\S+)', text)
    return " ".join(f"{k}={float(v):.0f}" for k, v in found) or "(no pack cache)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.storm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, default=DEFAULT_REPO)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--storms", type=int, default=3)
    parser.add_argument("--filter", default=None)
    parser.add_argument("--client", choices=("raw", "git"), default="raw")
    parser.add_argument("--gap", type=float, default=0.01)
    parser.add_argument("--verbose", action="store_true", help="print each fetch over 50 ms")
    parser.add_argument("--server-arg", action="append", default=[])
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="the server's sys.setswitchinterval (GIL hand-off), seconds")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    args = parser.parse_args(argv)
    exit_on_sigterm()
    loop_root, _ = build_fixtures(args.work, 10)
    tmp = Path(tempfile.mkdtemp(prefix="gitspout-storm-"))
    root = tmp / "root"
    root.mkdir()
    os.symlink(args.repo.resolve(), root / "storm.git")
    os.symlink(loop_root / "tiny.git", root / "tiny.git")
    tips = sorted(set(subprocess.run(["git", "--git-dir", str(args.repo), "for-each-ref",
                                      "--format=%(objectname)"], capture_output=True,
                                     text=True, check=True).stdout.split()))
    tiny_tip = subprocess.run(["git", "--git-dir", str(root / "tiny.git"), "rev-parse", "main"],
                              capture_output=True, text=True, check=True).stdout.strip()
    small = fetch_body([tiny_tip], None)
    port = free_port()
    prefix, extra = gitspout_command(REPO_TOP, tmp / "import")
    if args.switch_interval is not None:  # sitecustomize on the server's import path
        (tmp / "import" / "sitecustomize.py").write_text(
            f"import sys\nsys.setswitchinterval({args.switch_interval!r})\n")
    argv_ = [*prefix, "--root", str(root), "--host", LOOPBACK, "--port", str(port),
             "--log-level", "warning", "--allow-symlinks-outside-root", *args.server_arg]
    server = ServerProcess("gitspout", argv_, log_path=tmp / "server.log", cwd=REPO_TOP,
                           env={**os.environ, **extra}).start()
    try:
        wait_for_http(port, "/tiny.git/info/refs?service=git-upload-pack", procs=[server])
        idle = []
        for _ in range(50):
            s = time.perf_counter()
            post(port, "tiny.git", small, {"Git-Protocol": "version=2"})
            idle.append((time.perf_counter() - s) * 1000)
        print(f"repo {args.repo.name} clients {args.clients} ({args.client}) filter "
              f"{args.filter or '-'} server args {' '.join(args.server_arg) or '-'}")
        print(f"idle small fetch: p50 {statistics.median(idle):.1f} ms, p99 "
              f"{percentile(idle, 0.99):.1f} ms")
        everything: list[float] = []
        for i in range(args.storms):
            lat, wall = storm(port, args, fetch_body(tips, args.filter), small, tmp)
            everything += lat
            print(f"storm {i + 1}: wall {wall:.2f} s; small fetch n={len(lat)} p50 "
                  f"{statistics.median(lat):.1f} ms p99 {percentile(lat, 0.99):.1f} ms max "
                  f"{max(lat):.1f} ms; cache {cache_lookups(port)}", flush=True)
        p99 = percentile(everything, 0.99)
        print(f"all storms: small fetch n={len(everything)} p50 "
              f"{statistics.median(everything):.1f} ms p99 {p99:.1f} ms "
              f"[target p99 <= 100 ms: {'met' if p99 <= 100 else 'NOT met'}]")
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
