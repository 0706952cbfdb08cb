"""Storage faults, counted by kind and reported once per file (docs/ARCHITECTURE.md
"Errors", "Storage faults").

Two outcomes are counted by the process's :class:`FaultCounts` (the pack registry's,
``store/registry.py``), in plain integers the metrics layer reads at scrape time (the store
imports no metrics library):

- ``failed``: a request was answered as a server fault (500, or ``ERR`` in-band) because of
  a damaged file of this kind (``app/errors.py`` counts it, once per request);
- ``fallback``: a file of this kind is unusable and the server does without it (a bitmap or
  commit-graph: a walk; a ``.rev``: offsets sorted again; a pack: skipped, so only the
  requests that need one of its objects fail). Counted and logged once per file version
  (path and identity), not once per request.

Kinds: ``pack``, ``idx``, ``rev``, ``bitmap``, ``commit-graph``, ``packed-refs``,
``object`` (a loose or packed object that is corrupt or missing), ``io`` (an OSError).
"""

from __future__ import annotations

import logging
import threading

__all__ = ["FaultCounts", "KINDS", "report_unusable"]

log = logging.getLogger("gitspout")

KINDS = ("pack", "idx", "rev", "bitmap", "commit-graph", "packed-refs", "config", "object", "io")
_REPORTED_MAX = 10_000  # file versions remembered as reported (then forgotten at once)


class FaultCounts:
    """(kind, outcome) -> count, and which file versions were reported already."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[tuple[str, str], int] = {}
        self._reported: set[tuple[object, ...]] = set()

    def count(self, kind: str, outcome: str) -> None:
        with self._lock:
            self.counts[(kind, outcome)] = self.counts.get((kind, outcome), 0) + 1

    def first_report(self, identity: tuple[object, ...]) -> bool:
        """True the first time ``identity`` (a file and its version) is seen."""
        with self._lock:
            if identity in self._reported:
                return False
            if len(self._reported) >= _REPORTED_MAX:
                self._reported.clear()
            self._reported.add(identity)
            return True

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self.counts)


def report_unusable(faults: FaultCounts | None, kind: str, path: str, identity: object,
                    exc: BaseException, instead: str) -> None:
    """A file of ``kind`` at ``path`` cannot be used and the server does ``instead``: log it
    with its path (for the operator) and count it in ``faults``, once per (path,
    identity). Without ``faults`` (a pack opened outside a registry) it is logged each
    time."""
    if faults is not None:
        if not faults.first_report((kind, path, identity)):
            return
        faults.count(kind, "fallback")
    log.warning("unusable %s %s (%s: %s); %s", kind, path, type(exc).__name__, exc, instead)
