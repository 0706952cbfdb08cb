"""Services, methods, content types and response headers (gitprotocol-http; ARCHITECTURE.md
P1 and P11)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from appkit import run_with_client
from gitutil import LiveServer
from rawhttp import (
    ADVERT_CT,
    FLUSH,
    INFO_REFS,
    RESULT_CT,
    SERVICE_PREAMBLE,
    UPLOAD_CT,
    assert_not_5xx,
    assert_serving,
    get_info_refs,
    parse_pkts,
    post_upload_pack,
    request,
    v2_command,
)

READ_ONLY = b"read-only"


def _assert_no_cache(resp: Any) -> None:
    assert resp.header("cache-control") is not None
    assert "no-cache" in resp.header("cache-control")


# ------------------------------------------------------------------ info/refs

def test_info_refs_v0_headers_and_preamble(server: LiveServer, oids: dict[str, str]) -> None:
    resp = get_info_refs(server.port)
    assert resp.status == 200
    assert resp.header("content-type") == ADVERT_CT
    _assert_no_cache(resp)
    assert resp.body.startswith(SERVICE_PREAMBLE)
    pkts = parse_pkts(resp.body)
    first = pkts[2]
    assert first is not None and first.startswith(oids["basic_main"].encode() + b" HEAD\0")
    assert pkts[-1] is None


def test_info_refs_v2_headers(server: LiveServer) -> None:
    resp = get_info_refs(server.port, version=2)
    assert resp.status == 200
    assert resp.header("content-type") == ADVERT_CT
    _assert_no_cache(resp)
    assert resp.body.startswith(b"000eversion 2\n")
    assert resp.body.endswith(FLUSH)


def test_info_refs_head_method(server: LiveServer) -> None:
    resp = request(server.port, "HEAD", "/basic.git" + INFO_REFS)
    assert resp.status == 200
    assert resp.header("content-type") == ADVERT_CT


@pytest.mark.parametrize("query", ["", "?", "?service", "?service=", "?service=git-upload-pac",
                                   "?service=GIT-UPLOAD-PACK", "?service=%00",
                                   "?service=git-upload-pack%00", "?svc=git-upload-pack",
                                   "?service=git-upload-archive"])
def test_info_refs_without_valid_service_is_403(server: LiveServer, query: str) -> None:
    # C git's http-backend refuses the dumb protocol (http.getanyfile off) with 403.
    resp = request(server.port, "GET", "/basic.git/info/refs" + query)
    assert resp.status == 403, (query, resp.status)
    assert resp.header("content-type").startswith("text/plain")
    assert not resp.body.startswith(b"001e#")


def test_info_refs_receive_pack_is_403_read_only(server: LiveServer) -> None:
    for path in ("/basic.git/info/refs?service=git-receive-pack",
                 "/basic.git/info/refs?service=git-receive-pack&service=git-upload-pack"):
        resp = request(server.port, "GET", path)
        assert resp.status == 403
        assert READ_ONLY in resp.body
        assert not resp.body.startswith(b"001f#")


def test_info_refs_receive_pack_for_missing_repo_is_refused(server: LiveServer) -> None:
    resp = request(server.port, "GET", "/nope.git/info/refs?service=git-receive-pack")
    assert resp.status in (403, 404)


@pytest.mark.parametrize("repo", ["basic.git", "nope.git", "empty.git"])
@pytest.mark.parametrize("method", ["POST", "GET", "PUT"])
def test_receive_pack_endpoint_is_403(server: LiveServer, repo: str, method: str) -> None:
    resp = request(server.port, method, f"/{repo}/git-receive-pack",
                   {"Content-Type": "application/x-git-receive-pack-request"}, b"0000")
    assert resp.status == 403, resp.status
    assert READ_ONLY in resp.body


def test_push_with_git_is_refused(server: LiveServer, git: Any, tmp_path: Path) -> None:
    work = tmp_path / "w"
    git.run("clone", "-q", f"{server.url}/basic.git", str(work))
    git.run("commit", "-q", "--allow-empty", "-m", "x", cwd=work)
    res = git.run("push", "-q", "origin", "HEAD:refs/heads/new", cwd=work, check=False)
    assert res.returncode != 0
    assert b"403" in res.stderr or b"read-only" in res.stderr


# ------------------------------------------------------------------ methods

@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "PROPFIND"])
@pytest.mark.parametrize("suffix", ["/info/refs?service=git-upload-pack", "/git-upload-pack"])
def test_unhandled_methods_are_405(server: LiveServer, method: str, suffix: str) -> None:
    resp = request(server.port, method, "/basic.git" + suffix)
    assert resp.status == 405, (method, suffix, resp.status)


@pytest.mark.parametrize("method,path", [
    ("GET", "/basic.git/git-upload-pack"),
    ("HEAD", "/basic.git/git-upload-pack"),
    ("POST", "/basic.git/info/refs?service=git-upload-pack"),
])
def test_wrong_method_for_endpoint_is_405(server: LiveServer, method: str, path: str) -> None:
    resp = request(server.port, method, path, {"Content-Type": UPLOAD_CT},
                   b"0000" if method == "POST" else None)
    assert resp.status == 405


@pytest.mark.parametrize("method", ["FOO", "GETX", "BREW"])
def test_unknown_method_is_a_client_error(server: LiveServer, method: str) -> None:
    # aiohttp's parser may refuse a method it does not know (400) before the app sees it.
    resp = request(server.port, method, "/basic.git/git-upload-pack")
    assert resp.status in (400, 405), resp.status


@pytest.mark.parametrize("path", ["/", "/basic.git", "/basic.git/", "/basic.git/HEAD",
                                  "/basic.git/objects/info/packs", "/basic.git/info/refs/",
                                  "/basic.git/info", "/favicon.ico"])
def test_dumb_and_unknown_paths_are_404(server: LiveServer, path: str) -> None:
    resp = request(server.port, "GET", path)
    assert resp.status == 404, (path, resp.status)


# ------------------------------------------------------------------ content type

@pytest.mark.parametrize("ctype", [None, "", "text/plain", "application/x-git-receive-pack-request",
                                   "application/x-git-upload-pack-result",
                                   "application/x-git-upload-pack-requestx",
                                   "application/octet-stream", "multipart/form-data; boundary=x"])
def test_upload_pack_wrong_content_type_is_415(server: LiveServer, ctype: str | None) -> None:
    headers = {} if ctype is None else {"Content-Type": ctype}
    resp = request(server.port, "POST", "/basic.git/git-upload-pack", headers, b"0000")
    assert resp.status == 415, (ctype, resp.status)
    assert b"application/x-git-upload-pack-request" in resp.body


def test_content_type_parameters_are_accepted(server: LiveServer) -> None:
    resp = request(server.port, "POST", "/basic.git/git-upload-pack",
                   {"Content-Type": UPLOAD_CT + "; charset=binary"}, b"0000")
    assert resp.status == 200


def test_probe_post_is_200_with_result_headers(server: LiveServer) -> None:
    resp = post_upload_pack(server.port, b"0000")
    assert resp.status == 200
    assert resp.header("content-type") == RESULT_CT
    _assert_no_cache(resp)
    assert resp.body == b""


def test_v2_result_headers(server: LiveServer) -> None:
    resp = post_upload_pack(server.port, v2_command("ls-refs"), version=2)
    assert resp.status == 200
    assert resp.header("content-type") == RESULT_CT
    _assert_no_cache(resp)
    assert b" refs/heads/main\n" in resp.body


def test_error_statuses_are_not_cached(server: LiveServer) -> None:
    for resp in (request(server.port, "GET", "/nope.git" + INFO_REFS),
                 request(server.port, "POST", "/basic.git/git-upload-pack", {}, b"0000"),
                 post_upload_pack(server.port, b"zzzz")):
        assert resp.status in (404, 415, 400)
        _assert_no_cache(resp)


# ------------------------------------------------------------------ in-process app

def test_status_matrix_with_aiohttp_test_client(fixture_root: Path) -> None:
    """The same statuses through aiohttp's own client against the app built as cli.py does."""

    async def matrix(client: Any) -> list[tuple[str, int, str, str]]:
        cases = [
            ("GET", "/basic.git" + INFO_REFS, {}, None),
            ("GET", "/basic.git/info/refs", {}, None),
            ("GET", "/basic.git/info/refs?service=git-receive-pack", {}, None),
            ("POST", "/basic.git/git-receive-pack", {}, b"0000"),
            ("PUT", "/basic.git/git-upload-pack", {}, b"0000"),
            ("POST", "/basic.git/git-upload-pack", {}, b"0000"),
            ("POST", "/basic.git/git-upload-pack", {"Content-Type": "text/plain"}, b"0000"),
            ("POST", "/basic.git/git-upload-pack", {"Content-Type": UPLOAD_CT}, b"0000"),
            ("GET", "/nope.git" + INFO_REFS, {}, None),
        ]
        out = []
        for method, path, headers, body in cases:
            async with client.request(method, path, headers=headers, data=body) as resp:
                data = await resp.read()
                out.append((f"{method} {path}", resp.status,
                            resp.headers.get("Content-Type", ""),
                            resp.headers.get("Cache-Control", "") + "|" + data[:40].decode(
                                "latin-1")))
        return out

    got = run_with_client(fixture_root, matrix)
    statuses = [status for _, status, _, _ in got]
    assert statuses == [200, 403, 403, 403, 405, 415, 415, 200, 404], got
    assert got[0][2] == ADVERT_CT
    assert got[7][2] == RESULT_CT
    for _, _, _, rest in got:
        assert "no-cache" in rest.split("|")[0]


@pytest.mark.parametrize("version", [0, 1, 2])
def test_git_protocol_header_variants(server: LiveServer, version: int) -> None:
    for value in (f"version={version}", f"version={version}:foo=bar", f" version={version} ",
                  f"x=y:version={version}"):
        resp = request(server.port, "GET", "/basic.git" + INFO_REFS, {"Git-Protocol": value})
        assert resp.status == 200
        if version == 2:
            assert resp.body.startswith(b"000eversion 2\n"), value
        else:
            assert resp.body.startswith(SERVICE_PREAMBLE), value


@pytest.mark.parametrize("value", ["version=3", "version=99", "version=", "version", "\xff\xfe",
                                   "version=2x", "=2", ":::::"])
def test_unknown_git_protocol_falls_back_to_v0(server: LiveServer, value: str) -> None:
    resp = request(server.port, "GET", "/basic.git" + INFO_REFS, {"Git-Protocol": value})
    assert resp.status == 200
    assert resp.body.startswith(SERVICE_PREAMBLE + b"0")
    assert b"version 1" not in resp.body[:60]


def test_oversized_headers_are_a_client_error(server: LiveServer) -> None:
    resp = request(server.port, "GET", "/basic.git" + INFO_REFS, {"X-Big": "a" * 100_000})
    assert_not_5xx(resp)
    assert resp.status in (400, 431)
    resp = request(server.port, "GET", "/" + "a" * 20_000 + INFO_REFS)
    assert resp.status in (400, 404, 414)
    assert_serving(server.port)
