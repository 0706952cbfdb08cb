"""Object ids on the wire: lowercase hex, 40 digits for SHA-1 and 64 for SHA-256.

Ids are validated once, at parse time, and carried as ``bytes`` of hex from then on.
"""

from __future__ import annotations

from .errors import ClientError

__all__ = ["HEX_LEN", "ZERO_OID", "parse_oid", "is_oid", "zero_oid"]

HEX_LEN = {"sha1": 40, "sha256": 64}
_HEXDIGITS = frozenset(b"0123456789abcdef")
_ANYCASE_HEX = frozenset(b"0123456789abcdefABCDEF")


def zero_oid(object_format: str = "sha1") -> bytes:
    """The all-zero id of ``object_format``."""
    return b"0" * HEX_LEN[object_format]


ZERO_OID = zero_oid("sha1")


def is_oid(value: bytes, hex_len: int = 40) -> bool:
    """True if ``value`` is exactly ``hex_len`` lowercase hex digits."""
    return len(value) == hex_len and _HEXDIGITS.issuperset(value)


def parse_oid(value: bytes, hex_len: int = 40) -> bytes:
    """Validate a hex object id from the peer (any case, as C git's get_oid_hex accepts)
    and return it in lowercase, or raise :class:`ClientError`."""
    if len(value) != hex_len or not _ANYCASE_HEX.issuperset(value):
        shown = value[:80].decode("utf-8", "replace")
        raise ClientError(f"protocol error: expected an object id, got '{shown}'")
    return value.lower()
