"""Reftable ref churn: server CPU of big ref listings from a reftable repository, gitspout
beside C git's git-http-backend (issue 26), the reftable twin of the CPU rows of
``bench.syscalls``.

    python -m bench.reftable_churn --git GIT [--refs 100000] [--rounds 5]
                                   [--states warm,appended,compacted,racy,fresh]

Requests (as in bench.syscalls): v0 ``GET info/refs``, v2 ``ls-refs`` with ``git clone``'s
prefixes, v2 ``ls-refs`` with peel and symrefs and no prefix (``git ls-remote``). States,
each the same change made once before both servers' measured requests:

* ``warm``: the request repeats the previous one;
* ``appended``: one ref moved with ``git update-ref`` and auto-compaction off, so one
  table is appended to the stack (git 2.55 has no config for it: the switch is the
  environment variable ``GIT_TEST_REFTABLE_AUTOCOMPACTION=false``, refs/reftable-backend.c);
* ``compacted``: the ref moved, then ``git pack-refs --all``: the whole stack is compacted
  into one new table (a new name, so every record is read again);
* ``racy``: a thread moves the ref every 0.5 s while the rounds run (git's default
  geometric auto-compaction on);
* ``fresh``: the first request after gitspout restarted (git-http-backend always is).

Every round's two answers are compared (capabilities aside): the servers must list the
same refs. Figures: the median over ``--rounds`` rounds of each server's cgroup CPU
(children included), and the peak RSS of each.

The CI's git (2.39) neither writes nor reads reftables: the fixture and the reference
server come from a git >= 2.45 named by ``--git`` or ``$GITSPOUT_BENCH_GIT`` (its
executable or a build directory; a build's ``bin-wrappers/git`` works), whose exec path
holds ``git-http-backend``. The fixture (``bench/work/reftable-<refs>/``, reused unless
``--force``): ``root/base.git`` (500 commits, an annotated and a lightweight tag, gc'ed)
and ``root/manyrefs.git``, the same plus *refs* branches written by one ``git update-ref
--stdin`` and compacted into one table.

Needs root (cgroups), ``nginx``, ``fcgiwrap``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.client import client_env, git_out, run_git  # noqa: E402
from bench.process import exit_on_sigterm  # noqa: E402
from bench.syscalls import (  # noqa: E402
    BASE_COMMITS,
    BASE_DATE,
    BUMP_REF,
    Fixture,
    PeakRss,
    RefBumper,
    _fast_import,
    cpu_table,
    history_stream,
    measure_cpu,
    snapshot_gitspout,
    start_fixture,
    started,
)

BENCH_DIR = Path(__file__).resolve().parent
GIT_VAR = "GITSPOUT_BENCH_GIT"
MIN_VERSION = (2, 45)  # the first git with --ref-format=reftable
STATES = ("warm", "appended", "compacted", "racy", "fresh")
SUGGESTED = "/work/gitsuite-build/git-2.55.0-fresh/bin-wrappers/git"


class GitMissing(RuntimeError):
    """No usable reftable-capable git was named."""


@dataclass(frozen=True)
class ReftableGit:
    """A git that reads and writes reftables, and its git-http-backend."""

    git: Path
    exec_path: str
    version: str

    def env(self) -> dict[str, str]:
        """Client environment in which ``git`` is this one."""
        return client_env({"PATH": f"{self.git.parent}:{os.environ.get('PATH', '')}",
                           "GIT_EXEC_PATH": self.exec_path})

    @property
    def http_backend(self) -> str:
        return os.path.join(self.exec_path, "git-http-backend")


def find_git(arg: str | None) -> ReftableGit:
    """The git named by ``--git`` or ``$GITSPOUT_BENCH_GIT`` (a file, or a build directory
    with ``bin-wrappers/git``); :class:`GitMissing` says what is wrong."""
    named = arg or os.environ.get(GIT_VAR)
    hint = (f"name a git >= {'.'.join(map(str, MIN_VERSION))} with --git PATH or "
            f"${GIT_VAR} (e.g. {SUGGESTED}); the system git cannot write or read reftables")
    if not named:
        raise GitMissing(f"no git given: {hint}")
    path = Path(named)
    if path.is_dir():
        path = next((p for p in (path / "bin-wrappers" / "git", path / "git") if p.is_file()),
                    path / "git")
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise GitMissing(f"{path} is not an executable git: {hint}")
    env = client_env()
    try:
        version = subprocess.run([str(path), "--version"], capture_output=True, text=True,
                                 env=env, timeout=30, check=True).stdout.strip()
        exec_path = subprocess.run([str(path), "--exec-path"], capture_output=True, text=True,
                                   env=env, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise GitMissing(f"{path} does not run: {exc}; {hint}") from exc
    m = re.match(r"git version (\d+)\.(\d+)", version)
    if not m or (int(m[1]), int(m[2])) < MIN_VERSION:
        raise GitMissing(f"{path} is {version!r}: {hint}")
    found = ReftableGit(path, exec_path, version)
    if not os.access(found.http_backend, os.X_OK):
        raise GitMissing(f"{found.http_backend} missing (the exec path of {path}): {hint}")
    return found


class ReftableBumper(RefBumper):
    """The bump ref of :class:`RefBumper` in a reftable stack: ``appended`` adds one table
    (auto-compaction off), ``compacted`` rewrites the stack as one table; the racy thread
    leaves git's auto-compaction on. ``remove`` also compacts, so each run starts from one
    table."""

    def __init__(self, repo: Path, env: dict[str, str]) -> None:
        super().__init__(repo, env)
        self.append_env = {**env, "GIT_TEST_REFTABLE_AUTOCOMPACTION": "false"}

    def remove(self) -> None:
        super().remove()
        self.git("pack-refs", "--all")

    def change(self, state: str) -> None:
        if state == "appended":
            self(env=self.append_env)
        elif state == "compacted":
            self.repack()

    def tables(self) -> int:
        """Tables in the stack now."""
        return len((self.repo / "reftable" / "tables.list").read_text().split())


def build_fixture(work: Path, refs: int, git: ReftableGit, force: bool = False) -> Fixture:
    """Build (or reuse) the reftable fixture under *work*; see the module docstring."""
    fx = Fixture(work, [], refs=refs)
    stamp = work / f".built-reftable-{refs}"
    if not start_fixture(fx, stamp, force):
        return fx
    env = git.env()
    base = fx.root / fx.repo

    def g(repo: Path, *args: str, stdin: bytes | None = None) -> None:
        run_git(["--git-dir", str(repo), *args], env=env, input=stdin, timeout=3600)

    run_git(["init", "-q", "--bare", "-b", "main", "--ref-format=reftable", str(base)], env=env)
    _fast_import(base, history_stream(BASE_COMMITS, BASE_DATE, None, "base"), env)
    tagger = {"GIT_COMMITTER_NAME": "B", "GIT_COMMITTER_EMAIL": "b@example.org",
              "GIT_COMMITTER_DATE": f"{BASE_DATE} +0000"}
    run_git(["--git-dir", str(base), "tag", "-a", "-m", "v1", "v1", "main~100"],
            env={**env, **tagger})
    g(base, "tag", "v0-light", "main~200")
    g(base, "-c", "repack.writeBitmaps=true", "-c", "gc.writeCommitGraph=true",
      "gc", "-q", "--prune=now")
    many = fx.root / fx.manyrefs
    shutil.copytree(base, many, symlinks=True)
    commits = git_out(["--git-dir", str(base), "rev-list", "main"], env=env).split()
    stdin = "".join(f"create refs/heads/many/b{i:06d} {commits[i % len(commits)]}\n"
                    for i in range(refs)).encode()
    g(many, "update-ref", "--stdin", stdin=stdin)
    g(many, "pack-refs", "--all")
    stamp.write_text("ok\n")
    return fx


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--git", help=f"a git >= 2.45 (default ${GIT_VAR})")
    ap.add_argument("--refs", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5, help="rounds per row (median)")
    ap.add_argument("--states", default=",".join(STATES), help="comma list of " +
                    ",".join(STATES))
    ap.add_argument("--work", type=Path, help="fixture dir (default bench/work/reftable-REFS)")
    ap.add_argument("--force", action="store_true", help="rebuild the fixture")
    ap.add_argument("--gitspout-rev", default="HEAD", metavar="REV",
                    help="gitspout revision to measure (a frozen copy); 'worktree' for the "
                         "working tree as it is at the start")
    args = ap.parse_args(argv)
    exit_on_sigterm()
    try:
        git = find_git(args.git)
    except GitMissing as exc:
        print(f"bench.reftable_churn: {exc}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("needs root (cgroups)", file=sys.stderr)
        return 2
    states = [s for s in args.states.split(",") if s]
    if unknown := set(states) - set(STATES):
        ap.error(f"unknown states {sorted(unknown)}")
    t0 = time.monotonic()
    fx = build_fixture(args.work or BENCH_DIR / "work" / f"reftable-{args.refs}", args.refs,
                       git, args.force)
    print(f"fixture {fx.work} ready in {time.monotonic() - t0:.1f}s", flush=True)
    with tempfile.TemporaryDirectory(prefix="gitspout-reftable-") as tmp:
        what, env = snapshot_gitspout(args.gitspout_rev, Path(tmp) / "gitspout-src")
        print(f"gitspout {what}; {git.version} ({git.git}); load average "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        c_git = {"backend": git.http_backend, "backend_env": {"GIT_EXEC_PATH": git.exec_path}}
        bump = ReftableBumper(fx.root / fx.manyrefs, git.env())
        with started(["gitspout", "c-git"], fx.root, env, c_git) as servers, \
                PeakRss(servers) as rss:
            rows = measure_cpu(servers, fx, args.rounds, states, bump)
        print(f"\n== Server CPU (cgroup, children included), {fx.refs:,}-ref reftable "
              f"repository, median of {args.rounds} alternating rounds; gitspout {what}, "
              f"{git.version} ==")
        print(cpu_table(rows, ["gitspout", "c-git"]))
        print(rss.line(fx.refs))
        print(f"{BUMP_REF} moved in the changed states; stack at the end: "
              f"{bump.tables()} table(s); load average at the end {os.getloadavg()[0]:.2f}")
    return 1 if any(r.differ for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
