"""Decoding an HTTP request for the adapter: the path, ``Git-Protocol``, the body (gzip
under caps, ARCHITECTURE.md P4) and plain-text error answers."""

from __future__ import annotations

import asyncio
import zlib
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import StreamReader, web

__all__ = ["HttpError", "ServiceDisabled", "body_arrived", "BodyTimeout", "BodyTooLarge",
           "BodyLimits", "text_response",
           "start_response", "ADVERTISEMENT", "RESULT",
           "protocol_version", "split_path", "read_body", "decode_body", "check_declared_length",
           "NO_CACHE", "UPLOAD_PACK", "RECEIVE_PACK", "CONTINUE_DUE", "send_continue"]

UPLOAD_PACK = "git-upload-pack"
RECEIVE_PACK = "git-receive-pack"
# In git-http-backend's order (hdr_nocache), which git's own trace tests compare (t5551.5).
NO_CACHE = {
    "Expires": "Fri, 01 Jan 1980 00:00:00 GMT",
    "Pragma": "no-cache",
    "Cache-Control": "no-cache, max-age=0, must-revalidate",
}


class HttpError(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


class ServiceDisabled(Exception):
    """``http.uploadpack`` is false: an empty 403 (http.py), as git-http-backend's."""


ADVERTISEMENT = f"application/x-{UPLOAD_PACK}-advertisement"  # info/refs
RESULT = f"application/x-{UPLOAD_PACK}-result"  # the answer to a POST


def text_response(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text if text.endswith("\n") else text + "\n",
                        headers=NO_CACHE)


class _HeadersWithBody(web.StreamResponse):
    """A streamed response whose headers go out with its first bytes, in one write (as
    web.Response's do), not alone at ``prepare``: one TCP segment less per answer."""

    _send_headers_immediately = False


async def start_response(request: web.Request, content_type: str,
                         length: int | None = None) -> web.StreamResponse:
    """A streamed 200, its headers sent with the first bytes: what is decided is decided
    (I4). ``length``: its Content-Length, when known (else chunked)."""
    resp = _HeadersWithBody(status=200, headers={**NO_CACHE, "Content-Type": content_type})
    if length is not None:
        resp.content_length = length
    await resp.prepare(request)
    return resp


def protocol_version(request: web.Request) -> int:
    """Git-Protocol: colon-separated key=value pairs; the highest version= wins."""
    version = 0
    for item in request.headers.get("Git-Protocol", "").split(":"):
        key, _, value = item.strip().partition("=")
        if key == "version" and value in ("1", "2"):
            version = max(version, int(value))
    return version


def split_path(path: str) -> tuple[str, str]:
    """(repository path relative to the root, action). Only a single leading slash is
    dropped: doubled slashes make an empty segment, which resolves to nothing."""
    rel = path[1:] if path.startswith("/") else path
    for suffix in ("/info/refs", "/" + UPLOAD_PACK, "/" + RECEIVE_PACK):
        if rel.endswith(suffix) or rel == suffix[1:]:
            return rel[: -len(suffix)] if rel.endswith(suffix) else "", suffix[1:]
    return rel, ""


@dataclass(frozen=True)
class BodyLimits:
    """Caps and deadlines for reading one request body (0 turns a deadline off).

    ``timeout`` is the longest wait for the next bytes. ``min_rate`` stops a body that keeps
    trickling (a byte now and then never trips ``timeout``): once the body has been read
    for ``timeout`` seconds, its last ``timeout`` seconds must have brought ``min_rate *
    timeout`` bytes. Measured over that recent window only, never credited by bytes that
    came before: a deadline of ``start + timeout + received / min_rate`` let a body send
    32 MiB at once and then a byte every 25 s for 9 hours, holding its share of
    ``--body-memory`` all along. A body that arrives at ``min_rate`` or faster is never
    cut, however large.
    """

    max_body: int
    max_inflated: int
    timeout: float = 30.0
    min_rate: int = 1024


class BodyTimeout(HttpError):
    """The client was too slow to send its body: answered 408, then the connection ends."""

    def __init__(self, text: str) -> None:
        super().__init__(408, text)


# Bodies at most this big (not gzip) are joined on the event loop; bigger ones are decoded
# in the thread pool (inflating 64 MiB takes a third of a second). A gzip body of at most
# INLINE_GZIP bytes is inflated on the loop too, up to INLINE_INFLATED bytes out (git
# gzips every body from 1 KiB up to http.postBuffer: a clone's wants, a CI fetch's haves):
# its parts joined first, one bounded zlib call of 0.3 ms at most, usually tens of
# microseconds, where a pool step costs more in hand-offs alone. One that would inflate
# further goes to the pool whole.
INLINE_BODY = 1 << 20
INLINE_GZIP = 16 << 10
INLINE_INFLATED = 256 << 10
INFLATE_PIECE = 1 << 20  # output per zlib call: bounds memory overshoot past the cap


class BodyTooLarge(HttpError):
    """The declared Content-Length is over the cap: 413 from the head alone, and the
    connection ends (the body is not read)."""

    def __init__(self, max_body: int) -> None:
        super().__init__(413, f"request body larger than {max_body} bytes")


def check_declared_length(request: web.BaseRequest, max_body: int) -> None:
    """:class:`BodyTooLarge` when the head already says the body is over ``max_body``."""
    length = request.content_length
    if length is not None and length > max_body:
        raise BodyTooLarge(max_body)


# The request key of an ``Expect: 100-continue`` not answered yet (http.py ``expect``):
# the 100 is sent when the body is about to be read, after the access check and the
# admission, so that a request refused before (401, 403, 404, 429) is not first invited
# to upload its body. A final answer before it closes the connection (the body unsent).
CONTINUE_DUE = "gitspout.continue_due"


async def send_continue(request: web.BaseRequest) -> None:
    """The ``100 Continue`` the client waits for, once, if one is due."""
    if request.get(CONTINUE_DUE):
        request[CONTINUE_DUE] = False
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the response proper has not started


def body_arrived(request: web.BaseRequest) -> bool:
    """The whole body is here already (it came with the head, as a small one does) and
    needs no pool step to decode: reading it waits for nothing."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    return encoding in ("", "identity") and request.content.is_eof()


async def read_body(request: web.Request, limits: BodyLimits,
                    run: Callable[..., Awaitable[Any]],
                    take: Callable[[int], None] | None = None) -> bytes:
    """The whole request body, gunzipped, under both caps (ARCHITECTURE.md P4) and the body
    deadlines. ``run(fn, *args)`` runs blocking work off the event loop (the server's pool):
    inflating or joining a large body there keeps other requests answered meanwhile; a
    small one is decoded here (INLINE_BODY, INLINE_GZIP). (Its
    pkt-lines are counted, and capped, by the protocol parsers as they decode them.)
    ``take(n)`` is called for every ``n`` bytes held (received, then inflated): the
    server-wide cap on request bodies (admission.py ``BodyCharge``), which may raise."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity", "gzip", "x-gzip"):
        raise HttpError(415, f"unsupported Content-Encoding {encoding!r}")
    gzip = encoding in ("gzip", "x-gzip")
    check_declared_length(request, limits.max_body)
    await send_continue(request)
    content = request.content
    if content.is_eof():  # here whole already: no deadline to apply, nothing to wait for
        parts = [content.read_nowait()]
        if len(parts[0]) > limits.max_body:
            raise HttpError(413, f"request body larger than {limits.max_body} bytes")
        if take is not None:
            take(len(parts[0]))
    else:
        parts = await _read_parts(content, limits, take)
    size = sum(map(len, parts))
    if not gzip and size <= INLINE_BODY:
        return b"".join(parts)
    body: bytes | None = None
    if gzip and size <= INLINE_GZIP:
        body = _inflate_small(parts, limits.max_inflated)
    if body is None:
        body = await run(decode_body, parts, gzip, limits)
    if gzip and take is not None:
        take(len(body))  # the parts go with this frame; the inflated body stays
    return body


async def _read_parts(content: StreamReader, limits: BodyLimits,
                      take: Callable[[int], None] | None = None) -> list[bytes]:
    """The body as sent, in the pieces it arrived in; :class:`BodyTimeout` if it stalls or
    trickles (see :class:`BodyLimits`)."""
    loop = asyncio.get_running_loop()
    rate = _RecentRate(loop.time(), limits)
    parts: list[bytes] = []
    raw = 0
    while True:
        wait: float | None = None
        stalled = True  # which deadline binds: no bytes for ``timeout``, or the rate
        if limits.timeout:
            wait = limits.timeout
            if limits.min_rate:
                by_rate = rate.deadline(raw) - loop.time()
                if by_rate < wait:
                    wait, stalled = by_rate, raw == 0  # nothing yet: it is a stall
            if wait <= 0:
                raise BodyTimeout(rate.too_slow())
        try:
            async with asyncio.timeout(wait):
                chunk = await content.readany()
        except TimeoutError:
            if stalled:
                raise BodyTimeout(
                    f"request body stalled: no data for {limits.timeout:g} s") from None
            raise BodyTimeout(rate.too_slow()) from None
        if not chunk:
            return parts
        raw += len(chunk)
        rate.mark(loop.time(), raw)
        if raw > limits.max_body:
            raise HttpError(413, f"request body larger than {limits.max_body} bytes")
        if take is not None:
            take(len(chunk))
        parts.append(chunk)


class _RecentRate:
    """When a body falls under ``min_rate`` over its last ``timeout`` seconds (after its
    first ``timeout`` seconds), if no more bytes come: from the times at which it reached
    each total so far (only those that can still decide are kept)."""

    def __init__(self, start: float, limits: BodyLimits) -> None:
        self.limits = limits
        self.grace_end = start + limits.timeout
        self.marks: deque[tuple[float, int]] = deque()  # (time, bytes received by then)
        self._slot = -1

    def mark(self, now: float, raw: int) -> None:
        marks = self.marks
        slot = int(now * 20)  # arrivals within one 50 ms slot make one mark: at most 20
        if marks and self._slot == slot:  # a second per second of window
            marks.pop()
        self._slot = slot
        marks.append((now, raw))

    def deadline(self, raw: int) -> float:
        """The window ending at ``t`` holds ``raw - (bytes by t - timeout)``: it falls
        under the minimum once ``t - timeout`` passes the first mark above ``raw - need``."""
        need = self.limits.min_rate * self.limits.timeout
        floor = raw - need
        marks = self.marks
        while marks and marks[0][1] <= floor:
            marks.popleft()  # below every later floor too: it can never decide again
        if floor < 0 or not marks:
            return self.grace_end
        return max(self.grace_end, marks[0][0] + self.limits.timeout)

    def too_slow(self) -> str:
        return (f"request body too slow: under {self.limits.min_rate} bytes/s over "
                f"{self.limits.timeout:g} s")


def decode_body(parts: list[bytes], gzip: bool, limits: BodyLimits) -> bytes:
    """Blocking (run it in the pool): join or inflate the body under ``max_inflated``."""
    return _inflate(parts, limits.max_inflated) if gzip else b"".join(parts)


def _inflate_small(parts: list[bytes], max_inflated: int) -> bytes | None:
    """A small gzip body inflated here, on the event loop, if it inflates to at most
    INLINE_INFLATED bytes; None when it would inflate further (the pool decodes it under
    ``max_inflated``). Its parts are joined first: a body sent a byte per chunk would
    otherwise cost a zlib call a byte. Bad or truncated gzip raises as :func:`_inflate`
    does, and so does one over ``max_inflated`` when that is the smaller cap."""
    try:
        return _inflate([b"".join(parts)], min(max_inflated, INLINE_INFLATED))
    except HttpError as exc:
        if exc.status == 413 and max_inflated > INLINE_INFLATED:
            return None  # more than the inline cap out: for the pool
        raise


def _inflate(parts: list[bytes], max_inflated: int) -> bytes:
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out: list[bytes] = []
    size = 0
    for data in parts:
        while True:
            limit = min(INFLATE_PIECE, max_inflated - size + 1)
            try:
                piece = inflate.decompress(data, limit)
            except zlib.error as exc:
                raise HttpError(400, f"bad gzip request body: {exc}") from None
            size += len(piece)
            if size > max_inflated:
                raise HttpError(413, f"request body inflates past {max_inflated} bytes")
            out.append(piece)
            data = inflate.unconsumed_tail
            # A full piece may leave output pending inside zlib: ask again, input or not.
            if not data and len(piece) < limit:
                break
    if parts and not inflate.eof:
        raise HttpError(400, "truncated gzip request body")
    return b"".join(out)
