"""A repository's ``config`` file, read as C git reads it (git-config(1), "CONFIGURATION
FILE"; config.c), for the few settings upload-pack honours.

Section and variable names are case-insensitive, subsection names are not; entries keep
their file order across reopened sections (hideRefs is "last match wins" over the whole
file); ``include.path`` and ``includeIf.<condition>.path`` are followed where they stand.
A file C git would refuse (``fatal: bad config line N``) is refused here too: the
repository is not served (a storage fault), rather than served with its settings
dropped, hideRefs among them (docs/ARCHITECTURE.md, "Repository config").
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from .errors import StorageError

__all__ = ["ConfigEntry", "ConfigFileError", "parse_config", "read_config", "MAX_INCLUDE_DEPTH"]

MAX_INCLUDE_DEPTH = 10  # config.c: deeper is an error (an include cycle)


class ConfigFileError(StorageError):
    """The config file, or one it includes, is not one git would read."""

    what = "bad config file"
    kind = "config"


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """``section[.subsection].key = value``: section and key lowercased, subsection as
    written (None without one); value None for a bare ``key`` (boolean true)."""

    section: str
    subsection: str | None
    key: str
    value: str | None


_SECTION = re.compile(r'\[([A-Za-z0-9.-]+)(?:[ \t]+"((?:[^"\\\n]|\\.)*)")?\]')
_KEY = re.compile(r"([A-Za-z][A-Za-z0-9-]*)[ \t]*(=?)")
_ESCAPES = {"n": "\n", "t": "\t", "b": "\b", "\\": "\\", '"': '"'}


def parse_config(text: str, name: str = "config") -> list[ConfigEntry]:
    """The entries of one file, in order (includes not followed). Raises
    :class:`ConfigFileError` where C git dies."""
    out: list[ConfigEntry] = []
    section: tuple[str, str | None] | None = None
    text = text.replace("\r\n", "\n")  # config.c reads CRLF as LF
    pos, n, line = 0, len(text), 1
    if text.startswith("\ufeff"):
        pos = 1
    while pos < n:
        c = text[pos]
        if c == "\n":
            line += 1
            pos += 1
        elif c in " \t\r":
            pos += 1
        elif c in "#;":
            end = text.find("\n", pos)
            pos = n if end < 0 else end
        elif c == "[":
            m = _SECTION.match(text, pos)
            if m is None:
                raise _bad(name, line)
            sec, sub = m.group(1), m.group(2)
            if sub is not None:
                sub = re.sub(r"\\(.)", r"\1", sub)
            elif "." in sec:  # the deprecated [section.subsection]: lowercased
                sec, _, sub = sec.partition(".")
                sub = sub.lower()
            if not sec:
                raise _bad(name, line)
            section = (sec.lower(), sub)
            pos = m.end()
        else:
            m = _KEY.match(text, pos)
            if m is None:
                raise _bad(name, line)
            value: str | None = None
            pos = m.end()
            if m.group(2):
                value, pos, line = _value(text, pos, name, line)
            elif not _at_line_end(text, pos):
                raise _bad(name, line)
            # git reads a variable before any section too (named as if the section
            # were empty); none that upload-pack reads.
            sec_name, sub_name = section if section is not None else ("", None)
            out.append(ConfigEntry(sec_name, sub_name, m.group(1).lower(), value))
    return out


def _at_line_end(text: str, pos: int) -> bool:
    """After a bare key only blanks may follow (git: anything else, a comment too, is a
    bad line)."""
    while pos < len(text) and text[pos] in " \t":
        pos += 1
    return pos >= len(text) or text[pos] == "\n"


def _value(text: str, pos: int, name: str, line: int) -> tuple[str, int, int]:
    """A value from ``pos`` to the end of its line, continuations included, as config.c
    ``parse_value``: quotes keep whitespace; outside them a run of blanks inside the value
    becomes as many spaces, and blanks at either end go; git's five escapes; ``#`` or
    ``;`` outside quotes starts a comment."""
    out: list[str] = []
    quoted = False
    space = 0
    n = len(text)
    while pos < n:
        c = text[pos]
        pos += 1
        if c == "\n":
            if quoted:
                raise _bad(name, line)
            pos -= 1
            break
        if not quoted and c in " \t\v\f\r":
            if out:
                space += 1
            continue
        if not quoted and c in "#;":
            end = text.find("\n", pos)
            pos = n if end < 0 else end
            break
        if space:
            out.append(" " * space)
            space = 0
        if c == "\\":
            if pos >= n:
                raise _bad(name, line)
            e = text[pos]
            pos += 1
            if e == "\n":  # a continuation line
                line += 1
            elif e in _ESCAPES:
                out.append(_ESCAPES[e])
            else:
                raise _bad(name, line)
        elif c == '"':
            quoted = not quoted
        else:
            out.append(c)
    if quoted:
        raise _bad(name, line)
    return "".join(out), pos, line


def _bad(name: str, line: int) -> ConfigFileError:
    return ConfigFileError(f"bad config line {line} in file {name}")


Reader = Callable[[str], bytes | None]
"""Reads a file for :func:`read_config` (None: it does not exist)."""


def read_config(path: str, read: Reader, gitdir: str,
                depth: int = 0) -> tuple[list[ConfigEntry], list[str]]:
    """The entries of the config at ``path`` with its includes in place, and every file
    read (so that a change to any of them is seen). ``gitdir`` decides ``includeIf
    "gitdir:..."``. A missing included file is skipped, as git does; an include cycle is
    an error."""
    if depth > MAX_INCLUDE_DEPTH:
        raise ConfigFileError(f"exceeded maximum include depth ({MAX_INCLUDE_DEPTH}) at {path}")
    data = read(path)
    files = [path]
    if data is None:
        return [], files
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    out: list[ConfigEntry] = []
    for entry in parse_config(text, os.path.basename(path) if depth == 0 else path):
        out.append(entry)
        target = _include_target(entry, path, gitdir)
        if target is None:
            continue
        more, read_files = read_config(target, read, gitdir, depth + 1)
        out.extend(more)
        files.extend(read_files)
    return out, files


def _include_target(entry: ConfigEntry, config_path: str, gitdir: str) -> str | None:
    """The file ``entry`` includes here (``include.path``, or ``includeIf.<cond>.path``
    whose condition holds), relative to the including file; None for any other entry."""
    if entry.key != "path" or not entry.value:
        return None
    if entry.section == "includeif" and entry.subsection is not None:
        if not _condition_holds(entry.subsection, config_path, gitdir):
            return None
    elif entry.section != "include" or entry.subsection is not None:
        return None
    if entry.value.startswith("~/"):
        return _at_home(entry.value[2:])
    return os.path.join(os.path.dirname(config_path), entry.value)


def _at_home(rest: str) -> str | None:
    """``~/rest``; None without a HOME (git then skips the include or condition)."""
    home = os.environ.get("HOME")
    return os.path.join(home, rest) if home else None


def _condition_holds(cond: str, config_path: str, gitdir: str) -> bool:
    """``gitdir:`` and ``gitdir/i:`` as git matches them. Any other condition is false:
    ``onbranch:`` too, as in C git's upload-pack, which reads its config before the refs
    (a file:// ls-remote ignores such an include), and ``hasconfig:`` and unknown ones."""
    for prefix, fold in (("gitdir:", False), ("gitdir/i:", True)):
        if cond.startswith(prefix):
            pattern = _gitdir_pattern(cond[len(prefix):], config_path)
            if pattern is None:
                return False
            dirs = {gitdir, os.path.realpath(gitdir)}
            return any(_wildmatch(pattern, d, fold) for d in dirs)
    return False


def _gitdir_pattern(pattern: str, config_path: str) -> str | None:
    if pattern.startswith("~/"):
        at_home = _at_home(pattern[2:])
        if at_home is None:
            return None
        pattern = at_home
    elif pattern.startswith("./"):
        pattern = os.path.join(os.path.dirname(os.path.realpath(config_path)), pattern[2:])
    elif not pattern.startswith("/"):
        pattern = "**/" + pattern
    if pattern.endswith("/"):
        pattern += "**"
    return pattern


def _wildmatch(pattern: str, text: str, fold: bool) -> bool:
    """git's wildmatch with WM_PATHNAME: ``*`` and ``?`` stay within a path component,
    ``**/`` spans components (none included), a trailing ``/**`` everything below."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = pattern.find("]", i + 2)
            if end < 0:
                out.append(re.escape(c))
                i += 1
            else:
                body = pattern[i + 1:end]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.fullmatch("".join(out), text, re.IGNORECASE if fold else 0) is not None
