"""The one mapping from an exception to what the client is told (docs/ARCHITECTURE.md
"Errors").

:func:`answer_for` decides it for every exception met while serving, before the 200 (an
HTTP status with its headers, or a 200 whose body is one ``ERR`` pkt-line) and after it (a
message in-band: ``ERR`` before the pack, side-band 3 inside it). Each handler has one
``except`` that asks it and does what the :class:`Answer` says. It also writes the log line
an operator needs: one line for known faults, a traceback only for bugs.

=====================================  ===========================  =========================
raised                                 before the 200               after the 200
=====================================  ===========================  =========================
``HttpError`` (app/httpreq.py)         its status (4xx); a body     its text, in-band
                                       timeout or one too large
                                       also closes the connection
``AuthDenied`` (app/auth.py)           401 (+ WWW-Authenticate),    (never: decided first)
                                       403, 429 (+ Retry-After)
``AuthBusy`` (app/authgate.py),        503 + Retry-After: load,     (never: decided first)
``Overloaded`` (app/admission.py)      never a fault
``Refusal`` (protocol/errors.py)       200 + ``ERR``                ``ERR`` / band 3
``ClientError`` (protocol/errors.py)   its status, at least 400     its text, in-band
``RepoNotFound``, ``OutsideRoot``      404                          "repository not available"
``StorageError`` (store/errors.py),    500, logged with repo and    the same text, in-band,
``OSError`` but ``ConnectionError``    pack                         logged the same way
``ConnectionError``, cancellation      nothing: the client went away
anything else: a bug                   escapes (aiohttp's 500)      "internal error", logged
                                                                    with its traceback
=====================================  ===========================  =========================
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from gitspout.protocol.errors import ClientError, Refusal

from ..store.confine import OutsideRoot
from ..store.errors import StorageError
from ..store.faults import FaultCounts
from ..store.repos import RepoNotFound
from .admission import Overloaded
from .auth import AuthDenied
from .authgate import AuthBusy
from .httpreq import BodyTimeout, BodyTooLarge, HttpError

__all__ = ["Answer", "answer_for", "INTERNAL_ERROR"]

log = logging.getLogger("gitspout")

INTERNAL_ERROR = "upload-pack: internal error while producing the pack"
REFUSED_IN_BAND = 200  # Answer.status of a refusal the protocol has a place for (ERR)


@dataclass(frozen=True, slots=True)
class Answer:
    """What to tell the client, and what else to do.

    ``status`` is the HTTP status when no response has started (:data:`REFUSED_IN_BAND`:
    a 200 whose body is one ``ERR`` pkt-line with ``text``); after the 200, ``text`` goes
    in-band. ``gone``: the client went away, nothing is answered. ``bug``: not a known
    fault; before the 200 it escapes (aiohttp answers 500 and logs the traceback)."""

    status: int
    text: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    close: bool = False  # close the connection at once: its body is not read to the end
    timeout: str | None = None  # the connection timeout kind to count (metrics.py)
    forget: bool = False  # the repository is gone: forget what is kept for it
    gone: bool = False
    bug: bool = False


def answer_for(exc: BaseException, repo: str, *, started: bool = False,
               challenge: str | None = None, faults: FaultCounts | None = None) -> Answer:
    """What to tell the client about ``exc``, met while serving ``/repo``.

    ``started`` says the 200 went out already; ``challenge`` is the WWW-Authenticate value
    of a 401 (--auth-file); storage faults are counted in ``faults``."""
    if isinstance(exc, ConnectionError) or not isinstance(exc, Exception):
        return Answer(499, gone=True)
    if isinstance(exc, HttpError | AuthDenied | AuthBusy | Overloaded):
        return _refused(exc, challenge)
    if isinstance(exc, Refusal):
        return Answer(REFUSED_IN_BAND, exc.message)
    if isinstance(exc, ClientError):
        return Answer(exc.http_status if exc.http_status >= 400 else 400, exc.message)
    if isinstance(exc, RepoNotFound | OutsideRoot):
        if isinstance(exc, OutsideRoot):
            # The same answer as for a repository that is not there; the operator learns
            # which link it was.
            log.warning("refusing /%s: %s", repo, exc)
        return Answer(404, "upload-pack: repository not available" if started
                      else f"repository not found: /{repo}", forget=isinstance(exc, RepoNotFound))
    if isinstance(exc, StorageError | OSError):
        return _storage_fault(exc, repo, faults)
    if started:
        log.error("pack failed for /%s", repo, exc_info=exc)
    return Answer(500, INTERNAL_ERROR, bug=True)


def _refused(exc: HttpError | AuthDenied | AuthBusy | Overloaded,
             challenge: str | None) -> Answer:
    """The HTTP answers decided before anything is read or sent: bad HTTP, credentials,
    load (503 with Retry-After, before any pack byte: I4)."""
    if isinstance(exc, AuthBusy):
        return Answer(503, "gitspout: server busy (password checks); retry later",
                      {"Retry-After": str(exc.retry_after)})
    if isinstance(exc, Overloaded):
        return Answer(503, exc.text, {"Retry-After": str(exc.retry_after)},
                      close=exc.reason == "body_memory")
    headers: dict[str, str] = {}
    if isinstance(exc, AuthDenied):
        if exc.status == 401 and challenge is not None:
            headers["WWW-Authenticate"] = challenge  # git asks its credential helper
        if exc.retry_after:
            headers["Retry-After"] = str(exc.retry_after)
    return Answer(exc.status, exc.text, headers,
                  close=isinstance(exc, BodyTimeout | BodyTooLarge),
                  timeout="body" if isinstance(exc, BodyTimeout) else None)


def _storage_fault(exc: Exception, repo: str, faults: FaultCounts | None) -> Answer:
    """A damaged or unreadable repository: one log line with the repository and the pack
    (the message may hold paths: it is for the operator); the client gets the repository
    and a few words, never a path."""
    pack = exc.pack if isinstance(exc, StorageError) else None
    what = exc.what if isinstance(exc, StorageError) else "read error"
    if faults is not None:
        faults.count(exc.kind if isinstance(exc, StorageError) else "io", "failed")
    where = exc.path if isinstance(exc, StorageError) and exc.path else pack
    log.error("storage fault in /%s%s: %s: %s", repo, f" ({where})" if where else "",
              type(exc).__name__, exc)
    return Answer(500, f"upload-pack: cannot read repository /{repo}: {what}")
