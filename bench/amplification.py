"""CPU amplification figures (issue 8, item 3): small requests that cost the server a lot.

Prints, for one checkout of gitspout (and optionally for an older revision too, run from a
temporary worktree), what each of these requests costs against a real history:

* (a) ``object-info`` with many ids: seconds, and whether every size matches
  ``git cat-file --batch-check``; one id over the cap;
* (b) 40k distinct ``shallow`` lines with ``deepen 1``, and 40k distinct ``want-ref`` lines;
* (c) 600k duplicate ``have`` lines (v2 and v0): seconds, ACK bytes, and the slowest tiny
  ``ls-refs`` answered while it ran (event-loop stalls show there);
* (d) ``deepen 1000``: seconds, pack bytes and objects, next to C git's
  ``git upload-pack --stateless-rpc`` for the same request body.

    python bench/amplification.py [--repo bench/work/real/dulwich-gc.git]
                                  [--before REV] [--timeout 120] [--cases abcd]

``--before REV`` checks REV out in a temporary ``git worktree`` (removed afterwards) and runs
every case against it first, then against this checkout. The repository is served from a
local ``--mirror`` copy under ``bench/work/amp/`` (hard links, never committed) with
``uploadpack.allowRefInWant`` on. Standard library only; the server is started with the
interpreter running this script, which must have gitspout's dependencies. Only 127.0.0.1
is contacted; every request has a timeout and every loop is bounded.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.process import gitspout_command  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
CHECKOUT = BENCH_DIR.parent
DEFAULT_REPO = BENCH_DIR / "work" / "real" / "dulwich-gc.git"
WORK = BENCH_DIR / "work" / "amp"
HOST = "127.0.0.1"
UPLOAD_CT = "application/x-git-upload-pack-request"


def pkt(line: bytes) -> bytes:
    return b"%04x" % (len(line) + 4) + line


def lines(*texts: bytes) -> bytes:
    return b"".join(pkt(t + b"\n") for t in texts)


def v2_body(command: bytes, args: list[bytes]) -> bytes:
    return (lines(b"command=" + command, b"object-format=sha1") + b"0001"
            + b"".join(pkt(a + b"\n") for a in args) + b"0000")


def iter_pkts(body: bytes) -> Iterator[bytes | None]:
    pos = 0
    while pos + 4 <= len(body):
        n = int(body[pos : pos + 4], 16)
        if n < 4:
            yield None
            pos += 4
            continue
        yield body[pos + 4 : pos + n]
        pos += n


def pack_of(body: bytes) -> bytes:
    """The pack bytes of a v2 fetch answer (side-band 1 after ``packfile``)."""
    out: list[bytes] = []
    in_pack = False
    for p in iter_pkts(body):
        if p is None:
            continue
        if not in_pack:
            in_pack = p == b"packfile\n"
            continue
        if p[:1] == b"\x01":
            out.append(p[1:])
    return b"".join(out)


def pack_objects(pack: bytes) -> int:
    return int.from_bytes(pack[8:12], "big") if pack.startswith(b"PACK") else 0


def git(repo: Path, *args: str, input: bytes | None = None, timeout: float = 600) -> bytes:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    res = subprocess.run(["git", "--git-dir", str(repo), *args], input=input, env=env,
                         capture_output=True, timeout=timeout, check=True)
    return res.stdout


# ---------------------------------------------------------------- server


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log: list[str] = field(default_factory=list)

    def post(self, repo: str, body: bytes, version: int = 2,
             timeout: float = 120) -> tuple[int, bytes, float]:
        """POST to git-upload-pack; (status, body, seconds). Large bodies go gzipped, as
        git sends them. Status 0 means the request timed out."""
        headers = {"Content-Type": UPLOAD_CT}
        if version == 2:
            headers["Git-Protocol"] = "version=2"
        data = body
        if len(body) > 4096:
            data = gzip.compress(body, 1)
            headers["Content-Encoding"] = "gzip"
        conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        start = time.monotonic()
        try:
            conn.request("POST", f"/{repo}/git-upload-pack", data, headers)
            resp = conn.getresponse()
            payload = resp.read()
            return resp.status, payload, time.monotonic() - start
        except TimeoutError:
            return 0, b"", time.monotonic() - start
        finally:
            conn.close()


@contextmanager
def serve(tree: Path, root: Path) -> Iterator[Server]:
    """gitspout's ``serve`` from the source tree ``tree`` on a free loopback port."""
    prefix, extra = gitspout_command(tree, Path(tempfile.mkdtemp(prefix="gitspout-import-")))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITSPOUT_")} | extra
    proc = subprocess.Popen(
        [*prefix, "--root", str(root), "--host", HOST,
         "--port", "0", "--log-level", "warning"],
        cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    port = 0
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode(errors="replace")
        if not line:
            break
        m = re.search(r"at http://127\.0\.0\.1:(\d+)/", line)
        if m:
            port = int(m.group(1))
            break
    if not port:
        proc.kill()
        raise SystemExit(f"gitspout from {tree} did not start")
    srv = Server(proc, port)

    def drain() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            srv.log.append(raw.decode(errors="replace"))

    threading.Thread(target=drain, daemon=True).start()
    try:
        yield srv
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class LatencyProbe:
    """A tiny ls-refs every 20 ms while a heavy request runs; the slowest answer shows how
    long the event loop (or the pool) was unavailable to everybody else."""

    def __init__(self, srv: Server, repo: str) -> None:
        self.srv, self.repo = srv, repo
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._body = v2_body(b"ls-refs", [b"ref-prefix refs/heads/master"])

    def _run(self) -> None:
        for _ in range(100_000):
            if self._stop.is_set():
                return
            status, _, secs = self.srv.post(self.repo, self._body, timeout=300)
            if status:
                self.times.append(secs)
            self._stop.wait(0.02)

    def __enter__(self) -> LatencyProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=310)

    @property
    def worst_ms(self) -> float:
        return 1000 * max(self.times, default=0.0)


# ---------------------------------------------------------------- cases


@dataclass
class Fixture:
    repo: Path
    name: str
    head: str
    ids: list[str]  # commits, trees and blobs spread over the history
    sizes: dict[str, int]


def prepare(src: Path) -> Fixture:
    """A hard-linked mirror of ``src`` that allows want-ref, and a sample of its ids."""
    WORK.mkdir(parents=True, exist_ok=True)
    name = src.name.removesuffix(".git") + "-amp.git"
    repo = WORK / name
    if not (repo / "HEAD").exists():
        tmp = WORK / (name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        git(src, "clone", "-q", "--mirror", "--local", str(src), str(tmp))
        tmp.rename(repo)
    git(repo, "config", "uploadpack.allowRefInWant", "true")
    head = git(repo, "rev-parse", "HEAD").decode().strip()
    listing = git(repo, "rev-list", "--objects", "--all").decode().split("\n")
    every = [ln.split(" ", 1)[0] for ln in listing if ln]
    step = max(1, len(every) // 12_000)
    ids = every[::step][:12_000]
    check = git(repo, "cat-file", "--batch-check=%(objectname) %(objectsize)",
                input="\n".join(ids).encode() + b"\n").decode().split("\n")
    sizes = {a: int(b) for a, b in (ln.split() for ln in check if ln)}
    return Fixture(repo, name, head, ids, sizes)


Row = tuple[str, str]


def case_object_info(srv: Server, fx: Fixture, timeout: float) -> list[Row]:
    rows: list[Row] = []
    for n in (100, 2000, 10_000):
        ids = fx.ids[:n]
        body = v2_body(b"object-info", [b"size"] + [b"oid " + i.encode() for i in ids])
        status, answer, secs = srv.post(fx.name, body, timeout=timeout)
        if not status:
            # The server keeps working on it: larger batches would only queue behind.
            rows.append((f"(a) object-info {n} ids", f"timed out after {timeout:.0f} s"))
            rows.append(("(a) object-info 10,001 ids", "skipped: a smaller batch timed out"))
            return rows
        got = {}
        for p in iter_pkts(answer):
            if p and p != b"size\n":
                oid, _, size = p.decode().strip().partition(" ")
                got[oid] = int(size) if size else None
        right = sum(1 for i in ids if got.get(i) == fx.sizes[i])
        rows.append((f"(a) object-info {n} ids", f"{secs:.2f} s, {right}/{n} sizes right"))
    body = v2_body(b"object-info", [b"size"] + [b"oid " + i.encode() for i in fx.ids[:10_001]])
    status, answer, secs = srv.post(fx.name, body, timeout=timeout)
    what = answer[:80].decode(errors="replace").strip() if status else "timed out"
    rows.append(("(a) object-info 10,001 ids", f"HTTP {status} in {secs:.2f} s: {what}"))
    return rows


def case_lines(srv: Server, fx: Fixture, timeout: float) -> list[Row]:
    rows: list[Row] = []
    n = 40_000
    shallows = [b"shallow %040x" % (0xABC0000 + k) for k in range(n)]
    body = v2_body(b"fetch", [b"want " + fx.head.encode(), *shallows, b"deepen 1",
                              b"no-progress", b"done"])
    status, answer, secs = srv.post(fx.name, body, timeout=timeout)
    rows.append((f"(b) {n:,} distinct shallow lines, deepen 1",
                 f"{secs:.2f} s, HTTP {status}, pack of {pack_objects(pack_of(answer))} objects"
                 if status else f"timed out after {timeout:.0f} s"))
    refs = [b"want-ref refs/heads/nope-%06d" % k for k in range(n)]
    body = v2_body(b"fetch", [*refs, b"done"])
    status, answer, secs = srv.post(fx.name, body, timeout=timeout)
    rows.append((f"(b) {n:,} distinct want-ref lines",
                 f"{secs:.2f} s, HTTP {status}: {answer[4:60].decode(errors='replace').strip()}"
                 if status else f"timed out after {timeout:.0f} s"))
    return rows


def case_haves(srv: Server, fx: Fixture, timeout: float) -> list[Row]:
    rows: list[Row] = []
    n = 600_000
    have = b"have " + fx.head.encode()
    bodies = {
        "v2": (2, v2_body(b"fetch", [b"want " + fx.head.encode()] + [have] * n)),
        "v0": (0, lines(b"want " + fx.head.encode() + b" multi_ack_detailed side-band-64k")
               + b"0000" + lines(*([have] * n)) + b"0000"),
    }
    for label, (version, body) in bodies.items():
        with LatencyProbe(srv, fx.name) as probe:
            status, answer, secs = srv.post(fx.name, body, version=version, timeout=timeout)
        acks = answer.count(b"ACK ")
        rows.append((f"(c) {n:,} duplicate haves, {label}",
                     f"{secs:.2f} s, {len(answer) / 1e6:.2f} MB answer, {acks:,} ACKs, "
                     f"slowest ls-refs meanwhile {probe.worst_ms:.0f} ms"
                     if status else f"timed out after {timeout:.0f} s"))
    return rows


def case_deepen(srv: Server | None, fx: Fixture, timeout: float, depth: int = 1000) -> list[Row]:
    body = v2_body(b"fetch", [b"want " + fx.head.encode(), b"deepen %d" % depth, b"ofs-delta",
                              b"thin-pack", b"no-progress", b"done"])
    if srv is None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        env.update(GIT_PROTOCOL="version=2", GIT_CONFIG_NOSYSTEM="1")
        start = time.monotonic()
        res = subprocess.run(["git", "upload-pack", "--stateless-rpc", str(fx.repo)],
                             input=body, env=env, capture_output=True, timeout=timeout)
        secs, answer, label = time.monotonic() - start, res.stdout, "C git --stateless-rpc"
    else:
        status, answer, secs = srv.post(fx.name, body, timeout=timeout)
        label = "gitspout"
        if not status:
            return [(f"(d) deepen {depth}, {label}", f"timed out after {timeout:.0f} s")]
    pack = pack_of(answer)
    return [(f"(d) deepen {depth}, {label}",
             f"{secs:.2f} s, pack {len(pack) / 1e6:.2f} MB, {pack_objects(pack):,} objects")]


CASES: dict[str, Callable[[Server, Fixture, float], list[Row]]] = {
    "a": case_object_info, "b": case_lines, "c": case_haves, "d": case_deepen,
}


def run_all(tree: Path, fx: Fixture, cases: str, timeout: float) -> list[Row]:
    """Each case gets its own server, so that work a timed-out request left running in the
    pool cannot slow the next case down."""
    rows: list[Row] = []
    for key in cases:
        with serve(tree, fx.repo.parent) as srv:
            for row in CASES[key](srv, fx, timeout):
                print(f"  {row[0]:<44} {row[1]}", flush=True)
                rows.append(row)
            if srv.proc.poll() is not None:
                raise SystemExit("gitspout exited:\n" + "".join(srv.log[-20:]))
    return rows


@contextmanager
def worktree_at(rev: str) -> Iterator[Path]:
    """A temporary detached worktree of this checkout at ``rev``."""
    tmp = Path(tempfile.mkdtemp(prefix="gitspout-before-"))
    path = tmp / "tree"
    subprocess.run(["git", "-C", str(CHECKOUT), "worktree", "add", "-q", "--detach", str(path),
                    rev], check=True, timeout=120)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(CHECKOUT), "worktree", "remove", "--force", str(path)],
                       check=False, timeout=120)
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=DEFAULT_REPO,
                    help="bare repository to serve (bench/prepare_real.py dulwich makes it)")
    ap.add_argument("--before", metavar="REV", help="also run this revision, first")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    ap.add_argument("--cases", default="abcd", help="which of a, b, c, d to run")
    args = ap.parse_args(argv)
    if not (args.repo / "HEAD").exists():
        raise SystemExit(f"{args.repo} is missing: run bench/prepare_real.py dulwich first")
    fx = prepare(args.repo.resolve())
    print(f"repository {fx.repo} (HEAD {fx.head[:12]})", flush=True)
    results: dict[str, list[Row]] = {}
    if args.before:
        with worktree_at(args.before) as tree:
            rev = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                                 capture_output=True, text=True, check=True).stdout.strip()
            print(f"before: {args.before} ({rev})", flush=True)
            results["before"] = run_all(tree, fx, args.cases, args.timeout)
    rev = subprocess.run(["git", "-C", str(CHECKOUT), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, check=True).stdout.strip()
    print(f"after: this checkout ({rev})", flush=True)
    results["after"] = run_all(CHECKOUT, fx, args.cases, args.timeout)
    if "d" in args.cases:
        for row in case_deepen(None, fx, args.timeout):
            print(f"  {row[0]:<44} {row[1]}", flush=True)
    if "before" in results:
        print("\nsummary (before -> after)")
        before = dict(results["before"])
        for name, new in results["after"]:
            print(f"  {name}\n      before: {before.get(name, 'not run')}\n      after:  {new}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
