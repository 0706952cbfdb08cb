"""Overload: N concurrent ``git clone --mirror`` of one repository against one gitspout
(issue 13, "Admission control"). Prints how many were served (and fsck-clean), answered
503 (git's "HTTP 503", before any pack byte), or broken in any other way (a cut pack would
show here), the server's peak RSS above its idle RSS, and the wall time::

    .venv/bin/python -m bench.overload                               # 128 clones, defaults
    .venv/bin/python -m bench.overload --clones 128 -- --max-packs 8 --pack-queue 32

Extra arguments after ``--`` go to ``gitspout serve``. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.memcap import Sampler, rss
from bench.process import LOOPBACK, ServerProcess, exit_on_sigterm, free_port, gitspout_command, wait_for_http

REPO_TOP = Path(__file__).resolve().parent.parent


def clone(url: str, dest: Path) -> tuple[str, str]:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"}
    done = subprocess.run(["git", "-c", "protocol.version=2", "clone", "-q", "--mirror", url,
                           str(dest)], env=env, capture_output=True, timeout=1800)
    err = done.stderr.decode(errors="replace").strip()
    if done.returncode == 0:
        fsck = subprocess.run(["git", "--git-dir", str(dest), "fsck", "--connectivity-only",
                               "--no-progress"], capture_output=True, timeout=600)
        shutil.rmtree(dest, ignore_errors=True)
        return ("served", "") if fsck.returncode == 0 else ("broken", "fsck failed")
    shutil.rmtree(dest, ignore_errors=True)
    return ("503", err) if "503" in err else ("broken", err[-200:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overload", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, default=REPO_TOP, help="gitspout source tree")
    parser.add_argument("--root", type=Path, default=REPO_TOP / "bench" / "work" / "synthetic")
    parser.add_argument("--repo", default="synthetic-gc.git")
    parser.add_argument("--clones", type=int, default=128)
    parser.add_argument("serve_args", nargs="*", help="extra gitspout serve arguments")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    tree = args.tree.resolve()
    port = free_port()
    scratch = Path(tempfile.mkdtemp(prefix="gitspout-overload-"))
    try:
        prefix, extra = gitspout_command(tree, scratch / "import")
        argv_ = [*prefix, "--root", str(args.root), "--host", LOOPBACK, "--port", str(port),
                 "--log-level", "warning", *args.serve_args]
        server = ServerProcess("gitspout-overload", argv_, log_path=scratch / "server.log",
                               cwd=tree, env={**os.environ, **extra}).start()
        try:
            url = f"http://{LOOPBACK}:{port}/{args.repo}"
            wait_for_http(port, f"/{args.repo}/info/refs?service=git-upload-pack",
                          procs=[server])
            base = rss(server.pid)
            sampler = Sampler(server.pid)
            start = time.monotonic()
            with ThreadPoolExecutor(args.clones) as pool:
                results = list(pool.map(lambda i: clone(url, scratch / f"c{i}.git"),
                                        range(args.clones)))
            wall = time.monotonic() - start
            peak = sampler.stop()
            time.sleep(2)
            after = rss(server.pid)
        finally:
            server.stop()
        counts: dict[str, int] = {}
        for kind, _ in results:
            counts[kind] = counts.get(kind, 0) + 1
        print(f"gitspout {tree}; serve args: {' '.join(args.serve_args) or '(defaults)'}")
        print(f"{args.clones} concurrent mirror clones of {args.repo} on {os.cpu_count()} "
              f"cores: served {counts.get('served', 0)}, 503 {counts.get('503', 0)}, "
              f"broken {counts.get('broken', 0)}; RSS idle {base / 1e6:.0f} MB, peak "
              f"{peak / 1e6:.0f} MB (+{(peak - base) / 1e6:.0f}), after {after / 1e6:.0f} MB; "
              f"wall {wall:.0f} s")
        for kind, err in results:
            if kind == "broken":
                print("  broken:", err)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
