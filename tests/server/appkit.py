"""Run the real aiohttp app in-process, the way ``server/cli.py`` builds it, with aiohttp's
test client. Each call gets its own event loop (``asyncio.run``), so no pytest plugin is
needed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from aiohttp.test_utils import TestClient, TestServer
from gitspout.server.app.config import load_config
from gitspout.server.app.http import RUNNER_KWARGS, ServerState, make_app

T = TypeVar("T")
APP_TIMEOUT = 60.0


def make_state(root: Path, **settings: Any) -> ServerState:
    return ServerState.create(load_config({"root": str(root), **settings}, env={}))


async def _with_client(root: Path, fn: Callable[[TestClient], Awaitable[T]],
                       settings: dict[str, Any]) -> T:
    app = make_app(make_state(root, **settings))
    # RUNNER_KWARGS: bodies must reach the app as sent (gzip inflated under our caps).
    test_server = TestServer(app, host="127.0.0.1", **RUNNER_KWARGS)
    async with TestClient(test_server) as client:
        return await fn(client)


def run_with_client(root: Path, fn: Callable[[TestClient], Awaitable[T]], **settings: Any) -> T:
    """``await fn(client)`` against a fresh app serving ``root``; bounded by APP_TIMEOUT."""
    return asyncio.run(asyncio.wait_for(_with_client(root, fn, settings), APP_TIMEOUT))


def run_with_port(root: Path, fn: Callable[[int], T], **settings: Any) -> T:
    """Call blocking ``fn(port)`` (raw sockets) in a thread while the app serves ``root``."""

    async def body(client: TestClient) -> T:
        port = client.server.port
        assert port is not None
        return await asyncio.to_thread(fn, port)

    return run_with_client(root, body, **settings)
