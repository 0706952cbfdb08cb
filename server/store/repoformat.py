"""The repository format (``core.repositoryformatversion`` and ``extensions.*``), checked
as C git's setup.c checks it before any command touches the repository
(``check_repo_format``, ``verify_repository_format``; git 2.55).

It is read from the repository's own ``config`` only, without its includes, as C git
reads it (``git_config_from_file``). A repository C git would refuse to open
(``fatal: Expected git repo version <= 1, found 2``) is refused here too, with C git's
words: gitspout could otherwise serve refs or objects the way a newer git lays them out
differently, or serve a repository whose extension changes what its refs or objects mean.

- version missing (-1): every extension is ignored, sha1 and loose refs, as C git does.
- any other negative version: nothing is checked, the extensions are honoured.
- version 0: the historical extensions (``noop``, ``preciousObjects``, ``partialClone``,
  ``worktreeConfig``) are honoured, unknown ones ignored, and one that C git knows only
  in version 1 (``objectFormat``, ``refStorage``, ...) refuses the repository.
- version 1: an extension C git does not know refuses it.
- version 2 and above: refused.

``objectFormat`` and ``refStorage`` values C git does not know are refused in every
version (C git dies on them while it reads the config), as is a ``refStorage`` with a
location (``files:///elsewhere``): its refs are not in the repository.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .gitconfig import ConfigEntry, ConfigFileError

__all__ = ["RepoFormat", "repository_format", "V0_EXTENSIONS", "V1_EXTENSIONS"]

REPO_VERSION_READ = 1  # GIT_REPO_VERSION_READ

# handle_extension_v0: honoured in a version 0 repository too
V0_EXTENSIONS = frozenset({"noop", "preciousobjects", "partialclone", "worktreeconfig"})
# handle_extension: known only in version 1
V1_EXTENSIONS = frozenset({"noop-v1", "objectformat", "compatobjectformat", "refstorage",
                           "relativeworktrees", "submodulepathconfig"})
OBJECT_FORMATS = ("sha1", "sha256")  # hash_algo_by_name: case-sensitive
REF_STORAGES = ("files", "reftable")  # ref_storage_format_by_name: case-sensitive

_TRUE = ("true", "yes", "on")
_FALSE = ("false", "no", "off")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_INT_MAX = (1 << 31) - 1
# strtoimax(value, &end, 0) then an optional unit, nothing after it (config.c)
_INT = re.compile(r"[ \t\n\v\f\r]*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)([kKmMgG]?)")


@dataclass(frozen=True)
class RepoFormat:
    """What the repository format says: its hash, its ref storage, whether
    ``config.worktree`` belongs to its config, and why it is refused (None: it is not)."""

    version: int = -1
    object_format: str = "sha1"
    ref_storage: str = "files"
    worktree_config: bool = False
    refusal: str | None = None


def _config_int(value: str | None, what: str) -> int:
    """config.c ``git_config_int``: an integer with an optional k/m/g unit; anything else,
    or a value out of an int's range, is a fatal config error in C git."""
    m = _INT.fullmatch(value or "")
    if m is None:
        raise ConfigFileError(f"bad numeric config value {value!r} for {what!r}")
    sign, digits, unit = m.groups()
    base = 16 if digits[1:2] in ("x", "X") else 8 if digits.startswith("0") else 10
    n = int(sign + digits[2:] if base == 16 else sign + digits, base) * _UNITS[unit.lower()]
    if not -_INT_MAX - 1 <= n <= _INT_MAX:
        raise ConfigFileError(f"bad numeric config value {value!r} for {what!r}: out of range")
    return n


def _config_bool(value: str | None, what: str) -> bool:
    if value is None:
        return True
    low = value.lower()
    if low in _TRUE:
        return True
    if low in _FALSE or low == "":
        return False
    try:
        return _config_int(value, what) != 0
    except ConfigFileError:
        raise ConfigFileError(f"bad boolean config value {value!r} for {what!r}") from None


def _nonbool(value: str | None, what: str) -> str:
    if value is None:
        raise ConfigFileError(f"missing value for {what!r}")
    return value


def _listed(head: str, names: list[str]) -> str:
    many = "s" if len(names) > 1 else ""
    return f"{head.format(s=many)} {', '.join(names)}"


def repository_format(entries: list[ConfigEntry]) -> RepoFormat:
    """The format of the repository whose own config file (no includes) has ``entries``.

    A value C git dies on while reading (a version that is no number, a boolean extension
    that is no boolean) raises :class:`ConfigFileError`, as other bad config values do."""
    version = -1
    fmt, storage, worktree = "sha1", "files", False
    unknown: list[str] = []
    v1_only: list[str] = []
    refusal: str | None = None
    for e in entries:
        what = ".".join(p for p in (e.section, e.subsection, e.key) if p is not None)
        if e.section == "core" and e.subsection is None and e.key == "repositoryformatversion":
            version = _config_int(e.value, what)
            continue
        if e.section != "extensions":
            continue
        # The name after "extensions.", as C git sees it: a subsection keeps its case.
        ext = e.key if e.subsection is None else f"{e.subsection}.{e.key}"
        if ext in V0_EXTENSIONS:
            if ext == "partialclone":
                _nonbool(e.value, what)
            elif ext in ("preciousobjects", "worktreeconfig"):
                flag = _config_bool(e.value, what)
                if ext == "worktreeconfig":
                    worktree = flag
            continue
        if ext not in V1_EXTENSIONS:
            unknown.append(ext)
            continue
        if ext == "objectformat" or ext == "compatobjectformat":
            value = _nonbool(e.value, what)
            if value not in OBJECT_FORMATS:
                refusal = refusal or f"unsupported object format {value}"
            elif ext == "objectformat":
                fmt = value
        elif ext == "refstorage":
            value = _nonbool(e.value, what)
            if value not in REF_STORAGES:  # also "files://<elsewhere>": refs not here
                refusal = refusal or f"unsupported ref storage format {value!r}"
            else:
                storage = value
        elif ext in ("relativeworktrees", "submodulepathconfig"):
            _config_bool(e.value, what)
        v1_only.append(ext)
    if refusal is not None:
        return RepoFormat(version, refusal=refusal)
    if version == -1:  # read_repository_format: no version, no format (extensions dropped)
        return RepoFormat()
    if version > REPO_VERSION_READ:
        refusal = f"Expected git repo version <= {REPO_VERSION_READ}, found {version}"
    elif version >= 1 and unknown:
        refusal = _listed("unknown repository extension{s} found:", unknown)
    elif version == 0 and v1_only:
        refusal = _listed("repo version is 0, but v1-only extension{s} found:", v1_only)
    if refusal is not None:
        return RepoFormat(version, refusal=refusal)
    return RepoFormat(version, fmt, storage, worktree)
