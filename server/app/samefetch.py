"""Identical fetches answered from what their first occurrence decided (docs/ARCHITECTURE.md
"Pack cache").

A fetch's answer is a function of its request and of the repository's state. A fetch whose
pack goes through the pack cache leaves here, under the key of its request (the
repository, the namespace the URL serves, the user, the protocol version and the SHA-256
of its body), what it was answered: the pack-cache key of its pack, the lines before and
after the pack, its side-band and progress settings, and the repository state it was
planned under (``RequestContext.fetch_state``: the ref state with HEAD, the config by
value, the shallow file, the pack set). The same request again, under the same state, is
answered from that without parsing its body, checking its wants, negotiating or
computing its key: its pack-cache entry is read as it is (cacheread.py). The same
request arriving while the first is being planned waits for that plan. One pool step
reads the state again (``fetch_state``: stats of the directories and files each request
reads anyway, through the same caches: store/fscache.py, store/refs.py); a different state
is ``stale``, and the request is planned as any other. Loose objects are not part of the
state, as they are not part of the pack-cache key: what a push adds comes with a ref
update, which is.

The key holds the user and the namespace, and the state the config (hideRefs) and the
refs as this namespace sees them: an answer never crosses from one visibility to another.
Only fetches whose answer depends on nothing else are kept: no packfile URIs, no bundles
counted (``--bundles`` counts the full clones it sees), bodies up to
:data:`SAME_BODY_MAX`. The answers are kept within :data:`SAME_BYTES`, least recently used
first, counted in ``--cache-memory``.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass

from gitspout.protocol.fetch_request import Sideband

from ..store.lru import ByteLRU, MemoryBudget
from .scope import RequestScope

__all__ = ["SameFetches", "SameKey", "SameAnswer", "SAME_BYTES", "SAME_BODY_MAX"]

SAME_BYTES = 16 << 20
# Bodies hashed on the loop: a clone's wants, a CI fetch's haves. Larger ones (a mirror
# of many refs negotiating) are planned every time.
SAME_BODY_MAX = 256 << 10


@dataclass(frozen=True, slots=True)
class SameKey:
    """Who asked what: the repository (its git directory), the namespace, the user, the
    protocol version and the body's SHA-256."""

    gitdir: str
    namespace: bytes
    user: str | None
    version: int
    body: bytes


@dataclass(frozen=True)
class SameAnswer:
    """What a fetch was answered, and under which state of the repository."""

    pack_key: bytes  # the pack cache's (PackStream.key)
    state: tuple[object, ...]  # RequestContext.fetch_state when it was planned
    before: bytes  # the lines before the pack, framed
    after: bytes  # what follows it, framed
    sideband: Sideband
    sideband_all: bool
    no_progress: bool
    command: str  # for the request's record
    agent: str
    haves: int

    def nbytes(self) -> int:
        """What it holds, roughly: its lines and its state (the config and the ref
        segments it names are shared with the ref caches)."""
        return (400 + len(self.before) + len(self.after)
                + sum(len(s) if isinstance(s, bytes) else 80 * len(s) if isinstance(s, tuple)
                      else 80 for s in self.state))


class SameFetches:
    """The answers of fetches seen, by :class:`SameKey` (the module doc)."""

    def __init__(self, memory: MemoryBudget | None = None, budget: int = SAME_BYTES) -> None:
        self.answers: ByteLRU[SameAnswer] = ByteLRU("same_fetches", budget, parent=memory)
        self.results = dict.fromkeys(("hit", "stale", "gone"), 0)
        # Requests being planned, by key: the same request meanwhile waits for that plan
        # (a storm of identical clones is planned once, not once per clone in flight).
        self.planning: dict[SameKey, asyncio.Future[SameAnswer | None]] = {}

    async def planned(self, key: SameKey) -> SameAnswer | None:
        """The answer of the same request being planned now, once it is (None when none
        is, or it kept nothing: the caller plans for itself)."""
        fut = self.planning.get(key)
        if fut is None:
            return None
        return await asyncio.shield(fut)

    def begin(self, key: SameKey) -> None:
        """This request is planned now (:meth:`planned` waits for it); :meth:`end` follows
        in every case."""
        if key not in self.planning:
            self.planning[key] = asyncio.get_running_loop().create_future()

    def end(self, key: SameKey) -> None:
        """Planning is over: who waited gets what was kept (or None)."""
        fut = self.planning.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result(self.answers.get(key))

    @staticmethod
    def key(scope: RequestScope, version: int, body: bytes) -> SameKey | None:
        """The key of this request, or None when it is not to be kept (a large body)."""
        view = scope.view
        if view is None or len(body) > SAME_BODY_MAX:
            return None
        return SameKey(view.repo.gitdir, view.namespace, scope.record.user, version,
                       hashlib.sha256(body).digest())

    def get(self, key: SameKey) -> SameAnswer | None:
        """The answer kept for ``key``, or None (not counted: most requests are not seen
        before, and which of them are fetches is not known before they are parsed)."""
        return self.answers.get(key)

    def put(self, key: SameKey, answer: SameAnswer) -> None:
        self.answers.put(key, answer, cost=answer.nbytes())

    def forget(self, key: SameKey, result: str) -> None:
        """The answer cannot serve (``result``: ``stale``, or ``gone``: its pack is no
        longer in the cache): dropped, counted."""
        self.answers.pop(key)
        self.results[result] += 1

    def hit(self) -> None:
        self.results["hit"] += 1
