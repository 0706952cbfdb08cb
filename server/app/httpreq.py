"""Decoding an HTTP request for the adapter: the path, ``Git-Protocol``, the body (gzip
under caps, ARCHITECTURE.md P4) and plain-text error answers."""

from __future__ import annotations

import zlib

from aiohttp import web

__all__ = ["HttpError", "text_response", "protocol_version", "split_path", "read_body",
           "NO_CACHE", "UPLOAD_PACK", "RECEIVE_PACK"]

UPLOAD_PACK = "git-upload-pack"
RECEIVE_PACK = "git-receive-pack"
NO_CACHE = {
    "Cache-Control": "no-cache, max-age=0, must-revalidate",
    "Pragma": "no-cache",
    "Expires": "Fri, 01 Jan 1980 00:00:00 GMT",
}


class HttpError(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


def text_response(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text if text.endswith("\n") else text + "\n",
                        headers=NO_CACHE)


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


async def read_body(request: web.Request, max_body: int, max_inflated: int) -> bytes:
    """The whole request body, gunzipped, under both caps (ARCHITECTURE.md P4)."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity", "gzip", "x-gzip"):
        raise HttpError(415, f"unsupported Content-Encoding {encoding!r}")
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if encoding in ("gzip", "x-gzip") else None
    parts: list[bytes] = []
    raw = size = 0
    async for chunk in request.content.iter_chunked(1 << 16):
        raw += len(chunk)
        if raw > max_body:
            raise HttpError(413, f"request body larger than {max_body} bytes")
        if inflate is None:
            parts.append(chunk)
            size += len(chunk)
            continue
        data = chunk
        while data:
            try:
                out = inflate.decompress(data, max_inflated - size + 1)
            except zlib.error as exc:
                raise HttpError(400, f"bad gzip request body: {exc}") from None
            size += len(out)
            if size > max_inflated:
                raise HttpError(413, f"request body inflates past {max_inflated} bytes")
            parts.append(out)
            data = inflate.unconsumed_tail
    if inflate is not None and raw and not inflate.eof:
        raise HttpError(400, "truncated gzip request body")
    return b"".join(parts)
