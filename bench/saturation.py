"""Saturation: jobs/s and server CPU per job, gitspout ``--workers 1``/``2`` against
git-http-backend (nginx + fcgiwrap), the server pinned to one core then two (issue 28).

Load comes from wrk (Debian's package) with a Lua script that POSTs request bodies recorded
from real git: ``GIT_TRACE_PACKET`` of a ``git fetch`` 5 commits behind (the CI mix) and of
a ``git clone --bare`` (the clone mix), against the dulwich history. A job is the three
requests a client makes: ``GET info/refs`` (v2), ``ls-refs``, ``fetch``; jobs/s is wrk's
requests/s divided by 3, spread over ``--copies`` copies of the repository (full copies:
no cache is shared between them through hard links).

    .venv/bin/python -m bench.saturation [--repo bench/work/real/dulwich-gc.git]
        [--seconds 10] [--clone-seconds 30] [--copies 8] [--cores 1,2] [--mixes ci,clone]
        [--rounds 3] [--load wrk|trunc]

``--load trunc`` sends the same jobs from ``bench/loadgen.c`` (built with the machine's
``cc``), which discards each body in the kernel (``recv`` with ``MSG_TRUNC``) instead of
copying it as wrk does: at the clone mix's gigabytes per second, wrk's copying needs most
of the core that a second server worker would use on a 2-core machine.

The server is pinned with ``taskset`` (every process and thread, forks inherit it): to
CPU 0 with the load generator on CPU 1; then to CPUs 0-1 with the load generator on CPU 1
too. On a 2-core machine the second case has the load generator competing with the server
(its CPU time is reported as ``load_cpu``). Every body is checked once per server before
the run (a 200 with a pack in it); the non-2xx count is reported. CPU per job is the
server cgroup's CPU time over the run divided by the jobs.
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.peer import BenchServer, GitHttpBackend, Gitspout  # noqa: E402
from bench.process import LOOPBACK, exit_on_sigterm  # noqa: E402

REPO_TOP = Path(__file__).resolve().parent.parent
DEFAULT_REPO = REPO_TOP / "bench" / "work" / "real" / "dulwich-gc.git"
CONCURRENCY = {"ci": 16, "clone": 8}
UPLOAD_CT = "application/x-git-upload-pack-request"

LUA = r"""
local bodies = {}
local copies = %(copies)d
local n = 0
local headers = {["Content-Type"] = "%(ct)s", ["Git-Protocol"] = "version=2",
                 ["Accept"] = "application/x-git-upload-pack-result"}
local function slurp(path)
  local f = assert(io.open(path, "rb")); local d = f:read("*a"); f:close(); return d
end
bodies[1] = slurp("%(ls)s")
bodies[2] = slurp("%(fetch)s")
function setup(thread) end
function init(args) n = 0 end
function request()
  local step = n %% 3
  local repo = "/d" .. (math.floor(n / 3) %% copies) .. ".git"
  n = n + 1
  if step == 0 then
    return wrk.format("GET", repo .. "/info/refs?service=git-upload-pack",
                      {["Git-Protocol"] = "version=2"})
  end
  return wrk.format("POST", repo .. "/git-upload-pack", headers, bodies[step])
end
"""


def record_bodies(trace: Path) -> list[bytes]:
    """The request bodies (pkt-lines) a client sent, from its GIT_TRACE_PACKET file:
    every ``fetch>``/``clone>`` line (what git sent the server), a body ending at each flush."""
    bodies, cur = [], []
    for line in trace.read_text(errors="replace").splitlines():
        m = re.search(r"packet:\s+(?:fetch|clone)> (.*)$", line)
        if not m:
            continue
        text = m.group(1)
        if text == "0000":
            cur.append(b"0000")
            bodies.append(b"".join(cur))
            cur = []
        elif text == "0001":
            cur.append(b"0001")
        else:
            data = text.encode("latin-1").decode("unicode_escape").encode("latin-1")
            if not data.endswith(b"\n"):
                data += b"\n"
            cur.append(b"%04x" % (len(data) + 4) + data)
    return [b for b in bodies if b.startswith(b"0014command=ls-refs") or b"command=fetch" in b]


def _git(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    full = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", **(env or {})}
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True,
                          env=full, cwd=cwd, timeout=600).stdout


def record(url: str, repo: Path, work: Path) -> dict[str, tuple[bytes, bytes]]:
    """(ls-refs body, fetch body) of a real CI fetch 5 commits behind and a real clone."""
    head = _git("--git-dir", str(repo), "symbolic-ref", "--short", "HEAD").strip()
    env = {"GIT_PROTOCOL_FROM_USER": "1"}
    out = {}
    ci = work / "ci.git"
    _git("clone", "-q", "--bare", "--no-local", "--single-branch", "--no-tags",
         "--branch", head, str(repo), str(ci))
    _git("--git-dir", str(ci), "update-ref", f"refs/heads/{head}", f"{head}~5")
    _git("--git-dir", str(ci), "reflog", "expire", "--expire=now", "--all")
    _git("--git-dir", str(ci), "gc", "-q", "--prune=now")
    trace = work / "ci.trace"
    _git("-c", "protocol.version=2", "--git-dir", str(ci), "fetch", "-q", "--no-tags",
         f"{url}/d0.git", f"{head}:refs/heads/{head}",
         env={**env, "GIT_TRACE_PACKET": str(trace)})
    ls, fetch = record_bodies(trace)[:2]
    out["ci"] = (ls, fetch)
    trace = work / "clone.trace"
    _git("-c", "protocol.version=2", "clone", "-q", "--bare", f"{url}/d0.git",
         str(work / "clone.git"), env={**env, "GIT_TRACE_PACKET": str(trace)})
    ls, fetch = record_bodies(trace)[:2]
    out["clone"] = (ls, fetch)
    return out


def check_bodies(port: int, bodies: tuple[bytes, bytes]) -> int:
    """Each recorded body once against the server: 200 and, for the fetch, a pack."""
    size = 0
    for i, body in enumerate(bodies):
        conn = http.client.HTTPConnection(LOOPBACK, port, timeout=300)
        conn.request("POST", "/d1.git/git-upload-pack", body,
                     {"Content-Type": UPLOAD_CT, "Git-Protocol": "version=2"})
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        if resp.status != 200 or (i == 1 and b"PACK" not in data[:4096] and
                                  b"packfile\n" not in data[:65536]):
            raise SystemExit(f"body {i} answered {resp.status}: {data[:200]!r}")
        size = len(data)
    return size


def pin(srv: BenchServer, cpus: str) -> None:
    """Every process and thread of the server (forks inherit it) on ``cpus``."""
    for pid in srv.pids():
        subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], check=False,
                       capture_output=True)


def run_wrk(port: int, script: Path, conns: int, seconds: float, cpus: str) -> dict[str, float]:
    out = subprocess.run(["taskset", "-c", cpus, "wrk", "-t1", f"-c{conns}",
                          f"-d{seconds:g}s", "--timeout", "60s", "-s", str(script),
                          f"http://{LOOPBACK}:{port}"], capture_output=True, text=True,
                         check=True, timeout=seconds + 120).stdout
    reqs = re.search(r"(\d+) requests in", out)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errs = re.search(r"Socket errors: (.*)", out)
    return {"requests": float(reqs.group(1)) if reqs else 0.0,
            "non2xx": float(bad.group(1)) if bad else 0.0,
            "socket_errors": 0.0 if not errs else float(sum(
                int(x) for x in re.findall(r"\d+", errs.group(1))))}


LOADGEN_SRC = Path(__file__).resolve().parent / "loadgen.c"


def build_loadgen(work: Path) -> Path:
    """bench/loadgen.c, compiled into ``work`` (kept while the source is older)."""
    exe = work / "loadgen"
    if not exe.exists() or exe.stat().st_mtime < LOADGEN_SRC.stat().st_mtime:
        subprocess.run(["cc", "-O2", "-pthread", "-o", str(exe), str(LOADGEN_SRC)],
                       check=True, timeout=120)
    return exe


def run_trunc(exe: Path, port: int, bodies: tuple[Path, Path], conns: int, seconds: float,
              cpus: str, copies: int) -> dict[str, float]:
    """The same jobs as :data:`LUA`, by ``loadgen`` (the module doc)."""
    out = subprocess.run(["taskset", "-c", cpus, str(exe), LOOPBACK, str(port), str(conns),
                          f"{seconds:g}", str(copies), str(bodies[0]), str(bodies[1])],
                         capture_output=True, text=True, check=True,
                         timeout=seconds + 120).stdout
    got = dict(line.split() for line in out.splitlines() if line.strip())
    return {"requests": float(got["requests"]), "non2xx": float(got["non2xx"]),
            "socket_errors": float(got["errors"]), "bytes": float(got["bytes"]),
            "seconds": float(got["seconds"])}


def make_root(repo: Path, root: Path, copies: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(copies):
        dest = root / f"d{i}.git"
        if not dest.exists():
            shutil.copytree(repo, dest, symlinks=True)


def one_cell(make: object, name: str, mix: str, load: Callable[[int, float], dict[str, float]],
             bodies: tuple[bytes, bytes], cores: int, args: argparse.Namespace
             ) -> dict[str, object]:
    """One run of ``mix`` against one server; ``load(port, seconds)`` is the load
    generator (wrk, or loadgen), on CPU 1."""
    server_cpus = "0" if cores == 1 else "0-1"
    assert callable(make)
    seconds = args.clone_seconds if mix == "clone" else args.seconds
    warmup = args.clone_warmup if mix == "clone" else args.warmup
    with make() as srv:
        pin(srv, server_cpus)
        check_bodies(srv.port, bodies)
        load(srv.port, warmup)  # warm caches
        wrk_cpu0 = _self_children_cpu()
        srv.reset_counters()
        t0 = time.monotonic()
        res = load(srv.port, seconds)
        wall = time.monotonic() - t0
        cpu = srv.cpu_ns() / 1e9
        wrk_cpu = _self_children_cpu() - wrk_cpu0
    jobs = res["requests"] / 3
    # loadgen counts the answers that end after the deadline, and the time they took
    return {"server": name, "mix": mix, "cores": cores,
            "jobs_s": jobs / res.get("seconds", seconds),
            "cpu_ms_job": 1000 * cpu / jobs if jobs else float("nan"),
            "server_cpu_s": cpu, "wrk_cpu_s": wrk_cpu, "wall": wall,
            "non2xx": res["non2xx"], "socket_errors": res["socket_errors"]}


def _self_children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=DEFAULT_REPO)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--clone-seconds", type=float, default=30.0,
                    help="run length of the clone mix (a clone takes a second or more)")
    ap.add_argument("--clone-warmup", type=float, default=10.0)
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--cores", default="1,2")
    ap.add_argument("--mixes", default="ci,clone")
    ap.add_argument("--servers", default="gitspout-w1,gitspout-w2,c-git")
    ap.add_argument("--load", choices=("wrk", "trunc"), default="wrk",
                    help="the load generator: wrk with a Lua script, or bench/loadgen.c, "
                         "which drops bodies in the kernel (the module doc)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="runs of every cell, interleaved across servers; the table gives "
                         "medians (a shared machine's noise hits one run, not all)")
    args = ap.parse_args(argv)
    exit_on_sigterm()
    root = REPO_TOP / "bench" / "work" / "saturation" / "root"
    make_root(args.repo, root, args.copies)
    work = Path(tempfile.mkdtemp(prefix="gitspout-saturation-"))
    servers = {
        "gitspout-w1": lambda: Gitspout(root, extra_args=["--workers", "1"]),
        "gitspout-w2": lambda: Gitspout(root, extra_args=["--workers", "2"]),
        "c-git": lambda: GitHttpBackend(root),
    }
    try:
        with Gitspout(root) as srv:
            recorded = record(srv.url, root / "d0.git", work)
        loads: dict[str, Callable[[int, float], dict[str, float]]] = {}
        exe = build_loadgen(root.parent) if args.load == "trunc" else None
        for mix, (ls, fetch) in recorded.items():
            files = (work / f"{mix}.ls", work / f"{mix}.fetch")
            files[0].write_bytes(ls)
            files[1].write_bytes(fetch)
            conns = CONCURRENCY[mix]
            if exe is not None:
                loads[mix] = partial(lambda port, secs, files, conns: run_trunc(
                    exe, port, files, conns, secs, "1", args.copies), files=files, conns=conns)
                continue
            script = work / f"{mix}.lua"
            script.write_text(LUA % {"copies": args.copies, "ct": UPLOAD_CT,
                                     "ls": files[0], "fetch": files[1]})
            loads[mix] = partial(lambda port, secs, script, conns: run_wrk(
                port, script, conns, secs, "1"), script=script, conns=conns)
        print(f"load generator: {args.load}; load average before: {os.getloadavg()}",
              flush=True)
        runs: list[dict[str, object]] = []
        for mix in args.mixes.split(","):
            for cores in (int(c) for c in args.cores.split(",")):
                for _ in range(args.rounds):
                    for name in args.servers.split(","):
                        row = one_cell(servers[name], name, mix, loads[mix], recorded[mix],
                                       cores, args)
                        runs.append(row)
                        print(_fmt(row), f"load {os.getloadavg()[0]:.1f}", flush=True)
        print(table(medians(runs)))
        print(f"load average after: {os.getloadavg()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _fmt(r: dict[str, object]) -> str:
    return (f"{r['mix']:5} cores={r['cores']} {r['server']:12} jobs/s={r['jobs_s']:.1f} "
            f"cpu/job={r['cpu_ms_job']:.1f} ms load_cpu={r['wrk_cpu_s']:.2f} s "
            f"non2xx={r['non2xx']:.0f} sockerr={r['socket_errors']:.0f}")


def medians(runs: list[dict[str, object]]) -> list[dict[str, object]]:
    """One row per (mix, cores, server): the median jobs/s and CPU per job of its runs,
    with the range of jobs/s."""
    cells: dict[tuple[object, object, object], list[dict[str, object]]] = {}
    for r in runs:
        cells.setdefault((r["mix"], r["cores"], r["server"]), []).append(r)
    rows = []
    for (mix, cores, server), rs in cells.items():
        jobs = [float(str(r["jobs_s"])) for r in rs]
        rows.append({"mix": mix, "cores": cores, "server": server, "runs": len(rs),
                     "jobs_s": statistics.median(jobs), "low": min(jobs), "high": max(jobs),
                     "cpu_ms_job": statistics.median(float(str(r["cpu_ms_job"])) for r in rs)})
    return rows


def table(rows: list[dict[str, object]]) -> str:
    lines = ["| mix | cores | server | jobs/s (median; range) | CPU per job | vs gitspout w1 "
             "| vs git-http-backend |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        same = [x for x in rows if x["mix"] == r["mix"] and x["cores"] == r["cores"]]
        base = next((x for x in same if x["server"] == "gitspout-w1"), None)
        cgit = next((x for x in same if x["server"] == "c-git"), None)

        def ratio(other: dict[str, object] | None, r: dict[str, object] = r) -> str:
            if other is None or not other["jobs_s"]:
                return "-"
            return f"{float(str(r['jobs_s'])) / float(str(other['jobs_s'])):.2f}x"
        spread = f" ({r['low']:.0f}-{r['high']:.0f}, {r['runs']} runs)" if r.get("runs", 1) != 1 \
            else ""
        lines.append(f"| {r['mix']} | {r['cores']} | {r['server']} | {r['jobs_s']:.1f}{spread} | "
                     f"{r['cpu_ms_job']:.1f} ms | {ratio(base)} | {ratio(cgit)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
