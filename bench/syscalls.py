"""Server-side syscall and CPU budgets, side by side with git-http-backend.

    python -m bench.syscalls [--unknown 300,10000] [--servers gitspout,c-git]
                             [--protocols 2,0] [--refs 100000] [--rounds 5] [--force]

Three measurements, each on a warm server (one identical, unmeasured request
or fetch first):

1. **Metadata syscalls of one fetch.**  A client whose ``main`` carries N
   commits the server does not have (N = ``--unknown``) fetches the one new
   commit the server got since the client cloned.  ``strace -f -c`` is
   attached to every process of the server (gitspout's threads; nginx master
   and workers and fcgiwrap with its preforked children for C git, so that
   each CGI process and ``git upload-pack`` is followed through fork/exec)
   for the duration of the fetch.  Counted: ``openat open stat lstat fstat
   newfstatat statx access faccessat faccessat2 getdents64 readlink
   readlinkat`` (glibc implements ``fstat`` as ``newfstatat(fd, "",
   AT_EMPTY_PATH)``).  HTTP requests are counted on the client
   (``GIT_TRACE_CURL``).  Budget: <= 25 per request, flat in N.
2. **Write syscalls** (``write writev sendmsg sendto``, by fd kind from
   ``strace -yy``) of a 100k-ref v0 advertisement (``GET info/refs``) and a
   100k-ref v2 ``ls-refs`` (``POST``), with the response body size and the
   bound ``ceil(bytes / 32 KiB) + 4``.
3. **Server CPU** (the server's cgroup, children included) for those two
   requests, median of ``--rounds`` alternating rounds, without strace.

2 and 3 are measured twice: *warm* (the request repeats the previous one
exactly, so gitspout's cross-request caches answer) and *cold* (a loose ref
of the repository changes between the warm-up and the measured request, on
both servers, so nothing cached can be used).

1 is measured *warm* (the fetch repeats the warm-up) and *right after a push*
(a commit is pushed into base.git between them: loose objects, a loose ref, and
every listing they changed inside the 2 s racy window).  3 also reports the
peak RSS of each server over its rows, and (``--states ...,fresh``) the first
request after gitspout restarted.  4. **Mirror fetch** (``--skip mirror`` to
leave it out): a ``git clone --mirror`` of manyrefs.git, taken once; each round
one ref moves to a new commit and each server serves a ``git fetch`` of it into
a fresh copy of the mirror (haves from every ref); server CPU, median.

The fixture (``bench/work/syscalls/``, reused unless ``--force``):

* ``root/base.git``: a synthetic history of 500 commits over 48 files,
  ``git gc``'ed (one pack, bitmap, commit-graph, packed refs), then one new
  commit pushed into it (loose objects and a loose ``refs/heads/main``, as a
  small push leaves them);
* ``root/manyrefs.git``: ``base.git`` plus 100,000 packed branches;
* ``client-N``: a clone of ``base.git`` taken before that push, with N newer
  local commits on ``main`` (all of them sent as haves before the first
  common commit).

Needs root (cgroups, ``strace`` attach), ``strace``, ``nginx``, ``fcgiwrap``.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.client import client_env, git_out, run_git  # noqa: E402
from bench.peer import BenchServer, find_gitspout_bin, make_server  # noqa: E402
from bench.process import LOOPBACK, exit_on_sigterm, link_import_root  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
REPO_TOP = BENCH_DIR.parent
WORK = BENCH_DIR / "work" / "syscalls"

METADATA_SYSCALLS = ("openat", "open", "stat", "lstat", "fstat", "newfstatat", "statx",
                     "access", "faccessat", "faccessat2", "getdents64", "readlink",
                     "readlinkat")
WRITE_SYSCALLS = ("write", "writev", "sendmsg", "sendto")
SERVER_LABEL = {"gitspout": "gitspout", "c-git": "git-http-backend"}
BASE_DATE = 1_500_000_000
BASE_COMMITS = 500
FILES = 48
CHUNK = 32 * 1024
PER_REQUEST_BUDGET = 25

__all__ = [
    "METADATA_SYSCALLS", "WRITE_SYSCALLS", "Fixture", "Strace", "build_fixture",
    "count_http_requests", "http_request", "ls_refs_body", "median", "settle", "table",
]


# ---------------------------------------------------------------------------
# small helpers shared with bench.nfs


def median(xs: Iterable[float]) -> float:
    """Median of a non-empty sequence."""
    return float(statistics.median(list(xs)))


def table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A plain text table; first column left-aligned, the others right-aligned."""
    widths = [max([len(h), *(len(r[i]) for r in body)]) for i, h in enumerate(header)]

    def fmt(cells: Sequence[str]) -> str:
        return " | ".join(c.rjust(w) if i else c.ljust(w)
                          for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    return "\n".join([fmt(header), "-+-".join("-" * w for w in widths),
                      *(fmt(r) for r in body)])


def settle(srv: BenchServer, baseline: set[int], timeout: float = 10.0) -> bool:
    """Wait until the processes a request started (CGI children) have exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if set(srv.pids()) <= baseline:
            return True
        time.sleep(0.01)
    return False


def pkt(line: str) -> bytes:
    """One pkt-line (gitprotocol-common "pkt-line Format")."""
    data = line.encode()
    return b"%04x" % (len(data) + 4) + data


def ls_refs_all_body() -> bytes:
    """A v2 ``ls-refs`` of every ref, peeled, with symrefs (``git ls-remote`` sends
    no ref-prefix)."""
    return (pkt("command=ls-refs\n") + pkt("agent=git/2.39.5\n")
            + pkt("object-format=sha1\n") + b"0001" + pkt("peel\n") + pkt("symrefs\n")
            + b"0000")


def ls_refs_body() -> bytes:
    """The v2 ``ls-refs`` request ``git clone`` (2.39) sends."""
    return (pkt("command=ls-refs\n") + pkt("agent=git/2.39.5\n")
            + pkt("object-format=sha1\n") + b"0001" + pkt("peel\n") + pkt("symrefs\n")
            + pkt("unborn\n") + pkt("ref-prefix HEAD\n") + pkt("ref-prefix refs/heads/\n")
            + pkt("ref-prefix refs/tags/\n") + b"0000")


@dataclass
class HttpResult:
    """One HTTP exchange as the client saw it (``body`` only when asked to keep it)."""

    status: int
    body_bytes: int
    wall_s: float
    body: bytes | None = None


def http_request(port: int, kind: str, repo: str, timeout: float = 120.0,
                 conn: http.client.HTTPConnection | None = None,
                 keep_body: bool = False) -> HttpResult:
    """*kind* ``advert-v0`` (GET info/refs), ``advert-v2``, ``ls-refs`` (v2 POST, with
    the ref-prefixes of ``git clone``) or ``ls-refs-all`` (v2 POST, no prefix).

    The body is read completely; its length is returned (and the body itself with
    *keep_body*).  With *conn* the request reuses that keep-alive connection."""
    path, method, body = f"/{repo}/info/refs?service=git-upload-pack", "GET", None
    headers = {"User-Agent": "git/2.39.5", "Accept": "*/*", "Pragma": "no-cache"}
    if kind in ("advert-v2", "ls-refs", "ls-refs-all"):
        headers["Git-Protocol"] = "version=2"
    if kind in ("ls-refs", "ls-refs-all"):
        body = ls_refs_body() if kind == "ls-refs" else ls_refs_all_body()
        path, method = f"/{repo}/git-upload-pack", "POST"
        headers["Content-Type"] = "application/x-git-upload-pack-request"
        headers["Accept"] = "application/x-git-upload-pack-result"
    own = conn is None
    c = conn or http.client.HTTPConnection(LOOPBACK, port, timeout=timeout)
    try:
        t0 = time.perf_counter()
        c.request(method, path, body=body, headers=headers)
        resp = c.getresponse()
        n, kept = 0, []
        while chunk := resp.read(1 << 20):
            n += len(chunk)
            if keep_body:
                kept.append(chunk)
        return HttpResult(resp.status, n, time.perf_counter() - t0,
                          b"".join(kept) if keep_body else None)
    finally:
        if own:
            c.close()


_REQUEST_RE = re.compile(r"=> Send header: (GET|POST) ")


def count_http_requests(trace_file: Path) -> int:
    """HTTP requests in a ``GIT_TRACE_CURL`` file."""
    text = trace_file.read_text(errors="replace") if trace_file.exists() else ""
    return len(_REQUEST_RE.findall(text))


SERVER_PACKAGES = ("server", "protocol")


def snapshot_gitspout(rev: str, dest: Path) -> tuple[str, dict[str, str]]:
    """Freeze the gitspout code to measure: ``server/`` and ``protocol/`` of
    revision *rev* (``worktree``: the working tree as it is now) copied to
    *dest*, so edits made to the checkout during a run cannot mix versions.
    Returns a description and the environment that makes the venv's
    ``gitspout`` import the copy."""
    dest.mkdir(parents=True)
    if rev == "worktree":
        for pkg in SERVER_PACKAGES:
            shutil.copytree(REPO_TOP / pkg, dest / pkg,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        head = git_out(["-C", str(REPO_TOP), "rev-parse", "--short=12", "HEAD"])
        dirty = git_out(["-C", str(REPO_TOP), "status", "--porcelain", "--", *SERVER_PACKAGES])
        what = f"working tree at {head}" + (" with uncommitted changes" if dirty else "")
    else:
        commit = git_out(["-C", str(REPO_TOP), "rev-parse", "--verify", f"{rev}^{{commit}}"])
        tar = run_git(["-C", str(REPO_TOP), "archive", "--format=tar", commit,
                       *SERVER_PACKAGES]).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True, timeout=120)
        what = f"revision {rev} = {commit[:12]}"
    link_import_root(dest, SERVER_PACKAGES)
    env = {"PYTHONPATH": str(dest)}
    probe = subprocess.run(
        [str(find_gitspout_bin().parent / "python"), "-c",
         "import gitspout.server.app.cli as c; print(c.__file__)"],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=60, cwd=dest)
    if not probe.stdout.strip().startswith(str(dest)):
        raise RuntimeError(f"gitspout snapshot in {dest} is not the code imported: "
                           f"{probe.stdout}{probe.stderr[-2000:]}")
    return what, env


# ---------------------------------------------------------------------------
# strace


class StraceError(RuntimeError):
    """strace could not attach or did not produce a summary."""


class Strace:
    """``strace -f -c`` attached to *pids* (all their threads, and every child
    forked while attached) until :meth:`stop`; counts per syscall.

    ``start`` returns once every thread of every pid is traced, so nothing
    the caller does afterwards escapes the count.  ``stop`` sends SIGINT
    (strace detaches and writes its summary) and falls back to SIGKILL, which
    also detaches (the kernel releases the tracees)."""

    def __init__(self, pids: Iterable[int], syscalls: Sequence[str], workdir: Path,
                 *, detail: bool = False) -> None:
        self.pids = sorted(set(pids))
        self.syscalls = tuple(syscalls)
        self.detail = detail
        self.out = workdir / f"strace-{uuid.uuid4().hex[:8]}.txt"
        self.log = self.out.with_suffix(".log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.counts: dict[str, int] = {}
        #: with *detail*: ``{(syscall, fd kind): calls}``, fd kind from ``-yy``
        #: (``tcp``, ``unix``, ``pipe``, ``eventfd``, ``file``, ...)
        self.by_fd: dict[tuple[str, str], int] = {}

    def start(self, timeout: float = 20.0) -> Strace:
        if shutil.which("strace") is None:
            raise StraceError("strace not found (apt-get install -y strace)")
        mode = (["-qq", "-yy", "-s", "0", "-e", "signal=none"] if self.detail
                else ["-c", "-U", "name,calls,errors"])
        argv = ["strace", "-f", *mode, "-o", str(self.out),
                "-e", "trace=" + ",".join(self.syscalls)]
        for p in self.pids:
            argv += ["-p", str(p)]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log)
        deadline = time.monotonic() + timeout
        while not self._all_traced():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise StraceError(f"strace did not attach to {self.pids}: "
                                  f"{self.log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.01)
        return self

    def _all_traced(self) -> bool:
        assert self.proc is not None
        for pid in self.pids:
            for tid in _threads(pid):
                tracer = _status_field(f"/proc/{pid}/task/{tid}/status", "TracerPid")
                if tracer is not None and tracer != self.proc.pid:
                    return False
        return True

    def stop(self) -> dict[str, int]:
        """Detach, parse and return ``{syscall: calls}`` (only nonzero entries)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return self.counts
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            raise StraceError("strace ignored SIGINT (killed)") from None
        text = self.out.read_text(errors="replace") if self.out.exists() else ""
        if self.detail:
            self.by_fd = parse_strace_detail(text)
            self.counts = {}
            for (name, _kind), n in self.by_fd.items():
                self.counts[name] = self.counts.get(name, 0) + n
        else:
            self.counts = parse_strace_summary(text)
        return self.counts

    def __enter__(self) -> Strace:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _threads(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return []


def _status_field(path: str, name: str) -> int | None:
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(name + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def parse_strace_summary(text: str) -> dict[str, int]:
    """``strace -c -U name,calls,errors`` output -> ``{syscall: calls}``."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit() and parts[0] not in ("total", "syscall"):
            counts[parts[0]] = counts.get(parts[0], 0) + int(parts[1])
    return counts


_CALL_RE = re.compile(r"^\d+\s+(\w+)\((?:(\d+)<([^>]*)>)?")


def fd_kind(annotation: str) -> str:
    """Classify an ``strace -yy`` fd annotation."""
    if annotation.startswith(("TCP", "TCPv6")):
        return "tcp"
    if annotation.startswith("UNIX"):
        return "unix"
    for prefix, kind in (("pipe:", "pipe"), ("anon_inode:[eventfd]", "eventfd"),
                         ("/", "file")):
        if annotation.startswith(prefix):
            return kind
    return annotation.split(":", 1)[0] or "?"


def parse_strace_detail(text: str) -> dict[tuple[str, str], int]:
    """``strace -f -yy -o`` lines -> ``{(syscall, fd kind): calls}``; a call
    split by another thread counts once (its ``<... resumed>`` line is skipped)."""
    counts: dict[tuple[str, str], int] = {}
    for line in text.splitlines():
        m = _CALL_RE.match(line)
        if m:
            key = (m.group(1), fd_kind(m.group(3) or ""))
            counts[key] = counts.get(key, 0) + 1
    return counts


# ---------------------------------------------------------------------------
# fixture


@dataclass
class Fixture:
    """The served root and the client templates (see the module docstring)."""

    work: Path
    unknowns: list[int]
    repo: str = "base.git"
    manyrefs: str = "manyrefs.git"
    refs: int = 100_000

    @property
    def root(self) -> Path:
        return self.work / "root"

    def client(self, n: int) -> Path:
        return self.work / f"client-{n}"

    @property
    def new_tip(self) -> str:
        return git_out(["--git-dir", str(self.root / self.repo), "rev-parse", "main"])


def history_stream(commits: int, start: int, parent: str | None, tag: str,
                   ref: str = "refs/heads/main") -> bytes:
    """A ``git fast-import`` stream of *commits* linear commits on *ref*; each
    edits two of FILES files in 4 directories; dates start at *start*."""
    out: list[bytes] = []
    for i in range(commits):
        when = start + i * 60
        msg = f"{tag} commit {i}\n".encode()
        out.append(f"commit {ref}\nmark :{i + 1}\n".encode())
        out.append(f"committer Bench <bench@example.org> {when} +0000\n".encode())
        out.append(b"data %d\n%s\n" % (len(msg), msg))
        if i == 0 and parent:
            out.append(f"from {parent}\n".encode())
        for f in (i % FILES, (i * 7 + 3) % FILES):
            body = "".join(f"{tag} line {j} of file {f} at commit {i}\n"
                           for j in range(20 + f)).encode()
            out.append(f"M 100644 inline dir{f % 4}/file{f}.txt\n".encode())
            out.append(b"data %d\n%s\n" % (len(body), body))
    return b"".join(out)


def _fast_import(git_dir: Path, stream: bytes, env: dict[str, str] | None = None) -> None:
    run_git(["--git-dir", str(git_dir), "fast-import", "--quiet"], input=stream, timeout=600,
            env=env)


def _write_many_refs(repo: Path, count: int) -> None:
    """Add *count* packed branches ``refs/heads/many/bNNNNNN`` (commits of main)."""
    run_git(["--git-dir", str(repo), "pack-refs", "--all"])
    commits = git_out(["--git-dir", str(repo), "rev-list", "main"]).split()
    packed = repo / "packed-refs"
    entries: list[tuple[str, list[str]]] = []
    for line in packed.read_text().splitlines(keepends=True)[1:]:
        if line.startswith("^"):
            entries[-1][1].append(line)
        else:
            entries.append((line.split(" ", 1)[1].strip(), [line]))
    for i in range(count):
        name = f"refs/heads/many/b{i:06d}"
        entries.append((name, [f"{commits[i % len(commits)]} {name}\n"]))
    entries.sort(key=lambda e: e[0])
    packed.write_text("# pack-refs with: peeled fully-peeled sorted \n"
                      + "".join(line for _, group in entries for line in group))


def start_fixture(fx: Fixture, stamp: Path, force: bool) -> bool:
    """False when the fixture *stamp* marks as built can be reused; else an empty
    ``fx.root`` is made for building it (and True returned)."""
    if stamp.exists() and not force:
        return False
    if fx.work.exists():
        shutil.rmtree(fx.work)
    fx.root.mkdir(parents=True)
    return True


def build_fixture(work: Path = WORK, unknowns: Sequence[int] = (300, 10_000),
                  refs: int = 100_000, force: bool = False) -> Fixture:
    """Build (or reuse) the fixture under *work*; see the module docstring."""
    fx = Fixture(work, sorted(set(unknowns)), refs=refs)
    stamp = work / f".built-{'-'.join(map(str, fx.unknowns))}-{refs}"
    if not start_fixture(fx, stamp, force):
        return fx
    base = fx.root / fx.repo
    run_git(["init", "-q", "--bare", "-b", "main", str(base)])
    _fast_import(base, history_stream(BASE_COMMITS, BASE_DATE, None, "base"))
    run_git(["--git-dir", str(base), "tag", "v1", "main~100"])
    run_git(["--git-dir", str(base), "-c", "repack.writeBitmaps=true",
             "-c", "gc.writeCommitGraph=true", "gc", "-q", "--prune=now"])
    for n in fx.unknowns:
        client = fx.client(n)
        run_git(["clone", "-q", "--no-checkout", "--no-local", str(base), str(client)])
        start = BASE_DATE + BASE_COMMITS * 60 + 86_400   # newer than every server commit
        _fast_import(client / ".git", history_stream(n, start, "refs/remotes/origin/main",
                                                     f"local{n}"))
        run_git(["-C", str(client), "gc", "-q"])
    _push_new_commit(base, work / "pusher")
    manyrefs = fx.root / fx.manyrefs
    shutil.copytree(base, manyrefs, symlinks=True)
    _write_many_refs(manyrefs, refs)
    stamp.write_text("ok\n")
    return fx


def _push_new_commit(base: Path, work: Path) -> None:
    """One commit pushed the ordinary way (unpack-objects: loose objects, loose ref)."""
    run_git(["clone", "-q", str(base), str(work)])
    (work / "dir0" / "file0.txt").write_text("changed on the server\n")
    env = client_env({"GIT_AUTHOR_NAME": "S", "GIT_AUTHOR_EMAIL": "s@example.org",
                      "GIT_COMMITTER_NAME": "S", "GIT_COMMITTER_EMAIL": "s@example.org",
                      "GIT_AUTHOR_DATE": f"{BASE_DATE + 10**6} +0000",
                      "GIT_COMMITTER_DATE": f"{BASE_DATE + 10**6} +0000"})
    run_git(["-C", str(work), "commit", "-q", "-am", "server commit"], env=env)
    run_git(["-C", str(work), "push", "-q", "origin", "main"])
    shutil.rmtree(work)


# ---------------------------------------------------------------------------
# fetch


@dataclass
class FetchRun:
    """One fetch as the client saw it."""

    requests: int
    wall_s: float


def run_fetch(url: str, template: Path, scratch: Path, protocol: int,
              expect_tip: str) -> FetchRun:
    """Copy *template*, point ``origin`` at *url*, ``git fetch``; check the new tip."""
    dest = scratch / f"fetch-{uuid.uuid4().hex[:8]}"
    shutil.copytree(template, dest, symlinks=True)
    trace = scratch / f"curl-{uuid.uuid4().hex[:8]}.trace"
    try:
        run_git(["-C", str(dest), "remote", "set-url", "origin", url])
        env = client_env({"GIT_TRACE_CURL": str(trace), "GIT_TRACE_CURL_NO_DATA": "1"})
        t0 = time.monotonic()
        run_git(["-C", str(dest), "-c", f"protocol.version={protocol}", "fetch", "-q",
                 "origin"], env=env, timeout=600)
        wall = time.monotonic() - t0
        got = git_out(["-C", str(dest), "rev-parse", "refs/remotes/origin/main"])
        if got != expect_tip:
            raise RuntimeError(f"fetch from {url} left origin/main at {got}, "
                               f"expected {expect_tip}")
        return FetchRun(count_http_requests(trace), wall)
    finally:
        shutil.rmtree(dest, ignore_errors=True)
        trace.unlink(missing_ok=True)


@dataclass
class MetaRow:
    unknown: int
    protocol: int
    server: str
    requests: int
    counts: dict[str, int] = field(default_factory=dict)
    state: str = "warm"

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def per_request(self) -> float:
        return self.total / max(1, self.requests)


class Pusher:
    """Pushes one more commit into base.git, the ordinary way (loose objects and a loose
    ``refs/heads/main``), from a clone kept for it."""

    def __init__(self, fx: Fixture, scratch: Path) -> None:
        self.fx = fx
        self.work = scratch / "pusher"
        self.n = 0

    def __call__(self) -> str:
        if not self.work.exists():
            run_git(["clone", "-q", str(self.fx.root / self.fx.repo), str(self.work)])
        self.n += 1
        (self.work / "dir1" / "file1.txt").write_text(f"pushed {self.n}\n")
        env = client_env({"GIT_AUTHOR_NAME": "S", "GIT_AUTHOR_EMAIL": "s@example.org",
                          "GIT_COMMITTER_NAME": "S", "GIT_COMMITTER_EMAIL": "s@example.org"})
        run_git(["-C", str(self.work), "commit", "-q", "-am", f"push {self.n}"], env=env)
        run_git(["-C", str(self.work), "push", "-q", "origin", "main"])
        return self.fx.new_tip


METADATA_STATES = ("warm", "pushed")
META_LABEL = {"warm": "warm (fetch repeated)", "pushed": "right after a push"}


def measure_metadata(servers: dict[str, BenchServer], fx: Fixture, protocols: Sequence[int],
                     scratch: Path) -> list[MetaRow]:
    """One warm-up and one straced fetch per (state, unknown, protocol, server). State
    ``warm``: the fetch repeats the warm-up; ``pushed``: a commit is pushed into base.git
    between them (new loose objects and a loose ref, as after every push)."""
    rows: list[MetaRow] = []
    push = Pusher(fx, scratch)
    for state in METADATA_STATES:
        for n in fx.unknowns:
            for proto in protocols:
                for kind, srv in servers.items():
                    url = srv.repo_url(fx.repo)
                    run_fetch(url, fx.client(n), scratch, proto, fx.new_tip)  # warm-up
                    tip = push() if state == "pushed" else fx.new_tip
                    baseline = set(srv.pids())
                    settle(srv, baseline)
                    with Strace(srv.pids(), METADATA_SYSCALLS, scratch) as st:
                        fr = run_fetch(url, fx.client(n), scratch, proto, tip)
                        settle(srv, baseline)
                    rows.append(MetaRow(n, proto, kind, fr.requests, st.counts, state))
                    print(f"  fetch {state} N={n} v{proto} {SERVER_LABEL[kind]}: "
                          f"{fr.requests} requests, {rows[-1].total} metadata syscalls, "
                          f"{fr.wall_s:.2f}s (traced)", flush=True)
    return rows


# ---------------------------------------------------------------------------
# writes and CPU of big advertisements

BIG_REQUESTS = (("advert-v0", "v0 GET info/refs"), ("ls-refs", "v2 ls-refs, clone's prefixes"),
                ("ls-refs-all", "v2 ls-refs, no prefix"))


@dataclass
class WriteRow:
    server: str
    kind: str
    body_bytes: int
    counts: dict[str, int]
    by_fd: dict[tuple[str, str], int]
    state: str = "warm"

    def to(self, kind: str) -> int:
        """Write calls to fds of *kind* (``tcp``: the client connection)."""
        return sum(n for (_s, k), n in self.by_fd.items() if k == kind)

    @property
    def other_fds(self) -> str:
        kinds = sorted({k for (_s, k) in self.by_fd if k != "tcp"})
        return " ".join(f"{k}:{self.to(k)}" for k in kinds) or "-"

    @property
    def writes(self) -> int:
        return sum(self.counts.values())

    @property
    def bound(self) -> int:
        return math.ceil(self.body_bytes / CHUNK) + 4


STATES = ("warm", "cold", "packed", "racy")
ALL_STATES = (*STATES, "fresh")  # fresh: only when asked for (it restarts gitspout)
STATE_LABEL = {"warm": "warm (repeat)", "cold": "cold (a ref changed)",
               "packed": "packed-refs rewritten", "racy": "a change every 0.5 s",
               "fresh": "first request after a restart",
               # reftable stacks (bench.rtchurn)
               "appended": "a table appended", "compacted": "stack compacted"}
RACY_PERIOD = 0.5
BUMP_REF = "refs/heads/zz-bench-bump"


class RefBumper:
    """Changes the ref state of the many-ref repository before a "cold" request: a
    loose ``refs/heads/zz-bench-bump`` alternates between two commits, so no
    cross-request cache can answer (the same is done before git-http-backend's
    requests). *env* is the environment of the ``git`` that makes the changes."""

    def __init__(self, repo: Path, env: dict[str, str] | None = None) -> None:
        self.repo = repo
        self.env = env
        self.commits = git_out(["--git-dir", str(repo), "rev-list", "-2", "main"],
                               env=env).split()
        self.n = 0

    def git(self, *args: str, env: dict[str, str] | None = None) -> None:
        """``git --git-dir REPO ARGS`` with this bumper's git."""
        run_git(["--git-dir", str(self.repo), *args], env=env or self.env, timeout=1800)

    def remove(self) -> None:
        """Delete the bump ref (the fixture's refs as built)."""
        self.git("update-ref", "-d", BUMP_REF)

    def __call__(self, env: dict[str, str] | None = None) -> None:
        self.n += 1
        self.git("update-ref", BUMP_REF, self.commits[self.n % 2], env=env)

    def repack(self) -> None:
        """The bump ref moved, then ``git pack-refs --all``: packed-refs is rewritten
        (one line differs) and no loose ref is left."""
        self()
        self.git("pack-refs", "--all")

    def change(self, state: str) -> None:
        """The change made between the warm-up and the measured request in *state*."""
        if state == "cold":
            self()
        elif state == "packed":
            self.repack()

    @contextlib.contextmanager
    def every(self, period: float) -> Iterator[None]:
        """Move the bump ref every *period* seconds (in a thread) while the block runs:
        every listing is inside the racy window, nothing is trusted by its stat."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(period):
                self()

        t = threading.Thread(target=loop, daemon=True)
        t.start()
        try:
            yield
        finally:
            stop.set()
            t.join()


def _prepare(servers: dict[str, BenchServer], kind: str, fx: Fixture, state: str,
             bump: RefBumper) -> dict[str, set[int]]:
    """Warm-up request on every server, then one change of the refs (``bump.change``:
    cold, packed), so that every server answers the same refs; returns each server's
    idle pid set. (racy: the refs change every 0.5 s in the background, see
    :meth:`RefBumper.every`; fresh: no warm-up, gitspout is restarted, so its first
    request for the repository parses every ref: git-http-backend always does.)"""
    idle: dict[str, set[int]] = {}
    for name, srv in servers.items():
        if state == "fresh" and name == "gitspout":
            srv.stop()
            srv.start()
        idle[name] = set(srv.pids())
        if state != "fresh":
            http_request(srv.port, kind, fx.manyrefs)
    bump.change(state)
    for name, srv in servers.items():
        settle(srv, idle[name])
    return idle


def measure_writes(servers: dict[str, BenchServer], fx: Fixture,
                   scratch: Path) -> list[WriteRow]:
    rows: list[WriteRow] = []
    bump = RefBumper(fx.root / fx.manyrefs)
    bump.remove()
    for state in ("warm", "cold"):
        for kind, _label in BIG_REQUESTS:
            idle = _prepare(servers, kind, fx, state, bump)
            for name, srv in servers.items():
                with Strace(srv.pids(), WRITE_SYSCALLS, scratch, detail=True) as st:
                    res = http_request(srv.port, kind, fx.manyrefs)
                    settle(srv, idle[name])
                if res.status != 200:
                    raise RuntimeError(f"{name} {kind}: HTTP {res.status}")
                rows.append(WriteRow(name, kind, res.body_bytes, st.counts, st.by_fd, state))
    bump.remove()
    return rows


def answer_refs(body: bytes) -> bytes:
    """An advertisement or ls-refs answer with the capabilities cut from its first ref
    line (they name the server's agent); the rest as sent. Two servers agree on the refs
    exactly when these are equal (both send refs in name order, as git does)."""
    pos = 0
    while pos + 4 <= len(body):
        n = int(body[pos:pos + 4], 16)
        if n < 4:
            pos += 4
            continue
        line = body[pos + 4:pos + n]
        if b"\0" in line:
            return body[:pos] + line.split(b"\0", 1)[0] + b"\n" + body[pos + n:]
        if not line.startswith(b"# service="):
            return body
        pos += n
    return body


def first_difference(a: bytes, b: bytes) -> str:
    """Where two :func:`answer_refs` differ, for the report."""
    la, lb = a.split(b"\n"), b.split(b"\n")
    for i, (x, y) in enumerate(zip(la, lb, strict=False)):
        if x != y:
            return f"line {i}: {x[:120]!r} != {y[:120]!r}"
    return f"{len(la)} lines != {len(lb)} lines"


@dataclass
class CpuRow:
    kind: str
    cpu_ms: dict[str, float]
    wall_ms: dict[str, float]
    body_bytes: dict[str, int]
    state: str = "warm"
    #: answers compared between the servers, and what differed
    compared: int = 0
    differ: list[str] = field(default_factory=list)


def measure_cpu(servers: dict[str, BenchServer], fx: Fixture, rounds: int,
                states: Sequence[str] = STATES, bump: RefBumper | None = None) -> list[CpuRow]:
    """Median CPU per request, rounds alternating the servers, in each of ``states``:
    warm, cold (a loose ref moved), packed (packed-refs rewritten), racy (a ref moves
    every 0.5 s while the rounds run), fresh (gitspout restarted); *bump* makes the
    changes (default: :class:`RefBumper` on the fixture's many-ref repository)."""
    bump = bump or RefBumper(fx.root / fx.manyrefs)
    bump.remove()
    rows = [_cpu_row(servers, fx, rounds, state, kind, bump)
            for state in states for kind, _label in BIG_REQUESTS]
    bump.remove()
    return rows


def _cpu_row(servers: dict[str, BenchServer], fx: Fixture, rounds: int, state: str,
             kind: str, bump: RefBumper) -> CpuRow:
    """One request kind in one state; the servers' answers are compared in every round
    (racy: once, after the changes stopped)."""
    cpu: dict[str, list[float]] = {k: [] for k in servers}
    wall: dict[str, list[float]] = {k: [] for k in servers}
    row = CpuRow(kind, {}, {}, {}, state)
    racy = bump.every(RACY_PERIOD) if state == "racy" else contextlib.nullcontext()
    with racy:
        for _ in range(rounds):
            idle = _prepare(servers, kind, fx, state, bump)
            answers: dict[str, bytes] = {}
            for name, srv in servers.items():
                srv.reset_counters()
                res = http_request(srv.port, kind, fx.manyrefs, keep_body=True)
                settle(srv, idle[name])
                cpu[name].append(srv.cpu_ns() / 1e6)
                wall[name].append(res.wall_s * 1e3)
                if res.status != 200:
                    raise RuntimeError(f"{name} {kind} {state}: HTTP {res.status}")
                row.body_bytes[name] = res.body_bytes
                answers[name] = answer_refs(res.body or b"")
            if state != "racy":
                _compare(row, answers)
    if state == "racy":
        _compare(row, {name: answer_refs(http_request(srv.port, kind, fx.manyrefs,
                                                      keep_body=True).body or b"")
                       for name, srv in servers.items()})
    row.cpu_ms = {k: median(v) for k, v in cpu.items()}
    row.wall_ms = {k: median(v) for k, v in wall.items()}
    return row


def _compare(row: CpuRow, answers: dict[str, bytes]) -> None:
    """Count one comparison of the servers' answers; note the first difference."""
    if len(answers) < 2:
        return
    row.compared += 1
    (na, a), *others = answers.items()
    for nb, b in others:
        if a != b:
            row.differ.append(f"{SERVER_LABEL[na]} vs {SERVER_LABEL[nb]}: "
                              + first_difference(a, b))


# ---------------------------------------------------------------------------
# report


# ---------------------------------------------------------------------------
# peak RSS and the mirror fetch


class PeakRss:
    """The largest VmHWM of each server's processes, sampled every 20 ms while the block
    runs (gitspout's one process keeps its own high-water mark; git-http-backend's CGI
    processes are short-lived and a sample may miss one)."""

    def __init__(self, servers: dict[str, BenchServer]) -> None:
        self.servers = servers
        self.peak: dict[str, int] = dict.fromkeys(servers, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        for name, srv in self.servers.items():
            with contextlib.suppress(Exception):
                hwm = max(srv.peak_rss_by_pid().values(), default=0)
                self.peak[name] = max(self.peak[name], hwm)

    def _loop(self) -> None:
        while not self._stop.wait(0.02):
            self._sample()

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def line(self, refs: int) -> str:
        return (f"Peak RSS (VmHWM, largest process) over the CPU rows, {refs:,} refs: "
                + ", ".join(f"{SERVER_LABEL[k]} {v / 2**20:.0f} MiB"
                            for k, v in self.peak.items()))


@dataclass
class MirrorRow:
    cpu_ms: dict[str, list[float]]
    wall_ms: dict[str, list[float]]


def _mirror_template(fx: Fixture) -> Path:
    """``git clone --mirror`` of manyrefs.git (every ref: its haves come from all of
    them), taken once and copied before each fetch."""
    dest = fx.work / f"mirror-{fx.refs}"
    if not dest.exists():
        tmp = fx.work / f".mirror-{fx.refs}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        run_git(["clone", "-q", "--mirror", "--no-local", str(fx.root / fx.manyrefs), str(tmp)],
                timeout=1200)
        tmp.rename(dest)
    return dest


def measure_mirror(servers: dict[str, BenchServer], fx: Fixture, rounds: int,
                   scratch: Path) -> MirrorRow:
    """A mirror fetch (v2) of manyrefs.git where one ref moved to a new commit since the
    mirror was taken: the client has every other ref and sends haves from them. Each
    round makes one more commit on ``refs/heads/zz-bench-mirror`` (on ``main``) and
    fetches into a fresh copy of the mirror from each server in turn."""
    template = _mirror_template(fx)
    repo = fx.root / fx.manyrefs
    row = MirrorRow({k: [] for k in servers}, {k: [] for k in servers})
    parent = git_out(["--git-dir", str(repo), "rev-parse", "main"])
    tree = git_out(["--git-dir", str(repo), "rev-parse", "main^{tree}"])
    env = client_env({"GIT_AUTHOR_NAME": "B", "GIT_AUTHOR_EMAIL": "b@example.org",
                      "GIT_COMMITTER_NAME": "B", "GIT_COMMITTER_EMAIL": "b@example.org"})
    for i in range(rounds):
        parent = git_out(["--git-dir", str(repo), "commit-tree", tree, "-p", parent, "-m",
                          f"mirror round {i}"], env=env)
        run_git(["--git-dir", str(repo), "update-ref", "refs/heads/zz-bench-mirror", parent])
        for name, srv in servers.items():
            dest = scratch / f"mirror-{uuid.uuid4().hex[:8]}"
            shutil.copytree(template, dest, symlinks=True)
            try:
                run_git(["--git-dir", str(dest), "remote", "set-url", "origin",
                         srv.repo_url(fx.manyrefs)])
                baseline = set(srv.pids())
                settle(srv, baseline)
                srv.reset_counters()
                t0 = time.monotonic()
                run_git(["--git-dir", str(dest), "-c", "protocol.version=2", "fetch", "-q",
                         "origin"], timeout=600)
                wall = time.monotonic() - t0
                settle(srv, baseline)
                row.cpu_ms[name].append(srv.cpu_ns() / 1e6)
                row.wall_ms[name].append(wall * 1e3)
                got = git_out(["--git-dir", str(dest), "rev-parse", "refs/heads/zz-bench-mirror"])
                if got != parent:
                    raise RuntimeError(f"{name}: mirror fetch left {got}, expected {parent}")
            finally:
                shutil.rmtree(dest, ignore_errors=True)
    run_git(["--git-dir", str(repo), "update-ref", "-d", "refs/heads/zz-bench-mirror"])
    return row


def mirror_table(row: MirrorRow, servers: Sequence[str]) -> str:
    header = ["request", *(f"{SERVER_LABEL[s]} cpu ms" for s in servers),
              *(f"{SERVER_LABEL[s]} wall ms" for s in servers)]
    cells = ["mirror fetch, one ref moved", *(f"{median(row.cpu_ms[s]):.1f}" for s in servers),
             *(f"{median(row.wall_ms[s]):.1f}" for s in servers)]
    if "gitspout" in servers and "c-git" in servers:
        ratio = median(row.cpu_ms["gitspout"]) / median(row.cpu_ms["c-git"])
        header += ["cpu ratio", "<= 0.5x"]
        cells += [f"{ratio:.2f}x", "yes" if ratio <= 0.5 else "NO"]
    return table(header, [cells])


def metadata_tables(rows: list[MetaRow]) -> str:
    header = ["state", "unknown haves", "proto", "server", "HTTP requests", "metadata syscalls",
              "per request", f"<= {PER_REQUEST_BUDGET}/req"]
    body = [[META_LABEL[r.state], f"{r.unknown:,}", f"v{r.protocol}", SERVER_LABEL[r.server],
             str(r.requests),
             str(r.total), f"{r.per_request:.1f}",
             ("yes" if r.per_request <= PER_REQUEST_BUDGET else "NO")
             if r.server == "gitspout" else "-"] for r in rows]
    used = [s for s in METADATA_SYSCALLS if any(r.counts.get(s) for r in rows)]
    header2 = ["state unknown proto server", *used, "total"]
    body2 = [[f"{r.state} {r.unknown:,} v{r.protocol} {SERVER_LABEL[r.server]}",
              *(str(r.counts.get(s, 0)) for s in used), str(r.total)] for r in rows]
    return table(header, body) + "\n\nBy syscall (whole fetch):\n" + table(header2, body2)


def write_table(rows: list[WriteRow]) -> str:
    used = [s for s in WRITE_SYSCALLS if any(r.counts.get(s) for r in rows)]
    header = ["request", "state", "server", "body bytes", *used, "writes", "to client TCP",
              "to other fds", "bound ceil(B/32Ki)+4", "within"]
    body = [[dict(BIG_REQUESTS)[r.kind], STATE_LABEL[r.state], SERVER_LABEL[r.server],
             f"{r.body_bytes:,}",
             *(str(r.counts.get(s, 0)) for s in used), str(r.writes), str(r.to("tcp")),
             r.other_fds, str(r.bound),
             ("yes" if r.writes <= r.bound else "NO") if r.server == "gitspout" else "-"]
            for r in rows]
    return table(header, body)


def cpu_table(rows: list[CpuRow], servers: Sequence[str]) -> str:
    header = ["request", "state", *(f"{SERVER_LABEL[s]} cpu ms" for s in servers),
              *(f"{SERVER_LABEL[s]} wall ms" for s in servers)]
    both = "gitspout" in servers and "c-git" in servers
    if both:
        header += ["cpu ratio", "<= 0.5x", "same refs"]
    body = []
    for r in rows:
        cells = [dict(BIG_REQUESTS)[r.kind], STATE_LABEL[r.state],
                 *(f"{r.cpu_ms[s]:.1f}" for s in servers),
                 *(f"{r.wall_ms[s]:.1f}" for s in servers)]
        if both:
            ratio = r.cpu_ms["gitspout"] / r.cpu_ms["c-git"]
            same = r.compared - len(r.differ)
            cells += [f"{ratio:.2f}x", "yes" if ratio <= 0.5 else "NO",
                      f"{same}/{r.compared}" + ("" if same == r.compared else " NO")]
        body.append(cells)
    differ = [f"{STATE_LABEL[r.state]}, {dict(BIG_REQUESTS)[r.kind]}: {d}"
              for r in rows for d in r.differ]
    return table(header, body) + "".join(f"\nANSWERS DIFFER: {d}" for d in differ)


# ---------------------------------------------------------------------------
# main


@contextlib.contextmanager
def started(kinds: Sequence[str], root: Path, gitspout_env: dict[str, str],
            c_git: dict[str, object] | None = None) -> Iterator[dict[str, BenchServer]]:
    """The servers *kinds* on *root* (*c_git*: keyword arguments of GitHttpBackend)."""
    servers: dict[str, BenchServer] = {}
    try:
        for k in kinds:
            if k == "gitspout":
                srv = make_server(k, root, probe_repo="base.git", env=gitspout_env)
            else:
                srv = make_server(k, root, probe_repo="base.git", **(c_git or {}))
            servers[k] = srv.start()
        yield servers
    finally:
        for srv in servers.values():
            srv.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--unknown", default="300,10000",
                    help="comma-separated counts of client commits unknown to the server")
    ap.add_argument("--servers", default="gitspout,c-git")
    ap.add_argument("--protocols", default="2,0")
    ap.add_argument("--refs", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5, help="CPU rounds (median)")
    ap.add_argument("--work", type=Path, default=WORK)
    ap.add_argument("--force", action="store_true", help="rebuild the fixture")
    ap.add_argument("--skip", default="", help="comma list of: metadata,writes,cpu,mirror")
    ap.add_argument("--states", default=",".join(STATES),
                    help="ref states of the CPU rows: " + ",".join(ALL_STATES))
    ap.add_argument("--gitspout-rev", default="HEAD", metavar="REV",
                    help="gitspout revision to measure (a frozen copy); 'worktree' for the "
                         "working tree as it is at the start")
    args = ap.parse_args(argv)
    exit_on_sigterm()
    if os.geteuid() != 0:
        print("needs root (cgroups, strace attach)", file=sys.stderr)
        return 2
    kinds = [s for s in args.servers.split(",") if s]
    t0 = time.monotonic()
    fx = build_fixture(args.work, [int(x) for x in args.unknown.split(",")], args.refs,
                       args.force)
    print(f"fixture {fx.work} ready in {time.monotonic() - t0:.1f}s", flush=True)
    out: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gitspout-syscalls-") as tmp:
        what, env = snapshot_gitspout(args.gitspout_rev, Path(tmp) / "gitspout-src")
        print(f"gitspout code: {what}; git {git_out(['--version'])}; "
              f"load average {os.getloadavg()[0]:.2f}", flush=True)
        out.append(f"gitspout {what}")
        with started(kinds, fx.root, env) as servers:
            measure_all(args, fx, kinds, servers, Path(tmp), out)
        out.append(f"load average at the end: {os.getloadavg()[0]:.2f}")
    print()
    print("\n\n".join(out))
    return 0


def measure_all(args: argparse.Namespace, fx: Fixture, kinds: Sequence[str],
                servers: dict[str, BenchServer], scratch: Path, out: list[str]) -> None:
    """The three measurements of ``main`` (minus ``--skip``), appending tables to *out*."""
    skip = set(filter(None, args.skip.split(",")))
    if "metadata" not in skip:
        rows = measure_metadata(servers, fx, [int(p) for p in args.protocols.split(",")],
                                scratch)
        out.append("== Metadata syscalls of one fetch (strace -f -c on every server "
                   "process; warm: one identical fetch first) ==\n" + metadata_tables(rows))
    if "writes" not in skip:
        wrows = measure_writes(servers, fx, scratch)
        out.append(f"== Write syscalls, {fx.refs:,}-ref repository (one identical request "
                   "first; cold = a ref changed after it; bound applies to gitspout) ==\n"
                   + write_table(wrows))
    if "cpu" not in skip:
        with PeakRss(servers) as rss:
            crows = measure_cpu(servers, fx, args.rounds,
                                [x for x in args.states.split(",") if x])
        out.append(f"== Server CPU (cgroup, children included), {fx.refs:,}-ref "
                   f"repository, median of {args.rounds} alternating rounds, one identical "
                   "request before each (cold: then a ref changed), no strace ==\n"
                   + cpu_table(crows, kinds) + "\n\n" + rss.line(fx.refs))
    if "mirror" not in skip:
        mrow = measure_mirror(servers, fx, args.rounds, scratch)
        out.append(f"== Server CPU of a mirror fetch (v2), {fx.refs:,}-ref repository, one "
                   f"ref moved to a new commit, median of {args.rounds} rounds ==\n"
                   + mirror_table(mrow, kinds))


if __name__ == "__main__":
    sys.exit(main())
