"""Torture: clones run continuously while the repository is rewritten under them.

One gitspout serves a bare repository.  ``CLIENTS`` threads clone it in a
loop (protocol v0 and v2 alternating, every third clone ``--depth 1``), each
clone followed by ``git fsck`` (every clone is checked, not a sample), while a
writer thread loops: commit + push, ``git repack -ad``, commit + push,
``git gc --prune=now``, commit + push, ``git pack-refs --all``.  Nothing is
ever made unreachable (the writer only adds commits), so every clone must
succeed whatever the timing: packs disappearing under an open request, loose
refs turning into packed refs, loose objects being packed and pruned.

The run stops when ``TARGET`` clones have completed and the writer has done
``MIN_WRITER_ROUNDS`` rounds, or after ``BUDGET_S`` seconds; it must reach
both with no failure.  Each failure is
recorded with the clone's stderr and the server log lines around it.

``GITSPOUT_TORTURE_ON_MOUNT=1`` also runs the loop with the repository on a
latencyfs mount (0.2 ms per metadata request; writer and server both work
through it), with 2 clients and half the clone target.
"""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import pytest
from gitutil import Committer, Git, git_env, start_server
from mount import MountFactory

CLIENTS = 4
TARGET = 200
MIN_WRITER_ROUNDS = 3      # each: push, repack -ad, push, gc --prune=now, push, pack-refs
BUDGET_S = float(os.environ.get("GITSPOUT_TORTURE_SECONDS", "60"))
CLONE_TIMEOUT = 60.0
VARIANTS = (("2", ()), ("0", ()), ("2", ("--depth", "1")),
            ("0", ()), ("2", ()), ("0", ("--depth", "1")))


class ServerLog:
    """Tee for ``sys.stderr`` keeping the server's lines (``[gitspout] ...``,
    written there by gitutil's drain thread) in a bounded buffer."""

    def __init__(self, keep: int = 4000) -> None:
        self.lines: collections.deque[tuple[float, str]] = collections.deque(maxlen=keep)
        self._lock = threading.Lock()
        self._orig: TextIO | None = None

    def write(self, text: str) -> int:
        if text.startswith("[gitspout]"):
            with self._lock:
                self.lines.append((time.monotonic(), text.rstrip("\n")))
        return self._orig.write(text) if self._orig else len(text)

    def flush(self) -> None:
        if self._orig:
            self._orig.flush()

    def between(self, start: float, end: float, pad: float = 0.5) -> list[str]:
        with self._lock:
            return [line for t, line in self.lines if start - pad <= t <= end + pad]

    def __enter__(self) -> ServerLog:
        self._orig = sys.stderr
        sys.stderr = self  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        sys.stderr = self._orig  # type: ignore[assignment]


@dataclass
class Failure:
    what: str
    returncode: int | None
    stderr: str
    server_log: list[str]
    writer_ops: list[str]

    def __str__(self) -> str:
        log = "\n    ".join(self.server_log[-40:]) or "(no server output)"
        return (f"{self.what}: exit {self.returncode}\n  stderr: {self.stderr.strip()}\n"
                f"  writer steps overlapping it: {', '.join(self.writer_ops) or 'none'}\n"
                f"  server log (JSON lines of the requests around it):\n    {log}")


@dataclass
class Torture:
    git: Git
    url: str
    repo: Path
    scratch: Path
    log: ServerLog
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    clones: int = 0
    by_variant: collections.Counter[str] = field(default_factory=collections.Counter)
    failures: list[Failure] = field(default_factory=list)
    target: int = TARGET
    writer_rounds: int = 0
    writer_ops: collections.Counter[str] = field(default_factory=collections.Counter)
    #: (start, end, step) of every writer step, to tell which ones a failure overlapped
    timeline: list[tuple[float, float, str]] = field(default_factory=list)
    current: tuple[float, str] | None = None   # the writer step under way
    summary: str = ""

    def run_git(self, args: list[str], cwd: Path | None = None,
                timeout: float = CLONE_TIMEOUT) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=cwd, env=git_env(self.git.home),
                              capture_output=True, text=True, timeout=timeout, check=False)

    def fail(self, what: str, started: float, res: subprocess.CompletedProcess[str] | None,
             err: str = "") -> None:
        end = time.monotonic()
        with self.lock:
            steps = [f"{step} ({s0 - started:+.2f}s..{s1 - started:+.2f}s)"
                     for s0, s1, step in self.timeline if s0 <= end and s1 >= started]
            if self.current is not None:
                steps.append(f"{self.current[1]} ({self.current[0] - started:+.2f}s..running)")
            self.failures.append(Failure(
                what, res.returncode if res else None, (res.stderr if res else "") + err,
                self.log.between(started, end), steps))

    def step(self, name: str, args: list[str], cwd: Path) -> None:
        """One writer step, timed into the timeline."""
        t0 = time.monotonic()
        with self.lock:
            self.current = (t0, name)
        res = self.run_git(args, cwd=cwd)
        with self.lock:
            self.current = None
            self.timeline.append((t0, time.monotonic(), name))
            self.writer_ops[name.split()[0]] += 1
        if res.returncode != 0:
            self.fail(f"writer {name}", t0, res)

    # -- clients -------------------------------------------------------------
    def client(self, ident: int) -> None:
        n = 0
        while not self.stop.is_set():
            version, extra = VARIANTS[(ident + n) % len(VARIANTS)]
            n += 1
            label = f"v{version}{' ' + ' '.join(extra) if extra else ''}"
            dest = self.scratch / f"c{ident}-{n}"
            t0 = time.monotonic()
            try:
                self.clone_once(dest, version, extra, label, t0)
            except subprocess.TimeoutExpired as exc:
                self.fail(f"client {ident} clone #{n} {label}", t0, None, f"timeout: {exc}")
            finally:
                shutil.rmtree(dest, ignore_errors=True)

    def clone_once(self, dest: Path, version: str, extra: tuple[str, ...], label: str,
                   t0: float) -> None:
        res = self.run_git(["-c", f"protocol.version={version}", "clone", "-q", "--bare",
                            *extra, self.url, str(dest)])
        if res.returncode != 0:
            self.fail(f"clone {label}", t0, res)
            return
        res = self.run_git(["fsck", "--no-progress", "--no-dangling"], cwd=dest)
        if res.returncode != 0 or res.stdout.strip():
            self.fail(f"fsck of clone {label}", t0, res, res.stdout)
            return
        with self.lock:
            self.clones += 1
            self.by_variant[label] += 1
            self.maybe_done()

    def maybe_done(self) -> None:
        """Stop once both the clone target and the writer rounds are reached."""
        if self.clones >= self.target and self.writer_rounds >= MIN_WRITER_ROUNDS:
            self.stop.set()

    # -- writer -------------------------------------------------------------
    def writer(self) -> None:
        t0 = time.monotonic()
        try:
            self.write_loop()
        except Exception as exc:  # noqa: BLE001 - reported as a failure of the run
            self.fail("writer crashed", t0, None, repr(exc))

    def write_loop(self) -> None:
        work = self.scratch / "writer"
        self.git.run("clone", "-q", str(self.repo), str(work))
        c = Committer(self.git, work, start=1_700_000_000)
        maintenance = (["repack", "-adq"], ["gc", "-q", "--prune=now"],
                       ["pack-refs", "--all"])
        i = 0
        while not self.stop.is_set():
            for task in maintenance:
                if self.stop.is_set():
                    break
                i += 1
                c.commit({f"d{i % 7}/f{i}.txt": f"writer {i}\n" * (20 + i % 50),
                          "README.md": f"# torture\n\nround {i}\n"}, f"writer {i}", step=60)
                self.step("push", ["push", "-q", "origin", "HEAD:main"], work)
                self.step(" ".join(task), task, self.repo)
            with self.lock:
                self.writer_rounds += 1
                self.maybe_done()


def _base_repo(git: Git, where: Path) -> Path:
    """A small gc'ed bare repository with a few refs (some packed, some loose)."""
    work = where / "seed"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work, start=1_690_000_000)
    for i in range(20):
        c.commit({f"src/m{i % 4}.py": "".join(f"x{j} = {i}\n" for j in range(30 + i)),
                  "README.md": f"# torture\n\nseed {i}\n"}, f"seed {i}")
        if i in (5, 12):
            c.tag(f"v{i}", f"tag {i}")
    repo = where / "served" / "torture.git"
    git.run("clone", "-q", "--bare", "--no-local", str(work), str(repo))
    git.run("config", "gc.auto", "0", cwd=repo)
    git.run("gc", "-q", cwd=repo)
    git.run("branch", "side", "main~3", cwd=repo)
    return repo


def _torture(git: Git, repo: Path, root: Path, scratch: Path, clients: int = CLIENTS,
             target: int = TARGET) -> Torture:
    # The tee is installed in the test body: pytest re-installs its own
    # sys.stderr capture at the start of each phase.
    with ServerLog() as log:
        return _run(git, repo, root, scratch, log, clients, target)


def _run(git: Git, repo: Path, root: Path, scratch: Path, log: ServerLog, clients: int,
         target: int) -> Torture:
    server = start_server(root)
    try:
        t = Torture(git, f"{server.url}/{repo.relative_to(root)}", repo, scratch, log,
                    target=target)
        threads = [threading.Thread(target=t.writer, name="writer", daemon=True)]
        threads += [threading.Thread(target=t.client, args=(k,), name=f"client{k}", daemon=True)
                    for k in range(clients)]
        start = time.monotonic()
        for th in threads:
            th.start()
        t.stop.wait(BUDGET_S)
        t.stop.set()
        for th in threads:
            th.join(CLONE_TIMEOUT * 2 + 30)
        elapsed = time.monotonic() - start
        assert server.alive(), "gitspout died during the torture run"
    finally:
        server.stop()
    fsck = git.run("fsck", "--no-progress", "--no-dangling", cwd=repo, check=False)
    assert fsck.returncode == 0, f"served repository damaged: {fsck.stderr.decode()}"
    t.summary = (f"torture: {t.clones} clones, each fsck-clean, {len(t.failures)} failures, "
                 f"{elapsed:.1f}s, {clients} clients; by variant {dict(t.by_variant)}; "
                 f"writer {dict(t.writer_ops)}")
    print("\n" + t.summary)
    return t


def _check(t: Torture) -> None:
    if t.failures:
        report = t.scratch.parent / "torture-failures.txt"
        report.write_text("\n\n".join(map(str, t.failures)) + "\n")
        t.summary += f"; all failures with server logs in {report}"
    assert not t.failures, (f"{t.summary}\n{len(t.failures)} failures:\n"
                            + "\n\n".join(map(str, t.failures[:5])))
    assert t.clones >= t.target, f"only {t.clones} clones within {BUDGET_S}s: {t.summary}"
    assert t.writer_rounds >= MIN_WRITER_ROUNDS, f"writer too slow: {t.summary}"


RACES = (
    "gitspout server bugs (not fixed here; see test_ref_snapshot_during_pack_refs and "
    "test_want_moved_by_repack_is_found): a few clones in 200 fail with 'upload-pack: not our "
    "ref <old tip>' when a push, pack-refs or repack overlaps them; git-http-backend passes "
    "the same loop")


@pytest.mark.slow
@pytest.mark.timeout(BUDGET_S + 240)
def test_clones_survive_commits_repack_gc_and_pack_refs(git: Git, tmp_path: Path) -> None:
    repo = _base_repo(git, tmp_path)
    scratch = tmp_path / "clones"
    scratch.mkdir()
    _check(_torture(git, repo, repo.parent, scratch))


@pytest.mark.slow
@pytest.mark.timeout(BUDGET_S + 240)
@pytest.mark.skipif(os.environ.get("GITSPOUT_TORTURE_ON_MOUNT") != "1",
                    reason="set GITSPOUT_TORTURE_ON_MOUNT=1 to also run on a latencyfs mount")
def test_clones_survive_maintenance_on_the_mount(
        git: Git, tmp_path: Path, latency_mount: MountFactory) -> None:
    repo = _base_repo(git, tmp_path)
    mount = latency_mount(repo.parent, delay_ms=0.2)
    scratch = tmp_path / "clones"
    scratch.mkdir()
    on_mount = mount.path / repo.name
    # Fewer clients: the latencyfs daemon is one Python thread, and the writer's
    # gc through it slows down ~10x when four cloners keep it busy.
    _check(_torture(git, on_mount, mount.path, scratch, clients=2, target=TARGET // 2))


# --------------------------------------------------------------------------
# The two races behind the failures above, as deterministic interleavings of
# the server's own readers with git's maintenance commands.


def _git(cwd: Path, *args: str) -> str:
    ident = ["-c", "user.name=T", "-c", "user.email=t@example.com"]
    done = subprocess.run(["git", *ident, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, check=True)
    return done.stdout.strip()


def _bare_with_loose_tip(tmp_path: Path) -> tuple[Path, Path]:
    """A gc'ed bare repository (packed refs, one pack) plus one pushed commit (loose
    objects, loose ``refs/heads/main``), and the work tree it came from."""
    work, repo = tmp_path / "w", tmp_path / "r.git"
    _git(tmp_path, "init", "-q", "-b", "main", str(work))
    for i in range(3):
        _git(work, "commit", "-q", "--allow-empty", "-m", f"c{i}")
    _git(tmp_path, "clone", "-q", "--bare", str(work), str(repo))
    _git(repo, "gc", "-q")
    _git(work, "commit", "-q", "--allow-empty", "-m", "pushed")
    _git(work, "push", "-q", str(repo), "main")
    return repo, work


def test_ref_snapshot_during_pack_refs(tmp_path: Path) -> None:
    """``git pack-refs --all`` runs between the server's packed-refs read and its walk of
    ``refs/``: the snapshot must still show main's current value, not the older value
    packed-refs held before (which makes a client's want of the tip 'not our ref')."""
    from gitspout.server.store.fscache import DirCache
    from gitspout.server.store.fsops import FsOps
    from gitspout.server.store.refcache import RefCache
    from gitspout.server.store.refs import read_ref_snapshot

    repo, work = _bare_with_loose_tip(tmp_path)
    tip, old = _git(work, "rev-parse", "main"), _git(work, "rev-parse", "main~1")
    assert _git(repo, "show-ref", "refs/heads/main").split()[0] == tip

    class PackRefsMidway(FsOps):
        fired = False

        def stat(self, path: str) -> os.stat_result:
            if path.endswith(os.sep + "refs") and not self.fired:
                PackRefsMidway.fired = True
                _git(repo, "pack-refs", "--all")
            return super().stat(path)

    snap = read_ref_snapshot(str(repo), PackRefsMidway(), DirCache(), RefCache(), 40,
                             lambda oid: None)
    assert PackRefsMidway.fired
    main = {r.name: r.oid.decode() for r in snap.refs}.get(b"refs/heads/main")
    assert main == tip, f"main read as {main} ({'the pre-push value' if main == old else '?'})"


def test_want_moved_by_repack_is_found(tmp_path: Path) -> None:
    """``git repack -ad`` moves the pushed (loose) tip into a new pack after the request
    froze its pack list: the want check must still find it."""
    from gitspout.server.store.fscache import DirCache
    from gitspout.server.store.fsops import FsOps
    from gitspout.server.store.odb import ObjectSnapshot, PackRegistry

    repo, work = _bare_with_loose_tip(tmp_path)
    tip = bytes.fromhex(_git(work, "rev-parse", "main"))
    snap = ObjectSnapshot(str(repo / "objects"), 20, PackRegistry(), FsOps(), dirs=DirCache())
    _git(repo, "repack", "-adq")
    assert _git(repo, "cat-file", "-t", tip.hex()) == "commit"
    # A want is a true miss: the lookup may rescan objects/pack (once per request).
    assert snap.locate(tip, needed=True) is not None, \
        "want reported missing (the request would answer 'not our ref')"


def test_want_packed_by_gc_is_typed(tmp_path: Path) -> None:
    """``git gc --prune=now`` packs the pushed (loose) tip and deletes the loose file after
    the request froze its pack list. Peeling a want asks for its type and size, not its
    content: that lookup is a true miss too, and must rescan rather than answer
    'missing object' (seen once in the torture loop, on a v0 --depth 1 clone)."""
    from gitspout.server.store.fscache import DirCache
    from gitspout.server.store.fsops import FsOps
    from gitspout.server.store.odb import ObjectSnapshot, PackRegistry

    repo, work = _bare_with_loose_tip(tmp_path)
    tip = bytes.fromhex(_git(work, "rev-parse", "main"))
    snap = ObjectSnapshot(str(repo / "objects"), 20, PackRegistry(), FsOps(), dirs=DirCache())
    _git(repo, "gc", "-q", "--prune=now")
    assert not (repo / "objects" / tip.hex()[:2] / tip.hex()[2:]).exists()
    found = snap.object_size(tip)
    assert found is not None and found[0] == 1, f"tip typed as {found}"
