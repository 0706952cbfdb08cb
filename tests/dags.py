"""Random commit graphs for the Hypothesis properties (tests/server/*_property.py).

Commit ``i`` has parents among commits ``0..i-1``: mostly one (usually ``i - 1``,
sometimes a branch from further back), sometimes two (a merge), sometimes none (another
root). Histories built from them are written with ``git fast-import`` in that order.
"""

from __future__ import annotations

from hypothesis import strategies as st


def draw_parents(draw: st.DrawFn, min_commits: int, max_commits: int) -> tuple[tuple[int, ...], ...]:
    """The parents of each commit of a random graph of ``min_commits..max_commits``."""
    n = draw(st.integers(min_commits, max_commits))
    parents: list[tuple[int, ...]] = [()]
    for i in range(1, n):
        kind = draw(st.sampled_from(["one", "one", "one", "merge", "root"]))
        if kind == "root":
            parents.append(())
        elif kind == "merge" and i >= 2:
            a, b = draw(st.lists(st.integers(0, i - 1), min_size=2, max_size=2, unique=True))
            parents.append((a, b))
        else:  # mostly a chain, sometimes a branch from further back
            parents.append((draw(st.one_of(st.just(i - 1), st.integers(0, i - 1))),))
    return tuple(parents)
