"""End-to-end check of the harness: start servers "A" and "B", mirror-clone a
repository from each over protocol v0 and v2, fsck the clones, compare their
refs with the served repository, and print the CPU/memory each server's
cgroup recorded.

    python -m bench.selftest ROOT REPO [--a c-git] [--b c-git|gitspout|none]
                             [--protocols 0,2] [--quick]

With the default ``--b c-git`` both sides are git-http-backend, which tests
the harness itself before gitspout exists.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.client import clone_mirror, count_objects, fsck, list_refs
from bench.peer import BenchServer, make_server
from bench.process import exit_on_sigterm


@dataclass
class CloneCheck:
    """One verified clone and what the server's cgroup recorded for it."""

    server: str
    proto: int
    wall_s: float
    cpu_ns: int
    mem_max_bytes: int
    objects: int
    refs: int
    fsck_warnings: int

    def line(self) -> str:
        """Human-readable summary."""
        return (f"{self.server} v{self.proto}: clone {self.wall_s:.2f}s wall, server cpu "
                f"{self.cpu_ns / 1e6:.0f} ms ({self.cpu_ns} ns), cgroup mem max "
                f"{self.mem_max_bytes / 2**20:.1f} MiB, {self.objects} objects, "
                f"{self.refs} refs, fsck clean ({self.fsck_warnings} history warnings)")


def check_one(srv: BenchServer, repo: str, protocol: int, scratch: Path,
              expected_refs: dict[str, str], quick: bool = False) -> CloneCheck:
    """Clone *repo* from *srv* over *protocol*, verify it, return measurements."""
    dest = scratch / f"{srv.name}-v{protocol}.git"
    srv.reset_counters()
    res = clone_mirror(srv.repo_url(repo), dest, protocol=protocol)
    cpu = srv.cpu_ns()
    mem = srv.memory_max_bytes()
    warnings = fsck(dest, connectivity_only=quick).count("warning")
    got = list_refs(dest)
    if got != expected_refs:
        missing = sorted(set(expected_refs) - set(got))[:5]
        extra = sorted(set(got) - set(expected_refs))[:5]
        raise AssertionError(f"{srv.name} v{protocol}: refs differ; missing {missing} "
                             f"extra {extra}")
    objs = count_objects(dest)
    shutil.rmtree(dest)
    return CloneCheck(srv.name, protocol, res.wall_s, cpu, mem,
                      objs["in-pack"] + objs["count"], len(got), warnings)


def run(root: Path, repo: str, kind_a: str, kind_b: str | None = "c-git",
        protocols: tuple[int, ...] = (0, 2), quick: bool = False) -> list[CloneCheck]:
    """Start A (and B unless None) side by side and check each protocol on each."""
    expected = list_refs(root / repo)
    rows: list[CloneCheck] = []
    with tempfile.TemporaryDirectory(prefix="gitspout-bench-selftest-") as tmp, \
            contextlib.ExitStack() as stack:
        servers = [stack.enter_context(make_server(kind_a, root, name="A"))]
        if kind_b:
            servers.append(stack.enter_context(make_server(kind_b, root, name="B")))
        for srv in servers:
            print(f"{srv.name}: {type(srv).__name__} at {srv.url} "
                  f"ready in {srv.startup_s:.2f}s, {len(srv.pids())} processes", flush=True)
        for protocol in protocols:
            for srv in servers:
                row = check_one(srv, repo, protocol, Path(tmp), expected, quick)
                rows.append(row)
                print(row.line(), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, help="directory served as the project root")
    ap.add_argument("repo", help="repository path under ROOT, e.g. synthetic-gc.git")
    ap.add_argument("--a", default="c-git", choices=["c-git", "gitspout"])
    ap.add_argument("--b", default="c-git", choices=["c-git", "gitspout", "none"])
    ap.add_argument("--protocols", default="0,2", help="comma-separated, e.g. 2 or 0,1,2")
    ap.add_argument("--quick", action="store_true",
                    help="fsck --connectivity-only (for very large repositories)")
    args = ap.parse_args(argv)
    exit_on_sigterm()
    protocols = tuple(int(p) for p in args.protocols.split(","))
    run(args.root.resolve(), args.repo, args.a, None if args.b == "none" else args.b,
        protocols, args.quick)
    print("selftest OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
