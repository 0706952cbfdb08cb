"""What the warm-restart tests share (server/store/closurestore.py): the closure store's
counts on /metrics, its files, and a real clone checked against ``file://``."""

from __future__ import annotations

from pathlib import Path

from gitspout.server.store.closurestore import STORE_DIR
from gitutil import Git, LiveServer, fsck, repo_state
from rawhttp import metric_samples


def store_counts(port: int) -> dict[str, float]:
    """``gitspout_closure_store_total`` by result."""
    return {label.split('"')[1]: value for label, value
            in metric_samples(port, "gitspout_closure_store_total").items()}


def clone_equal(git: Git, srv: LiveServer, tmp: Path, name: str, spec: str,
                repo: str = "app.git") -> None:
    """A real mirror clone over HTTP (filtered by ``spec``), fsck-clean and holding what
    the same clone over ``file://`` holds."""
    filt = [f"--filter={spec}"] if spec else []
    dest, ref = tmp / name, tmp / f"{name}-file"
    git.run("-c", "protocol.version=2", "clone", "-q", "--mirror", *filt,
            f"{srv.url}/{repo}", str(dest))
    git.run("clone", "-q", "--mirror", "--no-local", *filt,
            f"file://{srv.root / repo}", str(ref))
    fsck(git, dest)
    assert repo_state(git, dest) == repo_state(git, ref)


def store_files(cache: Path) -> list[Path]:
    return sorted((cache / STORE_DIR).glob("*/*.clo"))
