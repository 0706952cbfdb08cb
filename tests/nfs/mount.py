"""Start and stop a latencyfs mount from tests and benchmarks.

Example::

    from tests.nfs.mount import LatencyMount, fuse_available

    if (reason := fuse_available()) is None:
        with LatencyMount("/srv/repos", delay_ms=1.0) as m:
            run_server(root=m.path)          # repositories seen through the mount
            m.reset()
            ...
            print(m.stats()["lookup"])

The filesystem runs as a subprocess (``latencyfs.py`` run by file path, so no
package import path is needed).  :meth:`LatencyMount.start` returns once the
mount serves requests; :meth:`LatencyMount.stop` (also on ``with`` exit,
whatever the exception) unmounts, ends the daemon, and lazily force-unmounts
if the daemon died, so a failed test never leaves a dead mount behind.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

try:
    from .latencyfs import control_request, ping, read_stats, reset_stats
except ImportError:  # imported as a top-level module (pytest rootdir-less conftest)
    from latencyfs import control_request, ping, read_stats, reset_stats  # type: ignore[no-redef]

#: The daemon script; run by path so callers need no particular sys.path.
LATENCYFS_SCRIPT = Path(__file__).resolve().with_name("latencyfs.py")

__all__ = [
    "LATENCYFS_SCRIPT",
    "LatencyMount",
    "MountError",
    "MountFactory",
    "force_unmount",
    "fuse_available",
    "is_mounted",
    "read_stats",
    "reset_stats",
]


class MountError(RuntimeError):
    """The latencyfs daemon did not come up (the message carries its log)."""


#: Type of the ``latency_mount`` pytest fixture: ``(source=None, **kwargs) -> LatencyMount``.
MountFactory = Callable[..., "LatencyMount"]


# --------------------------------------------------------------------------
# Environment probes
# --------------------------------------------------------------------------


def fuse_available(python: str | None = None) -> str | None:
    """Return None when a latencyfs mount can be made here, else the reason why not.

    Checks: Linux, an openable ``/dev/fuse``, pyfuse3 importable by *python*
    (default: this interpreter), and root or ``fusermount3``.
    """
    if not sys.platform.startswith("linux"):
        return f"FUSE passthrough needs Linux (platform is {sys.platform})"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing (no FUSE support in this kernel or container)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"cannot open /dev/fuse: {exc}"
    reason = _pyfuse3_missing(python)
    if reason:
        return reason
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        return "not root and fusermount3 is not installed (apt-get install fuse3)"
    return None


def _pyfuse3_missing(python: str | None) -> str | None:
    hint = "pyfuse3 is not installed (pip install -e '.[nfs]'; needs libfuse3-dev, pkg-config)"
    if python is None or os.path.realpath(python) == os.path.realpath(sys.executable):
        return None if importlib.util.find_spec("pyfuse3") is not None else hint
    try:
        done = subprocess.run([python, "-c", "import pyfuse3, trio"], capture_output=True,
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {python}: {exc}"
    return None if done.returncode == 0 else hint


def _unescape_mount_field(field: str) -> str:
    """Decode the octal escapes (``\\040`` etc.) of /proc/self/mountinfo."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def is_mounted(path: str | os.PathLike[str]) -> bool:
    """True when *path* is a mount point, even a dead FUSE mount (where stat fails)."""
    target = os.path.realpath(os.path.abspath(os.fspath(path)))
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
            return any(_unescape_mount_field(line.split()[4]) == target for line in fh)
    except OSError:
        return os.path.ismount(target)


def force_unmount(path: str | os.PathLike[str], timeout: float = 10.0) -> None:
    """Lazily detach the mount at *path* (works for a dead FUSE mount too)."""
    target = os.fspath(path)
    for cmd in (["fusermount3", "-u", "-z", target], ["umount", "-l", target]):
        if not is_mounted(target):
            return
        if shutil.which(cmd[0]) is None:
            continue
        try:
            subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
    if is_mounted(target):
        raise MountError(f"could not unmount {target}")


def _die_with_parent() -> None:
    """preexec_fn: SIGTERM the daemon when the process that started it dies."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (AttributeError, OSError):
        pass


# --------------------------------------------------------------------------
# The mount
# --------------------------------------------------------------------------


class LatencyMount:
    """A latencyfs mount of *source*, alive between :meth:`start` and :meth:`stop`.

    Attributes: ``path`` (the mount point), ``source``, ``control`` (the
    daemon's control socket), ``log_path`` and ``pid``.

    *mountpoint* defaults to a fresh temporary directory (removed on stop).
    *die_with_parent* makes the daemon exit when the thread that started it
    ends (PR_SET_PDEATHSIG): right for pytest and scripts, wrong when starting
    mounts from short-lived threads.
    """

    def __init__(
        self,
        source: str | os.PathLike[str],
        *,
        delay_ms: float = 1.0,
        data_delay_ms: float = 0.0,
        attr_timeout: float = 0.0,
        entry_timeout: float = 0.0,
        negative_timeout: float = 0.0,
        keep_cache: bool = True,
        mountpoint: str | os.PathLike[str] | None = None,
        stats_file: str | os.PathLike[str] | None = None,
        max_tasks: int = 128,
        python: str | None = None,
        startup_timeout: float = 10.0,
        stop_timeout: float = 10.0,
        die_with_parent: bool = True,
        debug: bool = False,
    ) -> None:
        self.source = Path(source).resolve()
        self.options: dict[str, Any] = {
            "delay_ms": delay_ms, "data_delay_ms": data_delay_ms,
            "attr_timeout": attr_timeout, "entry_timeout": entry_timeout,
            "negative_timeout": negative_timeout,
        }
        self.keep_cache = keep_cache
        self.stats_file = Path(stats_file).resolve() if stats_file else None
        self.max_tasks = max_tasks
        self.python = python or sys.executable
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.die_with_parent = die_with_parent
        self.debug = debug
        self._own_mountpoint = mountpoint is None
        self._mountpoint_arg = Path(mountpoint).resolve() if mountpoint else None
        self._workdir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_text = ""
        self.path: Path = self._mountpoint_arg or Path()
        self.control: Path = Path()
        self.log_path: Path = Path()

    # ---- lifecycle ------------------------------------------------------

    def start(self) -> LatencyMount:
        """Mount and wait (at most ``startup_timeout`` s) until it serves requests."""
        if self._proc is not None:
            raise MountError("already started")
        if not self.source.is_dir():
            raise MountError(f"source {self.source} is not a directory")
        self._workdir = Path(tempfile.mkdtemp(prefix="latencyfs-"))
        self.control = self._workdir / "ctl.sock"
        self.log_path = self._workdir / "daemon.log"
        if self._own_mountpoint:
            self.path = self._workdir / "mnt"
            self.path.mkdir()
        else:
            self.path = self._mountpoint_arg or Path()
        try:
            self._spawn()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _command(self) -> list[str]:
        cmd = [self.python, str(LATENCYFS_SCRIPT), str(self.source), str(self.path),
               "--foreground", "--control", str(self.control),
               "--max-tasks", str(self.max_tasks)]
        for name, value in self.options.items():
            cmd += [f"--{name.replace('_', '-')}", repr(float(value))]
        if not self.keep_cache:
            cmd.append("--no-keep-cache")
        if self.stats_file:
            cmd += ["--stats", str(self.stats_file)]
        if self.debug:
            cmd.append("--debug")
        return cmd

    def _spawn(self) -> None:
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                self._command(), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True, close_fds=True,
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        assert self._proc is not None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise MountError(f"latencyfs exited with {self._proc.returncode}:\n"
                                 f"{self.log_text()}")
            if self.control.exists() and ping(self.control) and is_mounted(self.path):
                return
            time.sleep(0.02)
        raise MountError(f"latencyfs not ready after {self.startup_timeout} s:\n"
                         f"{self.log_text()}")

    def stop(self) -> None:
        """Unmount and end the daemon; idempotent and safe after any failure."""
        if self._proc is None:
            return
        errors: list[str] = []
        self._end_daemon(errors)
        if is_mounted(self.path):
            try:
                force_unmount(self.path)
            except MountError as exc:
                errors.append(str(exc))
        self._cleanup_dirs()
        if errors:
            raise MountError("; ".join(errors))

    def _end_daemon(self, errors: list[str]) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            errors.append(f"latencyfs pid {proc.pid} ignored SIGTERM; killed")
            proc.kill()
            proc.wait(timeout=self.stop_timeout)

    def _cleanup_dirs(self) -> None:
        if self._workdir is None:
            return
        self._log_text = self.log_text()
        if self._own_mountpoint and self.path.exists() and not is_mounted(self.path):
            self.path.rmdir()
        if not is_mounted(self.path):
            shutil.rmtree(self._workdir, ignore_errors=True)
        self._workdir = None

    def __enter__(self) -> LatencyMount:
        return self if self._proc is not None else self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ---- observation ----------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The daemon's process id."""
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        """True while the daemon runs."""
        return self._proc is not None and self._proc.poll() is None

    def stats(self) -> dict[str, int]:
        """Request counters (kind -> count, plus ``_``-prefixed aggregates)."""
        return read_stats(self.control)

    def reset(self) -> None:
        """Zero the request counters."""
        reset_stats(self.control)

    def dump_stats(self) -> None:
        """Have the daemon write its counters to ``stats_file`` now."""
        control_request(self.control, "dump")

    def log_text(self) -> str:
        """The daemon's stdout/stderr so far (kept after stop)."""
        if self._workdir is not None and self.log_path.exists():
            return self.log_path.read_text(errors="replace")
        return self._log_text

    def __repr__(self) -> str:
        return (f"LatencyMount({str(self.source)!r} -> {str(self.path)!r}, "
                f"delay_ms={self.options['delay_ms']}, pid={self.pid})")
