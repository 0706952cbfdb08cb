"""A drain that delivers (issue 24, item 2; server/app/drain.py).

The server runs in a network namespace of its own, as in a container, and the namespace
(with its veth pair) is deleted the moment the process exits, as a runtime tears a pod's
network down. A clone in flight at SIGTERM, read slowly, must still complete and be
fsck-clean: the process may exit only once the kernel has delivered what it wrote.
"""

from __future__ import annotations

import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gitutil import (
    REPO_ROOT,
    Committer,
    Git,
    fsck,
    git_env,
    repo_state,
    stop_process,
    wait_until,
)
from netnskit import NetNs, SlowProxy, netns_usable

BLOB = 8 << 20  # incompressible: the pack is as large
RATE = 2 << 20  # bytes/s the client reads


@pytest.fixture(scope="module")
def big_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    root = tmp_path_factory.mktemp("drainroot")
    work = root.parent / (root.name + "-work")
    git.run("init", "-q", "-b", "main", str(work))
    Committer(git, work).commit({"blob.bin": random.Random(24).randbytes(BLOB)}, "big")
    git.run("clone", "-q", "--bare", "--no-local", str(work), str(root / "big.git"))
    return root


def _serve_in(ns: NetNs, root: Path) -> tuple[subprocess.Popen[bytes], int, list[str]]:
    cmd = [*ns.exec_prefix(), sys.executable, "-m", "gitspout.server.app.cli", "serve",
           "--root", str(root), "--host", ns.inner, "--port", "0", "--drain-timeout", "60"]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode(errors="replace")
        if not line:
            break
        lines.append(line.rstrip())
        m = re.search(r"serving .* at http://[0-9.]+:(\d+)/", line)
        if m:
            return proc, int(m.group(1)), lines
    proc.kill()
    raise AssertionError("gitspout did not start in the namespace:\n" + "\n".join(lines))


@pytest.mark.skipif(netns_usable() is not None, reason=str(netns_usable()))
def test_clone_in_flight_at_sigterm_completes_when_the_namespace_dies_with_the_process(
        big_root: Path, git: Git, tmp_path: Path) -> None:
    """Before: the request ended once its last bytes were in the socket, the process
    exited with up to megabytes unsent, and the namespace took them: `curl 18 transfer
    closed with outstanding read data remaining`."""
    with NetNs() as ns:
        proc, port, lines = _serve_in(ns, big_root)
        proxy = SlowProxy(ns.inner, port, RATE)
        dest = tmp_path / "clone"
        clone = subprocess.Popen(
            ["git", "clone", "-q", "--bare", f"http://127.0.0.1:{proxy.port}/big.git",
             str(dest)], env=git_env(git.home), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            # Half a megabyte through: the pack is in flight, most of it still to come.
            assert wait_until(lambda: proxy.relayed >= 1 << 20, 30), "no pack in flight"
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=90)
            ns.delete()  # at once, as the runtime does
            out, err = clone.communicate(timeout=120)
        finally:
            stop_process(proc)
            if clone.poll() is None:
                clone.kill()
            proxy.close()
        assert proc.returncode == 0
        assert clone.returncode == 0, err.decode(errors="replace")
    fsck(git, dest)
    ref = tmp_path / "ref"
    git.run("clone", "-q", "--bare", f"file://{big_root / 'big.git'}", str(ref))
    assert repo_state(git, dest) == repo_state(git, ref)

