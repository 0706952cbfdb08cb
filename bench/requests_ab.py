"""Server CPU per request of two source trees, interleaved: did a change cost the small
requests of a clone anything?

    .venv/bin/python -m bench.requests_ab OLD_TREE [NEW_TREE] [--rounds 3] [--repo R]

OLD_TREE is a checkout of an earlier revision (``git worktree add --detach /tmp/old REV``);
NEW_TREE defaults to this checkout. Each round starts one gitspout of each tree in turn, on a
fresh copy of the repository (its files dated an hour back, then RACY_NS waited out, so that
no config or listing is re-read for being recent), makes a real blobless clone with
``GIT_TRACE_PACKET`` to record its ls-refs and fetch bodies, then measures the process's CPU
(every thread's, from /proc) over ``--requests`` requests of each kind, each on a new
connection: ``GET /healthz`` (aiohttp's floor), ``GET info/refs`` v2, the recorded ls-refs,
and the recorded fetch answered from the pack cache. Prints each round and the medians.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.hits import _git, clone_args, fetch_once, get_once  # noqa: E402
from bench.process import (  # noqa: E402
    LOOPBACK,
    ServerProcess,
    free_port,
    gitspout_command,
    process_cpu_ns,
    wait_for_http,
)
from bench.saturation import record_bodies  # noqa: E402

REPO_TOP = Path(__file__).resolve().parent.parent
DEFAULT_REPO = REPO_TOP / "bench" / "work" / "real" / "dulwich-gc.git"
RACY_WAIT = 2.5  # seconds: past the server's RACY_NS (2 s) for the fresh copy's ctimes
WARM = 30  # requests of a kind before it is measured


def measure_tree(tree: Path, repo: Path, requests: int) -> dict[str, float]:
    """Milliseconds of server CPU per request of each kind, for a gitspout of ``tree``."""
    tmp = Path(tempfile.mkdtemp(prefix="gitspout-ab-"))
    root, cache, work = tmp / "root", tmp / "cache", tmp / "work"
    for d in (root, cache, work):
        d.mkdir()
    shutil.copytree(repo, root / "repo.git", symlinks=True)
    old = time.time() - 3600
    for p in [root / "repo.git", *(root / "repo.git").rglob("*")]:
        os.utime(p, (old, old), follow_symlinks=False)
    port = free_port()
    prefix, extra = gitspout_command(tree, tmp / "import")
    server = ServerProcess("gitspout", [
        *prefix, "--root", str(root), "--host", LOOPBACK, "--port", str(port),
        "--log-level", "warning", "--pack-cache-dir", str(cache), "--pack-cache-ttl", "3600"],
        log_path=tmp / "server.log", cwd=tree, env={**os.environ, **extra}).start()
    try:
        wait_for_http(port, "/repo.git/info/refs?service=git-upload-pack", procs=[server])
        trace = work / "trace"
        _git(*clone_args("blob:none"), f"http://{LOOPBACK}:{port}/repo.git",
             str(work / "traced.git"),
             env={"GIT_TRACE_PACKET": str(trace), "GIT_PROTOCOL_FROM_USER": "1"})
        bodies = record_bodies(trace)
        fetch = next(b for b in bodies if b"command=fetch" in b)
        ls_refs = next(b for b in bodies if b.startswith(b"0014command=ls-refs"))
        time.sleep(RACY_WAIT)  # not a synchronisation: the copy's ctimes must age
        kinds: dict[str, Callable[[], int]] = {
            "healthz": lambda: get_once(port, "/healthz"),
            "info/refs v2": lambda: get_once(port, "/repo.git/info/refs?service=git-upload-pack",
                                         "Git-Protocol: version=2\r\n"),
            "ls-refs": lambda: fetch_once(port, "/repo.git/git-upload-pack", ls_refs),
            "cache hit": lambda: fetch_once(port, "/repo.git/git-upload-pack", fetch),
        }
        out = {}
        for kind, send in kinds.items():
            for _ in range(WARM):
                send()
            before = process_cpu_ns(server.pid)
            for _ in range(requests):
                send()
            out[kind] = (process_cpu_ns(server.pid) - before) / 1e6 / requests
        return out
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.requests_ab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path, nargs="?", default=REPO_TOP)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--repo", type=Path, default=DEFAULT_REPO)
    args = parser.parse_args(argv)
    if not (args.repo / "objects").is_dir():
        raise SystemExit(f"{args.repo}: no repository (python bench/prepare_real.py dulwich)")
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    results: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    for r in range(args.rounds):
        for name, tree in trees.items():
            for kind, ms in measure_tree(tree, args.repo, args.requests).items():
                results[name].setdefault(kind, []).append(ms)
        print(f"round {r + 1}: " + "; ".join(
            f"{kind} {results['old'][kind][-1]:.3f} / {results['new'][kind][-1]:.3f} ms"
            for kind in results["old"]) + f" (old / new); load {os.getloadavg()[0]:.1f}",
            flush=True)
    print(f"\nserver CPU per request, medians of {args.rounds} rounds ({args.requests} "
          f"requests a kind, each on a new connection)")
    print("| request | old | new | new / old |\n|---|---:|---:|---:|")
    for kind in results["old"]:
        old, new = statistics.median(results["old"][kind]), statistics.median(results["new"][kind])
        print(f"| {kind} | {old:.3f} ms | {new:.3f} ms | {new / old:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
