"""Repositories on simulated NFS vs. local disk, gitspout beside git-http-backend.

    .venv/bin/python -m bench.nfs [--delay-ms 1.0] [--rounds 5] [--info-refs-reps 50]
                                  [--servers gitspout,c-git] [--caching noac,actimeo3]
                                  [--repo PATH.git] [--force]

The same fixture directory is served four ways: by gitspout and by
git-http-backend (nginx + fcgiwrap), each once from local disk and once
through a latencyfs mount of that directory (``tests/nfs``: a FUSE
passthrough that sleeps ``--delay-ms`` before every metadata request, like
one NFS round trip).  Measured, as medians of ``--rounds`` rounds that
alternate server and place (local, mount) within each round:

* ``clone``: ``git clone --bare`` over protocol v2 of the medium repository
  (default ``bench/work/synthetic/synthetic-gc.git``, 53k objects; the
  clone's checkout is left out so the figure is the transfer);
* ``fetch``: an incremental ``git fetch`` (v2) of the one commit pushed into
  the medium repository after the client's mirror clone was taken (the
  push leaves loose objects and a loose ref, as small pushes do);
* ``info/refs``: ``GET /small.git/info/refs?service=git-upload-pack`` of a
  small repository (20 commits, 3 branches, 2 tags), ``--info-refs-reps``
  requests per round, each on a new connection, timed by the client
  (``http.client``) from sending the request to the last body byte; the
  per-round value is the median; v0 (the ref advertisement) and v2 (the
  capability advertisement) separately.

and the FUSE requests the server caused (latencyfs counters, read after the
operation's server processes have exited), per operation and per HTTP
request.  Every combination runs one unmeasured warm-up operation first.

Two mounts are measured one after the other (``--caching``):
``noac`` = attr_timeout = entry_timeout = 0 (every stat and path lookup
reaches the daemon: NFS ``noac``, the worst case) and ``actimeo3`` =
attr_timeout = entry_timeout = 3 s (like NFS's ``actimeo=3``; negative
lookups are not cached in either).

Needs root (cgroups, FUSE), nginx, fcgiwrap and pyfuse3 in the interpreter
that runs this (the project venv).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.client import client_env, git_out, run_git  # noqa: E402
from bench.peer import BenchServer, make_server  # noqa: E402
from bench.process import exit_on_sigterm  # noqa: E402
from bench.syscalls import (  # noqa: E402
    SERVER_LABEL,
    count_http_requests,
    history_stream,
    http_request,
    median,
    settle,
    snapshot_gitspout,
    table,
)

BENCH_DIR = Path(__file__).resolve().parent
REPO_TOP = BENCH_DIR.parent
WORK = BENCH_DIR / "work" / "nfs"
DEFAULT_MEDIUM = BENCH_DIR / "work" / "synthetic" / "synthetic-gc.git"
FALLBACK_MEDIUM = BENCH_DIR / "work" / "quick" / "quick-gc.git"
CACHING = {"noac": 0.0, "actimeo3": 3.0}
OPS = ("clone", "fetch", "info/refs v0", "info/refs v2")
#: the issue's targets (mount / local) for gitspout, and git-http-backend's figures there
TARGETS = {"clone": 1.05, "fetch": 1.2, "info/refs v0": 2.0}
ISSUE_CGIT = {"clone": 1.13, "fetch": 2.79, "info/refs v0": 11.6}


# ---------------------------------------------------------------------------
# fixture


@dataclass
class NfsFixture:
    """``src/`` (served root: medium.git, small.git) and the fetch template."""

    work: Path
    medium_source: Path

    @property
    def src(self) -> Path:
        return self.work / "src"

    @property
    def template(self) -> Path:
        return self.work / "fetch-template.git"

    @property
    def new_tip(self) -> str:
        return git_out(["--git-dir", str(self.src / "medium.git"), "rev-parse", "HEAD"])


def build_fixture(work: Path, medium: Path, force: bool = False) -> NfsFixture:
    """Copy *medium*, take the fetch template, push one commit; build small.git."""
    fx = NfsFixture(work, medium)
    stamp = work / ".built"
    if stamp.exists() and not force and stamp.read_text().strip() == str(medium):
        return fx
    if work.exists():
        shutil.rmtree(work)
    fx.src.mkdir(parents=True)
    dest = fx.src / "medium.git"
    shutil.copytree(medium, dest, symlinks=True)
    for stale in ("bench-excluded-refs",):
        (dest / stale).unlink(missing_ok=True)
    run_git(["clone", "-q", "--mirror", "--no-local", str(dest), str(fx.template)])
    _push_one_commit(dest, work / "pusher")
    _build_small(fx.src / "small.git")
    stamp.write_text(f"{medium}\n")
    return fx


def _push_one_commit(repo: Path, work: Path) -> None:
    head = git_out(["--git-dir", str(repo), "symbolic-ref", "--short", "HEAD"])
    run_git(["clone", "-q", "--no-checkout", str(repo), str(work)])
    run_git(["-C", str(work), "checkout", "-q", head])
    (work / "NFS-BENCH-NEW-FILE.txt").write_text("one new commit for the fetch\n")
    env = client_env({"GIT_AUTHOR_NAME": "B", "GIT_AUTHOR_EMAIL": "b@example.org",
                      "GIT_COMMITTER_NAME": "B", "GIT_COMMITTER_EMAIL": "b@example.org"})
    run_git(["-C", str(work), "add", "-A"], env=env)
    run_git(["-C", str(work), "commit", "-q", "-m", "new"], env=env)
    run_git(["-C", str(work), "push", "-q", "origin", head], env=env)
    shutil.rmtree(work)


def _build_small(dest: Path) -> None:
    run_git(["init", "-q", "--bare", "-b", "main", str(dest)])
    run_git(["--git-dir", str(dest), "fast-import", "--quiet"],
            input=history_stream(20, 1_600_000_000, None, "small"))
    run_git(["--git-dir", str(dest), "branch", "topic", "main~5"])
    run_git(["--git-dir", str(dest), "branch", "old", "main~15"])
    run_git(["--git-dir", str(dest), "tag", "v1", "main~10"])
    run_git(["--git-dir", str(dest), "tag", "-a", "-m", "v2", "v2", "main"],
            env=client_env({"GIT_COMMITTER_NAME": "B", "GIT_COMMITTER_EMAIL": "b@x"}))
    run_git(["--git-dir", str(dest), "-c", "repack.writeBitmaps=true", "gc", "-q"])


# ---------------------------------------------------------------------------
# operations


@dataclass
class Result:
    """One measured operation: client wall time, HTTP requests, FUSE requests."""

    wall_s: float
    requests: int
    fuse: dict[str, int] = field(default_factory=dict)


def op_clone(url: str, scratch: Path, fx: NfsFixture) -> tuple[float, int]:
    dest = scratch / f"clone-{uuid.uuid4().hex[:8]}.git"
    trace = scratch / f"{dest.name}.trace"
    env = client_env({"GIT_TRACE_CURL": str(trace), "GIT_TRACE_CURL_NO_DATA": "1"})
    try:
        t0 = time.perf_counter()
        run_git(["-c", "protocol.version=2", "clone", "-q", "--bare", f"{url}/medium.git",
                 str(dest)], env=env, timeout=900)
        wall = time.perf_counter() - t0
        if git_out(["--git-dir", str(dest), "rev-parse", "HEAD"]) != fx.new_tip:
            raise RuntimeError(f"clone from {url} has the wrong HEAD")
        return wall, count_http_requests(trace)
    finally:
        shutil.rmtree(dest, ignore_errors=True)
        trace.unlink(missing_ok=True)


def op_fetch(url: str, scratch: Path, fx: NfsFixture) -> tuple[float, int]:
    dest = scratch / f"fetch-{uuid.uuid4().hex[:8]}.git"
    trace = scratch / f"{dest.name}.trace"
    shutil.copytree(fx.template, dest, symlinks=True)
    env = client_env({"GIT_TRACE_CURL": str(trace), "GIT_TRACE_CURL_NO_DATA": "1"})
    try:
        run_git(["--git-dir", str(dest), "remote", "set-url", "origin", f"{url}/medium.git"])
        t0 = time.perf_counter()
        run_git(["--git-dir", str(dest), "-c", "protocol.version=2", "fetch", "-q", "origin"],
                env=env, timeout=300)
        wall = time.perf_counter() - t0
        if git_out(["--git-dir", str(dest), "rev-parse", "HEAD"]) != fx.new_tip:
            raise RuntimeError(f"fetch from {url} did not get the new commit")
        return wall, count_http_requests(trace)
    finally:
        shutil.rmtree(dest, ignore_errors=True)
        trace.unlink(missing_ok=True)


def op_info_refs(kind: str, reps: int) -> Callable[[BenchServer], tuple[float, int]]:
    """Median seconds of *reps* GETs (one connection each)."""
    def run(srv: BenchServer) -> tuple[float, int]:
        times = []
        for _ in range(reps):
            res = http_request(srv.port, kind, "small.git", timeout=60)
            if res.status != 200:
                raise RuntimeError(f"{srv.name}: info/refs HTTP {res.status}")
            times.append(res.wall_s)
        return median(times), reps
    return run


# ---------------------------------------------------------------------------
# runner


@dataclass
class Side:
    """One server at one place (local disk or the mount)."""

    kind: str          # gitspout | c-git
    place: str         # local | mount
    srv: BenchServer


class Counters(Protocol):
    """What the runner needs of a :class:`tests.nfs.mount.LatencyMount`."""

    def reset(self) -> None: ...

    def stats(self) -> dict[str, int]: ...


class Runner:
    def __init__(self, fx: NfsFixture, scratch: Path, reps: int) -> None:
        self.fx = fx
        self.scratch = scratch
        self.ops: dict[str, Callable[[BenchServer], tuple[float, int]]] = {
            "clone": lambda s: op_clone(s.url, scratch, fx),
            "fetch": lambda s: op_fetch(s.url, scratch, fx),
            "info/refs v0": op_info_refs("advert-v0", reps),
            "info/refs v2": op_info_refs("advert-v2", reps),
        }

    def measure(self, side: Side, op: str, mount: Counters) -> Result:
        baseline = set(side.srv.pids())
        settle(side.srv, baseline)
        if side.place == "mount":
            mount.reset()
        try:
            wall, requests = self.ops[op](side.srv)
        except Exception as exc:
            side.srv.keep_workdir = True
            dead = [p.name for p in side.srv.procs if not p.alive()]
            raise RuntimeError(
                f"{SERVER_LABEL[side.kind]} ({side.place}) {op} failed: {exc!r}; exited: "
                f"{dead or 'none'}; logs kept in {side.srv.workdir}\n"
                f"{side.srv.log_tails(40)}") from exc
        settle(side.srv, baseline)
        fuse = mount.stats() if side.place == "mount" else {}
        return Result(wall, requests, fuse)

    def run(self, sides: list[Side], rounds: int, mount: Counters,
            ops: Sequence[str]) -> dict[tuple[str, str, str], list[Result]]:
        out: dict[tuple[str, str, str], list[Result]] = {}
        for op in ops:
            for side in sides:                                   # warm-up
                self.measure(side, op, mount)
        for r in range(rounds):
            for op in ops:
                order = sides if r % 2 == 0 else list(reversed(sides))
                for side in order:
                    res = self.measure(side, op, mount)
                    out.setdefault((op, side.kind, side.place), []).append(res)
            print(f"  round {r + 1}/{rounds} done", flush=True)
        return out


def fuse_metadata_ops(stats: dict[str, int]) -> int:
    """Delayed (metadata) FUSE requests: what would each cost an NFS round trip."""
    return stats.get("_delayed", 0)


def report(results: dict[tuple[str, str, str], list[Result]], kinds: Sequence[str],
           ops: Sequence[str]) -> str:
    header = ["operation"]
    for k in kinds:
        label = SERVER_LABEL[k]
        header += [f"{label} local ms", f"{label} mount ms", f"{label} ratio"]
    header += ["gitspout target", "met"] if "gitspout" in kinds else []
    body = []
    for op in ops:
        row = [op]
        ratios: dict[str, float] = {}
        for k in kinds:
            loc = median(r.wall_s for r in results[(op, k, "local")]) * 1e3
            mnt = median(r.wall_s for r in results[(op, k, "mount")]) * 1e3
            ratios[k] = mnt / loc
            row += [f"{loc:.1f}", f"{mnt:.1f}", f"{ratios[k]:.2f}x"]
        if "gitspout" in kinds:
            tgt = TARGETS.get(op)
            row += [f"<= {tgt}x" if tgt else "-",
                    ("yes" if ratios["gitspout"] <= tgt else "NO") if tgt else "-"]
        body.append(row)
    main = table(header, body)
    header2 = ["operation", "server", "HTTP req", "FUSE metadata ops", "per request",
               "all FUSE ops", "by kind (median op)"]
    body2 = []
    for op in ops:
        for k in kinds:
            rs = results[(op, k, "mount")]
            meta = median(fuse_metadata_ops(r.fuse) for r in rs)
            allops = median(r.fuse.get("_total", 0) for r in rs)
            req = median(r.requests for r in rs)
            mid = sorted(rs, key=lambda r: fuse_metadata_ops(r.fuse))[len(rs) // 2]
            kinds_txt = " ".join(f"{n}:{v}" for n, v in sorted(mid.fuse.items(),
                                 key=lambda kv: -kv[1])
                                 if not n.startswith("_") and v)
            per = meta / req if req else 0.0
            body2.append([op, SERVER_LABEL[k], f"{req:.0f}", f"{meta:.0f}", f"{per:.1f}",
                          f"{allops:.0f}", kinds_txt])
    delayed = sum(r.fuse.get("_delayed", 0) for rs in results.values() for r in rs)
    slept_us = sum(r.fuse.get("_delay_us", 0) for rs in results.values() for r in rs)
    # How close latencyfs keeps to its setting (tests/nfs/test_latencyfs.py only checks
    # that each delay is served in full: the upper side is a matter of timer precision).
    precision = (f"\n\nlatencyfs: {delayed} delayed requests, mean delay "
                 f"{slept_us / delayed / 1000:.3f} ms" if delayed else "")
    return main + "\n\nFUSE requests on the mount (medians; info/refs rows: all "\
        "repetitions of one round):\n" + table(header2, body2) + precision


@contextlib.contextmanager
def servers_for(kinds: Sequence[str], root: Path, place: str,
                gitspout_env: dict[str, str]) -> Iterator[list[Side]]:
    started: list[Side] = []
    try:
        for k in kinds:
            name = f"{k}-nfs-{place}"
            if k == "gitspout":
                srv = make_server(k, root, name=name, probe_repo="small.git", env=gitspout_env)
            else:
                srv = make_server(k, root, name=name, probe_repo="small.git")
            started.append(Side(k, place, srv.start()))
        yield started
    finally:
        for s in started:
            s.srv.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--delay-ms", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--info-refs-reps", type=int, default=50)
    ap.add_argument("--servers", default="gitspout,c-git")
    ap.add_argument("--caching", default="noac,actimeo3",
                    help=f"comma list of {sorted(CACHING)}")
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma list of {list(OPS)}")
    ap.add_argument("--repo", type=Path, default=None,
                    help=f"medium repository (default {DEFAULT_MEDIUM} if built, "
                         f"else {FALLBACK_MEDIUM})")
    ap.add_argument("--work", type=Path, default=WORK)
    ap.add_argument("--force", action="store_true", help="rebuild the fixture")
    ap.add_argument("--gitspout-rev", default="HEAD", metavar="REV",
                    help="gitspout revision to measure (a frozen copy); 'worktree' for the "
                         "working tree as it is at the start")
    args = ap.parse_args(argv)
    exit_on_sigterm()
    sys.path.insert(0, str(REPO_TOP))
    from tests.nfs.mount import fuse_available

    reason = fuse_available()
    if reason is not None:
        print(f"latencyfs unavailable: {reason}", file=sys.stderr)
        return 2
    medium = args.repo or (DEFAULT_MEDIUM if DEFAULT_MEDIUM.is_dir() else FALLBACK_MEDIUM)
    if not medium.is_dir():
        print(f"{medium} missing: python bench/make_repo.py (or --repo)", file=sys.stderr)
        return 2
    kinds = [k for k in args.servers.split(",") if k]
    ops = [o for o in args.ops.split(",") if o]
    t0 = time.monotonic()
    fx = build_fixture(args.work, medium.resolve(), args.force)
    objects = git_out(["--git-dir", str(fx.src / "medium.git"), "count-objects", "-v"])
    print(f"fixture {fx.work} ({time.monotonic() - t0:.1f}s); medium = copy of {medium} "
          f"({objects.splitlines()[2]}), small.git = 20 commits", flush=True)
    sections = []
    with tempfile.TemporaryDirectory(prefix="gitspout-nfs-") as tmp:
        what, env = snapshot_gitspout(args.gitspout_rev, Path(tmp) / "gitspout-src")
        print(f"gitspout code: {what}; git {git_out(['--version'])}; "
              f"load average {os.getloadavg()[0]:.2f}", flush=True)
        sections.append(f"gitspout {what}; medium.git = copy of {medium}")
        with servers_for(kinds, fx.src, "local", env) as local_sides:
            run_mounts(args, fx, kinds, ops, Path(tmp), local_sides, env, sections)
        sections.append(f"load average at the end: {os.getloadavg()[0]:.2f}")
    print()
    print(f"git-http-backend in the issue (noac, 1 ms): clone {ISSUE_CGIT['clone']}x, "
          f"fetch {ISSUE_CGIT['fetch']}x, info/refs {ISSUE_CGIT['info/refs v0']}x")
    print("\n\n".join(sections))
    return 0


def run_mounts(args: argparse.Namespace, fx: NfsFixture, kinds: Sequence[str],
               ops: Sequence[str], scratch: Path, local_sides: list[Side],
               env: dict[str, str], sections: list[str]) -> None:
    """One mount per ``--caching`` mode, its servers, the rounds, a report section each."""
    from tests.nfs.mount import LatencyMount

    runner = Runner(fx, scratch, args.info_refs_reps)
    for caching in args.caching.split(","):
        timeout = CACHING[caching]
        with LatencyMount(fx.src, delay_ms=args.delay_ms, attr_timeout=timeout,
                          entry_timeout=timeout) as mount, \
                servers_for(kinds, mount.path, "mount", env) as mount_sides:
            print(f"[{caching}] mount {mount.path} delay {args.delay_ms} ms, "
                  f"attr/entry timeout {timeout} s", flush=True)
            sides = [s for pair in zip(local_sides, mount_sides, strict=True) for s in pair]
            results = runner.run(sides, args.rounds, mount, ops)
        sections.append(
            f"== {caching}: attr_timeout=entry_timeout={timeout:g} s, "
            f"{args.delay_ms:g} ms per metadata request; medians of {args.rounds} "
            f"alternating rounds, warm ==\n" + report(results, kinds, ops))


if __name__ == "__main__":
    sys.exit(main())
