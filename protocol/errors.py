"""Protocol error types (docs/ARCHITECTURE.md "Errors").

`ClientError` is the peer's fault: it carries the HTTP status to use before the response
starts and the text for an ``ERR`` pkt-line (or side-band channel 3) after it. `Refusal` is
the client fault the protocol itself has a place for: it is always answered with a 200 and
an ``ERR`` pkt-line before the pack, as C git's upload-pack answers it. Anything else raised
from this package is a bug in gitspout.
"""

from __future__ import annotations

__all__ = ["ProtocolError", "ClientError", "Refusal"]


class ProtocolError(Exception):
    """Base class of every error this package raises on purpose."""


class ClientError(ProtocolError):
    """The peer sent something we refuse.

    ``http_status`` is what the HTTP layer answers when no response has started yet (a 4xx);
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
        return f"{type(self).__name__}({self.message!r}, http_status={self.http_status})"


class Refusal(ClientError):
    """A request refused inside the protocol (a want that is not ours, a filter that is not
    allowed, a deepen-not that is no ref...): a 200 whose body is one ``ERR`` pkt-line, sent
    before any pack. ``http_status`` is 200 for that reason."""

    def __init__(self, message: str) -> None:
        super().__init__(message, http_status=200)

    def __repr__(self) -> str:
        return f"Refusal({self.message!r})"
