"""Settings as operators see them: the flags of ``serve --help`` by topic, ``gitspout
config`` / ``serve --print-config`` (the effective settings with where each came from), and
``--check-config`` (everything a start would read: the settings, the TOML file, the auth
file, the namespaces' repositories, checked without starting).

The printed settings are a TOML file gitspout reads back (``--config``) to the same
values: strings quoted, sizes as ``"32 MiB"``, unset values commented out, each line
followed by its source (``default``, ``file PATH``, ``env GITSPOUT_NAME``, ``flag --name``).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from typing import Any

from ..store.confine import OutsideRoot
from ..store.errors import StorageError
from ..store.repos import RepoNotFound, RepoResolver
from .auth import load_access
from .config import GROUPS, Config, ConfigError, format_size, group_of
from .namespaces import NamespaceMap

__all__ = ["add_config_arguments", "describe", "check"]

_WIDTH = 42  # where the source comments start (two spaces after a longer line)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one ``--flag`` per setting, in argument groups by topic (:data:`GROUPS`); unset
    flags stay ``None`` so env and file can fill them."""
    groups = {name: parser.add_argument_group(name, about) for name, about in GROUPS.items()}
    for f in fields(Config):
        flag = "--" + f.name.replace("_", "-")
        default = "none" if f.default in (None, "") else f.default
        if f.metadata.get("size") and isinstance(f.default, int):
            default = format_size(f.default)
        elif isinstance(f.default, bool):
            default = "on" if f.default else "off"
        help_text = (f.metadata.get("help", "")
                     + f" (default: {default}; env GITSPOUT_{f.name.upper()})")
        target = groups[group_of(f)] if f.name != "config" else parser
        if f.type == "bool":
            target.add_argument(flag, dest=f.name, default=None,
                                action=argparse.BooleanOptionalAction, help=help_text)
        else:
            target.add_argument(flag, dest=f.name, default=None, help=help_text,
                                metavar=_metavar(f))
    for group in groups.values():  # no heading without flags (usually "other")
        if not group._group_actions:
            parser._action_groups.remove(group)


def _metavar(f: Any) -> str:
    if "metavar" in f.metadata:
        return str(f.metadata["metavar"])
    if f.metadata.get("size"):
        return "SIZE"
    if f.name == "config" or f.name.endswith("_file"):
        return "FILE"
    if f.name == "root" or f.name.endswith("_dir"):
        return "DIR"
    if f.name.endswith("port"):
        return "PORT"
    return {"int": "N", "float": "SECONDS"}.get(f.type, f.name.split("_")[-1].upper())


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
