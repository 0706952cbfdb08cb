"""Minimal cgroup v1 helper to measure the CPU and memory of a process tree.

A :class:`Cgroup` creates one group named ``gitspout-bench-<name>@<pid>`` in the
``cpuacct`` and ``memory`` hierarchies.  Each group is nested under the
cgroup the *current* process lives in for that controller (read from
``/proc/self/cgroup``), so the benchmark never escapes the memory/CPU
accounting of whatever started it.  Processes are put in the group from
birth with :meth:`Cgroup.wrap_argv`; everything they fork afterwards
inherits the group, so ``usage_ns()`` covers children (CGI processes, git
subprocesses, workers) too, including children that have already exited.

Peak RSS of a single live process is better read from ``/proc/<pid>/status``
(``VmHWM``) via :func:`peak_rss_bytes`; the memory controller's
``memory.max_usage_in_bytes`` also counts page cache charged to the group
(e.g. pack files first read by a process of the group).

CLI: ``python -m bench.cgroup list`` / ``python -m bench.cgroup cleanup``
removes leftovers of crashed runs (only groups named ``gitspout-bench-*``).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import sys
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PREFIX = "gitspout-bench-"
CONTROLLERS = ("cpuacct", "memory")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")  # '@' is reserved for the owner pid


class CgroupError(RuntimeError):
    """A cgroup could not be created, used or removed."""


def own_cgroup_path(controller: str) -> str:
    """Return this process's cgroup path (e.g. ``/`` or ``/a/b``) for a v1 controller."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if controller in ctrls.split(","):
            return path
    raise CgroupError(f"controller {controller!r} not found in /proc/self/cgroup")


def controller_base(controller: str) -> Path:
    """Directory under which our groups for *controller* are created."""
    mount = CGROUP_ROOT / controller
    if not (mount / "cgroup.procs").exists():
        raise CgroupError(f"cgroup v1 controller {controller!r} is not mounted at {mount}")
    return mount / own_cgroup_path(controller).lstrip("/")


def peak_rss_bytes(pid: int) -> int | None:
    """Peak resident set size (``VmHWM``) of a live process, or None if it is gone."""
    return _status_field(pid, "VmHWM")


def rss_bytes(pid: int) -> int | None:
    """Current resident set size (``VmRSS``) of a live process, or None if it is gone."""
    return _status_field(pid, "VmRSS")


def _status_field(pid: int, field: str) -> int | None:
    """Read a ``kB`` field of ``/proc/<pid>/status`` and return it in bytes."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return None  # kernel threads / zombies have no VmHWM


class Cgroup:
    """One benchmark cgroup (cpuacct + memory) holding a process tree.

    Usage::

        with Cgroup("A") as cg:                 # gitspout-bench-A@<pid>
            proc = subprocess.Popen(cg.wrap_argv(["nginx", ...]))
            ...
            print(cg.usage_ns(), cg.memory_max_bytes())
        # on exit: every process still in the group is killed, dirs removed
    """

    def __init__(self, name: str, controllers: tuple[str, ...] = CONTROLLERS,
                 unique: bool = True) -> None:
        """Group ``gitspout-bench-<name>@<our pid>`` (or without ``@pid`` if not
        *unique*); the pid suffix keeps concurrent benchmark runs apart and lets
        ``cleanup`` tell a crashed run's leftovers from a live run's groups."""
        if not _NAME_RE.match(name):
            raise CgroupError(f"invalid cgroup name {name!r}")
        self.name = PREFIX + name + (f"@{os.getpid()}" if unique else "")
        self.dirs: dict[str, Path] = {c: controller_base(c) / self.name for c in controllers}
        self.created = False

    # -- lifecycle -------------------------------------------------------
    def create(self) -> Cgroup:
        """Create the group directories; a stale empty group is reused."""
        for d in self.dirs.values():
            if d.exists():
                left = _read_pids(d)
                if left:
                    raise CgroupError(
                        f"{d} already exists with processes {left}; another benchmark is "
                        "running or a previous one crashed (python -m bench.cgroup cleanup)"
                    )
            else:
                try:
                    d.mkdir()
                except OSError as e:
                    raise CgroupError(f"cannot create {d}: {e} (root needed)") from e
        self.created = True
        self.reset()
        return self

    def remove(self, timeout: float = 10.0) -> None:
        """Kill every process left in the group, then remove the directories."""
        self.kill_all(timeout=timeout)
        for d in self.dirs.values():
            _rmdir_retry(d, timeout)
        self.created = False

    def __enter__(self) -> Cgroup:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # -- membership -------------------------------------------------------
    def add_pid(self, pid: int) -> None:
        """Move an existing process (not its existing children) into the group."""
        for d in self.dirs.values():
            (d / "cgroup.procs").write_text(f"{pid}\n")

    def wrap_argv(self, argv: list[str]) -> list[str]:
        """Return an argv that joins the group and then ``exec``\\ s *argv*.

        The process is inside the group before the target program starts, so
        nothing it does (or forks) escapes the accounting.
        """
        joins = " && ".join(f"echo $$ > {shlex.quote(str(d / 'cgroup.procs'))}"
                            for d in self.dirs.values())
        return ["sh", "-c", f'{joins} && exec "$@"', "sh", *argv]

    def pids(self) -> list[int]:
        """Processes currently in the group (union over controllers)."""
        found: set[int] = set()
        for d in self.dirs.values():
            found.update(_read_pids(d))
        return sorted(found)

    def kill_all(self, sig: int = signal.SIGKILL, timeout: float = 10.0) -> None:
        """Send *sig* to every process in the group until it is empty (bounded)."""
        deadline = time.monotonic() + timeout
        while True:
            pids = self.pids()
            if not pids:
                return
            if time.monotonic() > deadline:
                raise CgroupError(f"{self.name}: processes {pids} survived kill")
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)

    # -- measurements ---------------------------------------------------------
    def usage_ns(self) -> int:
        """Total CPU time (user+system, ns) consumed by the group since the last reset."""
        return int(self._read("cpuacct", "cpuacct.usage"))

    def cpu_stat(self) -> dict[str, int]:
        """``cpuacct.stat``: user/system CPU in USER_HZ ticks (usually 1/100 s)."""
        out: dict[str, int] = {}
        for line in self._read("cpuacct", "cpuacct.stat").splitlines():
            key, val = line.split()
            out[key] = int(val)
        return out

    def memory_max_bytes(self) -> int:
        """``memory.max_usage_in_bytes``: peak charge (RSS + page cache) since reset."""
        return int(self._read("memory", "memory.max_usage_in_bytes"))

    def memory_usage_bytes(self) -> int:
        """``memory.usage_in_bytes``: current charge (RSS + page cache)."""
        return int(self._read("memory", "memory.usage_in_bytes"))

    def memory_stat(self) -> dict[str, int]:
        """Parsed ``memory.stat`` (rss, cache, mapped_file, ...)."""
        out: dict[str, int] = {}
        for line in self._read("memory", "memory.stat").splitlines():
            key, val = line.split()
            out[key] = int(val)
        return out

    def peak_rss_by_pid(self) -> dict[int, int]:
        """``VmHWM`` of each live process of the group (bytes)."""
        out: dict[int, int] = {}
        for pid in self.pids():
            hwm = peak_rss_bytes(pid)
            if hwm is not None:
                out[pid] = hwm
        return out

    def reset(self) -> None:
        """Zero the CPU counter and the memory high-water mark."""
        if "cpuacct" in self.dirs:
            (self.dirs["cpuacct"] / "cpuacct.usage").write_text("0\n")
        if "memory" in self.dirs:
            (self.dirs["memory"] / "memory.max_usage_in_bytes").write_text("0\n")

    def _read(self, ctrl: str, fname: str) -> str:
        if ctrl not in self.dirs:
            raise CgroupError(f"{self.name} was created without the {ctrl} controller")
        return (self.dirs[ctrl] / fname).read_text()


def _read_pids(d: Path) -> list[int]:
    try:
        return [int(x) for x in (d / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def _rmdir_retry(d: Path, timeout: float) -> None:
    """rmdir a cgroup dir; retries while exiting processes are still being reaped."""
    deadline = time.monotonic() + timeout
    while d.exists():
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if time.monotonic() > deadline:
                raise CgroupError(f"cannot remove {d}: {e}") from e
            time.sleep(0.05)


def leftover_groups() -> list[Path]:
    """All ``gitspout-bench-*`` group directories under our own cgroups."""
    found: list[Path] = []
    for ctrl in CONTROLLERS:
        try:
            found.extend(sorted(controller_base(ctrl).glob(PREFIX + "*")))
        except CgroupError:
            continue
    return found


def owner_alive(d: Path) -> bool:
    """True if the group's name ends in ``@<pid>`` of a process that still runs."""
    _, _, pid = d.name.rpartition("@")
    return pid.isdigit() and Path(f"/proc/{pid}").exists()


def cleanup_leftovers(force: bool = False) -> int:
    """Kill processes in and remove leftover ``gitspout-bench-*`` groups whose
    creating process is gone (all of them with *force*)."""
    groups = [d for d in leftover_groups() if force or not owner_alive(d)]
    for d in groups:
        for pid in _read_pids(d):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _rmdir_retry(d, 10.0)
    return len(groups)


def main(argv: list[str] | None = None) -> int:
    """CLI: ``list`` or ``cleanup`` leftover benchmark cgroups."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["list", "cleanup"])
    ap.add_argument("--force", action="store_true",
                    help="also remove groups of benchmark runs that are still alive")
    args = ap.parse_args(argv)
    if args.action == "list":
        for d in leftover_groups():
            state = "owner running" if owner_alive(d) else "orphaned"
            print(d, state, _read_pids(d))
    else:
        print(f"removed {cleanup_leftovers(args.force)} group(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
