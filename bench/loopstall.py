"""Event-loop stalls: how long a tiny v2 ls-refs takes while heavy requests run.

gitspout serves every connection from one event loop. Work done on that loop by one
request (inflating a gzip body, framing megabytes of ACK lines) delays every other
request by as long as it runs. This measures the latency of a tiny ``ls-refs`` on one
repository, sent again and again, in three settings:

* ``idle``: nothing else running (the floor);
* ``gzip-bombs``: 4 clients, each posting gzip bodies that inflate to 60 MiB (within the
  default 64 MiB cap; they end in a 400 once inflated), one after the other;
* ``large-acks``: 2 clients, each posting a v0 negotiation round with ``--haves``
  distinct common haves (default 100,000): as many ``ACK <oid> common`` lines, 5 MB.
  ``--repeat K`` sends each have K times, as the issue's attack did (600k haves gave
  29 MB of ACK lines); a server that ACKs each distinct have once answers those with
  the same 100k lines.
* ``large-ls-refs``: 2 clients, each moving a ref of ``manyrefs.git`` (``--refs`` packed
  refs, default 1,000,000, packed-refs written directly) and then asking for all of its
  refs with ``ls-refs``: the cost of an advertisement after a change, and its writes.

and prints p50/p99/max per setting. ``--tree`` chooses the gitspout source tree to run
(default: this checkout), so an older version can be measured the same way::

    git archive <commit> | tar -x -C /tmp/old      # a copy of the old code, no worktree
    .venv/bin/python -m bench.loopstall --tree /tmp/old --tree .

Standard library only (the server runs with this interpreter, which must have gitspout's
dependencies). Fixtures are built once under ``bench/work/loopstall/`` with
``git fast-import``. The machine's other load shows in the figures: compare runs made
one after the other.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.process import (
    LOOPBACK,
    ServerProcess,
    exit_on_sigterm,
    free_port,
    gitspout_command,
    wait_for_http,
)

REPO_TOP = Path(__file__).resolve().parent.parent
DEFAULT_WORK = REPO_TOP / "bench" / "work" / "loopstall"
UPLOAD_CT = "application/x-git-upload-pack-request"
REQUEST_TIMEOUT = 300.0


# -- fixtures -------------------------------------------------------------------------------

def _fast_import(repo: Path, stream: bytes) -> None:
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(repo)], check=True)
    subprocess.run(["git", "--git-dir", str(repo), "fast-import", "--quiet"], input=stream,
                   check=True)
    subprocess.run(["git", "--git-dir", str(repo), "repack", "-adq"], check=True)


def _chain(commits: int) -> bytes:
    """A linear history of empty-tree commits (cheap to build, one have each)."""
    out = []
    for i in range(1, commits + 1):
        msg = b"c%d\n" % i
        out.append(b"commit refs/heads/main\nmark :%d\n" % i)
        out.append(b"committer Bench <bench@example.com> %d +0000\n" % (1_600_000_000 + i))
        out.append(b"data %d\n%s" % (len(msg), msg))
        if i > 1:
            out.append(b"from :%d\n" % (i - 1))
        out.append(b"\n")
    return b"".join(out)


def build_many_refs(root: Path, refs: int) -> str:
    """``root/manyrefs.git``: tiny.git's history with ``refs`` packed branches (written
    directly into packed-refs, sorted, in a few seconds); returns its name."""
    name = f"manyrefs-{refs}.git"
    repo = root / name
    if not repo.exists():
        print(f"building {repo} ({refs} refs)...", flush=True)
        tmp = root / (name + ".tmp")
        subprocess.run(["rm", "-rf", str(tmp)], check=True)
        subprocess.run(["cp", "-a", str(root / "tiny.git"), str(tmp)], check=True)
        subprocess.run(["git", "--git-dir", str(tmp), "pack-refs", "--all"], check=True)
        ids = subprocess.run(["git", "--git-dir", str(tmp), "rev-list", "main"], check=True,
                             capture_output=True, text=True).stdout.split()
        packed = tmp / "packed-refs"
        lines = packed.read_text().splitlines(keepends=True)
        entries = {ln.split(" ", 1)[1]: ln for ln in lines[1:] if not ln.startswith("^")}
        for i in range(refs):
            ref = f"refs/heads/many/b{i:07d}\n"
            entries[ref] = f"{ids[i % len(ids)]} {ref}"
        packed.write_text(lines[0] + "".join(entries[k] for k in sorted(entries)))
        tmp.rename(repo)
    return name


def build_fixtures(work: Path, haves: int) -> tuple[Path, list[str]]:
    """``root/acks.git`` (``haves`` + 1 commits), ``root/tiny.git`` (a few refs); returns
    the root and the ids of every commit of acks.git but its tip, newest first."""
    root = work / f"root-{haves}"
    acks, tiny = root / "acks.git", root / "tiny.git"
    if not acks.exists():
        print(f"building {acks} ({haves + 1} commits)...", flush=True)
        root.mkdir(parents=True, exist_ok=True)
        _fast_import(acks, _chain(haves + 1))
    if not tiny.exists():
        stream = _chain(3) + b"reset refs/heads/side\nfrom :2\n\nreset refs/tags/v1\nfrom :1\n\n"
        _fast_import(tiny, stream)
    ids = subprocess.run(["git", "--git-dir", str(acks), "rev-list", "main"], check=True,
                         capture_output=True, text=True).stdout.split()
    return root, ids[1:]


# -- requests -------------------------------------------------------------------------------

def pkt(line: str) -> bytes:
    data = line.encode()
    return b"%04x" % (len(data) + 4) + data


def post(port: int, repo: str, body: bytes, headers: dict[str, str]) -> tuple[int, int]:
    """One POST to git-upload-pack on a fresh connection: (status, response bytes)."""
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=REQUEST_TIMEOUT)
    try:
        conn.request("POST", f"/{repo}/git-upload-pack", body,
                     {"Content-Type": UPLOAD_CT, **headers})
        resp = conn.getresponse()
        return resp.status, len(resp.read())
    finally:
        conn.close()


TINY = pkt("command=ls-refs\n") + pkt("object-format=sha1\n") + b"0001" + b"0000"
BOMB = gzip.compress(b"z" * (60 << 20), 9)


def tiny(port: int) -> None:
    status, size = post(port, "tiny.git", TINY, {"Git-Protocol": "version=2"})
    if status != 200 or size < 100:
        raise RuntimeError(f"ls-refs answered {status} with {size} bytes")


def bomb(port: int) -> None:
    status, _ = post(port, "acks.git", BOMB, {"Content-Encoding": "gzip",
                                              "Git-Protocol": "version=2"})
    if status not in (400, 413):
        raise RuntimeError(f"gzip bomb answered {status}")


def ack_body(tip: str, haves: list[str], repeat: int = 1) -> bytes:
    parts = [pkt(f"want {tip} multi_ack_detailed side-band-64k ofs-delta\n"), b"0000"]
    parts.extend(pkt(f"have {oid}\n") * repeat for oid in haves)
    parts.append(b"0000")  # end of round, no "done": ACK lines only, no pack
    return b"".join(parts)


# -- measuring -------------------------------------------------------------------------------

@dataclass
class Figures:
    setting: str
    samples: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    load_requests: int

    def row(self) -> str:
        return (f"{self.setting:12s} {self.samples:8d} {self.p50_ms:9.1f} {self.p99_ms:9.1f} "
                f"{self.max_ms:9.1f} {self.load_requests:6d}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _loader(load: Callable[[], None], stop: Any, done: Any, failed: Any) -> None:
    """A load client (its own process): repeat ``load`` until ``stop`` is set."""
    while not stop.is_set():
        try:
            load()
        except Exception as exc:  # reported by the parent after the run
            failed.put(repr(exc))
            return
        with done.get_lock():
            done.value += 1


def measure(port: int, setting: str, load: Callable[[], None] | None, clients: int,
            seconds: float, gap: float) -> Figures:
    """ls-refs latencies for ``seconds`` while ``clients`` processes repeat ``load``.

    The load clients are processes, not threads: a thread reading a 33 MB response holds
    this process's GIL, and the ls-refs would be timed waiting for it."""
    ctx = multiprocessing.get_context("fork")
    stop, done, failed = ctx.Event(), ctx.Value("i", 0), ctx.SimpleQueue()
    procs = [ctx.Process(target=_loader, args=(load, stop, done, failed), daemon=True)
             for _ in range(clients if load is not None else 0)]
    for proc in procs:
        proc.start()
    time.sleep(0.3 if procs else 0)  # the load is under way
    latencies: list[float] = []
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            start = time.perf_counter()
            tiny(port)
            latencies.append(time.perf_counter() - start)
            time.sleep(gap)
    finally:
        stop.set()
        for proc in procs:
            proc.join(REQUEST_TIMEOUT)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
    if not failed.empty():
        raise RuntimeError(f"{setting}: load request failed: {failed.get()}")
    ms = [x * 1000 for x in latencies]
    return Figures(setting, len(ms), statistics.median(ms), percentile(ms, 0.99), max(ms),
                   done.value)


SETTINGS = ("idle", "gzip-bombs", "large-acks", "large-ls-refs")
LS_REFS_ALL = (pkt("command=ls-refs\n") + pkt("object-format=sha1\n") + b"0001"
               + pkt("peel\n") + pkt("symrefs\n") + b"0000")


_BUMPS = [0]  # per load process: its ref alternates between two commits


def large_ls_refs(port: int, root: Path, name: str, refs: int) -> None:
    """A ref of ``name`` moves (as a push does), then all of its refs are asked for."""
    _BUMPS[0] += 1
    subprocess.run(["git", "--git-dir", str(root / name), "update-ref",
                    f"refs/heads/bump-{os.getpid()}", f"main~{_BUMPS[0] % 2}"], check=True)
    status, size = post(port, name, LS_REFS_ALL, {"Git-Protocol": "version=2"})
    if status != 200 or size < 40 * refs:
        raise RuntimeError(f"large ls-refs answered {status} with {size} bytes")


def run_tree(tree: Path, root: Path, ids: list[str], seconds: float, gap: float,
             work: Path, settings: tuple[str, ...] = SETTINGS, repeat: int = 1,
             refs: int = 1_000_000) -> list[Figures]:
    port = free_port()
    log = work / f"server-{port}.log"
    prefix, extra = gitspout_command(tree, work / f"import-{port}")
    argv = [*prefix, "--root", str(root), "--host", LOOPBACK,
            "--port", str(port), "--log-level", "warning"]
    server = ServerProcess(f"gitspout@{tree}", argv, log_path=log, cwd=tree,
                           env={**os.environ, **extra}).start()
    try:
        wait_for_http(port, "/tiny.git/info/refs?service=git-upload-pack", procs=[server])
        tip = subprocess.run(["git", "--git-dir", str(root / "acks.git"), "rev-parse", "main"],
                             check=True, capture_output=True, text=True).stdout.strip()
        acks = ack_body(tip, ids, repeat)

        def ack_round() -> None:
            status, size = post(port, "acks.git", acks, {})
            if status != 200 or size < 50 * len(ids):
                raise RuntimeError(f"ACK round answered {status} with {size} bytes")

        for _ in range(3):
            tiny(port)
        if "large-acks" in settings:
            ack_round()  # warm: the commits are parsed and cached once
        many = build_many_refs(root, refs) if "large-ls-refs" in settings else ""
        if many:
            large_ls_refs(port, root, many, refs)  # warm: packed-refs parsed once
        loads: dict[str, tuple[Callable[[], None] | None, int]] = {
            "idle": (None, 0),
            "gzip-bombs": (lambda: bomb(port), 4),
            "large-acks": (ack_round, 2),
            "large-ls-refs": (lambda: large_ls_refs(port, root, many, refs), 2),
        }
        return [measure(port, name, *loads[name], seconds, gap) for name in settings]
    finally:
        server.stop()


def describe(tree: Path) -> str:
    proc = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%h %s"],
                          capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else "(not a git checkout)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loopstall", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", type=Path,
                        help="gitspout source tree to run (repeatable; default: this checkout)")
    parser.add_argument("--haves", type=int, default=100_000,
                        help="distinct common haves per large-ACK round")
    parser.add_argument("--repeat", type=int, default=1,
                        help="times each have is sent in a large-ACK round")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="measuring time per setting")
    parser.add_argument("--gap", type=float, default=0.01,
                        help="pause between two ls-refs (seconds)")
    parser.add_argument("--refs", type=int, default=1_000_000,
                        help="packed refs of the repository of large-ls-refs")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    parser.add_argument("--settings", default=",".join(SETTINGS),
                        help=f"comma-separated, among {', '.join(SETTINGS)}")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    args.work.mkdir(parents=True, exist_ok=True)
    root, ids = build_fixtures(args.work, args.haves)
    for tree in args.tree or [REPO_TOP]:
        tree = tree.resolve()
        print(f"\n{tree}: {describe(tree)}", flush=True)
        print(f"{'setting':12s} {'samples':>8s} {'p50 ms':>9s} {'p99 ms':>9s} {'max ms':>9s} "
              f"{'load':>6s}", flush=True)
        settings = tuple(s for s in args.settings.split(",") if s)
        unknown = set(settings) - set(SETTINGS)
        if unknown:
            parser.error(f"unknown settings {sorted(unknown)}")
        for fig in run_tree(tree, root, ids, args.seconds, args.gap, args.work, settings,
                            args.repeat, args.refs):
            print(fig.row(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
