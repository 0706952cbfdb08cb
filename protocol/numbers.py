"""Numbers as C git reads them (parse.c ``git_parse_signed`` / ``git_parse_unsigned``): the
form of ``strtoimax`` in base 0 (leading blanks, a sign, ``0x`` hexadecimal, a leading
``0`` octal), then nothing or one unit (``k``, ``m``, ``g``, either case), within a range.
Filter specs (``blob:limit=``, ``tree:``) and config values (``uploadpack.allowFilter =
2k`` is true) are read so.
"""

from __future__ import annotations

__all__ = ["git_number", "OutOfRange"]

_SPACE = " \t\n\v\f\r"
_DIGITS = {8: "01234567", 10: "0123456789", 16: "0123456789abcdefABCDEF"}
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


class OutOfRange(ValueError):
    """A number, but past the range asked for."""


def git_number(text: str, maximum: int, signed: bool = False) -> int:
    """``text`` as a number of at most ``maximum`` (and at least ``-maximum`` when
    ``signed``); ValueError when C git refuses it (an unsigned number with a ``-``
    anywhere, no digits, an unknown unit, out of range)."""
    if not text or not text.isascii() or (not signed and "-" in text):
        raise ValueError(f"not a number: {text!r}")
    i = len(text) - len(text.lstrip(_SPACE))
    negative = False
    if text[i : i + 1] in ("+", "-"):
        negative = text[i] == "-"
        i += 1
    base = 10
    if text[i : i + 2].lower() == "0x" and text[i + 2 : i + 3] and text[i + 2] in _DIGITS[16]:
        base, i = 16, i + 2
    elif text[i : i + 1] == "0":
        base = 8
    start = i
    while i < len(text) and text[i] in _DIGITS[base]:
        i += 1
    if i == start:
        raise ValueError(f"not a number: {text!r}")
    unit = text[i:].lower()
    if unit not in _UNITS:
        raise ValueError(f"not a number: {text!r}")
    value = int(text[start:i], base) * _UNITS[unit]
    if value > maximum:
        raise OutOfRange(f"out of range: {text!r}")
    return -value if negative else value
