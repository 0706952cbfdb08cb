"""The log as operators read it (issue 27, "Logs"; server/app/logtext.py, forwarded.py).

Real git clients against a live gitspout on 127.0.0.1:

* ``--log-format json``: every line the process writes is one JSON object (startup,
  warnings, access lines); access lines carry the client, method, path, status, bytes,
  duration, user (Basic auth), pack source and cache result, and the request id.
* ``X-Forwarded-For`` is believed only from ``--trusted-proxies`` (the right-most hop not
  in them is the client); a spoofed one from anyone else is ignored. ``X-Request-Id`` from
  a trusted proxy is kept when safe, replaced otherwise, and every answer carries it.
* ``--log-format text``: a UTC timestamp and a level on every line; control characters from
  the URL are escaped in both formats.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
from gitutil import Git, LiveServer, copy_repo, fsck, poll, start_server
from rawhttp import request

PASSWORD = "al1ce-l0gs"
HEX16 = re.compile(r"[0-9a-f]{16}")
TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR) "
                       r"[\w.]+: ")
# ESC [ 3 1 m, DEL, the C1 CSI, a carriage return: a colour, a rubout, a line rewritten.
NASTY = "/evil\x1b[31m\x7f\u009b\rx.git/info/refs"
ACCESS_KEYS = {"ts", "level", "logger", "request_id", "client", "user", "method", "path",
               "status", "bytes", "duration_ms", "pack_source", "pack_cache", "repo",
               "command", "agent"}


@pytest.fixture(scope="module")
def log_root(tmp_path_factory: pytest.TempPathFactory, fixture_root: Path) -> tuple[Path, Path]:
    """A root with a public repository and one only alice reads, and the auth file."""
    base = tmp_path_factory.mktemp("logs")
    root = base / "root"
    copy_repo(fixture_root / "basic.git", root / "public.git")
    copy_repo(fixture_root / "basic.git", root / "team" / "app.git")
    auth = base / "auth.toml"
    digest = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    auth.write_text(f'[users]\nalice = "{digest}"\n'
                    '[[access]]\nrepos = ["public.git"]\nanonymous = true\n'
                    '[[access]]\nrepos = ["team/*"]\nusers = ["alice"]\n')
    return root, auth


def _access(srv: LiveServer, start: int = 0) -> list[dict[str, object]]:
    out = []
    for line in srv.lines[start:]:
        record = json.loads(line)
        if record["logger"] == "gitspout.access":
            out.append(record)
    return out


def _access_until(srv: LiveServer, count: int, start: int = 0) -> list[dict[str, object]]:
    """The first ``count`` access records from line ``start`` on, once written."""
    return poll(lambda: got[:count] if len(got := _access(srv, start)) >= count else None,
                10, f"{count} access lines")


def _no_raw_controls(lines: list[str]) -> None:
    for text in lines:
        assert not [c for c in text if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0
                    or c in "\u2028\u2029"], repr(text)


def test_json_lines_carry_the_access_fields(log_root: tuple[Path, Path], git: Git,
                                            tmp_path: Path) -> None:
    root, auth = log_root
    raw: list[str] = []
    srv = start_server(root, ["--log-format", "json", "--auth-file", str(auth),
                              "--no-public-metrics"], output=raw)  # a warning at startup
    try:
        url = f"http://alice:{PASSWORD}@127.0.0.1:{srv.port}/team/app.git"
        for n in range(2):  # the second clone reads the pack the first one cached
            git.run("clone", "-q", "--bare", url, str(tmp_path / f"c{n}"))
            fsck(git, tmp_path / f"c{n}")

        def both_fetches() -> list[dict[str, object]] | None:
            got = _access(srv)
            return got if sum(r["command"] == "fetch" for r in got) == 2 else None

        records = poll(both_fetches, 10, "both fetches logged")
    finally:
        srv.stop()
    everything = [json.loads(line) for line in raw]  # every line is one JSON object
    _no_raw_controls(raw)
    start = [r for r in everything if r["logger"] == "gitspout.startup"]
    assert start[0]["level"] == "info" and f"at {srv.url}/" in str(start[0]["msg"])
    warned = [r for r in everything if r["level"] == "warning"]
    assert any("--no-public-metrics" in str(r["msg"]) for r in warned), warned
    assert all(isinstance(r["ts"], float) for r in everything)
    for rec in records:
        assert set(rec) >= ACCESS_KEYS, rec
        assert rec["client"] == "127.0.0.1" and rec["level"] == "info", rec
        assert HEX16.fullmatch(str(rec["request_id"])), rec
        assert isinstance(rec["duration_ms"], float) and rec["duration_ms"] > 0
        assert rec["user"] == ("alice" if rec["status"] == 200 else None), rec
        if rec["command"] in ("info-refs", "none"):  # none: refused before it was read
            assert (rec["method"], rec["path"]) == ("GET", "/team/app.git/info/refs"), rec
        else:
            assert (rec["method"], rec["path"]) == ("POST", "/team/app.git/git-upload-pack")
    assert [r["status"] for r in records if r["user"] is None] == [401, 401]  # git asks first
    assert len({r["request_id"] for r in records}) == len(records)
    fetches = [r for r in records if r["command"] == "fetch"]
    assert [r["pack_cache"] for r in fetches] == ["miss", "hit"], fetches
    assert fetches[0]["pack_source"] in ("verbatim", "reuse", "bitmap", "walk"), fetches
    assert fetches[1]["pack_source"] == "cache-hit"
    assert all(int(r["bytes"]) > 0 for r in fetches)


@pytest.fixture(scope="module")
def trusting(log_root: tuple[Path, Path]) -> Iterator[LiveServer]:
    """A server behind trusted proxies: loopback and 203.0.113.0/24."""
    srv = start_server(log_root[0], ["--log-format", "json",
                                     "--trusted-proxies", "127.0.0.0/8, 203.0.113.0/24"])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def distrusting(log_root: tuple[Path, Path]) -> Iterator[LiveServer]:
    """A server whose only trusted proxies are elsewhere: its peers are clients."""
    srv = start_server(log_root[0], ["--log-format", "json", "--trusted-proxies", "10.0.0.0/8"])
    yield srv
    srv.stop()


def _ls_remote(git: Git, srv: LiveServer, forwarded: str,
               request_id: str) -> list[dict[str, object]]:
    start = len(srv.lines)
    git.run("-c", f"http.extraHeader=X-Forwarded-For: {forwarded}",
            "-c", f"http.extraHeader=X-Request-Id: {request_id}",
            "-c", "protocol.version=2", "ls-remote", f"{srv.url}/public.git")
    return _access_until(srv, 2, start)  # info-refs, ls-refs


def test_forwarded_for_is_believed_from_trusted_proxies_only(
        git: Git, trusting: LiveServer, distrusting: LiveServer) -> None:
    # 203.0.113.5 is a trusted proxy: the client is the hop before it.
    for rec in _ls_remote(git, trusting, "198.51.100.7, 203.0.113.5", "proxy-id-42"):
        assert (rec["client"], rec["request_id"]) == ("198.51.100.7", "proxy-id-42"), rec
    # The right-most hop that is not a trusted proxy, whatever the client wrote before it.
    for rec in _ls_remote(git, trusting, "10.1.1.1, 198.51.100.7, 192.0.2.1", "id-2"):
        assert rec["client"] == "192.0.2.1", rec
    # A hop that is no address stops the walk at the last one believed (the peer).
    for rec in _ls_remote(git, trusting, "198.51.100.7, not-an-ip", "id-3"):
        assert rec["client"] == "127.0.0.1", rec
    # From a peer that is not a trusted proxy, both headers are the client's own say-so.
    spoofed = _ls_remote(git, distrusting, "198.51.100.7, 203.0.113.5", "proxy-id-42")
    for rec in spoofed:
        assert rec["client"] == "127.0.0.1", rec
        assert HEX16.fullmatch(str(rec["request_id"])), rec
    assert spoofed[0]["request_id"] != spoofed[1]["request_id"]


@pytest.mark.parametrize(("sent", "kept"), [
    ("abc-123", True),
    ("0f8fad5b-d9cb-469f-a165-70867728950e", True),
    ("Root=1-67891233-abcdef012345678912345678;Parent=x", False),  # ';' is not safe
    ("x" * 129, False),  # over the length cap
    ("two words", False),
    ("", False),
])
def test_request_id_is_kept_when_safe_and_returned(
        trusting: LiveServer, distrusting: LiveServer, sent: str, kept: bool) -> None:
    for srv, trusted in ((trusting, True), (distrusting, False)):
        start = len(srv.lines)
        resp = request(srv.port, "GET", "/public.git/info/refs?service=git-upload-pack",
                       {"X-Request-Id": sent})
        assert resp.status == 200
        returned = resp.header("X-Request-Id")
        if kept and trusted:
            assert returned == sent
        else:
            assert returned is not None and HEX16.fullmatch(returned), returned
        assert _access_until(srv, 1, start)[0]["request_id"] == returned
    # Answers that are not git requests carry one too: a 404, a probe.
    for path in ("/nothere.git/info/refs?service=git-upload-pack", "/healthz", "/readyz"):
        resp = request(trusting.port, "GET", path, {"X-Request-Id": "probe-1"})
        assert resp.header("X-Request-Id") == "probe-1", (path, resp.headers)


def test_no_request_id_header_unless_asked_or_trusted(trusting: LiveServer,
                                                     distrusting: LiveServer) -> None:
    """A client that sent no X-Request-Id, through no trusted proxy, gets git-http-backend's
    headers and nothing more (git's own t5551.5 compares them line by line); a trusted
    proxy always gets the id, to log beside its own."""
    path = "/public.git/info/refs?service=git-upload-pack"
    plain = request(distrusting.port, "GET", path)
    assert plain.status == 200 and plain.header("X-Request-Id") is None, plain.headers
    proxied = request(trusting.port, "GET", path)
    assert proxied.header("X-Request-Id") is not None and \
        HEX16.fullmatch(proxied.header("X-Request-Id") or ""), proxied.headers


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_control_characters_are_escaped(log_root: tuple[Path, Path], git: Git,
                                        log_format: str) -> None:
    raw: list[str] = []
    srv = start_server(log_root[0], ["--log-format", log_format], output=raw)
    try:
        git.run("ls-remote", f"{srv.url}/public.git")
        path = urllib.parse.quote(NASTY, safe="/")
        assert request(srv.port, "GET", path + "?service=git-upload-pack").status == 404
        line = srv.wait_for_line("evil")
    finally:
        srv.stop()
    _no_raw_controls(raw)
    if log_format == "json":
        rec = json.loads(line)
        assert rec["path"] == NASTY and rec["status"] == 404, rec  # escaped, not lost
        assert "\\u001b[31m\\u007f\\u009b\\r" in line, line
        return
    for text in raw:  # every line: a UTC timestamp, a level, the logger
        assert TEXT_LINE.match(text), text
    assert "path=/evil\\x1b[31m\\x7f\\x9b\\rx.git/info/refs " in line, line
    assert " status=404 " in line and " method=GET " in line and " client=127.0.0.1 " in line
    access = [x for x in raw if "gitspout.access: " in x and "command=ls-refs" in x]
    assert access and TEXT_LINE.match(access[0]) and " INFO " in access[0], raw
