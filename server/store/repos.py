"""Find repositories under ``--root`` and read the settings upload-pack honours.

Every bare repository (``*.git`` or any directory with HEAD, objects and refs) and every
non-bare repository's ``.git`` is served at its path relative to the root; ``/team/app``
and ``/team/app.git`` reach the same repository. Nothing that resolves outside the root
(``..``, encoded dots, symlinks) is served: not the repository itself (checked here), nor
what its own symlinks lead to (``confine.py``), unless ``--allow-symlinks-outside-root``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field, replace

from gitspout.protocol.errors import ClientError
from gitspout.protocol.numbers import git_number
from gitspout.protocol.refs import parse_hide_pattern

from .confine import is_within
from .fscache import RACY_NS, DirCache, Listing
from .fsops import FsOps
from .gitconfig import ConfigEntry, ConfigFileError, parse_config, read_config
from .lru import ByteLRU, MemoryBudget
from .refcache import RefCache
from .repoformat import RepoFormat, repository_format

__all__ = ["Repo", "RepoConfig", "RepoResolver", "RepoNotFound", "UnsupportedRepository",
           "parse_repo_config", "repo_config"]

log = logging.getLogger("gitspout")

# What gitspout reads in a git directory: when one of them is a symlink, it must stay
# inside the root. (Other entries, such as hooks/ or logs/, are never read.)
READ_ENTRIES = ("objects", "refs", "packed-refs", "HEAD", "config")


class RepoNotFound(Exception):
    """No servable repository at that path (answered with 404)."""


class UnsupportedRepository(ClientError):
    """A repository whose format C git would refuse to open (a newer version, an extension
    it does not know: store/repoformat.py): refused with 403 and C git's reason, as a
    repository gitspout cannot serve, not a fault of the server."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"unsupported repository format: {reason}", http_status=403)


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
    object_format: str = "sha1"  # extensions.objectFormat (store/repoformat.py)
    advertise_sid: bool = False
    unborn: str = "advertise"
    ref_storage: str = "files"  # extensions.refStorage: files or reftable
    # Why the repository format is refused (store/repoformat.py); None: it is served
    format_refusal: str | None = None
    http_upload_pack: bool = True  # http.uploadpack: false makes git-http-backend answer 403
    # uploadpack.advertiseBundleURIs, and every bundle.* entry in file order as the v2
    # bundle-uri command answers them (bundle-uri.c config_to_packet_line)
    advertise_bundle_uris: bool = False
    bundle_list: tuple[tuple[bytes, bytes], ...] = ()
    # uploadpack.blobPackfileUri values, raw: "<object-hash> <pack-hash> <uri>", checked
    # only when a fetch uses them (pack-objects dies there, upload-pack only counts them)
    blob_packfile_uris: tuple[bytes, ...] = ()
    # SHA-256 of the bytes of the config and its includes this was read from: what an
    # answer kept across requests names as its config (core/answers.py). Not compared:
    # two reads of the same settings are the same config.
    identity: bytes = field(default=b"", compare=False)


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0", "")


def _bool(value: str | None, what: str) -> bool:
    """git's boolean: a bare key is true; a number (C git's form: ``2k``, ``0x10``, within
    an int) is true unless 0; anything else is an error, as C git dies on it (``bad
    boolean config value``)."""
    if value is None:
        return True
    low = value.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    try:  # config.c git_config_bool: a number of an int's range, with units (2k: true)
        return git_number(value, _INT_MAX, signed=True) != 0
    except ValueError:
        raise ConfigFileError(f"bad boolean config value {value!r} for {what!r}") from None


_INT_MAX = (1 << 31) - 1
_ULONG_MAX = (1 << 64) - 1
_UNBORN = ("advertise", "allow", "ignore")


def repo_config(entries: list[ConfigEntry], fmt: RepoFormat | None = None) -> RepoConfig:
    """The settings upload-pack reads, from a config's entries in file order: the last
    value of a setting wins, and hideRefs collects every value in order (its last match
    wins when a ref is checked). ``fmt`` is the repository format, read from the config
    file alone (C git reads no include for it); None: from ``entries``."""
    if fmt is None:
        fmt = repository_format(entries)
    flags = {"allowfilter": True, "allowrefinwant": False, "allowtipsha1inwant": False,
             "allowreachablesha1inwant": False, "allowanysha1inwant": False,
             "allowsidebandall": False}
    hide: list[bytes] = []
    allow: dict[str, bool] = {}
    default = True
    max_depth: int | None = None
    unborn, sid = "advertise", False
    http_upload_pack = True
    bundle_uris, bundles, blob_uris = False, [], []
    for e in entries:
        what = ".".join(p for p in (e.section, e.subsection, e.key) if p is not None)
        if e.subsection is None and e.section in ("uploadpack", "transfer") \
                and e.key == "hiderefs":
            if e.value is None:
                raise ConfigFileError(f"missing value for {what!r}")
            if e.value:
                hide.append(parse_hide_pattern(e.value.encode("utf-8", "surrogateescape")))
        elif e.section == "uploadpack" and e.subsection is None and e.key in flags:
            flags[e.key] = _bool(e.value, what)
        elif e.section == "uploadpackfilter":
            if e.subsection is None and e.key == "allow":
                default = _bool(e.value, what)
            elif e.subsection is not None and e.key == "allow":
                allow[e.subsection] = _bool(e.value, what)
            elif e.subsection == "tree" and e.key == "maxdepth":
                try:  # upload-pack.c: git_config_ulong, which dies on a bad number
                    max_depth = git_number(e.value or "", _ULONG_MAX)
                except ValueError:
                    raise ConfigFileError(f"bad numeric config value {e.value!r} for "
                                          f"{what!r}") from None
                allow.setdefault("tree", True)
        elif e.section == "http" and e.subsection is None and e.key == "uploadpack":
            http_upload_pack = _bool(e.value, what)
        elif e.section == "lsrefs" and e.subsection is None and e.key == "unborn":
            if e.value is None:  # a bare key: config.c's "missing value"
                raise ConfigFileError(f"missing value for {what!r}")
            unborn = e.value  # the last one counts (checked below, as ls-refs.c does)
        elif e.section == "transfer" and e.subsection is None and e.key == "advertisesid":
            sid = _bool(e.value, what)
        elif e.section == "uploadpack" and e.subsection is None \
                and e.key == "advertisebundleuris":
            bundle_uris = _maybe_bool(e.value)
        elif e.section == "uploadpack" and e.subsection is None \
                and e.key == "blobpackfileuri" and e.value is not None:
            blob_uris.append(_raw(e.value))
        elif e.section == "bundle":
            bundles.append((_raw(what), _bundle_value(e.value)))
    if unborn not in _UNBORN:  # ls-refs.c dies on any other, case and all
        raise ConfigFileError(f"invalid value for 'lsrefs.unborn': {unborn!r}")
    return RepoConfig(
        hide_refs=tuple(hide),
        allow_filter=flags["allowfilter"],
        allow_ref_in_want=flags["allowrefinwant"],
        allow_tip_sha1=flags["allowtipsha1inwant"],
        allow_reachable_sha1=flags["allowreachablesha1inwant"],
        allow_any_sha1=flags["allowanysha1inwant"],
        allow_sideband_all=flags["allowsidebandall"],
        filter_allow=allow,
        filter_allow_default=default,
        tree_filter_max_depth=max_depth,
        object_format=fmt.object_format,
        advertise_sid=sid,
        unborn=unborn,
        ref_storage=fmt.ref_storage,
        format_refusal=fmt.refusal,
        http_upload_pack=http_upload_pack,
        advertise_bundle_uris=bundle_uris,
        bundle_list=tuple(bundles),
        blob_packfile_uris=tuple(blob_uris),
    )


def _raw(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _maybe_bool(value: str | None) -> bool:
    """config.c ``git_configset_get_maybe_bool``: a value that is no boolean is no error;
    it stores -1 in the flag, which bundle-uri.c then reads as true (it advertises)."""
    try:
        return _bool(value, "")
    except ConfigFileError:
        return True


def _bundle_value(value: str | None) -> bytes:
    # A bare ``key`` has no value: C git formats it with printf's ``%s`` of NULL, which
    # glibc writes as "(null)" (bundle-uri.c config_to_packet_line).
    return b"(null)" if value is None else _raw(value)


def parse_repo_config(data: bytes) -> RepoConfig:
    """Parse a repository's ``config`` file text (includes not followed)."""
    return repo_config(parse_config(data.decode("utf-8", "surrogateescape")))


@dataclass
class Repo:
    """A servable repository and its process-wide caches."""

    url_path: str
    gitdir: str
    ref_cache: RefCache = field(default_factory=RefCache)
    _config: _CachedConfig | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def objects_dir(self) -> str:
        return os.path.join(self.gitdir, "objects")

    def config(self, fs: FsOps, dirs: DirCache) -> RepoConfig:
        """:meth:`config_and_listing`'s config."""
        return self.config_and_listing(fs, dirs)[0]

    def config_and_listing(self, fs: FsOps, dirs: DirCache) -> tuple[RepoConfig, Listing]:
        """The repository config, with its includes, re-read when any of its files
        changed: each is stat'ed per request (one stat without includes), as an edit in
        place keeps the inode and the directory listing (a hideRefs appended with ``>>``
        takes effect at once, as in C git).

        Every request reads this first (the hash length depends on it), before any ref or
        object: so this is where the git directory's own symlinks (``objects``, ``refs``,
        ...) are checked, from the listing the config needs anyway. An include that leads
        outside the root is refused like such a symlink. The git directory's listing comes
        back too: what else a request looks up in it (a ``shallow`` file) costs no stat.

        A repository whose format C git would refuse (store/repoformat.py) raises
        :class:`UnsupportedRepository` here, before anything else of it is read."""
        top = dirs.listing(fs, self.gitdir)
        if top is None:
            raise RepoNotFound(self.url_path)
        dirs.check_links(fs, self.gitdir, top, READ_ENTRIES)
        cached = self._config
        if dirs.enabled and cached is not None and cached.trusted and \
                tuple(map(fs.version, cached.files)) == cached.signature:
            return _served(cached.cfg), top
        main = os.path.join(self.gitdir, "config")
        own: list[bytes | None] = []  # the config file's own bytes (the format is read there)

        seen: dict[str, tuple[int, int, int, int] | None] = {}
        digest = hashlib.sha256()
        # Before the first stat: what changed less than RACY_NS before this may change
        # again unseen after it (taken after the reading, a stall in between would hide it).
        now = time.time_ns()

        def read(path: str) -> bytes | None:
            if path != main and dirs.guard is not None:
                dirs.guard.check_real(f"{main} (include)", os.path.realpath(path))
            # Stat before reading: a change while it is read is seen by the next request.
            if path not in seen:
                seen[path] = fs.version(path)
            data = fs.read_file_or_none(path)
            if path == main and not own:
                own.append(data)
            name = path.encode("utf-8", "surrogateescape")
            digest.update(b"%d:%s|" % (len(name), name))
            digest.update(b"-" if data is None else b"%d:%s|" % (len(data), data))
            return data

        entries, files = read_config(main, read, self.gitdir)
        # The format from the file alone: a reader that has only its bytes finds every
        # include missing (and skips it, as a missing include is).
        fmt = repository_format(read_config(
            main, lambda path: own[0] if path == main and own else None, self.gitdir)[0])
        if fmt.worktree_config and fmt.refusal is None:
            # extensions.worktreeConfig: config.worktree is read after the config, as
            # C git's do_git_config_sequence does (a hideRefs there counts).
            more, more_files = read_config(os.path.join(self.gitdir, "config.worktree"),
                                           read, self.gitdir)
            entries += more
            files += more_files
        signature = tuple(seen[path] for path in files)
        cfg = replace(repo_config(entries, fmt), identity=digest.digest())
        if cfg.format_refusal is not None:
            log.warning("refusing /%s: %s", self.url_path, cfg.format_refusal)
        # A file changed (mtime or ctime: a rewrite may set its mtime back) within RACY_NS
        # of this reading may change again without its stat showing it (the same size,
        # within the same tick of the clock): read again by every request until it is
        # older, as a racy listing is listed again.
        trusted = all(v is None or now - max(v[2], v[3]) > RACY_NS for v in signature)
        self._config = _CachedConfig(tuple(files), signature, cfg, trusted)
        return _served(cfg), top


def _served(cfg: RepoConfig) -> RepoConfig:
    if cfg.format_refusal is not None:
        raise UnsupportedRepository(cfg.format_refusal)
    return cfg


@dataclass(frozen=True)
class _CachedConfig:
    files: tuple[str, ...]  # the config and what it includes
    signature: tuple[tuple[int, int, int, int] | None, ...]  # what each was (stat), in order
    cfg: RepoConfig
    trusted: bool = True  # not changed within RACY_NS of its reading


def _is_git_dir(path: str) -> bool:
    return (
        _head_ok(os.path.join(path, "HEAD"))
        and os.path.isdir(os.path.join(path, "objects"))
        and os.path.isdir(os.path.join(path, "refs"))
    )


def _head_ok(head: str) -> bool:
    """setup.c ``validate_headref``, as far as the file's kind: a symlink counts when it
    names something under ``refs/`` (an old-style symbolic HEAD, read as a symref by
    store/refs.py: its target may be a packed ref, so the link may lead nowhere), and
    no other symlink does; anything else must be a file."""
    try:
        target = os.readlink(head)
    except OSError:  # not a symlink (or not there)
        return os.path.isfile(head)
    return target.startswith("refs/")


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

    def __init__(self, root: str, allow_outside: bool = False,
                 memory: MemoryBudget | None = None) -> None:
        self.root = os.path.realpath(root)
        self.allow_outside = allow_outside  # --allow-symlinks-outside-root
        self.memory = memory  # --cache-memory: the maps below and each Repo's RefCache
        self._repos = ByteLRU[Repo]("repos", RESOLVED_ENTRIES, unit="entries",
                                    entry_bytes=REPO_BYTES, parent=memory)
        # URL path -> (real path, the path resolved when a symlink led there, else None)
        self._by_url = ByteLRU[tuple[str, str | None]]("repo_paths", RESOLVED_ENTRIES,
                                                       unit="entries", entry_bytes=URL_BYTES,
                                                       parent=memory)
        self._lock = threading.Lock()

    def forget(self, url_path: str) -> Repo | None:
        """Drop a cached resolution (the repository went away): every URL path that led
        to the same directory, and the :class:`Repo` with its caches, which is returned."""
        key = "/".join(p for p in url_path.split("/") if p)
        with self._lock:
            found = self._by_url.get(key)
            if found is None:
                return None
            real = found[0]
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

    def _name(self, real: str, key: str) -> str:
        """The repository's one name, whatever URL found it first (logs, metrics labels,
        the per-repository queue, offload URLs): its real path under the root, without
        ``/.git`` for a work tree's (``x`` for ``x/.git``), as the access rules name it;
        the URL path for one a link outside the root leads to."""
        if real == self.root or not is_within(real, self.root):
            return key
        rel = os.path.relpath(real, self.root).replace(os.sep, "/")
        return rel[: -len("/.git")] if rel.endswith("/.git") else rel

    def cached(self, url_path: str) -> Repo | None:
        """The repository already resolved for ``url_path`` (no I/O), or None."""
        found = self._by_url.get(url_path)  # keys are canonical paths: no cleaning to redo
        if found is None or found[1] is not None:  # through a symlink: resolve() checks it
            return None
        return self._repos.get(found[0])

    def resolve(self, url_path: str, fs: FsOps | None = None) -> Repo:
        """The repository at ``url_path`` (relative to root), or :class:`RepoNotFound`."""
        parts = _clean_segments(url_path)
        key = "/".join(parts)
        mapped = self._by_url.get(key)
        if mapped is not None:
            real, linked = mapped
            found = self._repos.get(real)
            # No syscall here: the request's first read of the git directory (through
            # the listing cache) finds out if the repository went away. A path that led
            # through a symlink is followed again (a few lstat()s): a link repointed to
            # another repository (a blue/green flip) is served from its new target at once.
            if found is not None and (linked is None or os.path.realpath(linked) == real):
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
                    repo = Repo(self._name(real, key), real, RefCache(self.memory))
                    self._repos.put(real, repo)
                linked = None if real == os.path.normpath(cand) else cand
                self._by_url.put(key, (real, linked))
            return repo
        if outside is not None:
            log.warning("refusing /%s: %s leads to %s, outside the root", key, *outside)
        raise RepoNotFound(url_path)
