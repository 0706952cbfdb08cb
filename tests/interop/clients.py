"""The git client implementations of the interoperability suite, behind one small API.

Each client does what it can: ``ls_remote``, ``clone`` (``depth``), ``fetch`` (``depth``:
deepen a shallow clone) and ``blobless`` (a ``blob:none`` clone, then what its checkout
fetches lazily, then one old blob by id). An operation the implementation has no means for
raises :class:`Unsupported` with the reason; one that it tried and that failed raises
:class:`ClientFailed` with the client's own message.

* ``git``: C git (the machine's, 2.39), protocol v2.
* ``pygit2``: libgit2 through pygit2 (its wheel bundles libgit2), in process.
* ``dulwich``: dulwich's own HTTP client (porcelain, and ``HttpGitClient`` for lazy fetches),
  in process.
* ``isogit``: isomorphic-git 1.x with its node http client (``isogit/client.mjs``; the
  ``node_modules`` that ``.ci/run`` installs with ``npm ci``).
* ``jgit``: Debian's ``jgit`` CLI (JGit 4.11, protocol v0 only, no shallow, no filter).
"""

from __future__ import annotations

from clientbase import CGit, Client, ClientFailed, Creds, Unsupported
from extclients import IsoGit, JGit
from libclients import Dulwich, Pygit2

CLIENTS: dict[str, type[Client]] = {c.name: c for c in (CGit, Pygit2, Dulwich, IsoGit, JGit)}

__all__ = ["CLIENTS", "Client", "ClientFailed", "Creds", "Unsupported"]
