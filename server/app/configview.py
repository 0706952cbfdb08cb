"""``gitspout config`` / ``serve --print-config`` and ``--check-config``: the effective
settings with where each came from, and a check of everything a start would read (the
settings, the TOML file, the auth file, the namespaces' repositories) without starting.

The printed settings are a TOML file gitspout reads back (``--config``) to the same
values: strings quoted, sizes as ``"32 MiB"``, unset values commented out, each line
followed by its source (``default``, ``file PATH``, ``env GITSPOUT_NAME``, ``flag --name``).
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from ..store.confine import OutsideRoot
from ..store.errors import StorageError
from ..store.repos import RepoNotFound, RepoResolver
from .auth import load_access
from .config import GROUPS, Config, ConfigError, format_size, group_of
from .namespaces import NamespaceMap

__all__ = ["describe", "check"]

_WIDTH = 42  # where the source comments start (two spaces after a longer line)


def _toml_value(f: Any, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if f.metadata.get("size") and isinstance(value, int):
        return json.dumps(format_size(value)) if value else "0"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string (JSON escapes are TOML's)


def describe(cfg: Config, sources: dict[str, str]) -> str:
    """The effective settings as TOML, by topic, each with its source."""
    out = ["# gitspout: effective settings; after each, where it came from", "[gitspout]"]
    by_group: dict[str, list[Any]] = {name: [] for name in GROUPS}
    for f in fields(Config):
        by_group[group_of(f)].append(f)
    config_line = f"# config = {json.dumps(cfg.config)}" if cfg.config else "# config ="
    out.append(f"{config_line:<{_WIDTH}}  # {sources['config']}")
    for group, members in by_group.items():
        members = [f for f in members if f.name != "config"]
        if not members:
            continue
        out.append(f"\n# {group}: {GROUPS[group]}")
        for f in members:
            value = getattr(cfg, f.name)
            line = (f"# {f.name} =" if value is None else
                    f"{f.name} = {_toml_value(f, value)}")
            out.append(f"{line:<{_WIDTH}}  # {sources[f.name]}")
    return "\n".join(out) + "\n"


def check(cfg: Config) -> tuple[list[str], str]:
    """What a start would refuse or not find beyond the settings themselves (which
    :func:`~.config.load_settings` checked): the auth file, and the repository of each
    namespace entry. The problems (one line each; none: good) and a summary."""
    problems = []
    notes = [f"root {cfg.root_path()}"]
    if cfg.auth_file:
        try:
            access = load_access(cfg.auth_file)
            notes.append(f"auth file {cfg.auth_file} ({len(access.rules)} rules)")
        except ConfigError as exc:
            problems.append(str(exc))
    ns = NamespaceMap.parse(cfg.namespaces)
    root = cfg.root_path()
    resolver = RepoResolver(str(root), cfg.allow_symlinks_outside_root)
    for url, (repo, _name) in ns.exact.items():
        try:
            resolver.resolve(repo)
        except (RepoNotFound, OutsideRoot, StorageError, OSError):
            problems.append(f"namespaces: {url!r} names repository {repo!r}, which is not "
                            f"served from {root}")
    for url, repo, _name in ns.prefixes:
        if repo and not (root / repo).is_dir():
            problems.append(f"namespaces: {url!r} names directory {repo!r}, which is not "
                            f"under {root}")
    if ns.exact or ns.prefixes:
        notes.append(f"{len(ns.exact) + len(ns.prefixes)} namespace entries")
    if cfg.config:
        notes.append(f"config file {cfg.config}")
    return problems, ", ".join(notes)
