"""The gitspout command: ``gitspout serve --root DIR [--host H] [--port P] [--config F]``;
``gitspout config`` (or ``serve --print-config``) prints the effective settings and where
each came from, ``--check-config`` checks them without serving (configview.py)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import getpass
import logging
import os
import resource
import socket
import sys
from collections.abc import Sequence
from dataclasses import replace
from importlib import metadata
from typing import Any

import uvloop
from aiohttp import web

from .auth import hash_password, load_access
from .config import Config, ConfigError, load_settings
from .configview import add_config_arguments, check, describe
from .connections import ConnectionGuard, install_log_filter, listen
from .drain import drain
from .http import HANDLER_KWARGS, SERVER_KWARGS, make_app, metrics_response
from .logtext import STARTUP, install_logging
from .memory import fix_mmap_threshold
from .signals import Signals, ignore_hangup
from .state import ServerState
from .workers import READY_SIGNAL, WorkerLink, resolve_workers, start_master
from .workerstats import WorkerStats

__all__ = ["main", "serve", "StartupError"]


class StartupError(Exception):
    """The server cannot start (a port in use, an unknown host...): one line, no traceback."""

log = logging.getLogger("gitspout")
startup = logging.getLogger(STARTUP)  # shown at every --log-level (logtext.py)
# Descriptors needed beside --max-open-packs and --max-connections: packs pinned by reads in
# progress (a few per pool thread), loose objects and ref files being read, pack-cache
# files, the pool, logs, listeners.
FD_RESERVE = 128
METRICS_CONNECTIONS = 16  # cap of the --metrics-port listener (Prometheus needs one or two)
# How long a pool thread running Python (negotiation, framing ACK lines) may keep the GIL
# while the event-loop thread waits for it; every hop of a request on the loop can wait this
# long. Python's default, 5 ms, put the p99 of a tiny ls-refs at ~90 ms beside a
# 100k-have negotiation on 2 cores; 1 ms brings it near 40 ms, for a few percent more GIL
# hand-offs between busy threads.
GIL_SWITCH_INTERVAL = 0.001
# A garbage collection runs in whichever thread allocates and holds the GIL throughout. A
# full one while a 600k-have negotiation holds millions of references took 100-300 ms, and
# the loop answered nothing meanwhile: with Python's default thresholds (700, 10, 10) there
# were ~20 of them in 10 s of such requests, one with these. Startup objects (modules,
# classes, ~40k) are frozen once the server is set up, so full collections skip them.
GC_THRESHOLDS = (50_000, 20, 10)


async def serve(cfg: Config, ready: asyncio.Event | None = None,
                link: WorkerLink | None = None) -> None:
    """Run the server until SIGINT, SIGTERM or SIGQUIT (signals.py); as one of the
    workers of ``link``'s master with ``--workers`` (workers.py)."""
    install_log_filter()
    # Signals first: a SIGTERM while the server starts drains it like any other (the
    # default action would kill it without removing its pack-cache directory).
    signals = Signals(asyncio.get_running_loop(), cfg)
    state = ServerState.create(cfg, link.cache_dir if link is not None else "",
                               link.bundle_dir if link is not None else "",
                               link.blob_dir if link is not None else "",
                               link.workers if link is not None else 1)
    signals.state = state
    listeners: list[asyncio.Server] = []
    runners: list[web.AppRunner] = []
    guards: list[ConnectionGuard] = []
    serving = False
    try:
        # aiohttp waits up to shutdown_timeout for each handler before cancelling it: that
        # is the drain (docs/ARCHITECTURE.md "Drain and health"). drain.py cuts every
        # connection at --drain-timeout itself; aiohttp's own timeout comes a moment
        # later, so that it never fires in the same tick as a handler ending from that cut
        # (its waiter cancelled while the handler sets it: InvalidStateError, logged).
        runner = web.AppRunner(make_app(state, metrics_route=cfg.public_metrics),
                               access_log=None, shutdown_timeout=cfg.drain_timeout + 1,
                               **SERVER_KWARGS)
        await runner.setup()
        limits = state.budgets.connections
        guard = ConnectionGuard(limits, state.metrics.connections)
        guards.append(guard)
        check_descriptor_limit(state.budgets.open_files, limits.max_connections)
        # A runner whose listen failed was cleaned up by _listen_or_explain.
        listeners.append(await _listen_or_explain(runner, guard, cfg.host, cfg.port,
                                                  reuse_port=link is not None,
                                                  **HANDLER_KWARGS))
        runners.append(runner)
        port = listeners[0].sockets[0].getsockname()[1]
        if cfg.metrics_port:
            # A guard of its own: scrapes go on while the serving port is at its cap.
            metrics_guard = ConnectionGuard(replace(limits, max_connections=METRICS_CONNECTIONS),
                                            state.metrics.connections)
            guards.append(metrics_guard)
            metrics_runner, metrics_listener = await _metrics_site(state, cfg, metrics_guard,
                                                                   link is not None)
            runners.append(metrics_runner)
            listeners.append(metrics_listener)
            if link is None or link.index == 0:
                startup.info("metrics at %smetrics", _url(cfg.host, cfg.metrics_port))
        elif not cfg.public_metrics and (link is None or link.index == 0):
            log.warning("--no-public-metrics without --metrics-port: /metrics is served nowhere")
        if link is None:
            startup.info("serving %s at %s", state.resolver.root, _url(cfg.host, port))
        else:
            await _join_master(state, link)
        log.info("budgets: %s", state.budgets.describe())
        gc.freeze()
        serving = True
        if ready is not None:
            ready.set()
        await signals.stop.wait()
    finally:
        # A runner's cleanup closes the state (app on_cleanup); a runner whose listen
        # failed was cleaned up already. A start that failed has nothing to drain.
        if serving:
            await drain(state, listeners, runners, guards, cfg.drain_timeout, signals.now)
            if link is not None:
                log.info("worker %d (pid %d) drained", link.index, os.getpid())
        else:
            for listener in listeners:
                listener.close()
            for r in runners:
                await r.cleanup()
        if state.worker_stats is not None:
            state.worker_stats.close()


async def _join_master(state: ServerState, link: WorkerLink) -> None:
    """A worker's listeners are up: serve its metrics to the others (that socket says it
    is ready), tell the master, and fail readiness once the master is gone."""
    stats = state.worker_stats = WorkerStats(link, state.metrics.scrape)
    await stats.start()
    if state.health is not None:
        state.health.master_alive = link.master_alive
    os.kill(link.master_pid, READY_SIGNAL)


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


async def _metrics_site(state: ServerState, cfg: Config, guard: ConnectionGuard,
                        reuse_port: bool) -> tuple[web.AppRunner, asyncio.Server]:
    """A second listener that serves only /metrics (``--metrics-port``)."""
    app = web.Application()

    async def metrics(_request: web.Request) -> web.Response:
        return await metrics_response(state)

    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    return runner, await _listen_or_explain(runner, guard, cfg.host, cfg.metrics_port,
                                            reuse_port=reuse_port, access_log=None)


async def _listen_or_explain(runner: web.BaseRunner, guard: ConnectionGuard, host: str,
                             port: int, **kwargs: Any) -> asyncio.Server:
    """listen(), with an address in use, an unknown host or an address this machine lacks
    turned into a StartupError of one line."""
    try:
        return await listen(runner, guard, host, port, **kwargs)
    except OSError as exc:
        await runner.cleanup()
        raise StartupError(_cannot_listen(host, port, exc)) from None


def _cannot_listen(host: str, port: int, exc: OSError) -> str:
    reason = exc.strerror or str(exc)
    if isinstance(exc, socket.gaierror):
        reason = f"unknown host ({reason})"
    return f"cannot listen on {host}:{port}: {reason}"


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (containers often start with 1,024
    soft over a much higher hard limit); the (soft, hard) limits then in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # RLIM_INFINITY past fs.nr_open: keep the soft one
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def check_descriptor_limit(max_open: int, max_connections: int) -> None:
    """One warning when the descriptor limit cannot hold the pack budget, the connection cap
    and FD_RESERVE: connections would then take the descriptors packs need (EMFILE)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max_open + max_connections + FD_RESERVE
    if soft != resource.RLIM_INFINITY and (not max_connections or need > soft):
        log.warning("descriptor limit %d (ulimit -n; hard limit %s) cannot hold "
                    "--max-open-packs %d + --max-connections %s + %d in reserve: lower "
                    "them or raise the limit", soft,
                    "unlimited" if hard == resource.RLIM_INFINITY else hard, max_open,
                    max_connections or "0 (no cap)", FD_RESERVE)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gitspout", description="A read-only Git smart-HTTP "
                                     "upload-pack server.")
    parser.add_argument("--version", action="version", version=f"gitspout {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve_p = sub.add_parser(
        "serve", help="serve git-upload-pack over smart HTTP",
        usage="gitspout serve [--root DIR] [--host H] [--port P] [--config FILE] [options]",
        description="Serve the repositories under --root over smart HTTP (read-only). Every "
        "setting is a flag, an environment variable GITSPOUT_NAME and a key of the --config "
        "file; a flag wins over the environment, the environment over the file. Sizes take "
        "KiB, MiB, GiB (32MiB, \"32 MiB\"), or a number of bytes.")
    config_p = sub.add_parser(
        "config", help="print the effective settings and where each came from",
        usage="gitspout config [--check-config] [settings as for serve]",
        description="Print the settings serve would use with the same flags, environment "
        "and --config file, as TOML, each with its source (default, file, env, flag).")
    for p in (serve_p, config_p):
        p.add_argument("--check-config", action="store_true",
                       help="check the settings, the config file, the auth file and the "
                       "namespaces' repositories, then exit (0: good) without serving")
    serve_p.add_argument("--print-config", action="store_true",
                         help="print the effective settings and their sources, then exit")
    for p in (serve_p, config_p):
        add_config_arguments(p)
    sub.add_parser("hash-password", help="read a password (or token) on stdin, print its "
                   "bcrypt hash for the auth file (docs/operations.md \"Access control\")")
    return parser


def _hash_password() -> int:
    try:
        password = input() if not sys.stdin.isatty() else getpass.getpass("password: ")
    except EOFError:
        password = ""
    if not password:
        print("gitspout: no password given", file=sys.stderr)
        return 2
    try:
        print(hash_password(password))
    except ConfigError as exc:
        print(f"gitspout: {exc}", file=sys.stderr)
        return 2
    return 0


def _version() -> str:
    try:
        return metadata.version("gitspout")
    except metadata.PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    ignore_hangup()  # until the loop's handler reloads on it (signals.py)
    args = _parser().parse_args(argv)
    if args.command == "hash-password":
        return _hash_password()
    try:
        cfg, sources = load_settings(vars(args))
        if args.command == "config" or args.print_config:
            print(describe(cfg, sources), end="")
        if args.check_config:
            return _check(cfg)
        if args.command == "config" or args.print_config:
            return 0
        if cfg.auth_file:
            load_access(cfg.auth_file)  # a bad auth file stops the start, with its reason
    except ConfigError as exc:
        print(f"gitspout: {exc}", file=sys.stderr)
        return 2
    install_logging(cfg.log_level, cfg.log_format)  # both formats escape control characters
    raise_descriptor_limit()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL)
    fix_mmap_threshold()  # memory.py: large blocks go back to the system when freed
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        workers = resolve_workers(cfg.workers)
        if workers > 1:
            return start_master(cfg, workers, _run_worker, _url)
        uvloop.run(serve(cfg))
    except ConfigError as exc:
        print(f"gitspout: {exc}", file=sys.stderr)
        return 2
    except StartupError as exc:
        print(f"gitspout: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the master could not reserve the address
        print(f"gitspout: {_cannot_listen(cfg.host, cfg.port, exc)}", file=sys.stderr)
        return 1
    return 0


def _run_worker(cfg: Config, link: WorkerLink) -> int:
    """One worker, in the child the master forked: its exit status."""
    try:
        uvloop.run(serve(cfg, link=link))
    except StartupError as exc:
        print(f"gitspout: worker {link.index}: {exc}", file=sys.stderr)
        return 1
    return 0


def _check(cfg: Config) -> int:
    """``--check-config``, once the settings themselves were good: 0, or 2 and each
    problem on stderr."""
    problems, summary = check(cfg)
    for problem in problems:
        print(f"gitspout: {problem}", file=sys.stderr)
    if problems:
        return 2
    print(f"gitspout: configuration OK: {summary}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
