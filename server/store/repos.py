"""Find repositories under ``--root`` and read the settings upload-pack honours.

Every bare repository (``*.git`` or any directory with HEAD, objects and refs) and every
non-bare repository's ``.git`` is served at its path relative to the root; ``/team/app``
and ``/team/app.git`` reach the same repository. Nothing that resolves outside the root
(``..``, encoded dots, symlinks) is served: not the repository itself (checked here), nor
what its own symlinks lead to (``confine.py``), unless ``--allow-symlinks-outside-root``.
"""

from __future__ import annotations

import io
import logging
import os
import threading
from dataclasses import dataclass, field

from dulwich.config import ConfigFile
from gitspout.protocol.refs import parse_hide_pattern

from .confine import is_within
from .fscache import DirCache
from .fsops import FsOps
from .lru import ByteLRU
from .refcache import RefCache

__all__ = ["Repo", "RepoConfig", "RepoResolver", "RepoNotFound", "parse_repo_config"]

log = logging.getLogger("gitspout")

# What gitspout reads in a git directory: when one of them is a symlink, it must stay
# inside the root. (Other entries, such as hooks/ or logs/, are never read.)
READ_ENTRIES = ("objects", "refs", "packed-refs", "HEAD", "config")


class RepoNotFound(Exception):
    """No servable repository at that path (answered with 404)."""


@dataclass(frozen=True)
class RepoConfig:
    """The parts of a repository's git config that upload-pack reads (upload-pack.c)."""

    hide_refs: tuple[bytes, ...] = ()
    allow_filter: bool = True
    allow_ref_in_want: bool = False
    allow_tip_sha1: bool = False
    allow_reachable_sha1: bool = False
    allow_any_sha1: bool = False
    allow_sideband_all: bool = False
    filter_allow: dict[str, bool] = field(default_factory=dict)
    filter_allow_default: bool = True
    tree_filter_max_depth: int | None = None
    object_format: str = "sha1"
    advertise_sid: bool = False
    unborn: str = "advertise"


def _bool(cf: ConfigFile, section: tuple[bytes, ...], name: bytes, default: bool) -> bool:
    try:
        value = cf.get_boolean(section, name)
    except (KeyError, ValueError):
        return default
    return default if value is None else bool(value)


def _hide_refs(cf: ConfigFile) -> tuple[bytes, ...]:
    out: list[bytes] = []
    for section in cf.sections():
        if section not in ((b"uploadpack",), (b"transfer",)):
            continue
        for key, value in cf.items(section):
            if key.lower() == b"hiderefs" and value:
                out.append(parse_hide_pattern(value))
    return tuple(out)


def _filter_config(cf: ConfigFile) -> tuple[dict[str, bool], bool, int | None]:
    allow: dict[str, bool] = {}
    default = _bool(cf, (b"uploadpackfilter",), b"allow", True)
    max_depth: int | None = None
    for section in cf.sections():
        if len(section) != 2 or section[0].lower() != b"uploadpackfilter":
            continue
        sub = section[1].decode("utf-8", "replace")
        for key, value in cf.items(section):
            if key.lower() == b"allow":
                allow[sub] = value.lower() in (b"true", b"yes", b"on", b"1")
            elif sub == "tree" and key.lower() == b"maxdepth" and value.isdigit():
                max_depth = int(value)
                allow.setdefault("tree", True)
    return allow, default, max_depth


def parse_repo_config(data: bytes) -> RepoConfig:
    """Parse a repository's ``config`` file text."""
    try:
        cf = ConfigFile.from_file(io.BytesIO(data))
    except Exception:  # dulwich raises several types for a malformed file
        return RepoConfig()
    up = (b"uploadpack",)
    fmt = b"sha1"
    try:
        fmt = cf.get((b"extensions",), b"objectformat").lower()
    except KeyError:
        pass
    allow, default, max_depth = _filter_config(cf)
    unborn = b"advertise"
    try:
        unborn = cf.get((b"lsrefs",), b"unborn").lower()
    except KeyError:
        pass
    return RepoConfig(
        hide_refs=_hide_refs(cf),
        allow_filter=_bool(cf, up, b"allowfilter", True),
        allow_ref_in_want=_bool(cf, up, b"allowrefinwant", False),
        allow_tip_sha1=_bool(cf, up, b"allowtipsha1inwant", False),
        allow_reachable_sha1=_bool(cf, up, b"allowreachablesha1inwant", False),
        allow_any_sha1=_bool(cf, up, b"allowanysha1inwant", False),
        allow_sideband_all=_bool(cf, up, b"allowsidebandall", False),
        filter_allow=allow,
        filter_allow_default=default,
        tree_filter_max_depth=max_depth,
        object_format=fmt.decode("ascii", "replace"),
        advertise_sid=_bool(cf, (b"transfer",), b"advertisesid", False),
        unborn=unborn.decode("ascii", "replace"),
    )


@dataclass
class Repo:
    """A servable repository and its process-wide caches."""

    url_path: str
    gitdir: str
    ref_cache: RefCache = field(default_factory=RefCache)
    _config: tuple[tuple[int, ...], RepoConfig] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def objects_dir(self) -> str:
        return os.path.join(self.gitdir, "objects")

    def config_key(self) -> tuple[int, ...]:
        """Identity of the config last read (its inode)."""
        return self._config[0] if self._config is not None else (0,)

    def config(self, fs: FsOps, dirs: DirCache) -> RepoConfig:
        """The repository config, re-read when the file is replaced (git rewrites it with
        a lock file and a rename, which gives it a new inode).

        Every request reads this first (the hash length depends on it), before any ref or
        object: so this is where the git directory's own symlinks (``objects``, ``refs``,
        ...) are checked, from the listing the config needs anyway."""
        top = dirs.listing(fs, self.gitdir)
        if top is None:
            raise RepoNotFound(self.url_path)
        dirs.check_links(fs, self.gitdir, top, READ_ENTRIES)
        entry = top.names().get("config")
        key = (entry[1], *top.key) if entry else (0,)
        cached = self._config
        if dirs.enabled and cached is not None and cached[0] == key:
            return cached[1]
        data = dirs.file(fs, os.path.join(self.gitdir, "config"), top) if entry else b""
        cfg = parse_repo_config(data or b"")
        self._config = (key, cfg) if top.trusted else ((-1,), cfg)
        return cfg


def _is_git_dir(path: str) -> bool:
    return (
        os.path.isfile(os.path.join(path, "HEAD"))
        and os.path.isdir(os.path.join(path, "objects"))
        and os.path.isdir(os.path.join(path, "refs"))
    )


def _clean_segments(rel: str) -> list[str]:
    """Path segments of a canonical URL path; anything else (``..``, ``.``, empty segments
    from doubled slashes, NUL, backslashes) is not a repository."""
    parts = rel.split("/") if rel else []
    for p in parts:
        if p in ("", ".", "..") or "\0" in p or "\\" in p:
            raise RepoNotFound(rel)
    return parts


# What a resolved repository holds besides its caches (which count for themselves): the
# Repo, its config, its RefCache with six empty ByteLRUs (4 KB measured); and a URL
# path's entry. For --cache-memory.
REPO_BYTES = 6144
URL_BYTES = 256
RESOLVED_ENTRIES = 1 << 20


class RepoResolver:
    """Maps URL paths to :class:`Repo` objects; caches positive answers per real path.

    Both maps are caches within --cache-memory: a repository nobody asked for lately is
    dropped with its caches, and resolved again (a few stats) when it is asked for."""

    def __init__(self, root: str, allow_outside: bool = False) -> None:
        self.root = os.path.realpath(root)
        self.allow_outside = allow_outside  # --allow-symlinks-outside-root
        self._repos = ByteLRU[Repo]("repos", RESOLVED_ENTRIES, unit="entries",
                                    entry_bytes=REPO_BYTES)
        self._by_url = ByteLRU[str]("repo_paths", RESOLVED_ENTRIES, unit="entries",
                                    entry_bytes=URL_BYTES)
        self._lock = threading.Lock()

    def forget(self, url_path: str) -> Repo | None:
        """Drop a cached resolution (the repository went away): every URL path that led
        to the same directory, and the :class:`Repo` with its caches, which is returned."""
        key = "/".join(p for p in url_path.split("/") if p)
        with self._lock:
            real = self._by_url.get(key)
            if real is None:
                return None
            self._by_url.pop(key)
            repo = self._repos.get(real)
            self._repos.pop(real)
            # Other paths to it stay mapped to ``real``, which now leads nowhere: they are
            # resolved again (and found missing) when asked for.
            return repo

    def _candidates(self, parts: list[str]) -> list[str]:
        rel = os.path.join(self.root, *parts) if parts else self.root
        if parts and parts[-1].endswith(".git"):
            bare = parts[-1][: -len(".git")]
            plain = os.path.join(self.root, *parts[:-1], bare) if bare else None
            return [rel] + ([os.path.join(plain, ".git")] if plain else [])
        return [rel + ".git", os.path.join(rel, ".git"), rel]

    def cached(self, url_path: str) -> Repo | None:
        """The repository already resolved for ``url_path`` (no I/O), or None."""
        real = self._by_url.get(url_path)  # keys are canonical paths: no cleaning to redo
        return self._repos.get(real) if real is not None else None

    def resolve(self, url_path: str, fs: FsOps | None = None) -> Repo:
        """The repository at ``url_path`` (relative to root), or :class:`RepoNotFound`."""
        parts = _clean_segments(url_path)
        key = "/".join(parts)
        real = self._by_url.get(key)
        found = self._repos.get(real) if real is not None else None
        if found is not None:
            # No syscall here: the request's first read of the git directory (through
            # the listing cache) finds out if the repository went away.
            return found
        outside: tuple[str, str] | None = None
        for cand in self._candidates(parts):
            real = os.path.realpath(cand)
            if not self.allow_outside and not is_within(real, self.root):
                outside = outside or (cand, real)
                continue  # not even looked at
            if not _is_git_dir(real):
                continue
            with self._lock:
                repo = self._repos.get(real)
                if repo is None:
                    repo = Repo(key, real)
                    self._repos.put(real, repo)
                self._by_url.put(key, real)
            return repo
        if outside is not None:
            log.warning("refusing /%s: %s leads to %s, outside the root", key, *outside)
        raise RepoNotFound(url_path)
