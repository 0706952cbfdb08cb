"""Git client helpers for the benchmark: run git with timeouts, mirror-clone
over a chosen protocol version, fsck, list refs.

The client environment is isolated (empty HOME, no system config, no proxy,
no prompts) so results do not depend on the machine's git configuration.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


class GitError(RuntimeError):
    """A git command failed or timed out."""


_CLIENT_HOME = Path(tempfile.gettempdir()) / "gitspout-bench-client-home"


def client_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for client-side git: isolated config, loopback without proxies."""
    _CLIENT_HOME.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.lower().endswith("_proxy") and not k.startswith("GIT_")}
    env.update({
        "HOME": str(_CLIENT_HOME), "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0",
        "no_proxy": "127.0.0.1,localhost", "LANG": "C.UTF-8",
    })
    env.update(extra or {})
    return env


def run_git(args: list[str], *, cwd: Path | None = None, timeout: float = 600.0,
            env: dict[str, str] | None = None, input: bytes | None = None,
            check: bool = True) -> subprocess.CompletedProcess[bytes]:
    """Run ``git ARGS`` and capture output; raise :class:`GitError` on failure/timeout."""
    cmd = ["git", *args]
    try:
        res = subprocess.run(cmd, cwd=cwd, env=env or client_env(), input=input,
                             capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise GitError(f"timeout after {timeout}s: {' '.join(cmd)}") from e
    if check and res.returncode != 0:
        raise GitError(f"exit {res.returncode}: {' '.join(cmd)}\n"
                       f"{res.stderr.decode(errors='replace')[-3000:]}")
    return res


def git_out(args: list[str], **kw: object) -> str:
    """stdout of ``git ARGS`` as text (stripped)."""
    return run_git(args, **kw).stdout.decode().strip()  # type: ignore[arg-type]


@dataclass
class CloneResult:
    """Outcome of one clone: wall time and where it went."""

    url: str
    dest: Path
    protocol: int
    wall_s: float
    stderr: str


def clone_mirror(url: str, dest: Path, *, protocol: int = 2,
                 timeout: float = 1800.0, extra_config: dict[str, str] | None = None,
                 ) -> CloneResult:
    """``git -c protocol.version=N clone --mirror URL DEST`` (timed)."""
    cfg = {"protocol.version": str(protocol), **(extra_config or {})}
    args: list[str] = []
    for k, v in cfg.items():
        args += ["-c", f"{k}={v}"]
    t0 = time.monotonic()
    res = run_git([*args, "clone", "--mirror", "--quiet", url, str(dest)], timeout=timeout)
    return CloneResult(url, dest, protocol, time.monotonic() - t0,
                       res.stderr.decode(errors="replace"))


# fsck message ids describing odd-but-valid *history content* (e.g. dulwich's
# test data has trees with ".git" entries). They are properties of upstream
# history, not transfer damage, so they are downgraded to warnings; missing,
# corrupt or unreachable-but-referenced objects remain fatal.
HISTORY_QUIRKS = ("hasDotgit", "hasDot", "hasDotdot", "badFilemode", "zeroPaddedFilemode",
                  "fullPathname", "emptyName", "duplicateEntries", "treeNotSorted",
                  "missingEmail", "badEmail", "badDate", "badDateOverflow", "badTimezone",
                  "zeroPaddedDate", "missingSpaceBeforeDate", "missingSpaceBeforeEmail",
                  "missingNameBeforeEmail", "badName", "nullSha1")


def fsck(repo: Path, timeout: float = 1800.0, tolerate: tuple[str, ...] = HISTORY_QUIRKS,
         connectivity_only: bool = False) -> str:
    """``git fsck --full`` (history quirks in *tolerate* only warn); raises on any
    error, returns the (warning) output.  *connectivity_only* skips re-hashing
    blobs (index-pack already verified every object while cloning)."""
    cfg: list[str] = []
    for msg_id in tolerate:
        cfg += ["-c", f"fsck.{msg_id}=warn"]
    mode = ["--connectivity-only"] if connectivity_only else ["--full"]
    res = run_git([*cfg, "--git-dir", str(repo), "fsck", *mode, "--no-progress"],
                  timeout=timeout)
    return (res.stdout + res.stderr).decode(errors="replace")


def list_refs(repo: Path) -> dict[str, str]:
    """All refs of a repository as ``{refname: objectname}``."""
    out = git_out(["--git-dir", str(repo), "for-each-ref",
                   "--format=%(refname) %(objectname)"])
    return dict(line.split(" ", 1) for line in out.splitlines())  # type: ignore[misc]


def count_objects(repo: Path) -> dict[str, int]:
    """Parsed ``git count-objects -v`` (count, in-pack, packs, size-pack, ...)."""
    out = git_out(["--git-dir", str(repo), "count-objects", "-v"])
    return {k: int(v) for k, v in (line.split(": ") for line in out.splitlines())}
