"""The parts of aiohttp's RequestHandler that app/connections.py relies on (its module doc:
methods it overrides, private attributes it reads), and the writer attribute sendwatch.py
reads: this fails, naming the part, when an aiohttp release changes their shape.
pyproject.toml bounds aiohttp to the releases these were checked against."""

from __future__ import annotations

import asyncio
import inspect
from collections import deque
from typing import Any

from aiohttp import web
from aiohttp.http_writer import StreamWriter
from aiohttp.web_protocol import RequestHandler
from gitspout.server.app.http import HANDLER_KWARGS

# What GuardedHandler overrides, with the parameters it is called with.
OVERRIDDEN = {
    "connection_made": (["self", "transport"], False),
    "data_received": (["self", "data"], False),
    "connection_lost": (["self", "exc"], False),
    "_handle_request": (["self", "request", "start_time", "request_handler"], True),
}


class _Transport(asyncio.Transport):
    """Enough of a transport for a handler to take a request head."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


def test_overridden_methods_keep_their_shape() -> None:
    for name, (params, is_async) in OVERRIDDEN.items():
        theirs = getattr(RequestHandler, name, None)
        assert theirs is not None, f"RequestHandler.{name} is gone"
        assert list(inspect.signature(theirs).parameters) == params, name
        assert inspect.iscoroutinefunction(theirs) == is_async, name


def test_constructor_takes_what_the_guard_passes() -> None:
    params = inspect.signature(RequestHandler.__init__).parameters
    assert list(params)[:2] == ["self", "manager"]
    for name in ("loop", *HANDLER_KWARGS):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
    assert callable(getattr(RequestHandler, "force_close", None))


def test_private_state_the_guard_reads() -> None:
    """A head fed to a handler: counted in ``_request_count`` and queued in ``_messages`` as
    (message, payload), its payload not at EOF while the body is unread; ``_lingering_time``
    is a float the guard may set; ``_loop``, ``transport`` and the writer's
    ``output_size`` are there."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        server = web.Server(lambda _request: web.Response(), loop=loop)
        handler = RequestHandler(server, loop=loop, **HANDLER_KWARGS)
        transport = _Transport()
        handler.connection_made(transport)
        try:
            assert handler._loop is loop and handler.transport is transport
            assert isinstance(handler._messages, deque) and handler._request_count == 0
            assert isinstance(handler._lingering_time, float)
            handler._lingering_time = 0.0
            handler.data_received(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nab")
            assert handler._request_count == 1
            message, payload = handler._messages[-1]
            assert message.path == "/x" and not payload.is_eof()
            writer = StreamWriter(handler, loop)
            assert writer.output_size == 0
        finally:
            handler.connection_lost(None)
            await asyncio.sleep(0)

    asyncio.run(run())


def test_writer_hooks_sendfile_uses() -> None:
    """What the sendfile senders (app/sendregion.py, filesend.py) and the headers-with-body
    response (app/httpreq.py) rely on: ``StreamWriter.send_headers`` and the response's
    ``_send_headers_immediately`` switch (aiohttp >= 3.12, pyproject.toml)."""
    assert callable(getattr(StreamWriter, "send_headers", None))
    assert inspect.signature(StreamWriter.send_headers).parameters.keys() == {"self"}
    assert web.StreamResponse._send_headers_immediately is True  # type: ignore[attr-defined]
