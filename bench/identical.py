"""Identical blobless clones of a pack the cache holds: the server CPU of one clone when
they come one after another and when they come all at once, for one source tree or two
in alternation (A/B).

    .venv/bin/python -m bench.identical [--tree DIR ...] [--rounds 5] [--clients 7]

Each tree's gitspout serves its own copy of ``--repo`` with a pack cache whose entries
outlive the run (``--pack-cache-ttl 600``); after three warm-up clones every clone is a
cache hit (checked from /metrics). A round measures ``--clients`` clones by C git one
after another, then as many at once, with the server's CPU (every thread, from /proc)
around each batch; the table gives each tree's medians per clone. The trees take turns,
the first one first in even rounds and last in odd ones, so the machine's drift falls on
both. Every clone of the last round is
fsck-checked (connectivity).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.hits import DEFAULT_REPO, SETTLE, _git, clones, metrics  # noqa: E402
from bench.process import (  # noqa: E402
    LOOPBACK,
    ServerProcess,
    exit_on_sigterm,
    free_port,
    gitspout_command,
    process_cpu_ns,
    wait_for_http,
)

REPO_TOP = Path(__file__).resolve().parent.parent


def _url(port: int) -> str:
    return f"http://{LOOPBACK}:{port}/repo.git"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.identical", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, action="append", default=[],
                        help="a gitspout source tree (repeat for A/B; default: this one)")
    parser.add_argument("--repo", type=Path, default=DEFAULT_REPO)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=7)
    parser.add_argument("--filter", default="blob:none")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    trees = args.tree or [REPO_TOP]
    tmp = Path(tempfile.mkdtemp(prefix="gitspout-identical-"))
    servers: list[tuple[Path, ServerProcess, int]] = []
    try:
        for n, tree in enumerate(trees):
            base = tmp / f"t{n}"
            (base / "root").mkdir(parents=True)
            (base / "cache").mkdir()
            shutil.copytree(args.repo, base / "root" / "repo.git", symlinks=True)
            port = free_port()
            prefix, extra = gitspout_command(tree.resolve(), base / "import")
            server = ServerProcess(f"gitspout {n}", [
                *prefix, "--root", str(base / "root"), "--host", LOOPBACK, "--port", str(port),
                "--log-level", "warning", "--pack-cache-dir", str(base / "cache"),
                "--pack-cache-ttl", "600"], log_path=base / "server.log", cwd=tree,
                env={**os.environ, **extra}).start()
            wait_for_http(port, "/healthz", procs=[server])
            for i in range(3):
                clones(_url(port), [base / f"warm{i}"], args.filter)
            servers.append((tree, server, port))
        rows: dict[tuple[int, str], list[float]] = {}
        for r in range(args.rounds):
            order = list(enumerate(servers))
            for n, (_tree, server, port) in (order if r % 2 == 0 else order[::-1]):
                url = _url(port)
                before = metrics(port).get("lookups.hit", 0)
                for kind in ("one after another", "all at once"):
                    dests = [tmp / f"r{r}-t{n}-{kind[0]}{i}" for i in range(args.clients)]
                    start = process_cpu_ns(server.pid)
                    if kind == "all at once":
                        clones(url, dests, args.filter)
                    else:
                        for d in dests:
                            clones(url, [d], args.filter)
                    time.sleep(SETTLE)
                    cpu = (process_cpu_ns(server.pid) - start) / 1e6 / args.clients
                    rows.setdefault((n, kind), []).append(cpu)
                    if r == args.rounds - 1:
                        for d in dests:
                            _git("--git-dir", str(d), "fsck", "--connectivity-only",
                                 "--no-dangling")
                    for d in dests:
                        shutil.rmtree(d)
                hits = metrics(port).get("lookups.hit", 0) - before
                if hits != 2 * args.clients:
                    raise RuntimeError(f"{hits:.0f} of {2 * args.clients} clones were hits")
            print(f"round {r + 1}: " + ", ".join(
                f"tree {n} {k}: {v[-1]:.2f} ms" for (n, k), v in rows.items()), flush=True)
        print(f"{args.repo.name}, --filter={args.filter}, {args.clients} clones a batch, "
              f"{args.rounds} rounds; server CPU per clone, medians")
        print("| tree | one after another | all at once |")
        print("|---|---:|---:|")
        for n, (tree, _, _) in enumerate(servers):
            seq = statistics.median(rows[(n, "one after another")])
            conc = statistics.median(rows[(n, "all at once")])
            print(f"| {n}: {tree} | {seq:.2f} ms | {conc:.2f} ms |")
    finally:
        for _, server, _ in servers:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
