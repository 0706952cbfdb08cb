"""URLs that serve one namespace of a repository: what ``GIT_NAMESPACE`` does for
git-http-backend under a web server (gitnamespaces(7); store/namespaces.py serves it).

The ``namespaces`` setting maps URL paths to a repository and a namespace. In the TOML
file, a table::

    [namespaces]
    "team/app-ns.git" = { repo = "team/app.git", namespace = "ns" }
    "tenant-a/" = { repo = "", namespace = "a" }   # a prefix: tenant-a/X is X in namespace a

and as a flag or env var, the same as ``URL=REPO#NAMESPACE`` entries joined by commas
(``--namespaces 'team/app-ns.git=team/app.git#ns,tenant-a/=#a'``). A URL ending in ``/``
is a prefix: the rest of the path names the repository under ``REPO`` (empty: under the
root). The longest matching prefix wins; an exact URL wins over every prefix.

A URL that is the repository's own path (``tenant.git=tenant.git#a``, or a prefix
``team/=team#a``) confines that repository: it is served only as the namespace, and every
other URL that leads to it without one (``tenant``, a link to it inside the root) is
refused as a missing repository. Otherwise another spelling of the same path would serve
every namespace of it, under the same access rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..store.namespaces import valid_namespace

__all__ = ["NamespaceMap", "namespaces_setting", "plain_name"]


@dataclass(frozen=True)
class NamespaceMap:
    """URL path (relative to the root, as routing sees it) -> (repository path, namespace)."""

    exact: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    prefixes: tuple[tuple[str, str, bytes], ...] = ()  # longest first
    # Repositories served only as a namespace at their own path (the module doc), by the
    # path the entry names (resolved as any URL's, compared by real git directory:
    # state.py ``resolve_for``); and directories whose repositories all are.
    confined: tuple[str, ...] = ()
    confined_dirs: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> NamespaceMap:
        """Entries ``URL=REPO#NAMESPACE`` joined by commas; ValueError names a bad one."""
        exact: dict[str, tuple[str, bytes]] = {}
        prefixes = []
        for entry in filter(None, (e.strip() for e in text.split(","))):
            url, eq, rest = entry.partition("=")
            repo, hash_, ns = rest.rpartition("#")
            url = url.strip().lstrip("/")
            name = ns.strip().strip("/").encode()
            if not eq or not hash_ or not url or not valid_namespace(name) \
                    or ".." in url.split("/") or ".." in repo.split("/"):
                raise ValueError(f"bad namespace entry {entry!r} (URL=REPO#NAMESPACE)")
            repo = repo.strip().strip("/")
            if url.endswith("/"):
                prefixes.append((url, repo, name))
            else:
                exact[url] = (repo, name)
        prefixes.sort(key=lambda p: -len(p[0]))
        confined = tuple(sorted({repo for url, (repo, _) in exact.items()
                                 if repo and plain_name(url) == plain_name(repo)}))
        dirs = tuple(sorted({repo for url, repo, _ in prefixes
                             if repo and url.rstrip("/") == repo}))
        return cls(exact, tuple(prefixes), confined, dirs)

    def map(self, path: str) -> tuple[str, bytes]:
        """(the repository path to resolve, the namespace) of a URL's repository path."""
        hit = self.exact.get(path)
        if hit is not None:
            return hit
        for url, repo, name in self.prefixes:
            if path.startswith(url) and len(path) > len(url):
                rest = path[len(url):]
                return (f"{repo}/{rest}" if repo else rest), name
        return path, b""


def plain_name(path: str) -> str:
    """A repository path without the suffixes that name the same repository: ``x``,
    ``x.git`` and ``x/.git`` are all ``x``."""
    path = path.strip("/")
    path = path.removesuffix("/.git")
    return path.removesuffix(".git")


def namespaces_setting(value: Any) -> str:
    """The setting's string form, from the TOML table form or the string itself."""
    if isinstance(value, str):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(value)
    entries = []
    for url, spec in value.items():
        if not isinstance(spec, Mapping) or set(spec) - {"repo", "namespace"} \
                or not isinstance(spec.get("namespace"), str) \
                or not isinstance(spec.get("repo", ""), str):
            raise ValueError(f"{url}: want {{ repo = ..., namespace = ... }}")
        entries.append(f"{url}={spec.get('repo', '')}#{spec['namespace']}")
    return ",".join(entries)
