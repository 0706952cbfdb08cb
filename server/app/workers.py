"""``--workers N``: a master process and N prefork workers on one port (README "Scaling";
docs/operations.md "Workers").

One gitspout process runs Python under one GIL and uses about one core. With ``--workers
N`` the process started becomes a master that serves nothing itself: it reserves the
address, forks N workers, restarts one that dies (with a backoff), forwards SIGTERM, SIGINT,
SIGQUIT and SIGHUP to every worker, and exits once every worker has drained.

Why ``SO_REUSEPORT``: each worker listens on a socket of its own bound to the same address,
and the kernel hashes each new connection to one of them. Accepting is balanced whatever
the workers are doing. With one listening socket shared by inheritance, every idle worker
is woken for each connection (epoll), and whichever loop comes back first takes it, so one
worker often gets most of a burst. The master binds the address with ``SO_REUSEPORT`` but
never listens: a bound socket that is not listening gets no connections. It holds the
port (``--port 0`` resolves once, for every worker and every restart) and keeps another
program from taking it while a worker restarts. A drawback: connections still queued in a
worker's own accept queue when it dies are reset (its kernel queue goes with it).

Budgets are split between the workers (:func:`worker_config`): memory, disk, connections
and pack slots are divided, so the whole pod stays within the limits set for one process
and its Kubernetes memory limit needs no change. Descriptors (``--max-open-packs``) and
threads stay per worker: each process has its own.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from .auth import load_access
from .cachedir import make_directory, reclaim_orphans
from .cacheshare import forget_producer
from .config import Config, ConfigError
from .logtext import STARTUP

__all__ = ["WorkerLink", "Master", "usable_cpus", "resolve_workers", "worker_config",
           "reserve_address", "READY_SIGNAL"]

log = logging.getLogger("gitspout")

READY_SIGNAL = signal.SIGUSR1  # a worker to the master: my listeners are up
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)
WATCHED = {*FORWARDED, signal.SIGCHLD, READY_SIGNAL}
BACKOFF_FIRST = 0.1  # seconds before restarting a worker that died
BACKOFF_MAX = 10.0  # doubling for each death in a row that came before STABLE
STABLE = 10.0  # seconds a worker must have lived for its death to reset the backoff
MAX_WORKERS = 256


def _cgroup_quota(root: str, self_cgroup: str) -> float | None:
    """CPUs allowed by the cgroup CPU quota of this process (v2 ``cpu.max``, v1
    ``cpu.cfs_quota_us``/``cfs_period_us``), the smallest along its cgroup's ancestors;
    None when there is no quota."""
    best: float | None = None
    try:
        lines = Path(self_cgroup).read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _id, ctrls, path = (line.split(":", 2) + ["", ""])[:3]
        if ctrls == "" and _id == "0":  # v2 unified hierarchy
            dirs, read = _ancestors(Path(root), path), _v2_quota
        elif "cpu" in ctrls.split(","):
            dirs = _ancestors(Path(root) / ctrls, path) + _ancestors(Path(root) / "cpu", path)
            read = _v1_quota
        else:
            continue
        for d in dirs:
            q = read(d)
            if q is not None and (best is None or q < best):
                best = q
    return best


def _ancestors(base: Path, path: str) -> list[Path]:
    parts = [p for p in path.strip().split("/") if p]
    return [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def _v2_quota(d: Path) -> float | None:
    try:
        quota, period = (d / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _v1_quota(d: Path) -> float | None:
    try:
        quota = int((d / "cpu.cfs_quota_us").read_text())
        period = int((d / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 or period <= 0 else quota / period


def usable_cpus(root: str = "/sys/fs/cgroup", self_cgroup: str = "/proc/self/cgroup") -> int:
    """The CPUs this process may use: its affinity mask (``taskset``, a cpuset), capped
    by a cgroup CPU quota (a Kubernetes CPU limit of 1500m gives 2); at least 1."""
    cpus = len(os.sched_getaffinity(0))
    quota = _cgroup_quota(root, self_cgroup)
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)


def resolve_workers(value: str) -> int:
    """``--workers``: a count from 1 to MAX_WORKERS, or ``auto`` (:func:`usable_cpus`)."""
    text = str(value).strip().lower()
    if text == "auto":
        return min(MAX_WORKERS, usable_cpus())
    try:
        n = int(text)
    except ValueError:
        raise ConfigError(f"workers must be a number or 'auto', not {value!r}") from None
    if not 1 <= n <= MAX_WORKERS:
        raise ConfigError(f"workers must be between 1 and {MAX_WORKERS}")
    return n


def _share(total: int, n: int, floor: int = 0) -> int:
    """One worker's share of a cap (0 stays 0: no cap), rounded up, at least ``floor``."""
    return 0 if total == 0 else max(floor, -(-total // n))


def worker_config(cfg: Config, n: int, port: int, metrics_port: int) -> Config:
    """One worker's settings: the resolved ports, and every budget of the pod divided by
    ``n`` (memory, disk, connections, pack slots), so that N workers stay within what one
    process was given (module doc)."""
    if n == 1:
        return replace(cfg, port=port, metrics_port=metrics_port)
    body = _share(cfg.body_memory, n)
    return replace(
        cfg, port=port, metrics_port=metrics_port,
        cache_memory=_share(cfg.cache_memory, n), inflate_memory=_share(cfg.inflate_memory, n),
        body_memory=max(body, cfg.max_inflated_body) if body else 0,
        pack_cache_size=_share(cfg.pack_cache_size, n),
        max_connections=_share(cfg.max_connections, n, 2),
        max_packs=_share(cfg.max_packs, n, 1), max_packs_per_repo=_share(cfg.max_packs_per_repo, n, 1),
        pack_queue=_share(cfg.pack_queue, n))


def reserve_address(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with SO_REUSEPORT and never listening: it holds the
    port for the workers (module doc). OSError when the address cannot be had."""
    family, kind, proto, _name, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    return sock


@dataclass(frozen=True)
class WorkerLink:
    """What a worker knows of its master: its index, the master's pid (a worker whose
    master is gone is not ready), the private directory where workers exchange metrics
    (workerstats.py), and how many workers there should be."""

    index: int
    master_pid: int
    directory: str
    workers: int
    cache_dir: str = ""  # the pack-cache directory shared by the workers (cacheshare.py)
    bundle_dir: str = ""  # --bundles: the bundle directory shared by the workers
    blob_dir: str = ""  # --blob-uri-threshold: the blob-pack directory shared by them

    def master_alive(self) -> bool:
        return os.getppid() == self.master_pid


@dataclass
class _Child:
    index: int
    pid: int
    started: float
    ready: bool = False


@dataclass
class Master:
    """The master's loop (module doc). ``run_worker`` runs one worker to its end in the
    forked child and returns its exit status."""

    cfg: Config
    workers: int
    run_worker: Callable[[Config, WorkerLink], int]
    url: str = ""
    cache_dir: str = ""
    bundle_dir: str = ""
    blob_dir: str = ""
    directory: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="gitspout-workers-"))
    children: dict[int, _Child] = field(default_factory=dict)  # by pid
    restarts: int = 0
    stopping: bool = False
    announced: bool = False
    _due: dict[int, float] = field(default_factory=dict)  # index -> monotonic restart time
    _fails: dict[int, int] = field(default_factory=dict)  # index -> quick deaths in a row
    auth_source: str = ""  # --auth-file as given; the workers read the master's copy

    def run(self) -> int:
        """Fork the workers and supervise them until they have all exited after a stop."""
        signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
        for sig in WATCHED:  # blocked and not ignored: they stay pending for sigtimedwait
            signal.signal(sig, signal.SIG_DFL)
        try:
            if self.cfg.auth_file and not self.auth_source:
                # Every worker, a restarted one too, reads the auth file the master last
                # found good: an edit not yet signalled, or a broken file, reaches none
                # of them until SIGHUP, and then all of them or none.
                self.auth_source = self.cfg.auth_file
                self._copy_auth_file()
                self.cfg = replace(self.cfg, auth_file=os.path.join(self.directory,
                                                                    "auth-file.toml"))
            for index in range(self.workers):
                self._spawn(index)
            while self.children or not self.stopping:
                self._write_status()
                info = signal.sigtimedwait(WATCHED, self._timeout())
                if info is not None:
                    self._on_signal(info.si_signo)
                self._reap()
                self._restart_due()
                self._announce()
        finally:
            for child in self.children.values():  # a bug in the master: take them along
                _kill(child.pid, signal.SIGTERM)
            _remove_tree(self.directory)
        log.info("all %d workers stopped", self.workers)
        return 0

    def _timeout(self) -> float:
        if not self._due:
            return 1.0
        return max(0.0, min(self._due.values()) - time.monotonic())

    def _spawn(self, index: int) -> None:
        link = WorkerLink(index, os.getpid(), self.directory, self.workers, self.cache_dir,
                          self.bundle_dir, self.blob_dir)
        pid = os.fork()
        if pid == 0:  # the worker: never returns into the master's code
            code = 1
            try:
                for sig in WATCHED:
                    signal.signal(sig, signal.SIG_DFL)
                signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until its loop handles it
                signal.pthread_sigmask(signal.SIG_UNBLOCK, WATCHED)
                _die_with_parent(link.master_pid)
                code = self.run_worker(self.cfg, link)
            except BaseException:  # noqa: BLE001 - the child must end here, whatever happened
                traceback.print_exc()
            finally:
                os._exit(code)
        self.children[pid] = _Child(index, pid, time.monotonic())

    def _copy_auth_file(self) -> None:
        """The auth file, checked, copied whole over the workers' copy; ConfigError (the
        copy left as it was) when it cannot be read or is not a good auth file."""
        copy = os.path.join(self.directory, "auth-file.toml")
        tmp = copy + ".tmp"
        try:
            with open(self.auth_source, "rb") as src:
                data = src.read()
            with open(tmp, "wb") as dst:
                dst.write(data)
        except OSError as exc:
            raise ConfigError(f"cannot read auth file {self.auth_source}: "
                              f"{exc.strerror or exc}") from None
        try:
            load_access(tmp)
        except ConfigError as exc:
            os.unlink(tmp)
            raise ConfigError(str(exc).replace(tmp, self.auth_source)) from None
        os.replace(tmp, copy)

    def _on_signal(self, signo: int) -> None:
        if signo == signal.SIGHUP and self.auth_source:
            try:
                self._copy_auth_file()
            except ConfigError as exc:
                log.warning("SIGHUP: auth file not reloaded, every worker keeps the previous "
                            "one: %s", exc)
                return
        if signo in FORWARDED:
            if signo != signal.SIGHUP and not self.stopping:
                self.stopping = True
                self._due.clear()
                log.info("%s: stopping %d workers", signal.Signals(signo).name,
                         len(self.children))
            for child in self.children.values():
                _kill(child.pid, signo)
        elif signo == READY_SIGNAL:
            for child in self.children.values():
                if not child.ready and os.path.exists(ready_path(self.directory, child.pid)):
                    child.ready = True
                    log.info("worker %d (pid %d) ready", child.index, child.pid)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is None:
                continue
            forget_worker(self.directory, pid)
            if self.cache_dir:
                forget_producer(self.cache_dir, pid)
            if self.stopping:
                log.info("worker %d (pid %d) stopped: %s", child.index, pid, _how(status))
                continue
            lived = time.monotonic() - child.started
            fails = 0 if lived >= STABLE else self._fails.get(child.index, 0) + 1
            self._fails[child.index] = fails
            delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** max(0, fails - 1))
            self._due[child.index] = time.monotonic() + delay
            log.warning("worker %d (pid %d) %s after %.1f s; restarting it in %.1f s",
                        child.index, pid, _how(status), lived, delay)

    def _restart_due(self) -> None:
        now = time.monotonic()
        for index, when in list(self._due.items()):
            if when <= now and not self.stopping:
                del self._due[index]
                self.restarts += 1
                self._spawn(index)

    def _announce(self) -> None:
        if not self.announced and all(c.ready for c in self.children.values()) \
                and len(self.children) == self.workers:
            self.announced = True
            logging.getLogger(STARTUP).info("serving %s at %s (%d workers)",
                                            self.cfg.root_path(), self.url, self.workers)

    def _write_status(self) -> None:
        """``master.status``: wanted, alive and ready workers and restarts, for /metrics
        and /readyz in the workers (workerstats.py)."""
        ready = sum(c.ready for c in self.children.values())
        text = f"{self.workers} {len(self.children)} {ready} {self.restarts}\n"
        path = os.path.join(self.directory, "master.status")
        try:
            tmp = path + ".tmp"
            with open(tmp, "w") as fh:
                fh.write(text)
            os.replace(tmp, path)
        except OSError:
            pass


def ready_path(directory: str, pid: int) -> str:
    """The socket a worker serves its own metrics on: its existence says it is ready."""
    return os.path.join(directory, f"w-{pid}.sock")


def forget_worker(directory: str, pid: int) -> None:
    """A dead worker's socket goes (its live gauges with it); its counters stay as last
    seen by a scrape (``last-PID.prom``, workerstats.py)."""
    try:
        os.unlink(ready_path(directory, pid))
    except OSError:
        pass


def _how(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with status {os.waitstatus_to_exitcode(status)}"


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _die_with_parent(master_pid: int) -> None:
    """A worker drains (SIGTERM) when its master dies, however it dies (PR_SET_PDEATHSIG):
    orphans would keep serving a port nobody supervises."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != master_pid:  # it died before the prctl
        os.kill(os.getpid(), signal.SIGTERM)


def _remove_tree(directory: str) -> None:
    import shutil

    shutil.rmtree(directory, ignore_errors=True)





def start_master(cfg: Config, n: int, run_worker: Callable[[Config, WorkerLink], int],
                 url: Callable[[str, int], str]) -> int:
    """Reserve the serving (and metrics) address, then run the master until its workers
    have stopped; OSError when an address cannot be had."""
    held = [reserve_address(cfg.host, cfg.port)]
    cache_dir, cache_lock = "", -1
    bundle_dir, bundle_lock = "", -1
    blob_dir, blob_lock = "", -1
    try:
        port = held[0].getsockname()[1]
        metrics_port = cfg.metrics_port
        if metrics_port:
            held.append(reserve_address(cfg.host, metrics_port))
            metrics_port = held[-1].getsockname()[1]
        wcfg = worker_config(cfg, n, port, metrics_port)
        if cfg.pack_cache_size > 0:  # one directory for all: one producer per key
            base = cfg.pack_cache_dir or tempfile.gettempdir()
            os.makedirs(base, exist_ok=True)
            reclaim_orphans(base)
            cache_dir, cache_lock = make_directory(base)
        if cfg.bundles:  # one directory for all: any worker serves what one wrote
            base = os.path.join(cfg.bundle_dir or tempfile.gettempdir(), "gitspout-bundles")
            os.makedirs(base, exist_ok=True)
            reclaim_orphans(base)
            bundle_dir, bundle_lock = make_directory(base)
        if cfg.blob_uri_threshold > 0:  # likewise the one-blob packs (blobpacks.py)
            base = os.path.join(cfg.bundle_dir or tempfile.gettempdir(), "gitspout-blobpacks")
            os.makedirs(base, exist_ok=True)
            reclaim_orphans(base)
            blob_dir, blob_lock = make_directory(base)
        log.info("master (pid %d): %d workers on %s", os.getpid(), n, url(cfg.host, port))
        return Master(wcfg, n, run_worker, url=url(cfg.host, port), cache_dir=cache_dir,
                      bundle_dir=bundle_dir, blob_dir=blob_dir).run()
    finally:
        for sock in held:
            sock.close()
        for directory, lock in ((cache_dir, cache_lock), (bundle_dir, bundle_lock),
                                (blob_dir, blob_lock)):
            if directory:
                _remove_tree(directory)
                os.close(lock)
