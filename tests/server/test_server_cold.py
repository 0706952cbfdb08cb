"""The cold path: the first request for a repository in a fresh server process.

Each case starts its own gitspout, runs one client operation as the first request and
prints the server's CPU time for it (from /proc/PID/stat). The targets (a cold bitmapped
clone at most C git's CPU, and so on) are judged by ``python -m bench.run``, against
git-http-backend on the same machine: this checks that each cold case works, and reports
its figure (``pytest -s`` shows it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from gitutil import Committer, Git, git_env, start_server

TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def _run(git: Git, args: list[str], cwd: Path | None = None) -> float:
    t0 = time.monotonic()
    subprocess.run(["git", *args], cwd=cwd, env=git_env(git.home), check=True,
                   capture_output=True, timeout=300)
    return time.monotonic() - t0


def _cold(git: Git, root: Path, args: list[str], what: str, cwd: Path | None = None) -> None:
    server = start_server(root)
    try:
        pid = server.proc.pid
        before = _cpu_s(pid)
        wall = _run(git, [a.replace("URL", server.url) for a in args], cwd)
        time.sleep(0.05)
        print(f"\ncold {what}: server CPU {1000 * (_cpu_s(pid) - before):.0f} ms, "
              f"client wall {wall:.2f} s")
    finally:
        server.stop()


@pytest.mark.slow
def test_cold_bitmapped_clone(git: Git, long_root: Path, tmp_path: Path) -> None:
    _cold(git, long_root, ["clone", "-q", "--mirror", "URL/long.git", str(tmp_path / "c")],
          "bitmapped clone of long.git")
    assert (tmp_path / "c" / "packed-refs").exists()
    subprocess.run(["git", "fsck", "--no-progress"], cwd=tmp_path / "c", check=True,
                   env=git_env(git.home), capture_output=True)


@pytest.mark.slow
def test_cold_fetch_of_one_commit(git: Git, long_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    served = root / "long.git"
    shutil.copytree(long_root / "long.git", served, symlinks=True)
    base = tmp_path / "base"
    git.run("clone", "-q", "--mirror", str(served), str(base))
    work = tmp_path / "work"
    git.run("clone", "-q", str(served), str(work))
    new = Committer(git, work, start=1_800_000_000).commit({"new.txt": "one more\n"}, "new")
    git.run("push", "-q", "origin", "HEAD:main", cwd=work)
    _cold(git, root, ["-c", "protocol.version=2", "--git-dir", str(base), "fetch", "-q",
                      "URL/long.git", "+refs/heads/*:refs/heads/*"], "fetch of one new commit")
    assert git.out("--git-dir", str(base), "rev-parse", "main").strip() == new


@pytest.mark.slow
def test_cold_advertisement_of_100k_refs(git: Git, long_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    served = root / "many.git"
    shutil.copytree(long_root / "long-plain.git", served, symlinks=True)
    tip = git.out("rev-parse", "main", cwd=served).strip()
    with open(served / "packed-refs", "a") as fh:
        fh.writelines(f"{tip} refs/heads/b{i:06d}\n" for i in range(100_000))
    _cold(git, root, ["-c", "protocol.version=2", "ls-remote", "-q", "URL/many.git"],
          "advertisement of 100k refs (v2 ls-refs)")
    server = start_server(root)
    try:  # and the answer is complete
        refs = git.out("-c", "protocol.version=2", "ls-remote", f"{server.url}/many.git")
    finally:
        server.stop()
    assert refs.count("refs/heads/b") == 100_000
