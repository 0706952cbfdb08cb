"""packgen/delta.py: line deltas, applied by dulwich's apply_delta (as index-pack would)."""

from __future__ import annotations

import os
import random
import subprocess

from dulwich.pack import apply_delta
from gitspout.server.packgen.delta import line_delta
from hypothesis import given, settings
from hypothesis import strategies as st

_LINES = st.lists(st.sampled_from([b"\n", b"}\n", b"a\n", b"return x;\n", b"\r\n",
                                   b"a line long enough to copy\n", b"no newline",
                                   b"\x00\xff binary", b"100644 setup.py\x00"]) |
                  st.binary(max_size=40),
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
    for sep in (b"\n", b"\0"):
        delta = line_delta(base, target, 1 << 30, sep)
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


def test_trees_by_entries(git, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two versions of a real tree (two entries changed of 200, far apart): cut at NULs,
    the delta is a few copies and two ids; cut at newlines (which a tree has only inside
    its ids), copies start only where an id happens to hold one, and the delta between the
    two changes is several times larger."""
    repo = tmp_path / "r.git"
    git.run("init", "-q", "--bare", str(repo))
    blobs = [git.out("hash-object", "-w", "--stdin", cwd=repo, input=f"{i}\n".encode()).strip()
             for i in range(201)]

    def tree(ids: list[str]) -> bytes:
        spec = "".join(f"100644 blob {oid}\tfile{i:03d}.txt\n" for i, oid in enumerate(ids))
        oid = git.out("mktree", cwd=repo, input=spec.encode()).strip()
        return subprocess.run(["git", "--git-dir", str(repo), "cat-file", "tree", oid],
                              check=True, capture_output=True).stdout

    changed = list(blobs[:200])
    changed[20], changed[180] = blobs[200], blobs[200]
    old, new = tree(blobs[:200]), tree(changed)
    by_entries = line_delta(old, new, len(new) // 2, b"\0")
    assert by_entries is not None and len(by_entries) < 80
    assert _apply(old, by_entries) == new
    by_lines = line_delta(old, new, 1 << 30)
    assert by_lines is not None and len(by_lines) > 4 * len(by_entries)
