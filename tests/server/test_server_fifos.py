"""A FIFO where a repository has a file (packed-refs, a loose ref, an included config, a
pack index) never blocks a thread of the server.

Opened for reading, a FIFO blocks until a writer comes: a request reading one held a pool
thread for good, after its client had gone, and as many such repositories as pool threads
stopped every request of the server (found by probing; only whoever can write the root
can do it, but a stuck file server acts the same). Every file of a repository is opened
with O_NONBLOCK now: a FIFO reads as empty, or fails at once (a storage fault of that
repository, as an unreadable file is). C git over ``file://`` blocks on them, so the answer is compared only
with the repository without the FIFO.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import Git, LiveServer, copy_repo, start_server

THREADS = 2  # the server's pool: more FIFO repositories than threads


@pytest.fixture
def fifo_root(tmp_path: Path, fixture_root: Path, git: Git) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    copy_repo(fixture_root / "basic.git", root / "good.git")
    for n in range(THREADS + 1):
        repo = copy_repo(fixture_root / "basic.git", root / f"packed{n}.git")
        git.run("pack-refs", "--all", cwd=repo)
        (repo / "packed-refs").unlink()
        os.mkfifo(repo / "packed-refs")
    repo = copy_repo(fixture_root / "basic.git", root / "loose.git")
    git.run("update-ref", "refs/heads/fifo", "HEAD", cwd=repo)
    (repo / "refs" / "heads" / "fifo").unlink()
    os.mkfifo(repo / "refs" / "heads" / "fifo")
    repo = copy_repo(fixture_root / "basic.git", root / "include.git")
    os.mkfifo(repo / "extra.config")
    git.run("config", "include.path", "extra.config", cwd=repo)
    repo = copy_repo(fixture_root / "basic.git", root / "index.git")
    git.run("repack", "-adq", cwd=repo)
    (idx,) = (repo / "objects" / "pack").glob("*.idx")
    idx.unlink()
    os.mkfifo(idx)
    return root


@pytest.fixture
def fifo_server(fifo_root: Path) -> Iterator[LiveServer]:
    srv = start_server(fifo_root, ["--threads", str(THREADS), "--threads-per-repo", "1"])
    yield srv
    srv.stop()


def _ls_remote(git: Git, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "ls-remote", url], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})


def test_fifos_never_block_the_server(git: Git, fifo_server: LiveServer, fifo_root: Path,
                                      tmp_path: Path) -> None:
    good = _ls_remote(git, f"{fifo_server.url}/good.git")
    assert good.returncode == 0 and "refs/heads/" in good.stdout
    for n in range(THREADS + 1):
        # packed-refs a FIFO: it cannot be read at an offset (ESPIPE), a storage fault of
        # that repository (500), at once, not a hang.
        got = _ls_remote(git, f"{fifo_server.url}/packed{n}.git")
        assert got.returncode != 0 and "500" in got.stderr, got.stderr
    loose = _ls_remote(git, f"{fifo_server.url}/loose.git")
    assert loose.returncode == 0 and "refs/heads/fifo" not in loose.stdout
    assert "refs/heads/" in loose.stdout
    include = _ls_remote(git, f"{fifo_server.url}/include.git")
    assert include.returncode == 0 and include.stdout == good.stdout
    dest = tmp_path / "c"
    clone = subprocess.run(["git", "clone", "-q", "--bare", f"{fifo_server.url}/index.git",
                            str(dest)], capture_output=True, text=True, timeout=60)
    assert clone.returncode != 0  # its only pack has no usable index: nothing to send
    # Every pool thread is free: the good repository still answers, at once.
    again = _ls_remote(git, f"{fifo_server.url}/good.git")
    assert again.returncode == 0 and again.stdout == good.stdout
    assert not any("Traceback" in line for line in fifo_server.lines)
    assert sum("storage fault in /packed" in line for line in fifo_server.lines) >= THREADS + 1
