"""The storage readers refuse garbage with their own error types, quickly (docs/ARCHITECTURE.md
"The fuzz invariant", "Storage faults: what is checked"): an EWAH bitmap whose run lengths
are garbage once expanded to gigabytes; a packed-refs line git does not write was dropped.
"""

from __future__ import annotations

import time

import pytest
from gitspout.server.store import packedrefs as P
from gitspout.server.store import refs as R
from gitspout.server.store.bitmaps import BitmapFormatError, decode_ewah
from gitspout.server.store.errors import StorageError
from hypothesis import given, settings
from hypothesis import strategies as st

OID = "a" * 40


def _refs(parsed: P.PackedRefs) -> list[R.Ref]:
    return [r for seg in parsed.segments for r in seg.refs()]


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=200), st.integers(min_value=0, max_value=5000))
def test_ewah_garbage_is_refused_or_bounded(data: bytes, nbits: int) -> None:
    start = time.monotonic()
    try:
        bits, _size, end = decode_ewah(data, 0, nbits)
    except BitmapFormatError:
        pass
    else:
        assert end <= len(data)
        assert bits.bit_length() <= 64 * (4 * ((nbits + 63) // 64) + 64)
    assert time.monotonic() - start < 1


def test_ewah_huge_run_is_refused() -> None:
    # one word: a run of 2^32 - 1 words of ones, no literals (once ~32 GB of output)
    word = ((0xFFFFFFFF << 1) | 1).to_bytes(8, "big")
    data = (64).to_bytes(4, "big") + (1).to_bytes(4, "big") + word + b"\0\0\0\0"
    with pytest.raises(BitmapFormatError):
        decode_ewah(data, 0, 64)


@pytest.mark.parametrize("text", [
    b"garbage\n",
    f"{OID} refs/heads/a\nnot a ref\n".encode(),
    f"{OID} refs/heads/a\n\n".encode(),  # an empty line
    f"^{OID}\n{OID} refs/tags/t\n".encode(),  # a peeled line before any ref
    f"{OID} refs/tags/t\n^{OID}\n^{OID}\n".encode(),  # two peeled lines
    f"{OID} refs/heads/a\n{'z' * 40} refs/heads/b\n".encode(),  # not hex
    f"{OID} refs/heads/a\n{OID} refs/heads/b".encode(),  # unterminated (truncated)
    f"{OID} refs/heads/a\n{OID}\n".encode(),  # no name
    f"{OID}0 refs/heads/a\n".encode(),  # 41 digits
    f"{OID} refs/heads/a\n# a comment\n".encode(),
])
def test_packed_refs_lines_git_does_not_write_are_refused(text: bytes) -> None:
    for header in (b"", b"# pack-refs with: peeled fully-peeled sorted \n"):
        with pytest.raises(StorageError) as exc:
            # lines are checked when their segment is first used (store/refs.py)
            _refs(P.parse_packed_refs(header + text, 40, lambda _oid: None))
        assert exc.value.kind == "packed-refs" and exc.value.what == "corrupt packed-refs"


def test_packed_refs_as_git_writes_them_parse() -> None:
    text = (b"# pack-refs with: peeled fully-peeled sorted \n"
            + f"{OID} refs/heads/a\n{'b' * 40} refs/tags/t\n^{'c' * 40}\n".encode())
    parsed = P.parse_packed_refs(text, 40, lambda _oid: None)
    refs = _refs(parsed)
    assert [(r.name, r.oid, r.peeled) for r in refs] == [
        (b"refs/heads/a", OID.encode(), None), (b"refs/tags/t", b"b" * 40, b"c" * 40)]
    assert _refs(P.parse_packed_refs(b"", 40, lambda _oid: None)) == []
