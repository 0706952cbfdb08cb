"""The client API of the interoperability suite, and C git as a client.

Each client does what it can: ``ls_remote``, ``clone`` (``depth``), ``fetch`` (``depth``:
deepen a shallow clone) and ``blobless`` (a ``blob:none`` clone, then what its checkout
fetches lazily, then one old blob by id). An operation the implementation has no means for
raises :class:`Unsupported` with the reason; one that it tried and that failed raises
:class:`ClientFailed` with the client's own message. The clients themselves: clients.py.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from gitutil import Git, git_env

TIMEOUT = 120  # seconds one client operation may take


class Unsupported(Exception):
    """The client has no means to do this operation (the reason says which)."""


class ClientFailed(Exception):
    """The client tried and failed; the message is its own."""


@dataclass(frozen=True)
class Creds:
    username: str
    password: str


def with_creds(url: str, creds: Creds | None) -> str:
    if creds is None:
        return url
    parts = urlsplit(url)
    netloc = f"{creds.username}:{creds.password}@{parts.hostname}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


class Client:
    """One client implementation; subclasses override what they support."""

    name = ""
    protocol = ""  # the protocol version it speaks for fetches, for the report

    def __init__(self, git: Git) -> None:
        self.git = git

    def available(self) -> str | None:
        """None when usable here, else why not."""
        return None

    def ls_remote(self, url: str, creds: Creds | None = None) -> dict[str, str]:
        raise Unsupported(f"{self.name} has no ls-remote")

    def clone(self, url: str, dest: Path, depth: int | None = None,
              creds: Creds | None = None) -> None:
        raise Unsupported(f"{self.name} cannot clone")

    def fetch(self, dest: Path, depth: int | None = None) -> None:
        raise Unsupported(f"{self.name} cannot fetch")

    def blobless(self, url: str, dest: Path, old_blob: str) -> None:
        raise Unsupported(f"{self.name} has no partial clone (no filter option)")


def _run(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> str:
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, timeout=TIMEOUT)
    if proc.returncode != 0:
        raise ClientFailed(f"{' '.join(argv[:3])}... exit {proc.returncode}: "
                           + (proc.stderr or proc.stdout).decode(errors="replace").strip()[-800:])
    return proc.stdout.decode(errors="replace")


class CGit(Client):
    name, protocol = "git", "v2"

    def _git(self, *args: str, cwd: Path | None = None) -> str:
        return _run(["git", "-c", "protocol.version=2", *args], git_env(self.git.home), cwd)

    def ls_remote(self, url: str, creds: Creds | None = None) -> dict[str, str]:
        out = self._git("ls-remote", "--symref", with_creds(url, creds))
        return _parse_ls_remote(out)

    def clone(self, url: str, dest: Path, depth: int | None = None,
              creds: Creds | None = None) -> None:
        extra = [f"--depth={depth}", "--no-single-branch"] if depth else []
        self._git("clone", "-q", *extra, with_creds(url, creds), str(dest))

    def fetch(self, dest: Path, depth: int | None = None) -> None:
        extra = [f"--depth={depth}"] if depth else []
        self._git("fetch", "-q", *extra, "origin", cwd=dest)

    def blobless(self, url: str, dest: Path, old_blob: str) -> None:
        self._git("clone", "-q", "--filter=blob:none", "--no-checkout", url, str(dest))
        self._git("checkout", "-q", "main", cwd=dest)  # the checkout's lazy fetch
        self._git("cat-file", "-e", old_blob, cwd=dest)  # one old blob, by id


def _parse_ls_remote(out: str) -> dict[str, str]:
    refs: dict[str, str] = {}
    for line in out.splitlines():
        left, tab, name = line.partition("\t")
        if not tab:
            continue  # a prompt, a progress line
        if left.startswith("ref: "):
            refs[f"{name} ->"] = left[5:]
        else:
            refs[name] = left
    return refs
