"""Clones that cost the server almost nothing (issue 29): the server CPU and wall time of a
clone that takes gitspout's own bundle (``--bundles``, client ``transfer.bundleURI=true``)
against a normal gitspout clone and git-http-backend, one at a time and 32 at once.

    python -m bench.offload --repo dulwich-gc.git [--root bench/work/real]
        [--git /path/to/git>=2.41] [--runs 3] [--parallel 32]

Every server runs in its own cgroup (bench/peer.py): its CPU includes every child. The
clones are plain ``git clone`` (branches and tags, what the bundle holds), all by the same
client git (>= 2.41, for transfer.bundleURI). Each side gets one warm-up clone first (for
the bundled side it is what makes gitspout write the bundle: ``--bundle-after 1``), then
``--runs`` measured clones one at a time (median), then ``--parallel`` at once. The first
bundled clone is checked: fsck and the same refs as a normal clone. Targets: a bundled
clone at most 0.1x the server CPU of a normal gitspout clone, wall at most 1.0x. "Normal"
is shown twice: with the pack cache (default; after the warm-up every clone is a cached
pack sent with sendfile, already nearly free) and without it (each pack produced), which
the ratios are taken against.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .client import client_env, fsck, list_refs
from .peer import BenchServer, GitHttpBackend, Gitspout
from .process import http_get

DEFAULT_GIT = "/work/gitsuite-build/git-2.55.0-fresh/bin-wrappers/git"


def _clone(git: str, url: str, dest: Path, bundle: bool) -> float:
    args = [git, "-c", "protocol.version=2"]
    if bundle:
        args += ["-c", "transfer.bundleURI=true"]
    t0 = time.monotonic()
    subprocess.run([*args, "clone", "-q", url, str(dest)], env=client_env(), check=True,
                   capture_output=True, timeout=1800)
    return time.monotonic() - t0


def _metric(srv: BenchServer, name: str) -> float:
    body = http_get(srv.port, "/metrics")[2].decode()
    return sum(float(line.split()[-1]) for line in body.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def _measure(srv: BenchServer, clone: Callable[[Path], float], scratch: Path,
             runs: int, parallel: int) -> dict[str, float]:
    one_cpu, one_wall = [], []
    for i in range(runs):
        srv.reset_counters()
        one_wall.append(clone(scratch / f"one{i}"))
        one_cpu.append(srv.cpu_ns() / 1e9)
    for i in range(runs):
        shutil.rmtree(scratch / f"one{i}", ignore_errors=True)
    srv.reset_counters()
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            clone(scratch / f"par{k}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(parallel)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    par_wall = time.monotonic() - t0
    par_cpu = srv.cpu_ns() / 1e9
    if errors:
        raise RuntimeError(f"{len(errors)} parallel clones failed: {errors[0]}")
    for k in range(parallel):
        shutil.rmtree(scratch / f"par{k}", ignore_errors=True)
    return {"cpu": statistics.median(one_cpu), "wall": statistics.median(one_wall),
            "par_cpu": par_cpu, "par_wall": par_wall}


SIDES = ("backend", "cached", "nocache", "bundle", "cdn")


def run(root: Path, repo: str, git: str, runs: int, parallel: int,
        sides: tuple[str, ...] = SIDES) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="offload-bench-") as tmp:
        scratch = Path(tmp)
        if "backend" in sides:
            with GitHttpBackend(root, probe_repo=repo) as srv:
                url = srv.repo_url(repo)
                _clone(git, url, scratch / "warm-c", False)
                shutil.rmtree(scratch / "warm-c")
                out["git-http-backend"] = _measure(
                    srv, lambda d: _clone(git, url, d, False), scratch, runs, parallel)
        for side, name, extra in (("cached", "gitspout", []),
                                  ("nocache", "gitspout, no pack cache",
                                   ["--pack-cache-size", "0"])):
            if side not in sides:
                continue
            with Gitspout(root, probe_repo=repo, name="gitspout", extra_args=extra) as srv:
                url = srv.repo_url(repo)
                _clone(git, url, scratch / "warm-g", False)
                shutil.rmtree(scratch / "warm-g")
                out[name] = _measure(srv, lambda d, u=url: _clone(git, u, d, False),
                                     scratch, runs, parallel)
        if "bundle" in sides:
            out["gitspout, bundle"] = _bundled(root, repo, git, scratch, runs, parallel, [])
        if "cdn" not in sides:
            return out
        cdn = subprocess.Popen([sys.executable, "-c", CDN, str(scratch / "bundles")],
                               stdout=subprocess.PIPE)
        try:
            assert cdn.stdout is not None
            port = int(cdn.stdout.readline())
            out["gitspout, bundle on another server"] = _bundled(
                root, repo, git, scratch, runs, parallel,
                ["--bundle-base-url", f"http://127.0.0.1:{port}"])
        finally:
            cdn.terminate()
            cdn.wait(timeout=30)
    return out


# --bundle-base-url's other server (a CDN's stand-in, outside the measured cgroup): the
# files of every gitspout bundle directory under argv[1], by name.
CDN = """
import glob, http.server, os, sys
root = sys.argv[1]
class H(http.server.SimpleHTTPRequestHandler):
    def translate_path(self, path):
        hits = glob.glob(os.path.join(root, "gitspout-bundles", "*", os.path.basename(path)))
        return hits[0] if hits else "/nonexistent"
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


def _bundled(root: Path, repo: str, git: str, scratch: Path, runs: int, parallel: int,
             extra: list[str]) -> dict[str, float]:
    """The bundled side: a warm-up clone makes gitspout write the bundle; the first
    bundled clone is checked; then measured as the others."""
    bundles = scratch / "bundles"
    with Gitspout(root, probe_repo=repo, name="gitspout-bundles", extra_args=[
            "--bundles", "--bundle-after", "1", "--bundle-dir", str(bundles), *extra]) as srv:
        url = srv.repo_url(repo)
        shutil.rmtree(scratch / "warm-b", ignore_errors=True)
        shutil.rmtree(scratch / "check-b", ignore_errors=True)
        _clone(git, url, scratch / "warm-b", False)
        deadline = time.monotonic() + 600
        while _metric(srv, "gitspout_bundles_written_total") < 1:
            if time.monotonic() > deadline:
                raise RuntimeError("no bundle written")
            time.sleep(0.2)
        check = scratch / "check-b"
        _clone(git, url, check, True)
        refs = list_refs(check / ".git")
        if not any(k.startswith("refs/bundles/") for k in refs):
            raise RuntimeError("the bundled clone did not apply the bundle")
        fsck(check / ".git")
        got = {k: v for k, v in refs.items() if not k.startswith("refs/bundles/")}
        if got != list_refs(scratch / "warm-b" / ".git"):
            raise RuntimeError("bundled clone's refs differ from a normal clone's")
        return _measure(srv, lambda d: _clone(git, url, d, True), scratch, runs, parallel)


def report(results: dict[str, dict[str, float]], repo: str, parallel: int,
           load: float) -> str:
    base = results.get("gitspout, no pack cache") or next(iter(results.values()))
    lines = [f"repository {repo}; load average (1 min) before: {load:.2f}, "
             f"after: {os.getloadavg()[0]:.2f}",
             "", f"| server | CPU s/clone | wall s/clone | CPU x no cache | wall x no cache "
             f"| {parallel} clones: CPU s | {parallel} clones: wall s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['cpu']:.3f} | {r['wall']:.2f} | "
                     f"{r['cpu'] / base['cpu']:.2f} | {r['wall'] / base['wall']:.2f} | "
                     f"{r['par_cpu']:.2f} | {r['par_wall']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path("bench/work/real"))
    ap.add_argument("--repo", default="dulwich-gc.git")
    ap.add_argument("--git", default=os.environ.get("GITSPOUT_TEST_NEW_GIT", DEFAULT_GIT),
                    help="client git, at least 2.41")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=32)
    ap.add_argument("--sides", default=",".join(SIDES),
                    help=f"which servers, comma-separated, of {','.join(SIDES)}")
    args = ap.parse_args(argv)
    load = os.getloadavg()[0]
    results = run(args.root, args.repo, args.git, args.runs, args.parallel,
                  tuple(s.strip() for s in args.sides.split(",")))
    print(report(results, args.repo, args.parallel, load), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
