"""The one mapping from an exception to what the client is told (docs/ARCHITECTURE.md
"Errors").

:func:`answer_for` is the only place that decides it; ``http.py`` asks it before the 200
(an HTTP status, or a 200 whose body is one ``ERR`` pkt-line) and after it (a message sent
in-band: ``ERR`` before the pack, side-band 3 inside it). It also writes the log line an
operator needs: one line for known faults, a traceback only for bugs.

=====================================  ===========================  =========================
raised                                 before the 200               after the 200
=====================================  ===========================  =========================
``HttpError`` (app/httpreq.py)         its status (4xx)             its text, in-band
``AuthDenied`` (app/auth.py)           401 (+ WWW-Authenticate),    (never: decided first)
                                       403
``Refusal`` (protocol/errors.py)       200 + ``ERR``                ``ERR`` / band 3
``ClientError`` (protocol/errors.py)   its status, at least 400     its text, in-band
``RepoNotFound``, ``OutsideRoot``      404                          "repository not available"
``StorageError`` (store/errors.py),    500, logged with repo and    the same text, in-band,
``OSError`` but ``ConnectionError``    pack                         logged the same way
anything else: a bug                   escapes (aiohttp's 500)      "internal error", logged
                                                                    with its traceback
=====================================  ===========================  =========================

``ConnectionError`` is no answer at all: the client went away; callers handle it first.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gitspout.protocol.errors import ClientError, Refusal

from ..store.confine import OutsideRoot
from ..store.errors import StorageError
from ..store.faults import FAULTS
from ..store.repos import RepoNotFound
from .auth import AuthDenied
from .httpreq import HttpError

__all__ = ["Answer", "answer_for", "INTERNAL_ERROR"]

log = logging.getLogger("gitspout")

INTERNAL_ERROR = "upload-pack: internal error while producing the pack"


@dataclass(frozen=True, slots=True)
class Answer:
    """``status`` is the HTTP status when no response has started (200: a 200 whose body
    is one ``ERR`` pkt-line with ``text``); after the 200, ``text`` goes in-band."""

    status: int
    text: str


def answer_for(exc: BaseException, repo: str, started: bool = False) -> Answer | None:
    """What to tell the client about ``exc``, met while serving ``/repo``.

    ``started`` says the 200 went out already. ``None`` means ``exc`` is a bug (or the
    client went away) and no answer was chosen: before the 200 the caller lets it escape;
    after it, the caller logs nothing more and sends :data:`INTERNAL_ERROR` (this function
    logged the traceback already when ``started``).
    """
    if isinstance(exc, ConnectionError) or not isinstance(exc, Exception):
        return None
    if isinstance(exc, (HttpError, AuthDenied)):
        return Answer(exc.status, exc.text)
    if isinstance(exc, Refusal):
        return Answer(200, exc.message)
    if isinstance(exc, ClientError):
        return Answer(exc.http_status if exc.http_status >= 400 else 400, exc.message)
    if isinstance(exc, RepoNotFound):
        return Answer(404, "upload-pack: repository not available" if started
                      else f"repository not found: /{repo}")
    if isinstance(exc, OutsideRoot):
        # The same answer as for a repository that is not there; the operator learns
        # which link it was.
        log.warning("refusing /%s: %s", repo, exc)
        return Answer(404, "upload-pack: repository not available" if started
                      else f"repository not found: /{repo}")
    if isinstance(exc, (StorageError, OSError)):
        return _storage_fault(exc, repo)
    if started:
        log.error("pack failed for /%s", repo, exc_info=exc)
    return None


def _storage_fault(exc: Exception, repo: str) -> Answer:
    """A damaged or unreadable repository: one log line with the repository and the pack
    (the message may hold paths: it is for the operator); the client gets the repository
    and a few words, never a path."""
    pack = exc.pack if isinstance(exc, StorageError) else None
    what = exc.what if isinstance(exc, StorageError) else "read error"
    FAULTS.count(exc.kind if isinstance(exc, StorageError) else "io", "failed")
    where = exc.path if isinstance(exc, StorageError) and exc.path else pack
    log.error("storage fault in /%s%s: %s: %s", repo, f" ({where})" if where else "",
              type(exc).__name__, exc)
    return Answer(500, f"upload-pack: cannot read repository /{repo}: {what}")
