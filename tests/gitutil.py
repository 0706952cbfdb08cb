"""Helpers shared by the test suites: running git, building fixture repos, a live server."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

REPO_ROOT = Path(__file__).resolve().parent.parent
GIT_TIMEOUT = 120


def git_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A hermetic environment for git: no system/global config, fixed identity and dates."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        HOME=str(home),
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=str(home / ".gitconfig"),
        GIT_AUTHOR_NAME="Test Author",
        GIT_AUTHOR_EMAIL="author@example.com",
        GIT_COMMITTER_NAME="Test Committer",
        GIT_COMMITTER_EMAIL="committer@example.com",
        GIT_TERMINAL_PROMPT="0",
        LC_ALL="C",
    )
    if extra:
        env.update(extra)
    return env


@dataclass
class Git:
    """Runs git with a hermetic environment and a timeout."""

    home: Path

    def run(
        self,
        *args: str,
        cwd: Path | str | None = None,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        input: bytes | None = None,
        timeout: float = GIT_TIMEOUT,
    ) -> subprocess.CompletedProcess[bytes]:
        proc = subprocess.run(
            ["git", *args],
            cwd=cwd,
            env=git_env(self.home, env),
            input=input,
            capture_output=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"git {' '.join(args)} failed ({proc.returncode}):\n"
                f"{proc.stderr.decode(errors='replace')}"
            )
        return proc

    def out(self, *args: str, cwd: Path | str | None = None, **kw: object) -> str:
        return self.run(*args, cwd=cwd, **kw).stdout.decode()  # type: ignore[arg-type]


class Committer:
    """Makes commits with increasing fixed dates, so object ids are reproducible."""

    def __init__(self, git: Git, workdir: Path, start: int = 1_600_000_000) -> None:
        self.git = git
        self.workdir = workdir
        self.when = start

    def commit(self, files: Mapping[str, str | bytes], message: str, step: int = 3600) -> str:
        for name, content in files.items():
            path = self.workdir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content)
        self.when += step
        date = f"{self.when} +0000"
        env = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
        self.git.run("add", "-A", cwd=self.workdir)
        self.git.run("commit", "-q", "--allow-empty", "-m", message, cwd=self.workdir, env=env)
        return self.git.out("rev-parse", "HEAD", cwd=self.workdir).strip()

    def tag(self, name: str, message: str | None = None) -> None:
        date = f"{self.when} +0000"
        env = {"GIT_COMMITTER_DATE": date}
        if message is None:
            self.git.run("tag", name, cwd=self.workdir)
        else:
            self.git.run("tag", "-a", name, "-m", message, cwd=self.workdir, env=env)


@dataclass
class LiveServer:
    """A gitspout process serving ``root`` on 127.0.0.1."""

    root: Path
    proc: subprocess.Popen[bytes]
    port: int
    lines: list[str] = field(default_factory=list)  # its output so far (log lines)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_process(self.proc)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_for_line(self, needle: str, timeout: float = 5.0) -> str:
        """The first output line containing ``needle``, waiting up to ``timeout`` seconds."""
        return self.wait_for_lines(needle, 1, timeout)[0]

    def wait_for_lines(self, needle: str, count: int, timeout: float = 5.0,
                       start: int = 0) -> list[str]:
        """The first ``count`` output lines from index ``start`` on that contain ``needle``,
        waiting up to ``timeout`` seconds for them."""
        def found() -> list[str]:
            hits = [line for line in self.lines[start:] if needle in line]
            return hits[:count] if len(hits) >= count else []

        try:
            return poll(found, timeout, f"{count} log lines with {needle!r}")
        except AssertionError:
            raise AssertionError(f"not {count} log lines with {needle!r} in:\n"
                                 + "\n".join(self.lines[-20:])) from None


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s: every test-started process ends this way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@dataclass(frozen=True)
class RepoState:
    """What a clone holds: refs, present objects, shallow boundary and HEAD."""

    refs: str
    objects: frozenset[str]
    shallow: str
    head: str


def repo_state(git: Git, path: Path) -> RepoState:
    refs = git.out("for-each-ref", "--format=%(objectname) %(refname)", cwd=path)
    objs = git.out("cat-file", "--batch-all-objects", "--batch-check=%(objectname)", cwd=path)
    gitdir = Path(git.out("rev-parse", "--absolute-git-dir", cwd=path).strip())
    shallow_file = gitdir / "shallow"
    shallow = "\n".join(sorted(shallow_file.read_text().split())) if shallow_file.exists() else ""
    head = (gitdir / "HEAD").read_text().strip()
    return RepoState(refs, frozenset(objs.split()), shallow, head)


def fsck(git: Git, path: Path) -> None:
    git.run("fsck", "--no-progress", "--no-dangling", cwd=path)


# Flags every test-started server gets, e.g. GITSPOUT_TEST_SERVER_ARGS="--max-open-packs 8
# --cache-memory 8MiB" (make test runs tests/compat once that way: same answers under tiny
# budgets). Read by the tests, never passed on to the server's environment.
SERVER_ARGS = tuple(shlex.split(os.environ.get("GITSPOUT_TEST_SERVER_ARGS", "")))


def start_server(root: Path, extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 timeout: float = 20.0, output: list[str] | None = None,
                 nofile: int | tuple[int, int] | None = None) -> LiveServer:
    """Start ``gitspout serve`` on a free port and wait until it says where it listens.

    Every line the server prints (stdout and stderr, in order) goes to ``LiveServer.lines``
    and the test's stderr, and to ``output`` too when given. ``nofile`` sets the server's
    RLIMIT_NOFILE, soft and hard, as ``ulimit -n`` does; ``(soft, hard)`` sets each.
    """
    cmd = [sys.executable, "-m", "gitspout.server.app.cli", "serve", "--root", str(root),
           "--host", "127.0.0.1", "--port", "0", *SERVER_ARGS, *extra_args]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GITSPOUT_")}
    full_env.update(env or {})

    def limit_fds() -> None:
        import resource

        assert nofile is not None
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want_soft, want_hard = nofile if isinstance(nofile, tuple) else (nofile, nofile)
        want_hard = min(want_hard, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want_soft, want_hard), want_hard))

    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT,
                            preexec_fn=limit_fds if nofile is not None else None)
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode(errors="replace")
        if not line:
            break
        if output is not None:
            output.append(line.rstrip("\n"))
        m = re.search(r"serving .* at http://127\.0\.0\.1:(\d+)/", line)
        if m:
            server = LiveServer(root, proc, int(m.group(1)))
            _drain_in_background(proc, server.lines, output)
            return server
    proc.kill()
    raise RuntimeError("gitspout did not start")


def _drain_in_background(proc: subprocess.Popen[bytes], sink: list[str],
                         output: list[str] | None = None) -> None:
    import threading

    def drain() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            text = line.decode(errors="replace")
            sink.append(text.rstrip("\n"))
            if output is not None:
                output.append(text.rstrip("\n"))
            sys.stderr.write("[gitspout] " + text)

    threading.Thread(target=drain, daemon=True).start()


def copy_repo(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def open_files(pid: int) -> list[str]:
    """What the descriptors of process ``pid`` point at (the symlinks in /proc/PID/fd)."""
    out = []
    fd_dir = f"/proc/{pid}/fd"
    for name in os.listdir(fd_dir):
        try:
            out.append(os.readlink(os.path.join(fd_dir, name)))
        except OSError:
            continue  # closed meanwhile
    return out


def deleted_files(pid: int, under: str | os.PathLike[str] = "/") -> list[str]:
    """Files of process ``pid`` under ``under`` that are held open (a descriptor) or mapped
    although they were deleted: what keeps a replaced pack's space from being freed."""
    top = os.fspath(under).rstrip("/") + "/"
    held = [f"fd {t}" for t in open_files(pid) if t.endswith(" (deleted)")]
    with open(f"/proc/{pid}/maps") as fh:
        held += sorted({"map " + line.split(None, 5)[5].strip() for line in fh
                        if line.rstrip().endswith(" (deleted)") and len(line.split(None, 5)) == 6})
    return [h for h in held if h.split(" ", 1)[1].startswith(top)]


T = TypeVar("T")


def backdate(root: Path, when: float) -> None:
    """Set the mtime of *root* and of everything below it to *when* (their ctimes become
    now: a server that distrusts a recent ctime, as for a config, sees them as changed)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            os.utime(os.path.join(dirpath, name), (when, when), follow_symlinks=False)
    os.utime(root, (when, when))


def poll(check: Callable[[], T], timeout: float, what: str, step: float = 0.05) -> T:
    """Call ``check`` until it returns a true value, and return that value; after
    ``timeout`` seconds fail with an AssertionError naming ``what`` and the last value.

    This is how a test waits for something the server does (a log line, a metric, a
    socket's state, a file): never a bare sleep, which is too short on a busy machine and
    needlessly long on an idle one. ``timeout`` is a hang guard, far above the normal wait.
    """
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}; last: {got!r}")
        time.sleep(step)


def wait_until(check: Callable[[], bool], timeout: float, step: float = 0.1) -> bool:
    """Poll ``check`` until it returns True or ``timeout`` seconds pass (False then); for
    callers that say themselves what failed. :func:`poll` raises instead."""
    try:
        return bool(poll(check, timeout, "a condition", step))
    except AssertionError:
        return False


def objects_received(git: Git, args: Sequence[str], cwd: Path, trace: Path) -> int:
    """Run ``git *args`` (a fetch) in ``cwd`` and return how many objects the pack it
    received holds, from its header (``GIT_TRACE_PACKFILE`` copies the pack to ``trace``).
    ``count-objects`` cannot tell: objects the client had already are dropped when a small
    pack is unpacked, and a thin pack kept is completed with bases it did not receive."""
    git.run(*args, cwd=cwd, env={"GIT_TRACE_PACKFILE": str(trace)})
    head = trace.read_bytes()[:12]
    assert head[:4] == b"PACK", f"no pack received: {head!r}"
    return int.from_bytes(head[8:12], "big")


def damage_blob(git: Git, repo: Path, spec: str, at: int) -> None:
    """Flip a byte ``at`` bytes into the stored entry of the blob ``spec`` (``rev:path``)
    in ``repo``'s only pack: its compressed data no longer inflates to the blob."""
    blob = git.out("rev-parse", spec, cwd=repo).strip()
    (idx,) = (repo / "objects" / "pack").glob("*.idx")
    offsets = {line.split()[1]: int(line.split()[0])
               for line in git.out("show-index", input=idx.read_bytes()).splitlines()}
    pack = idx.with_suffix(".pack")
    data = bytearray(pack.read_bytes())
    data[offsets[blob] + at] ^= 0xFF
    os.chmod(pack, 0o644)
    pack.write_bytes(bytes(data))
