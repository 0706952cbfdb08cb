"""Benchmark for "Fast pack serving": gitspout (B) against C git's
``git-http-backend`` behind nginx + fcgiwrap (A).

    python -m bench.run [--root-set synthetic|dulwich|git|quick|all] [--variants gc,unmaintained]
                        [--cases clone-v2,clone-v0,fetch-1,clone-x8] [--rounds 3]
                        [--quick] [--json OUT]

Both servers serve the SAME root: a temporary copy (``cp -a``) of the chosen
fixture variants, so pushes made for ``fetch-1`` never touch ``bench/work``.
Each server runs in its own cgroup (:mod:`bench.peer`); the client talks to
it through a byte-counting TCP proxy on 127.0.0.1 that lives in this process
(outside both cgroups).

Per run we record

* server CPU: the cgroup's ``cpuacct.usage`` over the client operation (every
  process of the server, including exited children such as ``pack-objects``);
  after the client exits we wait until the server's extra processes are gone;
* client wall time of the git command(s);
* bytes sent server -> client (counted by the proxy, HTTP framing included);
* peak RSS: for gitspout the ``VmHWM`` of its (only) process -- since that
  process started, i.e. since the restart before the case; for
  git-http-backend the largest ``VmHWM`` of any of its processes, sampled
  every 20 ms while the operation runs (short-lived children may be missed).
  The cgroup's memory high-water mark (which includes page cache) is only in
  the JSON.

Per case, gitspout is restarted and measured on its own first: that is
the **cold** run (first request after the server started, its cross-request
caches empty); ``--cold-runs N`` does it N times, each after its own restart,
and reports their median (one cold run is a noisy figure on a shared machine).
Then A and B alternate ``A B A B ...`` for ``--rounds``
rounds; the medians are over these rounds only, so B's median is a **warm**
figure.  Cases:

* ``clone-v2`` / ``clone-v0``: ``git clone --mirror`` over protocol v2 / v0;
  ``git fsck`` on the first run of each server;
* ``clone-x8``: 8 concurrent v2 mirror clones; wall = until all 8 finished;
* ``fetch-1``: after the clone cases, one realistic commit (a few lines in
  three text files) is pushed into the served repository (its objects arrive
  loose); each run fetches it (v2) into a fresh ``cp -a`` of a mirror clone
  made before the push.
* ``fleet`` (only when asked): ``--fleet-repos N`` distinct small bitmapped
  repositories (one template built with git, copied under N names) beside the
  variants; each run does ``git ls-remote`` plus a mirror clone of every one of
  them, once each. Besides CPU, wall and bytes: the server's open descriptors
  and RSS (summed over its processes) before and after, and how many of the N
  failed. ``--fleet-budgets tiny`` starts gitspout with ``--max-open-packs 8
  --cache-memory 8MiB``.

``--quick`` (CI) builds or reuses a small synthetic repository (300 commits,
``bench/work/quick``) and runs clone-v2 and fetch-1 once on both variants.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from random import Random
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cgroup import peak_rss_bytes  # noqa: E402
from bench.client import GitError, client_env, clone_mirror, fsck, git_out, list_refs, run_git  # noqa: E402,E501
from bench.peer import BenchServer, GitHttpBackend, Gitspout, find_gitspout_bin  # noqa: E402
from bench.process import LOOPBACK, ServerError, exit_on_sigterm, link_import_root  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
REPO_TOP = BENCH_DIR.parent
WORK = BENCH_DIR / "work"

# Identical clones at once, with a filter or a depth (issue 12, the pack cache): one
# (``clone-*``) or X8 (``x8-*``) ``git clone --mirror`` with these arguments.
STORM_ARGS = {"blobless": ("--filter=blob:none",), "treeless": ("--filter=tree:0",),
              "depth1": ("--depth", "1", "--no-single-branch"), "full": ()}
STORM_CASES = tuple(f"clone-{k}" for k in STORM_ARGS if k != "full") + tuple(
    f"x8-{k}" for k in STORM_ARGS)
# Issue 23 (bench/lazycases.py): lazy fetches after a blobless clone, and a deepen.
LAZY_CASES = ("lazy-blob", "lazy-checkout", "blobless-checkout", "deepen-1-20")
ALL_CASES = ("clone-v2", "clone-v0", "clone-x8", *STORM_CASES, *LAZY_CASES, "fetch-1",
             "fleet")  # execution order
DEFAULT_CASES = ("clone-v2", "clone-v0", "clone-x8", "fetch-1")
TINY_BUDGETS = ("--max-open-packs", "8", "--cache-memory", "8MiB")
CLONE_CASES = ("clone-v2", "clone-v0", "clone-x8")
ALL_VARIANTS = ("gc", "unmaintained")
X8 = 8
QUICK_COMMITS = 300
MB = 1024 * 1024


# ---------------------------------------------------------------------------
# root sets


@dataclass(frozen=True)
class RootSet:
    """A family of fixture repositories ``<dir>/<name>-<variant>.git``."""

    name: str
    directory: Path
    timeout: float          # bound for one client operation (s)
    big: bool = False       # fsck --connectivity-only (index-pack verified every object)
    hint: str = ""

    def source(self, variant: str) -> Path:
        """The pristine fixture repository of *variant* (never modified)."""
        return self.directory / f"{self.name}-{variant}.git"


ROOT_SETS = {
    "synthetic": RootSet("synthetic", WORK / "synthetic", 900.0,
                         hint="python bench/make_repo.py"),
    "dulwich": RootSet("dulwich", WORK / "real", 900.0,
                       hint="python bench/prepare_real.py dulwich"),
    "git": RootSet("git", WORK / "real", 3600.0, big=True,
                   hint="python bench/prepare_real.py git"),
}
QUICK_DIR = WORK / "quick"


def quick_root_set(directory: Path) -> RootSet:
    """The small synthetic repository of ``--quick``."""
    return RootSet("quick", directory, 120.0,
                   hint=f"python bench/make_repo.py {directory} --name quick "
                        f"--commits {QUICK_COMMITS}")


def ensure_quick_repo(directory: Path) -> None:
    """Build (once, under a lock) or reuse the ``--quick`` repositories."""
    import sysconfig

    from bench.make_repo import DEFAULT_SOURCE, build

    directory.mkdir(parents=True, exist_ok=True)
    rs = quick_root_set(directory)
    with open(directory / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all(rs.source(v).is_dir() for v in ALL_VARIANTS):
            return
        source = DEFAULT_SOURCE if DEFAULT_SOURCE.is_dir() else \
            Path(sysconfig.get_paths()["stdlib"])
        t0 = time.monotonic()
        for label, info in build(directory, "quick", QUICK_COMMITS, 1, source):
            print(f"  quick fixture {label}: {info.summary()}", flush=True)
        print(f"  quick fixture built in {time.monotonic() - t0:.1f}s", flush=True)


# ---------------------------------------------------------------------------
# byte-counting proxy


class ByteCountingProxy:
    """A TCP proxy on 127.0.0.1 that counts bytes in both directions.

    It runs an asyncio loop in a daemon thread of this process (so outside
    the servers' cgroups).  Bytes server -> client are counted as they are
    read from the server, so once the client has exited every byte it
    received has been counted.  ``upstream_port`` may be changed between
    runs (after a server restart); new connections use the new port.
    """

    CHUNK = 256 * 1024

    def __init__(self, upstream_port: int, name: str) -> None:
        self.upstream_port = upstream_port
        self.name = name
        self.port = 0
        self.down = 0            # server -> client
        self.up = 0              # client -> server
        self.connections = 0
        self.connect_errors = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> ByteCountingProxy:
        """Start the loop thread and wait until the listening socket exists."""
        self._thread = threading.Thread(target=self._run, name=f"proxy-{self.name}",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(10.0):
            raise ServerError(f"proxy {self.name} did not start")
        if self._start_error is not None:
            raise ServerError(f"proxy {self.name}: {self._start_error}")
        return self

    def snapshot(self) -> tuple[int, int, int]:
        """(bytes down, bytes up, connections) so far."""
        return self.down, self.up, self.connections

    def stop(self, timeout: float = 10.0) -> None:
        """Close the listener and every connection, end the thread (bounded)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if thread.is_alive():
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(self._shutdown)
            thread.join(timeout)
        self._thread = None

    def _new_loop(self) -> asyncio.AbstractEventLoop:
        try:
            import uvloop  # optional; plain asyncio otherwise
            return uvloop.new_event_loop()  # type: ignore[no-any-return]
        except ImportError:
            return asyncio.new_event_loop()

    def _run(self) -> None:
        loop = self._loop = self._new_loop()
        try:
            self._server = loop.run_until_complete(asyncio.start_server(
                self._handle, LOOPBACK, 0, limit=4 * self.CHUNK))
            self.port = int(self._server.sockets[0].getsockname()[1])
        except BaseException as e:  # noqa: BLE001 - reported by start()
            self._start_error = e
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._tasks):
            t.cancel()
        assert self._loop is not None
        self._loop.stop()

    async def _handle(self, creader: asyncio.StreamReader,
                      cwriter: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        uwriter: asyncio.StreamWriter | None = None
        try:
            try:
                ureader, upstream = await asyncio.wait_for(asyncio.open_connection(
                    LOOPBACK, self.upstream_port, limit=4 * self.CHUNK), 10.0)
            except (TimeoutError, OSError):
                self.connect_errors += 1
                return
            uwriter = upstream
            writers = (cwriter, upstream)
            await asyncio.gather(self._pump(creader, upstream, writers, up=True),
                                 self._pump(ureader, cwriter, writers, up=False))
        finally:
            for w in (cwriter, uwriter):
                if w is not None:
                    w.close()
            self._tasks.discard(task)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    both: tuple[asyncio.StreamWriter, ...], *, up: bool) -> None:
        try:
            while True:
                data = await reader.read(self.CHUNK)
                if not data:
                    break
                if up:
                    self.up += len(data)
                else:
                    self.down += len(data)
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()  # half-close, as the peer did
        except (ConnectionError, OSError):
            for w in both:  # ends the other direction too
                w.close()


# ---------------------------------------------------------------------------
# servers


class PeakRssWatcher:
    """Largest ``VmHWM`` of any process of a server, sampled in a thread."""

    def __init__(self, server: BenchServer, interval: float = 0.02) -> None:
        self.server = server
        self.interval = interval
        self.peak = 0
        self.peak_comm = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-watch", daemon=True)

    def __enter__(self) -> PeakRssWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        """Read VmHWM of every live process of the server once."""
        try:
            found = self.server.peak_rss_by_pid()
        except OSError:
            return
        for pid, hwm in found.items():
            if hwm > self.peak:
                self.peak = hwm
                with contextlib.suppress(OSError):
                    self.peak_comm = Path(f"/proc/{pid}/comm").read_text().strip()


_LOG_PROBLEM = re.compile(r"traceback|error|exception|fatal|failed|crit|alert|emerg|warn",
                          re.IGNORECASE)


class Side:
    """One contender: its server (restartable), proxy and log findings."""

    def __init__(self, label: str, impl: str, factory: Callable[[], BenchServer],
                 keep_logs: bool = False) -> None:
        self.label = label
        self.impl = impl
        self.factory = factory
        self.keep_logs = keep_logs
        self.server: BenchServer | None = None
        self.proxy: ByteCountingProxy | None = None
        self.generation = 0
        self.log_problems: dict[str, int] = {}

    def start(self) -> None:
        """Start a fresh server process (tree) and point the proxy at it."""
        self.generation += 1
        srv = self.factory()  # its own short work dir in $TMPDIR (unix socket path limit)
        srv.keep_workdir = True  # we read the logs after stopping it
        srv.start()
        self.server = srv
        if self.proxy is None:
            self.proxy = ByteCountingProxy(srv.port, self.label).start()
        else:
            self.proxy.upstream_port = srv.port

    def stop_server(self) -> None:
        """Stop the server (processes, cgroup) and collect problems from its logs."""
        srv, self.server = self.server, None
        if srv is None:
            return
        try:
            srv.stop()
        finally:
            self._scan_logs(srv.workdir)
            if self.keep_logs:
                print(f"  {self.label} ({self.impl}) logs kept in {srv.workdir}", flush=True)
            else:
                shutil.rmtree(srv.workdir, ignore_errors=True)

    def restart(self) -> None:
        """Stop the server and start a new one (empties gitspout's caches)."""
        self.stop_server()
        self.start()

    def died(self) -> str | None:
        """None while every top-level process runs, else their exit status and log tail."""
        if self.server is None:
            return "not started"
        dead = [p for p in self.server.procs if not p.alive()]
        if not dead:
            return None
        return "; ".join(
            f"{p.name} exit status {p.proc.returncode if p.proc else '?'}, log tail: "
            + " | ".join(p.log_tail(4).splitlines())[-400:] for p in dead)

    def ensure_alive(self) -> None:
        """Restart the server if any of its top-level processes died."""
        died = self.died()
        if died:
            self.note(f"{self.impl} was not running ({died}); restarted")
            self.restart()

    def close(self) -> None:
        """Stop server and proxy (cleanup path; never raises)."""
        for fn in (self.stop_server, self.proxy.stop if self.proxy else None):
            if fn is None:
                continue
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - finish cleanup
                print(f"warning: cleanup of {self.label}: {e}", file=sys.stderr)
        self.proxy = None

    def url(self, repo: str) -> str:
        """Clone URL through the byte-counting proxy."""
        assert self.proxy is not None
        return f"http://{LOOPBACK}:{self.proxy.port}/{repo}"

    @property
    def srv(self) -> BenchServer:
        assert self.server is not None
        return self.server

    def main_pid(self) -> int:
        """PID of the first launched process (gitspout itself for B)."""
        return self.srv.procs[0].pid

    def note(self, text: str) -> None:
        self.log_problems[text] = self.log_problems.get(text, 0) + 1

    def _scan_logs(self, workdir: Path) -> None:
        for log in sorted(workdir.glob("*.log")):
            if log.name == "access.log":
                continue
            with contextlib.suppress(OSError):
                for finding in log_findings(log.read_text(errors="replace")):
                    self.note(f"{log.name}: {_normalise(finding)[:300]}")


def log_findings(text: str) -> Iterator[str]:
    """Problem lines of a server log; a Python traceback becomes one line with its
    exception and innermost frame."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("Traceback (most recent call last)"):
            where = ""
            i += 1
            while i < len(lines) and (lines[i].startswith(" ") or not lines[i].strip()):
                m = re.match(r'\s+File "([^"]+)", line (\d+), in (\S+)', lines[i])
                if m:
                    where = f"{Path(m[1]).name}:{m[2]} in {m[3]}"
                i += 1
            exc = lines[i] if i < len(lines) else "?"
            yield f"Traceback: {exc} (innermost frame {where})"
        elif _LOG_PROBLEM.search(line) and "serving" not in line:
            yield line
        i += 1


def _normalise(line: str) -> str:
    """Strip timestamps/pids/ports/tmp paths so repeated log lines group together."""
    line = re.sub(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d ", "", line)
    line = re.sub(r"\b\d+#\d+: \*\d+ ", "", line)
    line = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", line)
    line = re.sub(r"/client_body/\d+", "/client_body/N", line)
    return re.sub(r"/tmp/gitspout-bench-[^/\s]+", "TMP", line)


# ---------------------------------------------------------------------------
# samples


@dataclass
class Sample:
    """One measured client operation against one server."""

    repo: str
    variant: str
    case: str
    server: str              # "A" or "B"
    impl: str                # "git-http-backend" or "gitspout"
    run: int                 # 0, -1, ... = cold gitspout runs, 1.. = rounds
    cold: bool
    cpu_ns: int = 0
    wall_s: float = 0.0
    bytes_down: int = 0
    bytes_up: int = 0
    connections: int = 0
    peak_rss_bytes: int | None = None
    peak_rss_process: str = ""
    cgroup_mem_max_bytes: int | None = None
    settled: bool = True
    fsck: str = "skipped"
    error: str | None = None
    loadavg_1m: float = 0.0  # machine load when the run started (the machine is shared)
    # fleet: the server's open descriptors and RSS (over its processes), failed repositories
    fds_before: int | None = None
    fds_after: int | None = None
    rss_before_bytes: int | None = None
    rss_after_bytes: int | None = None
    fleet_failures: int | None = None
    pack_cache: dict[str, float] = field(default_factory=dict)  # gitspout: counter deltas
    objects: int | None = None  # objects the server sent, where the case counts them

    @property
    def ok(self) -> bool:
        return self.error is None

    def error_summary(self) -> str:
        """The telling line of the error (git's ``fatal:``/``error:`` line if any)."""
        lines = [ln.strip() for ln in (self.error or "").splitlines() if ln.strip()]
        key = next((m.group(0) for ln in lines
                    if (m := re.search(r"\b(fatal|error): .*", ln))), None)
        return (f"{lines[0].split(':')[0]}: {key}" if key else lines[0] if lines else "")[:300]

    def line(self) -> str:
        """Progress line."""
        tag = "B cold" if self.cold else f"{self.server} r{self.run}"
        if self.error:
            return (f"    {tag:7} ERROR {self.error_summary()} (cpu {self.cpu_ns / 1e6:.0f} ms, "
                    f"wall {self.wall_s:.2f} s, bytes {human_bytes(self.bytes_down)})")
        rss = f"{self.peak_rss_bytes / MB:.0f} MB" if self.peak_rss_bytes else "-"
        return (f"    {tag:7} cpu {self.cpu_ns / 1e6:8.0f} ms  wall {self.wall_s:7.2f} s  "
                f"bytes {human_bytes(self.bytes_down):>9}  peak rss {rss:>6} "
                f"({self.peak_rss_process or '?'})  fsck {self.fsck}"
                + (f"  objects {self.objects}" if self.objects is not None else "")
                + ("" if self.settled else "  [server processes still running]")
                + ("  cache " + " ".join(f"{k}={v:.0f}" for k, v in self.pack_cache.items()
                                         if "bytes" not in k and v)
                   if any(self.pack_cache.values()) else "")
                + (f"\n            fds {self.fds_before} -> {self.fds_after}, RSS "
                   f"{(self.rss_before_bytes or 0) / MB:.0f} -> {(self.rss_after_bytes or 0) / MB:.0f}"
                   f" MB, {self.fleet_failures} failed" if self.fds_before is not None else ""))


def human_bytes(n: float | None) -> str:
    """1234567 -> '1.18 MB' (binary units, 3 significant digits)."""
    if n is None:
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError


# ---------------------------------------------------------------------------
# cases


class Case:
    """A client operation: ``prepare`` (untimed), ``op`` (timed), ``verify``."""

    name = ""
    fsck_all_dests = False

    def __init__(self, bench: Bench, repo: str, served: Path) -> None:
        self.bench = bench
        self.repo = repo
        self.served = served
        self.expected_refs = list_refs(served)
        self.timeout = bench.rs.timeout

    def prepare(self, side: Side, run: int) -> Any:
        raise NotImplementedError

    def op(self, side: Side, state: Any) -> None:
        raise NotImplementedError

    def verify(self, side: Side, state: Any, check: bool) -> str:
        raise NotImplementedError

    def cleanup(self, state: Any) -> None:
        raise NotImplementedError

    def _check_refs(self, repo: Path) -> None:
        got = list_refs(repo)
        if got != self.expected_refs:
            missing = sorted(set(self.expected_refs) - set(got))[:5]
            extra = sorted(set(got) - set(self.expected_refs))[:5]
            changed = sorted(r for r in set(got) & set(self.expected_refs)
                             if got[r] != self.expected_refs[r])[:5]
            raise AssertionError(f"refs of {repo.name} differ from the served repository: "
                                 f"missing {missing} extra {extra} different {changed}")

    def _fsck(self, repo: Path) -> str:
        out = fsck(repo, timeout=self.timeout, connectivity_only=self.bench.rs.big)
        warnings = out.count("warning")
        kind = "connectivity" if self.bench.rs.big else "full"
        return f"clean ({kind}{f', {warnings} history warnings' if warnings else ''})"


class CloneCase(Case):
    """``git clone --mirror`` over protocol v2 or v0."""

    def __init__(self, bench: Bench, repo: str, served: Path, protocol: int) -> None:
        super().__init__(bench, repo, served)
        self.protocol = protocol
        self.name = f"clone-v{protocol}"

    def prepare(self, side: Side, run: int) -> Path:
        return self.bench.scratch_path(f"{side.label}-{self.name}-{run}.git")

    def op(self, side: Side, state: Path) -> None:
        clone_mirror(side.url(self.repo), state, protocol=self.protocol, timeout=self.timeout)

    def verify(self, side: Side, state: Path, check: bool) -> str:
        self._check_refs(state)
        return self._fsck(state) if check else "skipped"

    def cleanup(self, state: Path) -> None:
        shutil.rmtree(state, ignore_errors=True)


class ParallelCloneCase(Case):
    """``X8`` concurrent protocol v2 mirror clones; wall = until the last finished."""

    name = "clone-x8"

    def prepare(self, side: Side, run: int) -> list[Path]:
        return [self.bench.scratch_path(f"{side.label}-{self.name}-{run}-{i}.git")
                for i in range(X8)]

    def op(self, side: Side, state: list[Path]) -> None:
        url = side.url(self.repo)
        procs: list[tuple[subprocess.Popen[bytes], Any]] = []
        try:
            for dest in state:
                err = tempfile.TemporaryFile()
                procs.append((subprocess.Popen(
                    ["git", "-c", "protocol.version=2", "clone", "--mirror", "--quiet", url,
                     str(dest)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=err, env=client_env()), err))
            deadline = time.monotonic() + self.timeout
            failures = []
            for p, err in procs:
                try:
                    rc = p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired as e:
                    raise GitError(f"clone-x8: timeout after {self.timeout}s") from e
                if rc != 0:
                    err.seek(0)
                    failures.append(f"exit {rc}: {err.read().decode(errors='replace')[-500:]}")
            if failures:
                raise GitError(f"{len(failures)} of {X8} clones failed: {failures[0]}")
        finally:
            for p, err in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                err.close()

    def verify(self, side: Side, state: list[Path], check: bool) -> str:
        for dest in state:
            self._check_refs(dest)
        return self._fsck(state[0]) + " (1 of 8)" if check else "skipped"

    def cleanup(self, state: list[Path]) -> None:
        for dest in state:
            shutil.rmtree(dest, ignore_errors=True)


class StormCase(ParallelCloneCase):
    """``git clone --mirror`` with a filter or a depth, once (``clone-*``) or X8 at once
    (``x8-*``): identical requests, which the pack cache answers with one generation."""

    def __init__(self, bench: Bench, repo: str, served: Path, name: str) -> None:
        super().__init__(bench, repo, served)
        self.name = name
        kind, _, what = name.partition("-")
        self.count = X8 if kind == "x8" else 1
        self.args = STORM_ARGS[what]

    def prepare(self, side: Side, run: int) -> list[Path]:
        return [self.bench.scratch_path(f"{side.label}-{self.name}-{run}-{i}.git")
                for i in range(self.count)]

    def op(self, side: Side, state: list[Path]) -> None:
        url = side.url(self.repo)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for dest in state:
                procs.append(subprocess.Popen(
                    ["git", "-c", "protocol.version=2", "clone", "--mirror", "--quiet",
                     *self.args, url, str(dest)], stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=client_env()))
            failures = []
            for p in procs:
                _, err = p.communicate(timeout=self.timeout)
                if p.returncode != 0:
                    failures.append(f"exit {p.returncode}: {err.decode(errors='replace')[-500:]}")
            if failures:
                raise GitError(f"{len(failures)} of {len(procs)} clones failed: {failures[0]}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()

    def verify(self, side: Side, state: list[Path], check: bool) -> str:
        for dest in state:
            self._check_refs(dest)
        if not check:
            return "skipped"
        out = fsck(state[0], timeout=self.timeout, connectivity_only=True)
        return f"clean (connectivity{', warnings' if 'warning' in out else ''}, 1 of {len(state)})"


def scrape_pack_cache(side: Side) -> dict[str, float]:
    """gitspout's pack cache counters (lookups by result, bytes) and closure store counters
    (``store_<result>``: loaded, missed, based...), straight from its port."""
    import urllib.request

    if side.impl != "gitspout":
        return {}
    try:
        with urllib.request.urlopen(f"{side.srv.url}/metrics", timeout=30) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for m in re.finditer(r'^gitspout_pack_cache_(lookups_total\{result="(\w+)"\}|'
                         r'(served_bytes_total|generated_bytes_total)) (\S+)$', text, re.M):
        out[m.group(2) or m.group(3)] = float(m.group(4))
    for m in re.finditer(r'^gitspout_closure_store_total\{result="(\w+)"\} (\S+)$', text, re.M):
        out[f"store_{m.group(1)}"] = float(m.group(2))
    return out


class FetchOneCase(Case):
    """``git fetch`` (v2) of one new pushed commit into a copy of a base clone."""

    name = "fetch-1"

    def __init__(self, bench: Bench, repo: str, served: Path, template: Path,
                 new_commit: str, branch: str) -> None:
        super().__init__(bench, repo, served)
        self.template = template
        self.new_commit = new_commit
        self.branch = branch

    def prepare(self, side: Side, run: int) -> Path:
        dest = self.bench.scratch_path(f"{side.label}-{self.name}-{run}.git")
        subprocess.run(["cp", "-a", str(self.template), str(dest)], check=True,
                       timeout=self.timeout)
        run_git(["--git-dir", str(dest), "remote", "set-url", "origin", side.url(self.repo)])
        return dest

    def op(self, side: Side, state: Path) -> None:
        run_git(["-c", "protocol.version=2", "--git-dir", str(state), "fetch", "--quiet",
                 "origin"], timeout=self.timeout)

    def verify(self, side: Side, state: Path, check: bool) -> str:
        got = git_out(["--git-dir", str(state), "rev-parse", self.branch])
        if got != self.new_commit:
            raise AssertionError(f"{self.branch} is {got} after fetch, expected the "
                                 f"pushed {self.new_commit}")
        self._check_refs(state)
        return self._fsck(state) if check else "skipped"

    def cleanup(self, state: Path) -> None:
        shutil.rmtree(state, ignore_errors=True)


def _server_fds_rss(srv: BenchServer) -> tuple[int, int]:
    """Open descriptors and RSS (bytes) summed over the server's processes."""
    fds = rss = 0
    for pid in srv.pids():
        with contextlib.suppress(OSError):
            fds += len(os.listdir(f"/proc/{pid}/fd"))
            with open(f"/proc/{pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1]) * 1024
    return fds, rss


def build_fleet(root: Path, count: int, timeout: float) -> list[str]:
    """``count`` small bitmapped repositories under ``root/fleet``: one template made
    with git (a few commits, a tag, ``repack -adb``, a commit-graph), then ``cp -a``."""
    top = root / "fleet"
    tpl = top / "template.src"
    if not tpl.exists():
        work = top / "template.work"
        run_git(["init", "-q", "-b", "main", str(work)], timeout=timeout)
        for i in range(4):
            (work / f"f{i}.txt").write_text(f"line {i}\n" * 50)
            run_git(["-C", str(work), "add", "-A"], timeout=timeout)
            run_git(["-C", str(work), "-c", "user.name=b", "-c", "user.email=b@x", "commit",
                     "-q", "-m", f"c{i}"], timeout=timeout)
        run_git(["-C", str(work), "tag", "v1"], timeout=timeout)
        run_git(["clone", "-q", "--bare", "--no-local", str(work), str(tpl)], timeout=timeout)
        run_git(["-C", str(tpl), "repack", "-adq", "--write-bitmap-index"], timeout=timeout)
        run_git(["-C", str(tpl), "commit-graph", "write", "--reachable"], timeout=timeout)
        shutil.rmtree(work)
    names = [f"fleet/g{i // 100:03d}/r{i:05d}.git" for i in range(count)]
    for name in names:
        if not (root / name).exists():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["cp", "-a", str(tpl), str(root / name)], check=True, timeout=timeout)
    return names


class FleetCase(Case):
    """``git ls-remote`` and a mirror clone of each of N distinct small repositories."""

    name = "fleet"

    def __init__(self, bench: Bench, names: list[str], template: Path) -> None:
        super().__init__(bench, names[0], template)
        self.names = names

    def prepare(self, side: Side, run: int) -> dict[str, Any]:
        return {"dest": self.bench.scratch_path(f"{side.label}-fleet-{run}"), "failed": []}

    def op(self, side: Side, state: dict[str, Any]) -> None:
        state["dest"].mkdir(parents=True, exist_ok=True)
        for i, name in enumerate(self.names):
            dest = state["dest"] / f"{i}.git"
            try:
                run_git(["ls-remote", side.url(name)], timeout=self.timeout)
                clone_mirror(side.url(name), dest, protocol=2, timeout=self.timeout)
                self._check_refs(dest)
            except (GitError, AssertionError, subprocess.SubprocessError) as e:
                state["failed"].append(f"{name}: {e}")
            finally:
                shutil.rmtree(dest, ignore_errors=True)
        if state["failed"]:
            raise GitError(f"{len(state['failed'])} of {len(self.names)} failed: "
                           f"{state['failed'][0]}")

    def verify(self, side: Side, state: dict[str, Any], check: bool) -> str:
        return "skipped"  # every clone's refs were checked in op()

    def cleanup(self, state: dict[str, Any]) -> None:
        shutil.rmtree(state["dest"], ignore_errors=True)


# ---------------------------------------------------------------------------
# the new commit for fetch-1

TEXT_SUFFIXES = (".py", ".c", ".h", ".txt", ".rst", ".md", ".sh", ".pl", ".perl", ".tcl",
                 ".adoc", ".cfg", ".toml", ".yml", ".yaml", ".el", ".mak")
PUSH_SEED = 20240601


def _edit_text(data: bytes, rng: Random) -> bytes:
    """Change one line, insert two, delete one: a small, realistic edit."""
    lines = data.split(b"\n")
    n = len(lines)
    i = rng.randrange(n // 4, max(n // 4 + 1, 3 * n // 4))
    indent = re.match(rb"[ \t]*", lines[i]).group(0)  # type: ignore[union-attr]
    lines[i] = lines[i].rstrip() + b"  "
    j = rng.randrange(1, n)
    lines[j:j] = [indent + b"bench_value = %d" % rng.randrange(10**6),
                  indent + b"bench_limit = bench_value * 2"]
    k = rng.randrange(1, len(lines) - 1)
    del lines[k]
    return b"\n".join(lines)


def push_new_commit(served: Path, work: Path, timeout: float) -> tuple[str, str, list[str]]:
    """Commit edits of three text files in a temporary work clone of *served* and
    push the commit to its default branch.  Deterministic: the same commit id
    for every variant of a repository.  Returns (commit, branch ref, paths)."""
    ref = git_out(["--git-dir", str(served), "symbolic-ref", "HEAD"])
    branch = ref.removeprefix("refs/heads/")
    shutil.rmtree(work, ignore_errors=True)
    run_git(["clone", "--quiet", "--branch", branch, str(served), str(work)], timeout=timeout)
    try:
        paths = run_git(["-C", str(work), "ls-files", "-z"]).stdout.decode(
            errors="surrogateescape").split("\0")
        candidates = []
        for p in sorted(paths):
            if not p.endswith(TEXT_SUFFIXES):
                continue
            f = work / p
            if f.is_symlink() or not f.is_file() or not 2048 <= f.stat().st_size <= 200_000:
                continue
            if b"\0" in f.read_bytes():
                continue
            candidates.append(p)
        if len(candidates) < 3:
            raise RuntimeError(f"{served.name}: fewer than 3 text files to edit")
        rng = Random(PUSH_SEED)
        picked = rng.sample(candidates, 3)
        for p in picked:
            f = work / p
            f.write_bytes(_edit_text(f.read_bytes(), rng))
        parent_time = int(git_out(["-C", str(work), "log", "-1", "--format=%ct"]))
        date = f"{parent_time + 3600} +0000"
        env = client_env({"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date,
                          "GIT_AUTHOR_NAME": "Bench Pusher", "GIT_COMMITTER_NAME": "Bench Pusher",
                          "GIT_AUTHOR_EMAIL": "bench@example.org",
                          "GIT_COMMITTER_EMAIL": "bench@example.org"})
        run_git(["-C", str(work), "commit", "-q", "-a", "-m",
                 "bench: tweak " + ", ".join(picked)], env=env)
        new = git_out(["-C", str(work), "rev-parse", "HEAD"])
        run_git(["-C", str(work), "push", "--quiet", "origin", f"HEAD:{ref}"], timeout=timeout)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if git_out(["--git-dir", str(served), "rev-parse", ref]) != new:
        raise RuntimeError(f"push of {new} to {served}:{ref} did not update the ref")
    if not (served / "objects" / new[:2] / new[2:]).is_file():
        raise RuntimeError(f"pushed commit {new} did not arrive as a loose object")
    return new, ref, picked


# ---------------------------------------------------------------------------
# the benchmark


@dataclass
class Row:
    """Medians of one (repo, variant, case)."""

    repo: str
    variant: str
    case: str
    a_runs: int
    b_runs: int
    a_cpu_ms: float | None
    b_cpu_ms: float | None
    a_wall_s: float | None
    b_wall_s: float | None
    a_bytes: float | None
    b_bytes: float | None
    b_cold_cpu_ms: float | None
    b_cold_wall_s: float | None
    b_cold_bytes: int | None
    b_peak_rss_mb: float | None
    a_peak_rss_mb: float | None
    ratios: dict[str, float | None] = field(default_factory=dict)
    cold_ratios: dict[str, float | None] = field(default_factory=dict)
    a_objects: float | None = None  # objects sent (median), where the case counts them
    b_objects: float | None = None
    b_cold_objects: float | None = None


def _ratio(b: float | None, a: float | None) -> float | None:
    return None if a is None or b is None or a == 0 else b / a


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


class Bench:
    """Runs every (variant, case) of one root set against A and B."""

    def __init__(self, rs: RootSet, variants: list[str], cases: list[str], rounds: int,
                 tmp: Path, samples: list[Sample], sides: dict[str, Side],
                 fleet_repos: int = 0, cold_runs: int = 1) -> None:
        self.rs = rs
        self.variants = variants
        self.cases = cases
        self.rounds = rounds
        self.cold_runs = cold_runs
        self.tmp = tmp
        self.root = tmp / "root"
        self.scratch = tmp / "scratch"
        self.samples = samples
        self.sides = sides
        self.pushes: dict[str, dict[str, Any]] = {}
        self.cold_store = "empty"  # --cold-store
        self.b_cache: Path | None = None  # B's --pack-cache-dir, where its closure store is
        self._template: Path | None = None
        self.fleet_repos = fleet_repos

    def scratch_path(self, name: str) -> Path:
        p = self.scratch / name
        shutil.rmtree(p, ignore_errors=True)
        return p

    # -- driving ------------------------------------------------------------
    def run(self) -> None:
        for variant in self.variants:
            repo = f"{self.rs.name}-{variant}.git"
            served = self.root / repo
            print(f"\n== {self.rs.name} {variant}: {repo} ==", flush=True)
            for case_name in self.cases:
                if case_name in CLONE_CASES:
                    case: Case = (ParallelCloneCase(self, repo, served) if case_name == "clone-x8"
                                  else CloneCase(self, repo, served, int(case_name[-1])))
                    self.run_case(variant, case)
                elif case_name in STORM_CASES:
                    self.run_case(variant, StormCase(self, repo, served, case_name))
                elif case_name in LAZY_CASES:
                    from bench.lazycases import make_case  # it imports this module

                    self.run_case(variant, make_case(case_name, self, repo, served))
            if "fetch-1" in self.cases:
                self.run_case(variant, self.fetch_case(repo, served))
        if "fleet" in self.cases:
            t0 = time.monotonic()
            names = build_fleet(self.root, self.fleet_repos, self.rs.timeout)
            print(f"\n== fleet: {len(names)} repositories (built in "
                  f"{time.monotonic() - t0:.1f}s) ==", flush=True)
            self.run_case("fleet", FleetCase(self, names, self.root / names[0]))

    def fetch_case(self, repo: str, served: Path) -> FetchOneCase:
        """Base clone template (made before the first push), then push one commit."""
        if self._template is None:
            t0 = time.monotonic()
            self._template = self.tmp / f"template-{self.rs.name}.git"
            run_git(["clone", "--mirror", "--quiet", f"file://{served}", str(self._template)],
                    timeout=self.rs.timeout)
            print(f"  base clone for fetch-1 (file://, before the push) made in "
                  f"{time.monotonic() - t0:.1f}s", flush=True)
        loose_before = len(list((served / "objects").glob("[0-9a-f][0-9a-f]/*")))
        new, ref, paths = push_new_commit(served, self.scratch_path("push-work"),
                                          self.rs.timeout)
        loose = len(list((served / "objects").glob("[0-9a-f][0-9a-f]/*"))) - loose_before
        self.pushes[repo] = {"commit": new, "ref": ref, "paths": paths, "loose_objects": loose}
        print(f"  pushed {new[:12]} to {ref} ({loose} new loose objects; edited "
              f"{', '.join(paths)})", flush=True)
        return FetchOneCase(self, repo, served, self._template, new, ref)

    @staticmethod
    def pushes_before(case: Case) -> bool:
        """``--cold-store pushed`` pushes before a cold clone of one repository only: fetch-1
        checks for its own pushed commit, and the fleet's repositories are too small to edit."""
        return not isinstance(case, (FetchOneCase, FleetCase))

    def run_case(self, variant: str, case: Case) -> None:
        print(f"  -- {case.name}: {self.cold_runs} B cold run(s), each on a restarted "
              f"gitspout, then {self.rounds} round(s) A B", flush=True)
        a, b = self.sides["A"], self.sides["B"]
        # cold runs are numbered 0, -1, -2...: a case's state (a copy to fetch into) is named
        # by its run
        plan: list[tuple[Side, int, bool]] = [(b, -k, True) for k in range(self.cold_runs)]
        prime = self.cold_store in ("warm", "pushed")
        if prime:  # an untimed first process leaves its closures for the cold runs
            plan.insert(0, (b, -self.cold_runs, True))
        for r in range(1, self.rounds + 1):
            plan += [(a, r, False), (b, r, False)]
        states: list[Any] = []
        try:
            for side, run, _ in plan:  # untimed preparation (e.g. cp -a of the base clone)
                states.append(case.prepare(side, run))
            if isinstance(case, FetchOneCase):
                os.sync()  # do not let writeback of the copies land in a measurement
            first = True
            for (side, run, cold), state in zip(plan, states, strict=True):
                # first run of each server; every cold run read from a warm closure store
                check = first or (side is a and run == 1) or (cold and self.cold_store != "empty")
                if cold:
                    if self.cold_store == "empty" and self.b_cache is not None:
                        shutil.rmtree(self.b_cache / "gitspout-closures", ignore_errors=True)
                    if self.cold_store == "pushed" and not prime and self.pushes_before(case):
                        new, ref, _ = push_new_commit(case.served, self.scratch_path("push-work"),
                                                      self.rs.timeout)
                        print(f"  pushed {new[:12]} to {ref} before the restart", flush=True)
                        case.expected_refs = list_refs(case.served)
                        os.sync()  # the push's writeback outside the measurement
                    b.restart()
                first = False
                side.ensure_alive()
                sample = self.measure(side, variant, case, run, cold, state, check)
                if prime:
                    prime = False
                    print(f"  (untimed run for the closure store: {sample.line().strip()})",
                          flush=True)
                    case.cleanup(state)
                    continue
                self.samples.append(sample)
                print(sample.line(), flush=True)
                case.cleanup(state)
        finally:
            for state in states:
                case.cleanup(state)

    def measure(self, side: Side, variant: str, case: Case, run: int, cold: bool,
                state: Any, check: bool) -> Sample:
        """Run ``case.op`` once against *side* and record what it cost."""
        srv = side.srv
        proxy = side.proxy
        assert proxy is not None
        s = Sample(self.rs.name, variant, case.name, side.label, side.impl, run, cold,
                   loadavg_1m=os.getloadavg()[0])
        baseline = set(srv.pids())
        if isinstance(case, FleetCase):
            s.fds_before, s.rss_before_bytes = _server_fds_rss(srv)
        cache0 = scrape_pack_cache(side)
        d0, u0, c0 = proxy.snapshot()
        srv.reset_counters()
        errors = (GitError, AssertionError, subprocess.SubprocessError, OSError)
        with PeakRssWatcher(srv) as watch:
            t0 = time.monotonic()
            try:
                case.op(side, state)
            except errors as e:  # still record what the failed run cost
                s.error = f"{type(e).__name__}: {e}"
            finally:
                s.wall_s = time.monotonic() - t0
                s.settled = _settle(srv, baseline)
                s.cpu_ns = srv.cpu_ns()
                s.cgroup_mem_max_bytes = srv.memory_max_bytes()
        if isinstance(case, FleetCase):
            s.fds_after, s.rss_after_bytes = _server_fds_rss(srv)
            s.fleet_failures = len(state["failed"])
        d1, u1, c1 = proxy.snapshot()
        s.bytes_down, s.bytes_up, s.connections = d1 - d0, u1 - u0, c1 - c0
        cache1 = scrape_pack_cache(side)
        s.pack_cache = {k: v - cache0.get(k, 0.0) for k, v in cache1.items()}
        if side.label == "B":  # VmHWM since start; the watcher's last sample if it died
            s.peak_rss_bytes = peak_rss_bytes(side.main_pid()) or watch.peak or None
            s.peak_rss_process = "gitspout"
        else:
            s.peak_rss_bytes, s.peak_rss_process = watch.peak or None, watch.peak_comm
        died = side.died()
        if died:
            s.error = (s.error or "") + f" [server died during the run: {died}]"
            side.note(f"{side.impl} died during {self.rs.name} {variant} {case.name} "
                      f"{'cold' if cold else f'run {run}'}: {died}")
        if s.error is None:
            try:
                s.fsck = case.verify(side, state, check)
                if hasattr(case, "objects_sent"):  # bench/lazycases.py
                    s.objects = case.objects_sent(state)
            except errors as e:
                s.fsck = "FAILED"
                s.error = f"verification failed: {type(e).__name__}: {e}"
        return s


def _settle(srv: BenchServer, baseline: set[int], timeout: float = 10.0) -> bool:
    """Wait until the processes started for the request (CGI children) are gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if set(srv.pids()) <= baseline:
            return True
        time.sleep(0.01)
    return False


# ---------------------------------------------------------------------------
# report


def summarise(samples: list[Sample]) -> list[Row]:
    """Medians per (repo, variant, case) over the alternating rounds."""
    keys: list[tuple[str, str, str]] = []
    for s in samples:
        if (s.repo, s.variant, s.case) not in keys:
            keys.append((s.repo, s.variant, s.case))
    rows = []
    for key in keys:
        group = [s for s in samples if (s.repo, s.variant, s.case) == key]
        a = [s for s in group if s.server == "A" and s.ok]
        b = [s for s in group if s.server == "B" and not s.cold and s.ok]
        colds = [s for s in group if s.cold and s.ok]
        b_rss = [s.peak_rss_bytes for s in group if s.server == "B" and s.peak_rss_bytes]
        a_rss = [s.peak_rss_bytes for s in a if s.peak_rss_bytes]
        row = Row(
            *key, len(a), len(b),
            _median([s.cpu_ns / 1e6 for s in a]), _median([s.cpu_ns / 1e6 for s in b]),
            _median([s.wall_s for s in a]), _median([s.wall_s for s in b]),
            _median([s.bytes_down for s in a]), _median([s.bytes_down for s in b]),
            _median([s.cpu_ns / 1e6 for s in colds]), _median([s.wall_s for s in colds]),
            _median([s.bytes_down for s in colds]),
            max(b_rss) / MB if b_rss else None, max(a_rss) / MB if a_rss else None)
        row.a_objects = _median([s.objects for s in a if s.objects is not None])
        row.b_objects = _median([s.objects for s in b if s.objects is not None])
        row.b_cold_objects = _median([s.objects for s in colds if s.objects is not None])
        row.ratios = {"cpu": _ratio(row.b_cpu_ms, row.a_cpu_ms),
                      "wall": _ratio(row.b_wall_s, row.a_wall_s),
                      "bytes": _ratio(row.b_bytes, row.a_bytes),
                      "objects": _ratio(row.b_objects, row.a_objects)}
        row.cold_ratios = {"cpu": _ratio(row.b_cold_cpu_ms, row.a_cpu_ms),
                           "wall": _ratio(row.b_cold_wall_s, row.a_wall_s),
                           "bytes": _ratio(row.b_cold_bytes, row.a_bytes),
                           "objects": _ratio(row.b_cold_objects, row.a_objects)}
        rows.append(row)
    return rows


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _table(header: list[str], body: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h)
              for i, h in enumerate(header)]
    def fmt(cells: list[str]) -> str:
        return " | ".join(c.rjust(w) if i else c.ljust(w)
                          for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
    return "\n".join([fmt(header), "-+-".join("-" * w for w in widths),
                      *(fmt(r) for r in body)])


def main_table(rows: list[Row]) -> str:
    """The final table (medians over the rounds; B cold separately)."""
    header = ["repo variant case", "A cpu ms", "B cpu ms", "cpu ratio", "A wall s", "B wall s",
              "wall ratio", "A bytes", "B bytes", "bytes ratio", "B cold cpu ms",
              "B peak RSS MB", "A peak RSS MB"]
    body = [[f"{r.repo} {r.variant} {r.case}", _f(r.a_cpu_ms, ".0f"), _f(r.b_cpu_ms, ".0f"),
             _x(r.ratios["cpu"]), _f(r.a_wall_s, ".2f"), _f(r.b_wall_s, ".2f"),
             _x(r.ratios["wall"]), human_bytes(r.a_bytes), human_bytes(r.b_bytes),
             _x(r.ratios["bytes"]), _f(r.b_cold_cpu_ms, ".0f"), _f(r.b_peak_rss_mb, ".0f"),
             _f(r.a_peak_rss_mb, ".0f")] for r in rows]
    return _table(header, body)


def cold_table(rows: list[Row]) -> str:
    """gitspout's first request after a restart against A's median."""
    header = ["repo variant case", "B cold cpu ms", "cold cpu ratio", "B cold wall s",
              "cold wall ratio", "B cold bytes", "cold bytes ratio"]
    body = [[f"{r.repo} {r.variant} {r.case}", _f(r.b_cold_cpu_ms, ".0f"),
             _x(r.cold_ratios["cpu"]), _f(r.b_cold_wall_s, ".2f"), _x(r.cold_ratios["wall"]),
             human_bytes(r.b_cold_bytes), _x(r.cold_ratios["bytes"])] for r in rows]
    return _table(header, body)


@dataclass
class Target:
    """One goal of the issue and how the run measured up."""

    name: str
    limit: float
    instances: list[tuple[str, float | None, float | None]]   # (label, median, cold)
    unit: str = "x"

    @property
    def verdict(self) -> str:
        return self._verdict([v for _, v, _ in self.instances])

    @property
    def cold_verdict(self) -> str | None:
        colds = [c for _, _, c in self.instances]
        return None if all(c is None for c in colds) else self._verdict(colds)

    def _verdict(self, values: list[float | None]) -> str:
        if not values or any(v is None for v in values):
            return "N/A"
        return "PASS" if all(v <= self.limit for v in values if v is not None) else "MISS"

    def line(self) -> str:
        def fmt(v: float | None) -> str:
            return "-" if v is None else (f"{v:.2f}x" if self.unit == "x" else f"{v:.0f} MB")
        parts = [f"{label} {fmt(v)}" + (f" (cold {fmt(c)})" if c is not None else "")
                 for label, v, c in self.instances]
        lim = f"<={self.limit:.2f}x" if self.unit == "x" else f"<={self.limit:.0f} MB"
        cold = f" [cold: {self.cold_verdict}]" if self.cold_verdict else ""
        return (f"{self.verdict:4} {self.name} {lim}{cold}: "
                + ("; ".join(parts) or "not measured"))


def _eight_vs_one(rows: list[Row], what: str) -> list[tuple[str, float | None, float | None]]:
    """B's CPU for 8 identical clones over B's CPU for one (medians; cold over cold)."""
    out = []
    for r in rows:
        if r.case != f"x8-{what}":
            continue
        one = next((o for o in rows if (o.repo, o.variant, o.case) ==
                    (r.repo, r.variant, f"clone-{what}")), None)
        if one is not None:
            out.append((f"{r.repo} {r.variant}", _ratio(r.b_cpu_ms, one.b_cpu_ms),
                        _ratio(r.b_cold_cpu_ms, one.b_cold_cpu_ms)))
    return out


def targets(rows: list[Row], root_sets: list[str]) -> list[Target]:
    """The issue's goals, evaluated on the medians (cold ratios shown alongside)."""
    def pick(variant: str | None, cases: tuple[str, ...], metric: str
             ) -> list[tuple[str, float | None, float | None]]:
        return [(f"{r.repo}{'' if variant else ' ' + r.variant} {r.case}", r.ratios[metric],
                 r.cold_ratios[metric])
                for r in rows if (variant is None or r.variant == variant) and r.case in cases]
    full = ("clone-v2", "clone-v0")
    out = [
        Target("full clone bitmapped (gc) CPU", 1.0, pick("gc", full, "cpu")),
        Target("full clone bitmapped (gc) wall", 1.05, pick("gc", full, "wall")),
        Target("full clone bitmapped (gc) bytes", 1.05, pick("gc", full, "bytes")),
        Target("full clone unmaintained CPU", 2.0, pick("unmaintained", full, "cpu")),
        Target("fetch-1 wall", 1.1, pick(None, ("fetch-1",), "wall")),
        Target("fetch-1 bytes", 1.3, pick(None, ("fetch-1",), "bytes")),
        Target("clone-x8 wall", 1.0, pick(None, ("clone-x8",), "wall")),
        Target("blobless clone CPU", 1.0, pick(None, ("clone-blobless",), "cpu")),
        Target("blobless clone wall", 1.0, pick(None, ("clone-blobless",), "wall")),
        Target("8 identical clones (x8-*) wall", 1.0,
               pick(None, tuple(c for c in STORM_CASES if c.startswith("x8-")), "wall")),
        Target("8 identical blobless clones: gitspout CPU / its CPU for one", 1.5,
               _eight_vs_one(rows, "blobless")),
        Target("one lazy blob fetch wall", 1.0, pick(None, ("lazy-blob",), "wall")),
        Target("blobless clone plus checkout wall", 1.0,
               pick(None, ("blobless-checkout",), "wall")),
        Target("deepen 1->20 objects sent", 1.0, pick(None, ("deepen-1-20",), "objects")),
    ]
    if "git" in root_sets:
        rss: list[tuple[str, float | None, float | None]] = [
            (f"git {r.variant} {r.case}", r.b_peak_rss_mb, None) for r in rows if r.repo == "git"]
        out.append(Target("gitspout peak RSS serving git/git", 150.0, rss, unit="MB"))
    return [t for t in out if t.instances or t.unit == "MB"]


# ---------------------------------------------------------------------------
# main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.run",
        description="gitspout (B) vs git-http-backend behind nginx+fcgiwrap (A): server CPU, "
                    "wall time, bytes and peak RSS, alternating A B, medians.")
    ap.add_argument("--root-set", choices=["synthetic", "dulwich", "git", "quick", "all"],
                    action="append", default=None,
                    help="fixture family (repeatable; default synthetic + dulwich; 'all' = "
                         "synthetic, dulwich and git/git, which is slow)")
    ap.add_argument("--variants", default=",".join(ALL_VARIANTS))
    ap.add_argument("--cases", default=None,
                    help=f"comma-separated subset of {','.join(ALL_CASES)} (default "
                         f"{','.join(DEFAULT_CASES)})")
    ap.add_argument("--fleet-repos", type=int, default=200, metavar="N",
                    help="repositories of the fleet case (default %(default)s)")
    ap.add_argument("--fleet-budgets", choices=["default", "tiny"], default="default",
                    help="gitspout's budgets for the whole run: its defaults, or "
                         "--max-open-packs 8 --cache-memory 8MiB")
    ap.add_argument("--rounds", type=int, default=None, help="A B rounds per case (default 3)")
    ap.add_argument("--cold-runs", type=int, default=1,
                    help="B cold runs per case, each on a freshly restarted gitspout; the "
                         "cold figures are their median (default 1)")
    ap.add_argument("--cold-store", choices=["empty", "warm", "pushed"], default="empty",
                    help="B's closure store (--pack-cache-dir of the run's own) at each cold "
                         "restart: 'empty' (truly cold) or 'warm': left by an untimed run of "
                         "the same case in a previous gitspout process (the first clone "
                         "after a restart on the same disk); 'pushed': as warm, but a commit "
                         "is pushed to the default branch before each cold run (the first "
                         "clone after a push and a restart)")
    ap.add_argument("--b-arg", action="append", default=[], metavar="ARG",
                    help="an extra argument for gitspout serve (repeatable), e.g. "
                         "--b-arg=--pack-cache-ttl=0.001 (coalescing only, no hits across "
                         "rounds) or --b-arg=--pack-cache-size=0 (no pack cache)")
    ap.add_argument("--quick", action="store_true",
                    help="CI mode: small synthetic repo, 1 round, clone-v2 and fetch-1")
    ap.add_argument("--quick-dir", type=Path, default=QUICK_DIR,
                    help="where --quick builds/reuses its repositories (default %(default)s)")
    ap.add_argument("--json", type=Path, metavar="OUT", help="write samples and medians here")
    ap.add_argument("--gitspout-rev", metavar="REV", default=None,
                    help="serve with server/ and protocol/ of this git revision (default: a "
                         "copy of the working tree taken at the start)")
    ap.add_argument("--report", type=Path, metavar="JSON", default=None,
                    help="measure nothing: print the tables of an earlier run's --json file")
    ap.add_argument("--tmp-dir", type=Path, default=None,
                    help="parent of the run's temporary directory (default $TMPDIR)")
    ap.add_argument("--keep-tmp", action="store_true",
                    help="keep the temporary directory (served copies) and server logs")
    args = ap.parse_args(argv)
    if args.quick:
        args.root_set = args.root_set or ["quick"]
        args.rounds = args.rounds or 1
        args.cases = args.cases or "clone-v2,fetch-1"
    sets: list[str] = []
    for s in args.root_set or ["synthetic", "dulwich"]:
        for name in (["synthetic", "dulwich", "git"] if s == "all" else [s]):
            if name not in sets:
                sets.append(name)
    args.root_sets = sets
    args.rounds = args.rounds or 3
    if args.cold_runs < 1:
        ap.error("--cold-runs must be 1 or more")
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    cases = [c.strip() for c in (args.cases or ",".join(DEFAULT_CASES)).split(",")
             if c.strip()]
    bad = [c for c in cases if c not in ALL_CASES]
    if bad or not cases:
        ap.error(f"unknown case(s) {bad}; choose from {', '.join(ALL_CASES)}")
    args.case_list = [c for c in ALL_CASES if c in cases]  # clones before the fetch-1 push
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in ALL_VARIANTS]
    if bad or not variants:
        ap.error(f"unknown variant(s) {bad}; choose from {', '.join(ALL_VARIANTS)}")
    args.variant_list = variants
    return args


def _resolve_root_set(name: str, quick_dir: Path) -> RootSet:
    if name == "quick":
        ensure_quick_repo(quick_dir.resolve())
        return quick_root_set(quick_dir.resolve())
    return ROOT_SETS[name]


def _copy_root(rs: RootSet, variants: list[str], root: Path) -> None:
    """``cp -a`` the pristine variants into the served root of this run."""
    root.mkdir(parents=True, exist_ok=True)
    for v in variants:
        src = rs.source(v)
        if not (src / "HEAD").is_file():
            raise SystemExit(f"fixture {src} missing; build it with: {rs.hint}")
        t0 = time.monotonic()
        subprocess.run(["cp", "-a", str(src), str(root / src.name)], check=True, timeout=1800)
        # C git serves partial clones only when allowed; gitspout allows them by default.
        run_git(["--git-dir", str(root / src.name), "config", "uploadpack.allowFilter", "true"])
        print(f"  copied {src} -> served root ({time.monotonic() - t0:.1f}s)", flush=True)


PROBE_REPO = "bench-probe.git"


def _make_probe_repo(root: Path) -> None:
    """A one-commit repository for the servers' readiness probes, so that probing
    never touches (and warms gitspout's caches for) a measured repository."""
    probe = root / PROBE_REPO
    env = client_env({"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.org",
                      "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.org",
                      "GIT_AUTHOR_DATE": "1262304000 +0000",
                      "GIT_COMMITTER_DATE": "1262304000 +0000"})
    run_git(["init", "-q", "--bare", "--initial-branch=main", str(probe)])
    tree = git_out(["--git-dir", str(probe), "mktree"], input=b"")
    commit = git_out(["--git-dir", str(probe), "commit-tree", tree, "-m", "probe"], env=env)
    run_git(["--git-dir", str(probe), "update-ref", "refs/heads/main", commit])


def _meta(args: argparse.Namespace) -> dict[str, Any]:
    def out(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                                  cwd=REPO_TOP).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    return {
        "argv": sys.argv, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "root_sets": args.root_sets, "variants": args.variant_list, "cases": args.case_list,
        "rounds": args.rounds, "cold_runs": args.cold_runs, "quick": args.quick,
        "cold_store": args.cold_store,
        "gitspout_commit": out(["git", "rev-parse", "HEAD"]),
        "gitspout_dirty": bool(out(["git", "status", "--porcelain", "--", "server",
                                    "protocol"])),
        "git_version": out(["git", "--version"]), "nginx": out(["nginx", "-v"]) or "",
        "cpus": os.cpu_count(), "host": platform.node(), "loadavg_start": os.getloadavg(),
        "python": sys.version.split()[0],
        "notes": {
            "cpu": "cgroup cpuacct.usage delta over the client operation, all server processes",
            "bytes": "server->client bytes counted by a TCP proxy (HTTP framing included)",
            "peak_rss": "B: VmHWM of the gitspout process since its restart before the case; "
                        "A: largest VmHWM of any of its processes sampled every 20 ms",
            "cold": "B run 0 of each case: first request after gitspout restarted",
            "medians": "over rounds 1..N only; B's rounds are warm (after the cold run)",
        },
    }


@contextlib.contextmanager
def _sigint_as_exit() -> Iterator[None]:
    """Make sure Ctrl-C and SIGTERM unwind through every cleanup."""
    exit_on_sigterm()
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


SERVER_PACKAGES = ("server", "protocol")


def snapshot_gitspout(rev: str | None, dest: Path, gitspout_bin: Path) -> str:
    """Freeze the gitspout code this run serves with: a copy of the working tree's
    ``server/`` and ``protocol/`` (or of revision *rev*) in *dest*, used through
    ``PYTHONPATH`` so edits made to the checkout while the benchmark runs (gitspout
    is restarted for every case) cannot mix versions.  Returns a description."""
    dest.mkdir(parents=True)
    if rev is None:
        for pkg in SERVER_PACKAGES:
            shutil.copytree(REPO_TOP / pkg, dest / pkg,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        head = git_out(["-C", str(REPO_TOP), "rev-parse", "--short=12", "HEAD"])
        dirty = git_out(["-C", str(REPO_TOP), "status", "--porcelain", "--",
                         *SERVER_PACKAGES])
        what = f"working tree at {head}" + (" with uncommitted changes" if dirty else "")
    else:
        commit = git_out(["-C", str(REPO_TOP), "rev-parse", "--verify", f"{rev}^{{commit}}"])
        tar = run_git(["-C", str(REPO_TOP), "archive", "--format=tar", commit,
                       *SERVER_PACKAGES]).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True, timeout=120)
        what = f"revision {rev} = {commit[:12]}"
    link_import_root(dest, SERVER_PACKAGES)
    python = gitspout_bin.parent / "python"
    probe = subprocess.run(
        [str(python), "-c", "import gitspout.server.app.cli as c, gitspout.protocol; print(c.__file__)"],
        env={**os.environ, "PYTHONPATH": str(dest)}, capture_output=True, text=True,
        timeout=60, cwd=dest)
    if probe.returncode != 0 or not probe.stdout.strip().startswith(str(dest)):
        raise ServerError(f"gitspout snapshot in {dest} is not importable or not used: "
                          f"{probe.stdout}{probe.stderr[-2000:]}")
    return what


def _make_sides(root: Path, gitspout_bin: Path, snapshot: Path,
                keep_logs: bool, extra_args: tuple[str, ...] = ()) -> dict[str, Side]:
    """A (git-http-backend) and B (gitspout) serving *root*, probed on PROBE_REPO."""
    def a() -> BenchServer:
        return GitHttpBackend(root, name="bench-run-A", probe_repo=PROBE_REPO)

    def b() -> BenchServer:
        return Gitspout(root, name="bench-run-B", probe_repo=PROBE_REPO,
                        gitspout_bin=gitspout_bin, env={"PYTHONPATH": str(snapshot)},
                        extra_args=extra_args)

    return {"A": Side("A", "git-http-backend", a, keep_logs),
            "B": Side("B", "gitspout", b, keep_logs)}


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; returns the exit status."""
    if os.geteuid() != 0:
        print("bench.run needs root (cgroups)", file=sys.stderr)
        return 2
    for tool in ("git", "nginx", "fcgiwrap"):
        if not shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"):
            print(f"{tool} not found: apt-get install -y git nginx fcgiwrap", file=sys.stderr)
            return 2
    gitspout_bin = find_gitspout_bin()
    meta = _meta(args)
    meta["gitspout_bin"] = str(gitspout_bin)
    samples: list[Sample] = []
    pushes: dict[str, Any] = {}
    problems: dict[str, dict[str, int]] = {}
    t_start = time.monotonic()
    interrupted = False
    tmp = Path(tempfile.mkdtemp(prefix="gitspout-bench-run-", dir=args.tmp_dir))
    print(f"bench.run: root sets {', '.join(args.root_sets)}; variants "
          f"{', '.join(args.variant_list)}; cases {', '.join(args.case_list)}; "
          f"{args.rounds} round(s); tmp {tmp}", flush=True)
    try:
        with _sigint_as_exit():
            snapshot = tmp / "gitspout-src"
            meta["gitspout_code"] = snapshot_gitspout(args.gitspout_rev, snapshot, gitspout_bin)
            print(f"gitspout code: {meta['gitspout_code']} (frozen copy for this run)",
                  flush=True)
            for name in args.root_sets:
                rs = _resolve_root_set(name, args.quick_dir)
                rtmp = tmp / rs.name
                (rtmp / "scratch").mkdir(parents=True)
                _copy_root(rs, args.variant_list, rtmp / "root")
                root = rtmp / "root"
                _make_probe_repo(root)
                b_cache = rtmp / "b-cache"  # survives B's restarts: its closure store
                b_cache.mkdir()
                sides = _make_sides(root, gitspout_bin, snapshot, args.keep_tmp,
                                    (TINY_BUDGETS if args.fleet_budgets == "tiny" else ())
                                    + ("--pack-cache-dir", str(b_cache)) + tuple(args.b_arg))
                try:
                    for side in sides.values():
                        side.start()
                    bench = Bench(rs, args.variant_list, args.case_list, args.rounds, rtmp,
                                  samples, sides, args.fleet_repos, args.cold_runs)
                    bench.cold_store = args.cold_store
                    bench.b_cache = b_cache
                    bench.run()
                    pushes.update(bench.pushes)
                finally:
                    for side in sides.values():
                        side.close()
                        if side.log_problems:
                            problems.setdefault(f"{rs.name} {side.label} {side.impl}", {}) \
                                .update(side.log_problems)
                    if not args.keep_tmp:  # free the disk before the next root set
                        shutil.rmtree(rtmp / "root", ignore_errors=True)
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted; servers stopped, cgroups removed", file=sys.stderr)
    finally:
        if args.keep_tmp:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    rows = summarise(samples)
    tgts = targets(rows, args.root_sets)
    report(rows, tgts, samples, problems, time.monotonic() - t_start, args)
    if args.json:
        data = {"meta": meta | {"seconds": time.monotonic() - t_start,
                                "interrupted": interrupted, "loadavg_end": os.getloadavg()},
                "pushes": pushes,
                "samples": [asdict(s) for s in samples],
                "medians": [asdict(r) for r in rows],
                "targets": [{"name": t.name, "limit": t.limit, "unit": t.unit,
                             "verdict": t.verdict, "cold_verdict": t.cold_verdict,
                             "instances": [{"what": w, "median": v, "cold": c}
                                           for w, v, c in t.instances]} for t in tgts],
                "log_problems": problems}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=1) + "\n")
        print(f"raw samples and medians written to {args.json}")
    if interrupted:
        return 130
    return 1 if any(not s.ok for s in samples) else 0


def report(rows: list[Row], tgts: list[Target], samples: list[Sample],
           problems: dict[str, dict[str, int]], seconds: float, args: argparse.Namespace
           ) -> None:
    """Print the final tables, target verdicts and anything odd."""
    if not samples:
        print("\nno runs were measured")
        return
    print("\n=== Results: A = git-http-backend (nginx+fcgiwrap), B = gitspout ===")
    print(f"medians over {args.rounds} alternating round(s) A B; B medians are WARM runs "
          "(gitspout's cross-request cache filled by the cold run)")
    print(f"B cold = gitspout's first request after a restart (median of "
          f"{getattr(args, 'cold_runs', 1)} run(s), each after its own restart, not in the "
          "warm median); ratio = B/A")
    print("cpu = server cgroup CPU (all processes); bytes = server->client on the wire; "
          "B peak RSS = VmHWM of the gitspout process; A peak RSS = largest VmHWM of one of "
          "its processes\n")
    print(main_table(rows))
    fleet = [s for s in samples if s.fds_before is not None]
    if fleet:
        print(f"\n--- fleet: ls-remote + clone of each repository once; descriptors and RSS "
              f"of the server's processes before -> after (gitspout budgets: "
              f"{args.fleet_budgets}) ---")
        print(_table(["server run", "cpu ms", "wall s", "fds before", "fds after",
                      "RSS MB before", "RSS MB after", "failed"],
                     [[f"{s.server} {'cold' if s.cold else f'r{s.run}'} ({s.impl})",
                       f"{s.cpu_ns / 1e6:.0f}", f"{s.wall_s:.1f}", str(s.fds_before),
                       str(s.fds_after), f"{(s.rss_before_bytes or 0) / MB:.0f}",
                       f"{(s.rss_after_bytes or 0) / MB:.0f}", str(s.fleet_failures)]
                      for s in fleet]))
    counted = [r for r in rows if r.a_objects is not None or r.b_objects is not None]
    if counted:
        print("\n--- objects sent (medians; from the packs each run received) ---")
        print(_table(["repo variant case", "A objects", "B objects", "objects ratio",
                      "B cold objects"],
                     [[f"{r.repo} {r.variant} {r.case}", _f(r.a_objects, ".0f"),
                       _f(r.b_objects, ".0f"), _x(r.ratios.get("objects")),
                       _f(r.b_cold_objects, ".0f")] for r in counted]))
    store = {"warm": "from a warm closure store (left by an untimed earlier process)",
             "pushed": "a push after the closure store was left by an earlier process"
             }.get(getattr(args, "cold_store", "empty"), "closure store empty")
    print(f"\n--- gitspout cold (first request after restart; {store}) vs. "
          "git-http-backend median ---")
    print(cold_table(rows))
    print("\n--- targets: verdict on the medians (warm for B); [cold: verdict] and (cold x) "
          "use B's cold run against A's median ---")
    for t in tgts:
        print(t.line())
    failed = [s for s in samples if not s.ok]
    if failed:
        print(f"\n--- {len(failed)} failed run(s) (full errors in the JSON) ---")
        for s in failed:
            print(f"{s.repo} {s.variant} {s.case} {s.server} ({s.impl}) "
                  f"{'cold' if s.cold else f'run {s.run}'}: {s.error_summary()}")
    unsettled = [s for s in samples if not s.settled]
    if unsettled:
        print(f"\nnote: {len(unsettled)} run(s) where server processes outlived the client by "
              ">10 s (CPU may be undercounted)")
    if problems:
        print("\n--- problem lines in server logs (count x line) ---")
        for who, lines in problems.items():
            for line, n in sorted(lines.items(), key=lambda kv: -kv[1])[:15]:
                print(f"{who}: {n} x {line}")
    loads = [s.loadavg_1m for s in samples if s.loadavg_1m]
    if loads:
        print(f"\nshared machine, {os.cpu_count()} cores: 1-minute load average at the start of "
              f"the runs {min(loads):.1f}..{max(loads):.1f} (median {statistics.median(loads):.1f})")
    fscks = [s for s in samples if s.fsck not in ("skipped",)]
    print(f"\nfsck: {sum(s.fsck.startswith('clean') for s in fscks)} clean of {len(fscks)} "
          f"checked; {len(samples)} runs, {len(failed)} failed; {seconds:.0f} s total")


def reprint(path: Path) -> int:
    """``--report JSON``: the tables of an earlier run, from its raw samples."""
    data = json.loads(path.read_text())
    samples = [Sample(**s) for s in data["samples"]]
    meta = data["meta"]
    print(f"report of {path}: {' '.join(meta['argv'])} (started {meta['started']}, "
          f"gitspout code: {meta.get('gitspout_code', meta.get('gitspout_commit'))})")
    rows = summarise(samples)
    report(rows, targets(rows, meta["root_sets"]), samples, data.get("log_problems", {}),
           meta.get("seconds", 0.0),
           argparse.Namespace(rounds=meta["rounds"], cold_runs=meta.get("cold_runs", 1),
                              cold_store=meta.get("cold_store", "empty")))
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    args = parse_args(argv)
    if args.report:
        return reprint(args.report)
    try:
        return run(args)
    except ServerError as e:
        print(f"bench.run: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
