"""Text log lines escape control characters (issue 24, item 8; server/app/logtext.py).

ESC, CR and OSC sequences from the URL reached the text log raw, in the ``refusing /PATH:
... outside the root`` warning: a colour, a cleared line or a window title of the
client's choosing on the operator's terminal. The JSON access log escaped them already.
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

from gitutil import copy_repo, start_server
from rawhttp import request

# A colour, an OSC window title ended by BEL, a carriage return and the C1 OSC byte.
NASTY = "evil\x1b[31m\x1b]0;pwned\x07\r\u009dx.git"


def test_refusal_warning_escapes_what_the_url_holds(tmp_path: Path, fixture_root: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside = copy_repo(fixture_root / "basic.git", tmp_path / "outside.git")
    os.symlink(outside, root / NASTY)
    raw: list[str] = []
    srv = start_server(root, output=raw)
    try:
        path = "/" + urllib.parse.quote(NASTY) + "/info/refs?service=git-upload-pack"
        assert request(srv.port, "GET", path).status == 404
        line = srv.wait_for_line("refusing /evil")
    finally:
        srv.stop()
    assert "\\x1b[31m\\x1b]0;pwned\\x07\\r\\x9dx.git" in line, line
    for text in raw:  # nothing the server printed holds a raw control character
        assert not [c for c in text if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0], repr(text)
