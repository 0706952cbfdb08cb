"""filesend.parse_range: the single byte ranges of RFC 9110 14.1.2 (a-b, a-, -n), whole
file for what it does not serve ranges for, unsatisfiable ones refused (416)."""

from __future__ import annotations

import pytest
from gitspout.server.app.filesend import parse_range


@pytest.mark.parametrize(("header", "want"), [
    (None, None), ("", None), ("bytes=0-99", (0, 100)), ("bytes=100-", (100, 1000)),
    ("bytes=-100", (900, 1000)), ("bytes=-5000", (0, 1000)), ("bytes=990-5000", (990, 1000)),
    ("bytes=1000-", False), ("bytes=5-4", False), ("bytes=-0", False), ("bytes=-", False),
    ("bytes=0-1,5-6", None), ("items=0-1", None),
    # Numbers no file has: ignored (the whole file), never int()'s 4,300-digit ValueError.
    ("bytes=" + "9" * 5000 + "-", None), ("bytes=-" + "1" * 4400, None),
    ("bytes=" + "9" * 19 + "-", False),
])
def test_parse_range(header: str | None, want: object) -> None:
    assert parse_range(header, 1000) == want
