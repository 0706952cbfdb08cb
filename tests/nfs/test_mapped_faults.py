"""A storage fault under a pack index or a commit-graph the server has open, on the
simulated NFS mount (server/store/mapped.py).

The server mapped these files. Once the kernel dropped a mapped page (here: a new mtime
seen through the mount, as NFS's close-to-open does; in production also memory
pressure), reading it again through a failing mount (an NFS soft mount's timeout, ESTALE
after another host's repack) raised SIGBUS: the whole process died, every request in
flight with it, with nothing in the log. On a filesystem that is not local the files are
read, not mapped, now: a fault is an error of the requests that need the file, and the
server serves again once the fault is gone.
"""

from __future__ import annotations

import os
import shutil
import time
import urllib.request
from pathlib import Path

from gitutil import Committer, Git, fsck, poll, repo_state, start_server
from latencyfs import control_request
from mount import MountFactory


def test_a_failing_index_or_commit_graph_fails_requests_not_the_server(
        latency_mount: MountFactory, git: Git, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    work = tmp_path / "w"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    for i in range(30):
        c.commit({f"f{i % 7}.txt": f"{i}\n" * 200}, f"c{i}")
    repo = src / "r.git"
    git.run("clone", "-q", "--bare", str(work), str(repo))
    git.run("repack", "-adq", cwd=repo)
    git.run("commit-graph", "write", "--reachable", cwd=repo)
    mount = latency_mount(src, delay_ms=0.1)
    srv = start_server(mount.path)
    url = f"{srv.url}/r.git"
    try:
        git.run("clone", "-q", "--bare", url, str(tmp_path / "first"))
        git.run("clone", "-q", "--bare", "--depth", "2", url, str(tmp_path / "shallow"))
        for part in (".idx", "commit-graph"):
            control_request(mount.control, f"fail-reads {part} EIO")
        # A new mtime, seen through the mount: the kernel drops the files' cached pages.
        files = [*(repo / "objects" / "pack").glob("*.idx"),
                 repo / "objects" / "info" / "commit-graph"]
        later = time.time() + 5
        for f in files:
            os.utime(f, (later, later))
            os.stat(mount.path / f.relative_to(src))
        for n, extra in enumerate((["--depth", "1"], [])):
            git.run("clone", "-q", "--bare", *extra, url, str(tmp_path / f"during{n}"),
                    check=False)  # may fail: the storage does
            assert srv.alive(), "the server died (SIGBUS)"
            with urllib.request.urlopen(f"{srv.url}/healthz", timeout=10) as resp:
                assert resp.status == 200
        control_request(mount.control, "clear-faults")
        after = tmp_path / "after"

        def clone_after() -> bool:
            shutil.rmtree(after, ignore_errors=True)
            return git.run("clone", "-q", "--bare", url, str(after), check=False).returncode == 0

        poll(clone_after, 30, "a clone once the fault is gone")
        fsck(git, after)
        ref = tmp_path / "file"
        git.run("clone", "-q", "--bare", "--no-local", f"file://{repo}", str(ref))
        assert repo_state(git, after) == repo_state(git, ref)
        assert srv.alive()
    finally:
        srv.stop()
