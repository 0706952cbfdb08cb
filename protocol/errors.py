"""Protocol error types.

`ClientError` is the peer's fault: it carries the HTTP status to use before the response
starts and the text for an ``ERR`` pkt-line (or side-band channel 3) after it.  Anything else
raised from this package is a bug in gitspout.
"""

from __future__ import annotations

__all__ = ["ProtocolError", "ClientError"]


class ProtocolError(Exception):
    """Base class of every error this package raises on purpose."""


class ClientError(ProtocolError):
    """The peer sent something we refuse.

    ``http_status`` is what the HTTP layer answers when no response has started yet;
    ``message`` is the human text (no trailing newline) for ``ERR`` or band 3.
    """

    def __init__(self, message: str, http_status: int = 400) -> None:
        # The text ends up in an ERR pkt-line or an HTTP body: keep it valid UTF-8 even
        # when it echoes undecodable client bytes.
        message = message.encode("utf-8", "replace").decode("utf-8")
        super().__init__(message)
        self.message = message
        self.http_status = http_status

    def __repr__(self) -> str:
        return f"ClientError({self.message!r}, http_status={self.http_status})"
