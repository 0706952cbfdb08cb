"""git-http-backend's per-repository switches and its headers, against git-http-backend
itself (run as the CGI program it is, on the same repositories).

* ``http.uploadpack=false`` in a repository's config: 403 (gitspout served it: git's
  t5561.10, .14).
* ``--require-export-ok``: only repositories with ``git-daemon-export-ok``, others 404, as
  git-http-backend without ``GIT_HTTP_EXPORT_ALL``.
* The no-cache headers in C git's order (Expires, Pragma, Cache-Control), then the
  content type: git's trace test t5551.5 compares them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import Committer, Git, LiveServer, git_env, start_server
from rawhttp import FLUSH, pkt_lines, request

ORDERED = ["expires", "pragma", "cache-control", "content-type"]


@pytest.fixture(scope="module")
def sw_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    root = tmp_path_factory.mktemp("swroot")
    work = tmp_path_factory.mktemp("swwork") / "w"
    git.run("init", "-q", "-b", "main", str(work))
    Committer(git, work).commit({"a.txt": "a\n"}, "one")
    for name in ("open.git", "closed.git", "exported.git"):
        git.run("clone", "-q", "--bare", str(work), str(root / name))
    git.run("config", "http.uploadpack", "false", cwd=root / "closed.git")
    (root / "exported.git" / "git-daemon-export-ok").write_text("")
    return root


@pytest.fixture(scope="module")
def sw_server(sw_root: Path) -> Iterator[LiveServer]:
    srv = start_server(sw_root)
    yield srv
    srv.stop()


def _cgi(git: Git, root: Path, method: str, path: str, query: str = "",
         export_all: bool = True, body: bytes = b"") -> tuple[int, list[str]]:
    """git-http-backend's status and header names, in order."""
    env = git_env(git.home, {
        "GATEWAY_INTERFACE": "CGI/1.1", "REQUEST_METHOD": method, "PATH_INFO": path,
        "QUERY_STRING": query, "GIT_PROJECT_ROOT": str(root), "REMOTE_ADDR": "127.0.0.1",
        "CONTENT_TYPE": "application/x-git-upload-pack-request" if body else "",
        "CONTENT_LENGTH": str(len(body)) if body else "",
    })
    if export_all:
        env["GIT_HTTP_EXPORT_ALL"] = "1"
    out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True,
                         timeout=60).stdout
    head = out.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
    status = 200
    names = []
    for line in head:
        name, _, value = line.partition(":")
        if name.lower() == "status":
            status = int(value.split()[0])
        else:
            names.append(name.strip().lower())
    return status, names


def _ours(srv: LiveServer, method: str, path: str, body: bytes = b"") -> tuple[int, list[str]]:
    headers = {"Content-Type": "application/x-git-upload-pack-request"} if body else {}
    resp = request(srv.port, method, path, headers, body)
    return resp.status, list(resp.headers)  # names, lowercased, in the order received


def _order(names: list[str]) -> list[str]:
    return [n for n in names if n in ORDERED]


def _post_body(git: Git, repo: Path) -> bytes:
    tip = git.out("rev-parse", "main", cwd=repo).strip()
    return pkt_lines(f"want {tip} side-band-64k") + FLUSH + pkt_lines("done")


def test_headers_in_c_git_order(git: Git, sw_server: LiveServer, sw_root: Path) -> None:
    status, theirs = _cgi(git, sw_root, "GET", "/open.git/info/refs", "service=git-upload-pack")
    ours_status, ours = _ours(sw_server, "GET", "/open.git/info/refs?service=git-upload-pack")
    assert status == ours_status == 200
    assert _order(ours) == _order(theirs) == ORDERED
    body = _post_body(git, sw_root / "open.git")
    status, theirs = _cgi(git, sw_root, "POST", "/open.git/git-upload-pack", body=body)
    ours_status, ours = _ours(sw_server, "POST", "/open.git/git-upload-pack", body)
    assert status == ours_status == 200
    assert _order(ours) == _order(theirs) == ORDERED


def test_http_uploadpack_false_is_refused(git: Git, sw_server: LiveServer, sw_root: Path) -> None:
    body = _post_body(git, sw_root / "closed.git")
    for method, path, query, data in (("GET", "/closed.git/info/refs", "service=git-upload-pack", b""),
                                      ("POST", "/closed.git/git-upload-pack", "", body)):
        status, _ = _cgi(git, sw_root, method, path, query, body=data)
        ours, _ = _ours(sw_server, method, path + (f"?{query}" if query else ""), data)
        assert status == ours == 403, (method, status, ours)
    proc = git.run("ls-remote", f"{sw_server.url}/closed.git", check=False)
    assert proc.returncode != 0 and b"403" in proc.stderr


def test_require_export_ok(git: Git, sw_root: Path) -> None:
    srv = start_server(sw_root, ["--require-export-ok"])
    try:
        for repo in ("open.git", "exported.git"):
            path = f"/{repo}/info/refs"
            status, _ = _cgi(git, sw_root, "GET", path, "service=git-upload-pack",
                             export_all=False)
            body = _post_body(git, sw_root / repo)
            post_status, _ = _cgi(git, sw_root, "POST", f"/{repo}/git-upload-pack", body=body,
                                  export_all=False)
            assert (status, post_status) == ((404, 404) if repo == "open.git" else (200, 200))
            assert _ours(srv, "GET", path + "?service=git-upload-pack")[0] == status
            assert _ours(srv, "POST", f"/{repo}/git-upload-pack", body)[0] == post_status
        git.run("ls-remote", f"{srv.url}/exported.git")
    finally:
        srv.stop()


def test_refusals_have_git_http_backends_empty_body(git: Git, sw_server: LiveServer,
                                                    sw_root: Path) -> None:
    """git-http-backend's 403 has no body (its message goes to the server's log): git's
    t5561.14 compares the access log's byte counts."""
    resp = request(sw_server.port, "GET", "/closed.git/info/refs?service=git-upload-pack")
    assert resp.status == 403 and resp.body == b""
