"""Object ids on the wire: lowercase hex, 40 digits for SHA-1 and 64 for SHA-256.

An id the client sends is validated and converted to its binary form once, at parse time
(:func:`parse_oid`); requests carry binary ids from then on, and an answer writes them in
hex again only when it is encoded (:func:`oid_hex`). Ref values (:class:`.refs.Ref`) are
the exception: they stay hex, as they are read from the repository and written on the wire.
"""

from __future__ import annotations

import binascii

from .errors import ClientError

__all__ = ["HEX_LEN", "ZERO_OID", "parse_oid", "oid_hex", "is_oid", "zero_oid"]

HEX_LEN = {"sha1": 40, "sha256": 64}
_HEXDIGITS = frozenset(b"0123456789abcdef")


def zero_oid(object_format: str = "sha1") -> bytes:
    """The all-zero id of ``object_format`` (hex, as advertised)."""
    return b"0" * HEX_LEN[object_format]


ZERO_OID = zero_oid("sha1")


def is_oid(value: bytes, hex_len: int = 40) -> bool:
    """True if ``value`` is exactly ``hex_len`` lowercase hex digits."""
    return len(value) == hex_len and _HEXDIGITS.issuperset(value)


def parse_oid(value: bytes, hex_len: int = 40) -> bytes:
    """Validate a hex object id from the peer (any case, as C git's get_oid_hex accepts)
    and return its binary form (``hex_len // 2`` bytes), or raise :class:`ClientError`.

    ``binascii.unhexlify`` is the check: it accepts exactly the hex digits of either case
    (no whitespace, no sign, nothing outside ASCII), so with the length test it admits
    what the ``0-9a-fA-F`` rule admits, in one C call.
    """
    if len(value) == hex_len:
        try:
            return binascii.unhexlify(value)
        except binascii.Error:
            pass
    shown = value[:80].decode("utf-8", "replace")
    raise ClientError(f"protocol error: expected an object id, got '{shown}'")


def oid_hex(oid: bytes) -> bytes:
    """A binary id as the wire writes it: lowercase hex."""
    return binascii.hexlify(oid)
