"""Text log lines that a terminal or a log viewer shows as they are.

Log lines carry what clients chose: repository paths from the URL (``refusing /PATH:
...``), user agents, protocol lines. A raw ESC, CR or OSC sequence in one of them
rewrites what an operator sees (colours, a cleared line, a window title, a line that
looks like another). The JSON access log escapes them already (``json.dumps``); every
other line goes through :class:`EscapingFormatter`, which writes each control character
(C0, DEL, C1, and the Unicode line and paragraph separators) as ``\\xNN``, ``\\n``,
``\\r``, ``\\t`` or ``\\uNNNN``. A traceback keeps its own line breaks (bugs only; its
other control characters are escaped too).
"""

from __future__ import annotations

import logging

__all__ = ["EscapingFormatter", "escape_controls", "install_escaping"]

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_CONTROLS = [*range(0x20), *range(0x7F, 0xA0)]
_TABLE = {c: _NAMED.get(chr(c), f"\\x{c:02x}") for c in _CONTROLS}
_TABLE.update({0x2028: "\\u2028", 0x2029: "\\u2029"})
_TABLE_KEEP_NL = {**_TABLE}
del _TABLE_KEEP_NL[ord("\n")]


def escape_controls(text: str, keep_newlines: bool = False) -> str:
    """``text`` with every control character written as an escape."""
    return text.translate(_TABLE_KEEP_NL if keep_newlines else _TABLE)


class EscapingFormatter(logging.Formatter):
    """A formatter whose message part never holds a raw control character."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging API)
        return escape_controls(super().formatMessage(record))

    def formatException(self, ei: object) -> str:  # noqa: N802
        return escape_controls(super().formatException(ei), keep_newlines=True)  # type: ignore[arg-type]

    def formatStack(self, stack_info: str) -> str:  # noqa: N802
        return escape_controls(super().formatStack(stack_info), keep_newlines=True)


def install_escaping(level: str) -> None:
    """The process's logging: one line per record, on stderr, escaped."""
    handler = logging.StreamHandler()
    handler.setFormatter(EscapingFormatter("%(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])
