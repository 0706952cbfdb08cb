"""packgen/delta.py: line deltas, applied by dulwich's apply_delta (as index-pack would)."""

from __future__ import annotations

import os
import random

from dulwich.pack import apply_delta
from gitspout.server.packgen.delta import line_delta
from hypothesis import given, settings
from hypothesis import strategies as st

_LINES = st.lists(st.sampled_from([b"\n", b"}\n", b"a\n", b"return x;\n", b"\r\n",
                                   b"a line long enough to copy\n", b"no newline",
                                   b"\x00\xff binary"]) | st.binary(max_size=40),
                  max_size=60)


def _apply(base: bytes, delta: bytes) -> bytes:
    return b"".join(apply_delta(base, delta))


@settings(max_examples=400, deadline=None)
@given(_LINES, _LINES, st.data())
def test_a_delta_makes_the_target(base_lines, target_lines, data) -> None:  # type: ignore[no-untyped-def]
    base = b"".join(base_lines)
    # Targets made of the base's lines (reordered, repeated, dropped) and of new ones.
    if base_lines and data.draw(st.booleans()):
        target_lines = [data.draw(st.sampled_from(base_lines)) if data.draw(st.booleans())
                        else line for line in target_lines]
    target = b"".join(target_lines)
    delta = line_delta(base, target, 1 << 30)
    assert delta is not None
    assert _apply(base, delta) == target


def test_long_copies_and_offsets_over_three_bytes() -> None:
    """Copies over 64 KiB are cut, offsets past 16 MiB take four bytes."""
    rng = random.Random(1)
    lines = [b"%08d %s\n" % (i, rng.randbytes(24).hex().encode()) for i in range(300_000)]
    base = b"".join(lines)
    assert len(base) > 1 << 24
    target = b"".join(lines[200_000:]) + b"new line in the middle\n" + b"".join(lines[:1000])
    delta = line_delta(base, target, len(target) // 2)
    assert delta is not None and len(delta) < 4096
    assert _apply(base, delta) == target


def test_an_unrelated_target_is_refused_at_the_limit() -> None:
    base = os.urandom(50_000).hex().encode()
    target = os.urandom(50_000).hex().encode()
    assert line_delta(base, target, len(target) // 2) is None
    assert _apply(base, line_delta(base, target, 1 << 30) or b"") == target
