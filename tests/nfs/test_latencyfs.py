"""Tests of the latencyfs FUSE passthrough itself (no gitspout server involved)."""

from __future__ import annotations

import errno
import json
import mmap
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from gitutil import poll
from latencyfs import DELAYED_OPS, op_total
from mount import MountFactory, force_unmount, is_mounted

REPO_ROOT = Path(__file__).resolve().parents[2]
GIT_TIMEOUT = 60


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def git_env(home: Path) -> dict[str, str]:
    """An isolated git environment: no user/system config, no auto gc."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    config = {
        "gc.auto": "0",
        "maintenance.auto": "false",
        "init.defaultBranch": "main",
        "safe.directory": "*",
        "protocol.file.allow": "always",
    }
    env.update(
        HOME=str(home), GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull,
        GIT_AUTHOR_NAME="T", GIT_AUTHOR_EMAIL="t@example.com",
        GIT_COMMITTER_NAME="T", GIT_COMMITTER_EMAIL="t@example.com",
        GIT_CONFIG_COUNT=str(len(config)),
    )
    for i, (key, value) in enumerate(config.items()):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


def git(env: dict[str, str], *args: str | Path, cwd: Path | None = None) -> str:
    """Run git, fail the test with its output on a non-zero exit."""
    done = subprocess.run(["git", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=GIT_TIMEOUT, check=False)
    if done.returncode != 0:
        pytest.fail(f"git {' '.join(map(str, args))} -> {done.returncode}\n"
                    f"{done.stdout}\n{done.stderr}")
    return done.stdout.strip()


def make_history(env: dict[str, str], work: Path, commits: int, files: int) -> None:
    """Create *commits* commits touching *files* files each (some in subdirectories)."""
    git(env, "init", "-q", work)
    for c in range(commits):
        for f in range(files):
            path = work / f"dir{f % 3}" / f"file{f}.txt"
            path.parent.mkdir(exist_ok=True)
            path.write_text(f"commit {c} file {f}\n" + "payload line\n" * (50 + f * c))
        git(env, "add", "-A", cwd=work)
        git(env, "commit", "-q", "-m", f"commit {c}", cwd=work)


def timed_stats(path: Path, count: int) -> float:
    """Seconds taken by *count* sequential stat() calls of *path*."""
    start = time.perf_counter()
    for _ in range(count):
        os.stat(path)
    return time.perf_counter() - start


# --------------------------------------------------------------------------
# filesystem semantics
# --------------------------------------------------------------------------


def test_file_and_directory_operations(latency_mount: MountFactory, tmp_path: Path) -> None:
    src = tmp_path / "src"
    m = latency_mount(src, delay_ms=0)
    root = m.path
    (root / "d" / "sub").mkdir(parents=True)
    f = root / "d" / "f.txt"
    f.write_bytes(b"hello")
    with open(f, "ab") as fh:
        fh.write(b" world")
    assert f.read_bytes() == b"hello world"
    assert (src / "d" / "f.txt").read_bytes() == b"hello world"

    os.truncate(f, 5)
    assert f.read_bytes() == b"hello"
    with open(f, "r+b") as fh:
        fh.seek(10)
        fh.write(b"!")  # sparse hole
    assert f.read_bytes() == b"hello" + b"\0" * 5 + b"!"

    f.chmod(0o600)
    assert stat.S_IMODE(os.stat(src / "d" / "f.txt").st_mode) == 0o600
    os.utime(f, ns=(1_000_000_000, 2_000_000_000))
    assert os.stat(f).st_mtime_ns == 2_000_000_000

    g = root / "d" / "sub" / "g.txt"
    os.rename(f, g)
    assert not f.exists() and g.read_bytes().startswith(b"hello")
    os.symlink("sub/g.txt", root / "d" / "link")
    assert os.readlink(root / "d" / "link") == "sub/g.txt"
    assert (root / "d" / "link").read_bytes().startswith(b"hello")
    assert os.path.islink(src / "d" / "link")

    assert sorted(os.listdir(root / "d")) == ["link", "sub"]
    assert sorted(os.listdir(root / "d")) == sorted(os.listdir(src / "d"))
    with pytest.raises(OSError) as info:
        os.rmdir(root / "d" / "sub")
    assert info.value.errno == errno.ENOTEMPTY
    os.unlink(root / "d" / "link")
    os.unlink(g)
    os.rmdir(root / "d" / "sub")
    assert os.listdir(root / "d") == [] == os.listdir(src / "d")
    with pytest.raises(FileNotFoundError):
        os.stat(root / "d" / "missing")
    assert os.statvfs(root).f_bsize > 0


def test_listing_dot_entries_and_many_files(latency_mount: MountFactory, tmp_path: Path) -> None:
    names = [f"n{i:04d}-{'x' * 40}" for i in range(300)]  # spans several readdir replies
    (tmp_path / "src" / "big").mkdir(parents=True)
    for name in names:
        (tmp_path / "src" / "big" / name).touch()
    m = latency_mount(tmp_path / "src", delay_ms=0)
    assert sorted(os.listdir(m.path / "big")) == names
    entries = subprocess.run(["ls", "-a", m.path / "big"], capture_output=True, text=True,
                             timeout=30, check=True).stdout.split()
    assert entries[:2] == [".", ".."] and len(entries) == len(names) + 2


def test_rename_over_existing_and_hard_links(latency_mount: MountFactory, tmp_path: Path) -> None:
    src = tmp_path / "src"
    m = latency_mount(src, delay_ms=0)
    a, b, c = m.path / "a", m.path / "b", m.path / "c"
    a.write_text("A")
    b.write_text("B")
    ino_b = os.stat(b).st_ino
    os.link(a, c)
    assert os.stat(a).st_ino == os.stat(c).st_ino != ino_b
    assert os.stat(a).st_nlink == 2 and os.stat(src / "a").st_nlink == 2
    os.rename(a, b)  # replaces b; c still shares the inode
    assert b.read_text() == "A" and not a.exists()
    assert os.stat(b).st_ino == os.stat(c).st_ino
    os.unlink(c)
    assert os.stat(b).st_nlink == 1 and b.read_text() == "A"
    # inode numbers are stable for a given file
    assert os.stat(b).st_ino == os.stat(b).st_ino


def test_unlinked_and_replaced_files_stay_readable_while_open(
    latency_mount: MountFactory,
) -> None:
    m = latency_mount(delay_ms=0)
    data = os.urandom(1 << 20)
    p = m.path / "pack"
    p.write_bytes(data)
    with open(p, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        assert mm[:4096] == data[:4096]
        os.unlink(p)  # like `git repack -ad` deleting a pack a reader has mapped
        st = os.fstat(fh.fileno())
        assert st.st_nlink == 0 and st.st_size == len(data)
        assert mm[-4096:] == data[-4096:]
        assert os.pread(fh.fileno(), 100, 5000) == data[5000:5100]
    q = m.path / "ref"
    q.write_text("old")
    with open(q) as old:
        (m.path / "ref.lock").write_text("new")
        os.rename(m.path / "ref.lock", q)
        assert old.read() == "old"
        assert os.fstat(old.fileno()).st_nlink == 0
    assert q.read_text() == "new"


def test_write_through_mmap(latency_mount: MountFactory) -> None:
    m = latency_mount(delay_ms=0)
    p = m.path / "shared"
    p.write_bytes(b"\0" * 8192)
    with open(p, "r+b") as fh, mmap.mmap(fh.fileno(), 0) as mm:
        mm[100:105] = b"hello"
        mm.flush()
    assert p.read_bytes()[100:105] == b"hello"


# --------------------------------------------------------------------------
# counters, delay, caching
# --------------------------------------------------------------------------


def test_counters_move_and_reset(latency_mount: MountFactory) -> None:
    m = latency_mount(delay_ms=0)
    f = m.path / "f"
    f.write_text("x" * 100)
    m.reset()
    stats = m.stats()
    assert op_total(stats) == 0 and stats["_total"] == 0
    assert set(DELAYED_OPS) <= set(stats)

    os.stat(f)
    stats = m.stats()
    assert stats["lookup"] >= 1 and stats["getattr"] >= 1

    m.reset()
    assert f.read_text() == "x" * 100
    stats = m.stats()
    assert stats["open"] == 1 and stats["read"] >= 1 and stats["release"] == 1
    assert stats["_read_bytes"] == 100

    m.reset()
    os.listdir(m.path)
    stats = m.stats()
    assert stats["opendir"] == 1 and stats["readdir"] >= 1 and stats["releasedir"] == 1
    m.reset()
    assert m.stats()["_total"] == 0


def test_metadata_delay_is_applied(latency_mount: MountFactory) -> None:
    delay = 0.005
    m = latency_mount(delay_ms=delay * 1000)
    f = m.path / "f"
    f.write_text("x")
    m.reset()
    elapsed = timed_stats(f, 10)
    stats = m.stats()
    delayed = stats["_delayed"]
    assert delayed >= 10  # at least one request per stat with no attribute caching
    assert delayed == op_total(stats, DELAYED_OPS)
    # Each delay is served (a lower bound: load can only add to it). How close to the
    # setting the delays are is the precision bench.nfs relies on, not a test's to time.
    assert elapsed >= delayed * delay * 0.95
    mean = stats["_delay_us"] / delayed / 1e6
    assert mean >= delay * 0.95


def test_no_delay_for_data_by_default_and_optional_data_delay(
    latency_mount: MountFactory, tmp_path: Path
) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_bytes(b"y" * 300_000)
    m = latency_mount(tmp_path / "src", delay_ms=0, data_delay_ms=0)
    assert len((m.path / "f").read_bytes()) == 300_000
    assert m.stats()["_delayed"] == 0
    m2 = latency_mount(tmp_path / "src", delay_ms=0, data_delay_ms=2, keep_cache=False)
    assert len((m2.path / "f").read_bytes()) == 300_000
    stats = m2.stats()
    assert stats["read"] >= 1 and stats["_delayed"] == stats["read"]


def test_concurrent_requests_overlap(latency_mount: MountFactory) -> None:
    """Eight clients stat at once: the daemon sleeps their delays side by side (counted by
    the daemon, not timed: serial delays would show at most one in progress)."""
    delay = 0.02
    m = latency_mount(delay_ms=delay * 1000)
    files = [m.path / f"f{i}" for i in range(8)]
    for f in files:
        f.write_text("x")
    m.reset()
    threads = [threading.Thread(target=timed_stats, args=(f, 4)) for f in files]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    stats = m.stats()
    assert stats["_delayed"] >= 8 * 4
    assert stats["_overlap_max"] >= 2, f"no overlap: {stats}"


def test_attr_and_entry_timeouts_let_the_kernel_cache(latency_mount: MountFactory) -> None:
    cached = latency_mount(delay_ms=0, attr_timeout=60, entry_timeout=60)
    uncached = latency_mount(delay_ms=0)
    for m in (cached, uncached):
        (m.path / "f").write_text("x")
        os.stat(m.path / "f")
        m.reset()
        for _ in range(20):
            os.stat(m.path / "f")
    assert cached.stats()["lookup"] + cached.stats()["getattr"] == 0
    assert uncached.stats()["lookup"] >= 20 and uncached.stats()["getattr"] >= 20


# --------------------------------------------------------------------------
# git on the mount
# --------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_git_commit_gc_repack_clone_fsck(latency_mount: MountFactory, tmp_path: Path) -> None:
    env = git_env(tmp_path / "home")
    src = tmp_path / "src"
    m = latency_mount(src, delay_ms=0.1)
    work = m.path / "work"
    make_history(env, work, commits=2, files=4)  # commits written through the mount
    head = git(env, "rev-parse", "HEAD", cwd=work)

    bare = m.path / "repo.git"
    git(env, "clone", "-q", "--bare", work, bare)  # local clone: hard-links objects
    assert m.stats()["link"] > 0
    git(env, "gc", "-q", "--prune=now", cwd=bare)
    git(env, "repack", "-q", "-a", "-d", cwd=bare)
    git(env, "fsck", "--full", "--strict", cwd=bare)
    assert len(list((bare / "objects" / "pack").glob("*.pack"))) == 1

    m.reset()
    clone = tmp_path / "clone"
    git(env, "clone", "-q", "--no-local", f"file://{bare}", clone)
    assert git(env, "rev-parse", "HEAD", cwd=clone) == head
    git(env, "fsck", "--full", cwd=clone)
    stats = m.stats()
    assert stats["lookup"] > 0 and stats["getattr"] > 0 and stats["read"] > 0

    # what git wrote through the mount is a valid repository on the real disk
    git(env, "fsck", "--full", cwd=src / "repo.git")
    assert git(env, "rev-parse", "HEAD", cwd=src / "repo.git") == head


@pytest.mark.timeout(120)
def test_git_readers_survive_concurrent_repack(latency_mount: MountFactory, tmp_path: Path) -> None:
    env = git_env(tmp_path / "home")
    src = tmp_path / "src"
    make_history(env, tmp_path / "work", commits=4, files=6)  # on local disk: faster
    git(env, "clone", "-q", "--bare", "--no-local", tmp_path / "work", src / "repo.git")
    m = latency_mount(src, delay_ms=0.1)
    bare = m.path / "repo.git"
    expected = git(env, "rev-list", "--objects", "--all", cwd=bare)
    failures: list[str] = []
    reads = 0
    stop = threading.Event()

    def reader() -> None:
        nonlocal reads
        while not stop.is_set():
            done = subprocess.run(["git", "rev-list", "--objects", "--all"], cwd=bare, env=env,
                                  capture_output=True, text=True, timeout=GIT_TIMEOUT)
            reads += 1
            if done.returncode != 0 or done.stdout.strip() != expected:
                failures.append(done.stderr)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        git(env, "repack", "-q", "-a", "-d", "-f", cwd=bare)
        git(env, "gc", "-q", "--prune=now", cwd=bare)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=GIT_TIMEOUT)
    assert reads > 0 and not failures, failures[:3]
    git(env, "fsck", "--full", cwd=bare)


# --------------------------------------------------------------------------
# lifecycle
# --------------------------------------------------------------------------


def test_stop_cleans_up_after_the_daemon_was_killed(latency_mount: MountFactory) -> None:
    m = latency_mount(delay_ms=0)
    assert m.pid is not None
    os.kill(m.pid, signal.SIGKILL)
    poll(lambda: not m.alive, 10, "the killed daemon to be gone")
    assert is_mounted(m.path)  # a dead FUSE mount: still in the mount table
    path = m.path
    m.stop()
    assert not is_mounted(path) and not path.exists()


def test_stop_with_a_busy_mount(latency_mount: MountFactory) -> None:
    m = latency_mount(delay_ms=0)
    busy = subprocess.Popen(["sleep", "30"], cwd=m.path)
    try:
        path = m.path
        m.stop()
        assert not is_mounted(path)
    finally:
        busy.kill()
        busy.wait(timeout=10)


def test_stats_file_written_at_exit(latency_mount: MountFactory, tmp_path: Path) -> None:
    stats_file = tmp_path / "stats.json"
    m = latency_mount(delay_ms=0, stats_file=stats_file)
    (m.path / "f").write_text("x")
    m.dump_stats()
    assert json.loads(stats_file.read_text())["create"] == 1
    os.stat(m.path / "f")
    m.stop()
    final = json.loads(stats_file.read_text())
    assert final["create"] == 1 and final["lookup"] >= 1


def test_command_line_background_mode(fuse_reason: str | None, tmp_path: Path) -> None:
    """``python -m tests.nfs.latencyfs`` returns once mounted; fusermount3 -u ends it."""
    if fuse_reason is not None:
        pytest.skip(fuse_reason)
    src, mnt, stats_file = tmp_path / "src", tmp_path / "mnt", tmp_path / "stats.json"
    src.mkdir()
    mnt.mkdir()
    (src / "hello").write_text("hi")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = [sys.executable, "-m", "tests.nfs.latencyfs", str(src), str(mnt),
           "--delay-ms", "0.5", "--stats", str(stats_file)]
    try:
        subprocess.run(cmd, cwd=REPO_ROOT, env=env, timeout=30, check=True)
        assert is_mounted(mnt)
        assert (mnt / "hello").read_text() == "hi"
        subprocess.run(["fusermount3", "-u", str(mnt)], timeout=30, check=True)
        poll(stats_file.exists, 10, "the daemon to write its stats file at exit")
        assert json.loads(stats_file.read_text())["open"] == 1
    finally:
        if is_mounted(mnt):
            force_unmount(mnt)
