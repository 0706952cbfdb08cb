"""The cold path: the first request for a repository in a fresh server process.

Each case starts its own gitspout, runs one client operation as the first request and
prints the server's CPU time for it (from /proc/PID/stat). The targets (a cold bitmapped
clone at most C git's CPU, and so on) are judged by ``python -m bench.run``, against
git-http-backend on the same machine: this checks that each cold case works, and reports
its figure (``pytest -s`` shows it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from gitutil import Committer, Git, git_env, poll, start_server

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


def _cold(git: Git, root: Path, args: list[str], what: str, last: str,
          cwd: Path | None = None) -> None:
    """Run ``args`` against a fresh server; print the server's CPU time once the access log
    has the operation's ``last`` command (the server has accounted for all of it)."""
    server = start_server(root, ["--log-format", "json"])
    try:
        pid = server.proc.pid
        before = _cpu_s(pid)
        wall = _run(git, [a.replace("URL", server.url) for a in args], cwd)
        server.wait_for_line(f'"command":"{last}"', timeout=30)
        print(f"\ncold {what}: server CPU {1000 * (_cpu_s(pid) - before):.0f} ms, "
              f"client wall {wall:.2f} s")
    finally:
        server.stop()


@pytest.mark.slow
def test_cold_bitmapped_clone(git: Git, long_root: Path, tmp_path: Path) -> None:
    _cold(git, long_root, ["clone", "-q", "--mirror", "URL/long.git", str(tmp_path / "c")],
          "bitmapped clone of long.git", "fetch")
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
                      "URL/long.git", "+refs/heads/*:refs/heads/*"], "fetch of one new commit",
          "fetch")
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
          "advertisement of 100k refs (v2 ls-refs)", "ls-refs")
    server = start_server(root)
    try:  # and the answer is complete
        refs = git.out("-c", "protocol.version=2", "ls-remote", f"{server.url}/many.git")
    finally:
        server.stop()
    assert refs.count("refs/heads/b") == 100_000


# -- a few new commits from a large pack, cold: a walk instead of the reverse index ---------

def _lines(n: int, tag: str) -> str:
    return "".join(f"{tag} line {i}: some words to make the file worth a delta\n" for i in range(n))


def _advanced(git: Git, tmp_path: Path, new_commits: int) -> tuple[Path, Path, str]:
    """A served repository (one bitmapped pack) and a bare clone of it from before its last
    ``new_commits`` commits. The first new commit shortens a long file: git then stores the
    new, smaller version as a delta against the old one, which the client has. Returns
    (served, client, shortened blob id)."""
    work = tmp_path / "work"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    for i in range(6):
        c.commit({"long.txt": _lines(400, "long"), f"src/f{i}.txt": _lines(40, f"f{i}"),
                  "README": f"v{i}\n"}, f"c{i}")
    root = tmp_path / "root"
    served = root / "r.git"
    git.run("clone", "-q", "--bare", "--no-local", str(work), str(served))
    client = tmp_path / "client.git"
    git.run("clone", "-q", "--bare", "--no-local", str(served), str(client))
    c.commit({"long.txt": _lines(360, "long"), "src/f0.txt": _lines(41, "f0"),
              "src/new.txt": "a new file\n"}, "shorten")
    for i in range(1, new_commits):
        c.commit({"README": f"after {i}\n", f"src/f{i % 6}.txt": _lines(40 + i, f"f{i % 6}")},
                 f"n{i}")
    git.run("push", "-q", str(served), "main", cwd=work)
    git.run("repack", "-adq", "--write-bitmap-index", cwd=served)
    git.run("commit-graph", "write", "--reachable", cwd=served)
    return served, client, git.out("rev-parse", "main:long.txt", cwd=served).strip()


def _fetch_cold(git: Git, served: Path, client: Path, protocol: str,
                args: list[str]) -> tuple[str, list[dict[str, object]]]:
    """Fetch main into ``client`` from a fresh server (first request for the repository):
    the client's stderr and the server's fetch log records."""
    import json

    server = start_server(served.parent, [*args, "--log-format", "json"])
    try:
        proc = subprocess.run(
            ["git", "-c", f"protocol.version={protocol}", "--git-dir", str(client), "fetch",
             "--no-auto-gc", "--progress", f"{server.url}/{served.name}",
             "+refs/heads/*:refs/heads/*"],
            env=git_env(git.home), capture_output=True, text=True, timeout=120, check=True)

        def fetches() -> list[dict[str, object]] | None:
            """The fetch records, once the one that sent the pack is logged (after its
            response is done)."""
            got = [json.loads(line) for line in list(server.lines)
                   if line.startswith("{") and '"command":"fetch"' in line]
            return got if any(r["objects"] for r in got) else None

        logs = poll(fetches, 30, "the access-log line of the fetch that sent the pack")
    finally:
        server.stop()
    return proc.stderr, logs


@pytest.mark.parametrize("protocol", ["0", "2"])
def test_cold_small_fetch_walks_and_keeps_stored_deltas(git: Git, tmp_path: Path,
                                                        protocol: str) -> None:
    """With a pack over --cold-walk-pack-entries and no reverse index loaded yet, a fetch
    of a few new commits is walked and its objects written afresh. The pack holds what a
    fetch over file:// (C git's upload-pack) gives, passes fsck, and keeps the stored delta
    of the shortened file against the old version the client has (a thin REF_DELTA)."""
    served, client, short = _advanced(git, tmp_path, new_commits=3)
    stored = git.out("verify-pack", "-v", *map(str, served.glob("objects/pack/*.idx")))
    assert any(line.startswith(short) and len(line.split()) == 7 for line in stored.splitlines()), \
        "precondition: git stored the shortened file as a delta"
    twin = tmp_path / "twin.git"
    shutil.copytree(client, twin, symlinks=True)
    git.run("--git-dir", str(twin), "fetch", "-q", "--no-auto-gc", f"file://{served}",
            "+refs/heads/*:refs/heads/*")
    err, logs = _fetch_cold(git, served, client, protocol, ["--cold-walk-pack-entries", "10"])
    assert [r["pack_source"] for r in logs if r["objects"]] == ["walk"], logs
    match = re.search(r"Total \d+ \(delta \d+\), reused \d+ \(delta (\d+)\)", err)
    assert match and int(match[1]) >= 1, err  # the stored delta, not a new one
    git.run("--git-dir", str(client), "fsck", "--no-progress", "--strict")
    for repo in (client, twin):
        git.run("--git-dir", str(repo), "repack", "-adq")

    def objects(repo: Path) -> set[str]:
        return set(git.out("--git-dir", str(repo), "rev-list", "--objects", "--all").split())

    assert git.out("--git-dir", str(client), "rev-parse", "main") == \
        git.out("--git-dir", str(served), "rev-parse", "main")
    assert objects(client) == objects(twin)


@pytest.mark.parametrize("args, new_commits", [([], 3), (["--cold-walk-pack-entries", "0"], 3),
                                               (["--cold-walk-pack-entries", "10"], 20)])
def test_cold_fetch_uses_bitmaps_otherwise(git: Git, tmp_path: Path, args: list[str],
                                           new_commits: int) -> None:
    """A pack under the default --cold-walk-pack-entries, the walk turned off, or more new
    commits than the short walk takes (it gives up and the bitmaps answer): the bitmaps."""
    served, client, _ = _advanced(git, tmp_path, new_commits)
    _, logs = _fetch_cold(git, served, client, "2", args)
    assert [r["pack_source"] for r in logs if r["objects"]] == ["bitmap"], logs
    git.run("--git-dir", str(client), "fsck", "--no-progress")
    assert git.out("--git-dir", str(client), "rev-parse", "main") == \
        git.out("--git-dir", str(served), "rev-parse", "main")
