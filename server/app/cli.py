"""The ``gitspout`` command: ``gitspout serve --root DIR [--host H] [--port P] [--config F]``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

import uvloop
from aiohttp import web

from .config import Config, ConfigError, add_config_arguments, load_config
from .http import RUNNER_KWARGS, ServerState, make_app, metrics_response

__all__ = ["main", "serve"]

log = logging.getLogger("gitspout")


async def serve(cfg: Config, ready: asyncio.Event | None = None) -> None:
    """Run the server until SIGINT or SIGTERM."""
    state = ServerState.create(cfg)
    runner = web.AppRunner(make_app(state), access_log=None, **RUNNER_KWARGS)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port, reuse_address=True)
    await site.start()
    runners = [runner]
    port = runner.addresses[0][1] if runner.addresses else cfg.port
    if cfg.metrics_port:
        runners.append(await _metrics_site(state, cfg))
        print(f"gitspout: metrics at http://{cfg.host}:{cfg.metrics_port}/metrics", flush=True)
    print(f"gitspout: serving {state.resolver.root} at http://{cfg.host}:{port}/", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        for r in runners:
            await r.cleanup()


async def _metrics_site(state: ServerState, cfg: Config) -> web.AppRunner:
    """A second listener that serves only /metrics (``--metrics-port``)."""
    app = web.Application()

    async def metrics(_request: web.Request) -> web.Response:
        return metrics_response(state)

    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, cfg.host, cfg.metrics_port, reuse_address=True).start()
    return runner


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gitspout", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_p = sub.add_parser("serve", help="serve git-upload-pack over smart HTTP")
    add_config_arguments(serve_p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = load_config(vars(args))
    except ConfigError as exc:
        print(f"gitspout: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=cfg.log_level.upper(), format="%(message)s")
    uvloop.run(serve(cfg))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
