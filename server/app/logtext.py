"""The process's log lines, in one of two formats (``--log-format``), all on stdout.

* ``text``: ``2026-12-04T18:22:57.123Z WARNING gitspout: message``, a UTC timestamp with
  milliseconds, the level, the logger, the message. An access line's message is its fields
  as ``key=value`` pairs (a value with a space, a quote or an ``=`` in double quotes).
* ``json``: one object per line, ``{"ts": 1796408577.123, "level": "warning", "logger":
  "gitspout", "msg": "..."}``; an access line has its fields at the top level beside them
  (``ts`` is seconds since the epoch, as the access log always had it).

Log lines carry what clients chose: repository paths from the URL (``refusing /PATH:
...``), user agents, protocol lines. A raw ESC, CR or OSC sequence in one of them would
rewrite what an operator sees (colours, a cleared line, a window title, a line that looks
like another). So both formats escape every control character (C0, DEL, C1, and the
Unicode line and paragraph separators) and every lone surrogate (a byte that was not
UTF-8, as ``\\xNN``): text as ``\\xNN``, ``\\n``, ``\\r``, ``\\t`` or
``\\uNNNN``, JSON as ``\\uNNNN`` (``json.dumps`` with ASCII output, plus DEL, which it
leaves raw). A text traceback keeps its own line breaks (bugs only; its other control
characters are escaped too); a JSON one is the ``exc`` field of its line.

Records that must show whatever ``--log-level`` says (where the server listens) go to the
:data:`STARTUP` logger, which stays at INFO.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any

__all__ = ["EscapingFormatter", "TextFormatter", "JsonFormatter", "escape_controls",
           "install_logging", "logfmt", "STARTUP", "FIELDS"]

STARTUP = "gitspout.startup"
FIELDS = "fields"  # the LogRecord attribute (``extra={FIELDS: {...}}``) of structured fields

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_CONTROLS = [*range(0x20), *range(0x7F, 0xA0)]
_TABLE = {c: _NAMED.get(chr(c), f"\\x{c:02x}") for c in _CONTROLS}
_TABLE.update({0x2028: "\\u2028", 0x2029: "\\u2029"})
# Lone surrogates: bytes that were not UTF-8 in a header or a path, decoded with
# ``surrogateescape`` (U+DC80-U+DCFF: the byte, shown as ``\\xNN``; written out as is, a raw
# 0x9B is a C1 CSI), or any other, which a strict JSON parser refuses.
_SURROGATES = {c: f"\\x{c - 0xDC00:02x}" if 0xDC80 <= c <= 0xDCFF else f"\\u{c:04x}"
               for c in range(0xD800, 0xE000)}
_TABLE.update(_SURROGATES)
_TABLE_KEEP_NL = {**_TABLE}
del _TABLE_KEEP_NL[ord("\n")]


def escape_controls(text: str, keep_newlines: bool = False) -> str:
    """``text`` with every control character written as an escape."""
    return text.translate(_TABLE_KEEP_NL if keep_newlines else _TABLE)


def _logfmt_value(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, Mapping):
        value = ",".join(f"{k}:{_logfmt_value(v)}" for k, v in value.items())
    text = str(value)
    if any(c in text for c in ' "=\\'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def logfmt(fields: Mapping[str, Any]) -> str:
    """``key=value`` pairs; an empty value is ``-``. Control characters are escaped by the
    formatter that writes the line."""
    return " ".join(f"{key}={_logfmt_value(value)}" for key, value in fields.items())


class EscapingFormatter(logging.Formatter):
    """A formatter whose message part never holds a raw control character."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging API)
        return escape_controls(super().formatMessage(record))

    def formatException(self, ei: object) -> str:  # noqa: N802
        return escape_controls(super().formatException(ei), keep_newlines=True)  # type: ignore[arg-type]

    def formatStack(self, stack_info: str) -> str:  # noqa: N802
        return escape_controls(super().formatStack(stack_info), keep_newlines=True)


class TextFormatter(EscapingFormatter):
    """``TIMESTAMP LEVEL LOGGER: MESSAGE``; structured fields as ``key=value`` pairs."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{stamp}.{int(record.msecs):03d}Z"

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802
        fields = getattr(record, FIELDS, None)
        if fields:
            pairs = logfmt(fields)
            record.message = f"{record.message} {pairs}" if record.message else pairs
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line, with no raw control character."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": round(record.created, 3),
                               "level": record.levelname.lower(), "logger": record.name}
        message = record.getMessage()
        if message:
            out["msg"] = message
        fields = getattr(record, FIELDS, None)
        if fields:
            out.update((k, v) for k, v in fields.items() if k not in ("ts", "level", "logger"))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        for key, value in out.items():  # the message, the fields, a traceback
            if isinstance(value, str) and not value.isascii():
                out[key] = value.translate(_SURROGATES)
        # ensure_ascii writes C0, C1 and U+2028/2029 as \uNNNN; DEL is left raw: escape it.
        return json.dumps(out, separators=(",", ":"), default=str).replace("\x7f", "\\u007f")


def install_logging(level: str, log_format: str = "text") -> None:
    """The process's logging: one line per record, on stdout, in ``log_format``."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.getLogger(STARTUP).setLevel(logging.INFO)
    logging.captureWarnings(True)  # Python's warnings too: a line in the same format
