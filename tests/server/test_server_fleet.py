"""A fleet of small repositories under tight budgets (docs/ARCHITECTURE.md I1; README.md,
"Open files").

320 bitmapped repositories (one template built with git, then copied under other names),
each cloned once with the real git client and fsck'ed, against one gitspout started with
``--max-open-packs 8 --cache-memory 8MiB``. Afterwards the server holds at most the budget
in pack and commit-graph descriptors and maps, over the descriptors it had before the first
request (plus a few sockets that may still be closing), and its RSS grew by at most the
memory budget plus a fixed allowance.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from gitutil import Committer, Git, git_env, open_files, start_server, wait_until

REPOS = 320
BUDGET = 8
MEMORY = 8 << 20  # --cache-memory 8MiB
SOCKET_SLACK = 4  # connections of the last clients, which the server may still be closing
RSS_SLACK = 32 << 20  # what a Python process grows by anyway (allocator arenas, imports)


def _template(git: Git, where: Path) -> Path:
    work = where / "work"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    for i in range(4):
        c.commit({f"src/f{i}.txt": f"line {i}\n" * 20, "README": f"v{i}\n"}, f"c{i}")
    c.tag("v1", "release 1")
    tpl = where / "template.git"
    git.run("clone", "-q", "--bare", "--no-local", str(work), str(tpl))
    git.run("config", "gc.auto", "0", cwd=tpl)
    git.run("repack", "-adq", "--write-bitmap-index", cwd=tpl)
    git.run("commit-graph", "write", "--reachable", cwd=tpl)
    return tpl


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return -1.0


def _pack_files(pid: int, root: Path) -> tuple[list[str], list[str]]:
    """Descriptors and maps of the server that are files under ``root``."""
    top = str(root) + "/"
    fds = [t for t in open_files(pid) if t.startswith(top)]
    with open(f"/proc/{pid}/maps") as fh:
        maps = sorted({line.split(None, 5)[5].strip() for line in fh
                       if len(line.split(None, 5)) == 6 and line.split(None, 5)[5].startswith(top)})
    return fds, maps


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fleet_of_repositories_within_the_open_file_budget(git: Git, tmp_path: Path) -> None:
    tpl = _template(git, tmp_path)
    root = tmp_path / "fleet"
    for i in range(REPOS):
        shutil.copytree(tpl, root / f"team{i % 8}" / f"repo{i:04d}.git", symlinks=True)
    server = start_server(root, ["--max-open-packs", str(BUDGET), "--cache-memory", str(MEMORY),
                                 "--sweep-interval", "0"])
    env = git_env(git.home)
    scratch = tmp_path / "clones"
    scratch.mkdir()
    try:
        pid = server.proc.pid
        baseline = len(open_files(pid))
        rss_before = _rss_kb(pid)

        def clone(i: int) -> str | None:
            path = f"team{i % 8}/repo{i:04d}.git"
            dest = scratch / f"c{i}"
            version = "2" if i % 3 else "0"
            res = subprocess.run(["git", "-c", f"protocol.version={version}", "clone", "-q",
                                  "--bare", f"{server.url}/{path}", str(dest)],
                                 env=env, capture_output=True, text=True, timeout=120)
            if res.returncode == 0:
                res = subprocess.run(["git", "fsck", "--no-progress", "--no-dangling"], cwd=dest,
                                     env=env, capture_output=True, text=True, timeout=120)
            shutil.rmtree(dest, ignore_errors=True)
            return None if res.returncode == 0 else f"{path}: {res.stderr.strip()}"

        with ThreadPoolExecutor(4) as pool:
            failures = [f for f in pool.map(clone, range(REPOS)) if f]
        assert not failures, f"{len(failures)} clones failed: " + "\n".join(failures[:5])
        # <= 1: the scrape itself
        assert wait_until(lambda: _metric(server.url, "gitspout_requests_in_flight") <= 1, 10)

        fds, maps = _pack_files(pid, root)
        total = len(open_files(pid))
        rss_after = _rss_kb(pid)
        print(f"\nfleet: {REPOS} clones; fds {baseline} -> {total} ({len(fds)} pack files, "
              f"{len(maps)} mapped); RSS {rss_before} -> {rss_after} KiB")
        # Python's mmap keeps a descriptor of its own: every map is also one of the fds.
        assert len(fds) <= BUDGET and set(maps) <= set(fds), "\n".join(["fds:", *fds, "maps:", *maps])
        assert total <= baseline + BUDGET + SOCKET_SLACK, open_files(pid)
        assert _metric(server.url, 'gitspout_open_files_closed_total{reason="evicted"}') > 0
        assert 0 < _metric(server.url, "gitspout_cache_memory_bytes") <= MEMORY
        assert (rss_after - rss_before) * 1024 <= MEMORY + RSS_SLACK
        assert os.path.isdir(root)
    finally:
        server.stop()
