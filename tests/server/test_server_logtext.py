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


def _raw_log(root: Path, tmp_path: Path, log_format: str, sends: list[bytes]) -> bytes:
    """What a server printed (stdout and stderr, as bytes) while answering ``sends``."""
    import re
    import signal
    import subprocess
    import sys

    from gitutil import REPO_ROOT, SERVER_ARGS, poll
    from rawhttp import exchange

    out = tmp_path / f"log-{log_format}"
    with open(out, "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "gitspout.server.app.cli", "serve",
                                 "--root", str(root), "--host", "127.0.0.1", "--port", "0",
                                 *SERVER_ARGS, "--log-format", log_format],
                                cwd=REPO_ROOT, stdout=sink, stderr=subprocess.STDOUT,
                                env={k: v for k, v in os.environ.items()
                                     if not k.startswith("GITSPOUT_")})
        try:
            def listening() -> re.Match[bytes] | None:
                assert proc.poll() is None, out.read_bytes()
                return re.search(rb"127\.0\.0\.1:(\d+)", out.read_bytes())

            port = int(poll(listening, 20, "the server to listen").group(1))
            for data in sends:
                exchange(port, data.replace(b"PORT", str(port).encode()))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    return out.read_bytes()


def test_bytes_that_are_not_utf8_are_escaped(tmp_path: Path, fixture_root: Path) -> None:
    """A user agent and a path with bytes that are not UTF-8 (a raw 0x9B is the 8-bit
    CSI): the text log shows them as ``\\xNN``, and the JSON log is strict UTF-8 with no
    lone surrogate (a strict parser refused the line). Before, the text log wrote the
    bytes back raw and the JSON one held ``\\udc9b``."""
    import json

    root = tmp_path / "root"
    root.mkdir()
    copy_repo(fixture_root / "basic.git", root / "basic.git")
    sends = [b"GET /basic.git/info/refs?service=git-upload-pack HTTP/1.1\r\nHost: x\r\n"
             b"User-Agent: ua\xff\xfe\x9bcsi\r\nConnection: close\r\n\r\n",
             b"GET /nothere\xc3\x28\x9b.git/info/refs?service=git-upload-pack HTTP/1.1\r\n"
             b"Host: x\r\nConnection: close\r\n\r\n"]
    for log_format in ("text", "json"):
        raw = _raw_log(root, tmp_path, log_format, sends)
        text = raw.decode("utf-8")  # strict: raw bytes would fail here
        assert not [c for c in text if 0x80 <= ord(c) < 0xA0 or 0xD800 <= ord(c) < 0xE000]
        assert "ua\\xff\\xfe\\x9bcsi" in text.replace("\\\\", "\\"), text
        if log_format == "json":
            for line in text.splitlines():
                if line.startswith("{"):
                    for value in json.loads(line).values():
                        str(value).encode("utf-8")  # no lone surrogate
