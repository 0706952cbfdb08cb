"""Repo-affinity routing (deploy/nginx/affinity.conf, README.md "Scaling out"): three gitspout
processes behind nginx on 127.0.0.1, 30 repositories cloned twice each through round-robin
and through ``hash $repo consistent``, every clone fsck-clean; then one process is killed
(SIGKILL) while it serves: the clones in flight on it fail cleanly, a retry succeeds, and
nothing else breaks.

The figures (cold repository opens, pack index loads, server CPU) are printed, and the
cold counts are asserted: with affinity each repository is opened by exactly one process.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from gitutil import REPO_ROOT, Git, LiveServer, fsck, start_server, wait_until

AFFINITY_CONF = REPO_ROOT / "deploy" / "nginx" / "affinity.conf"
REPOS = 30
ROUNDS = 2  # clones of every repository per mode
WORKERS = 4
CLONE_TIMEOUT = 60.0

pytestmark = pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx not installed")


def _stream(files: int = 120, commits: int = 60) -> bytes:
    """A fast-import stream: ``commits`` commits, each rewriting 8 of ``files`` files of a few
    KiB of text that does not compress to nothing (a pack of a few MB)."""
    out: list[bytes] = []
    seed = 12345
    when = 1_600_000_000
    for c in range(commits):
        out.append(b"commit refs/heads/main\n")
        out.append(f"committer T <t@example.com> {when + c * 60} +0000\n".encode())
        msg = f"commit {c}\n".encode()
        out.append(b"data %d\n%s" % (len(msg), msg))
        for f in (range(files) if c == 0 else [(c * 8 + k) % files for k in range(8)]):
            words = []
            for _ in range(600):
                seed = (seed * 1103515245 + 12345) & 0x7FFFFFFF
                words.append(f"{seed % 99991:05d}")
            body = (" ".join(words) + "\n").encode()
            out.append(f"M 100644 inline d{f % 7}/f{f}.txt\n".encode())
            out.append(b"data %d\n%s" % (len(body), body))
        out.append(b"\n")
    return b"".join(out)


@pytest.fixture(scope="module")
def fleet_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    """30 bare repositories (copies of one, each its own path, files and caches)."""
    root = tmp_path_factory.mktemp("fleet")
    base = root / "r00.git"
    git.run("init", "-q", "--bare", str(base))
    git.run("fast-import", "--quiet", cwd=base, input=_stream())
    git.run("repack", "-adqb", cwd=base)
    for i in range(1, REPOS):
        shutil.copytree(base, root / f"r{i:02d}.git")
    return root


@dataclass
class Fleet:
    servers: list[LiveServer]
    nginx: subprocess.Popen[bytes]
    port: int
    workdir: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def access_log(self) -> list[list[str]]:
        path = self.workdir / "access.log"
        return [line.split("|") for line in path.read_text().splitlines()] if path.exists() else []


def nginx_config(workdir: Path, listen: int, upstreams: list[int], affinity: bool) -> str:
    """deploy/nginx/affinity.conf as shipped, with loopback addresses (and without its
    ``hash`` line for round-robin), inside a main config that keeps every file in workdir."""
    conf = AFFINITY_CONF.read_text()
    server_lines = re.findall(r"^ *server 10\.0\.0\.\d+:8080 .*;$", conf, re.M)
    assert len(server_lines) == 3, server_lines
    conf = conf.replace(server_lines[0], "\n".join(
        f"    server 127.0.0.1:{p} max_fails=1 fail_timeout=10s;" for p in upstreams))
    for line in server_lines[1:]:
        conf = conf.replace(line + "\n", "")
    assert conf.count("    listen 80;") == 1
    conf = conf.replace("    listen 80;", f"    listen 127.0.0.1:{listen};")
    if not affinity:
        assert conf.count("    hash $repo consistent;\n") == 1
        conf = conf.replace("    hash $repo consistent;\n", "")
    (workdir / "affinity.conf").write_text(conf)
    user = "user root;\n" if os.geteuid() == 0 else ""
    w = workdir
    return f"""{user}daemon off;
worker_processes 1;
pid {w}/nginx.pid;
error_log {w}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    client_body_temp_path {w}/client_body;
    proxy_temp_path {w}/proxy;
    fastcgi_temp_path {w}/fastcgi;
    uwsgi_temp_path {w}/uwsgi;
    scgi_temp_path {w}/scgi;
    include {w}/affinity.conf;
    log_format fleet '$request_method|$uri|$status|$repo|$upstream_addr|$upstream_status';
    access_log {w}/access.log fleet;
}}
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def fleet_factory(tmp_path: Path) -> Iterator[object]:
    started: list[Fleet] = []

    def make(root: Path, affinity: bool) -> Fleet:
        # No pack cache: a repeated clone is then produced again, long enough to be caught
        # in flight by the kill round (a cache hit by sendfile is over in a millisecond).
        servers = [start_server(root, extra_args=["--pack-cache-size", "0"])
                   for _ in range(3)]
        workdir = tmp_path / ("affinity" if affinity else "round-robin")
        workdir.mkdir()
        port = _free_port()
        conf = workdir / "nginx.conf"
        conf.write_text(nginx_config(workdir, port, [s.port for s in servers], affinity))
        argv = ["nginx", "-p", str(workdir), "-c", str(conf), "-e", str(workdir / "error.log")]
        check = subprocess.run([*argv, "-t", "-q"], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stderr
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        fleet = Fleet(servers, proc, port, workdir)
        started.append(fleet)
        assert wait_until(lambda: _http_status(fleet.url + "/r00.git/info/refs?service="
                                               "git-upload-pack") == 200, 10)
        return fleet

    yield make
    for fleet in started:
        fleet.nginx.terminate()
        fleet.nginx.wait(timeout=10)
        for s in fleet.servers:
            s.stop()


def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except OSError:
        return 0


def _metric(server: LiveServer, name: str, labels: str = "") -> float:
    """One sample of a server's /metrics, read directly (not through nginx); 0 if absent."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + (labels and "{")) and (not labels or labels in line):
            if labels or line.split()[0] == name:
                total += float(line.split()[-1])
    return total


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Figures:
    repo_opens: float  # cold repository opens: cache "repos" misses, over the 3 processes
    index_loads: float  # pack indexes parsed: cache "pack_indexes" misses
    packs_opened: float  # gitspout_open_files_opened_total
    cpu_s: float


def _figures(fleet: Fleet, cpu_before: list[float]) -> Figures:
    s = fleet.servers
    return Figures(
        repo_opens=sum(_metric(x, "gitspout_cache_lookups_total",
                               'cache="repos",result="miss"') for x in s),
        index_loads=sum(_metric(x, "gitspout_cache_lookups_total",
                                'cache="pack_indexes",result="miss"') for x in s),
        packs_opened=sum(_metric(x, "gitspout_open_files_opened_total") for x in s),
        cpu_s=sum(_cpu_seconds(x.proc.pid) - c for x, c in zip(s, cpu_before, strict=True)),
    )


def _clone(git: Git, url: str, dest: Path) -> subprocess.CompletedProcess[bytes]:
    return git.run("clone", "-q", "--no-checkout", url, str(dest), check=False,
                   timeout=CLONE_TIMEOUT)


def _clone_all(git: Git, fleet: Fleet, dest: Path, names: list[str]) -> None:
    def one(name: str) -> None:
        target = dest / name
        res = _clone(git, f"{fleet.url}/{name}", target)
        assert res.returncode == 0, res.stderr.decode(errors="replace")
        fsck(git, target)
        shutil.rmtree(target)

    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(one, names))


def _run_mode(git: Git, fleet: Fleet, dest: Path) -> Figures:
    names = [f"r{i:02d}.git" for i in range(REPOS)]
    cpu_before = [_cpu_seconds(s.proc.pid) for s in fleet.servers]
    for _ in range(ROUNDS):
        _clone_all(git, fleet, dest, names)
    return _figures(fleet, cpu_before)


def test_round_robin_against_affinity_and_kill_one(
        git: Git, fleet_root: Path, fleet_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    dest = tmp_path / "clones"
    dest.mkdir()
    rr_fleet = fleet_factory(fleet_root, affinity=False)
    rr = _run_mode(git, rr_fleet, dest)
    rr_fleet.nginx.terminate()
    rr_fleet.nginx.wait(timeout=10)
    for s in rr_fleet.servers:
        s.stop()

    fleet = fleet_factory(fleet_root, affinity=True)
    aff = _run_mode(git, fleet, dest)

    print(f"\n{REPOS} repositories x {ROUNDS} clones, 3 gitspout processes behind nginx")
    print(f"{'mode':<14}{'repo opens':>12}{'idx loads':>11}{'packs opened':>14}{'server CPU s':>14}")
    for mode, f in (("round-robin", rr), ("repo-affinity", aff)):
        print(f"{mode:<14}{f.repo_opens:>12.0f}{f.index_loads:>11.0f}{f.packs_opened:>14.0f}"
              f"{f.cpu_s:>14.2f}")
    print(f"CPU affinity/round-robin: {aff.cpu_s / rr.cpu_s:.2f}")

    # With affinity, every repository is opened by exactly one process; round-robin opens
    # most of them on every process.
    assert aff.repo_opens == REPOS
    assert aff.packs_opened == REPOS
    assert rr.repo_opens >= 2 * REPOS

    # Which process serves which repository (nginx's log of the affinity rounds).
    owner: dict[str, str] = {}
    for fields in fleet.access_log():
        method, uri, status, repo, upstream = fields[:5]
        assert status == "200", fields
        assert owner.setdefault(repo, upstream) == upstream, f"{repo} moved between replicas"
    assert len(owner) == REPOS
    victim = fleet.servers[1]
    victim_addr = f"127.0.0.1:{victim.port}"
    victim_repos = sorted(r.strip("/") for r, u in owner.items() if u == victim_addr)
    assert victim_repos, "the hash put no repository on the second process"
    log_lines_before = len(fleet.access_log())
    first_failures: dict[str, str] = {}
    retried_ok: list[str] = []

    def one(name: str) -> None:
        target = dest / ("kill-" + name)
        res = _clone(git, f"{fleet.url}/{name}", target)
        if res.returncode != 0:
            # A clean failure: git says why and leaves no half-made clone behind.
            first_failures[name] = res.stderr.decode(errors="replace").strip()
            assert not target.exists()
            for _attempt in range(3):
                time.sleep(0.2)  # the scenario: a user's retry, a moment later
                res = _clone(git, f"{fleet.url}/{name}", target)
                if res.returncode == 0:
                    retried_ok.append(name)
                    break
            assert res.returncode == 0, res.stderr.decode(errors="replace")
        fsck(git, target)

    # Kill round: every repository once more, the victim's first, 6 at a time; the victim is
    # SIGKILLed as soon as it has requests in flight.
    order = victim_repos + sorted(r.strip("/") for r in owner if r.strip("/") not in victim_repos)
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(one, name) for name in order]
        # Two requests in flight make it likely that one is sending its pack (a clone that
        # fails mid-response), the other not answering yet (nginx moves it).
        busy = wait_until(lambda: _metric(victim, "gitspout_requests_in_flight") >= 2, 20,
                          step=0.005)
        assert busy or wait_until(lambda: _metric(victim, "gitspout_requests_in_flight") >= 1,
                                  10, step=0.005), "no request ever in flight on the victim"
        os.kill(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait(timeout=10)
        for fut in futures:
            fut.result()

    # What nginx did with the requests of the kill round.
    kill_round = fleet.access_log()[log_lines_before:]
    nginx_retried = [f for f in kill_round if victim_addr in f[4] and "," in f[4]]
    print(f"kill round: victim {victim_addr} owned {len(victim_repos)} of {REPOS} small "
          f"repositories; {len(first_failures)} clones failed and then succeeded "
          f"on retry ({sorted(first_failures)}); {len(nginx_retried)} requests nginx moved "
          f"to another replica before answering")
    for name, err in first_failures.items():
        print(f"  {name}: {err.splitlines()[-1] if err else '(no message)'}")
    # Something was in flight on the victim: a clone failed (cleanly, above: git said why
    # and left nothing behind) or nginx moved a request that had no answer yet.
    assert first_failures or nginx_retried
    for err in first_failures.values():
        assert err.splitlines()[-1].startswith(("error:", "fatal:")), err
    # Only clones of the victim's repositories were affected, and each retry succeeded.
    assert set(first_failures) <= set(victim_repos), (first_failures, victim_repos)
    assert sorted(retried_ok) == sorted(first_failures)
    # The survivors are fine and answered no 5xx.
    for s in fleet.servers:
        if s is not victim:
            assert s.alive()
            assert _metric(s, "gitspout_requests_total", 'status="5') == 0
