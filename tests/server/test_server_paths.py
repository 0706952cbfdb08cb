"""Repository resolution from the URL path: missing repos, traversal in every spelling,
NUL, backslashes and symlinks all give 404 and never leave --root (repos.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from appkit import run_with_client, run_with_port
from gitutil import Git, LiveServer
from rawhttp import (
    ADVERT_CT,
    INFO_REFS,
    SERVICE_PREAMBLE,
    UPLOAD_CT,
    assert_serving,
    pkt_lines,
    request,
)

MISSING = [
    "/nope.git",
    "/nope",
    "/basic.git.git",
    "/team",  # a plain directory, not a repository
    "/basic.git/objects",  # inside a repository, but not one
    "/basic.git/refs",
    "/.git",
    "",  # the root itself
]

TRAVERSAL = [
    "/../basic.git",
    "/team/../basic.git",
    "/team/app/../../basic.git",
    "/%2e%2e/basic.git",
    "/%2E%2E/basic.git",
    "/team/%2E%2E/basic.git",
    "/team/%2e%2e/basic.git",
    "/.%2e/basic.git",
    "/%2e./basic.git",
    "/team%2f..%2fbasic.git",
    "/team/app/.git/..%2F..%2F..%2Fbasic.git",
    "/./basic.git",
    "/%2e/basic.git",
    "/basic.git/.",
    "/basic.git/..",
    "/team/app/.git/../.git",
    "//../basic.git",
    "/team//../basic.git",
    "/%252e%252e/basic.git",  # double-encoded: a literal "%2e%2e" directory, which is absent
    "/%c0%ae%c0%ae/basic.git",  # overlong UTF-8 dots
    "/..%5cbasic.git",
    "/..\\basic.git",
    "/team\\..\\basic.git",
    "/basic.git\\",
    "/%5cbasic.git",
    "/basic.git%00",
    "/basic.git%00.git",
    "/%00/basic.git",
    "/team/app%00/.git",
    "/%2ftmp/basic.git",
    "/~/basic.git",
    "/proc/self/root",
]


def _info_refs(port: int, repo_path: str, method: str = "GET") -> Any:
    return request(port, method, repo_path + INFO_REFS)


def _upload(port: int, repo_path: str) -> Any:
    return request(port, "POST", repo_path + "/git-upload-pack",
                   {"Content-Type": UPLOAD_CT}, b"0000")


@pytest.mark.parametrize("repo_path", MISSING)
def test_missing_repository_is_404(server: LiveServer, repo_path: str) -> None:
    for resp in (_info_refs(server.port, repo_path), _upload(server.port, repo_path)):
        assert resp.status == 404, (repo_path, resp.status, resp.body[:200])
        assert resp.header("content-type").startswith("text/plain")
        assert not resp.body.startswith(b"001e#")


@pytest.mark.parametrize("repo_path", TRAVERSAL)
def test_traversal_nul_and_backslash_are_404(server: LiveServer, repo_path: str) -> None:
    for resp in (_info_refs(server.port, repo_path), _upload(server.port, repo_path)):
        assert resp.status == 404, (repo_path, resp.status, resp.body[:200])
        assert SERVICE_PREAMBLE not in resp.body
    assert_serving(server.port)


@pytest.mark.parametrize("repo_path", ["/basic.git", "/basic", "/team/app", "/team/app.git",
                                       "/team/app/.git", "/empty.git", "/sha256.git"])
def test_servable_spellings(server: LiveServer, repo_path: str) -> None:
    resp = _info_refs(server.port, repo_path)
    assert resp.status == 200
    assert resp.header("content-type") == ADVERT_CT
    assert resp.body.startswith(SERVICE_PREAMBLE)


def test_overlong_paths_are_404(server: LiveServer) -> None:
    for repo_path in ("/" + "a" * 300, "/" + "a/" * 2000 + "x.git", "/" + "%2e%2e/" * 500):
        resp = _info_refs(server.port, repo_path)
        assert resp.status == 404, (repo_path[:40], resp.status)


def test_undecodable_percent_escapes_are_404(server: LiveServer) -> None:
    for repo_path in ("/%ff", "/%", "/%zz", "/basic%ff.git", "/basic.git%20"):
        resp = _info_refs(server.port, repo_path)
        assert resp.status == 404, (repo_path, resp.status)


def test_control_character_in_path_is_not_served(server: LiveServer) -> None:
    resp = _info_refs(server.port, "/basic.git%0a")
    assert resp.status == 404


# ------------------------------------------------------------------ symlinks (live server)

INSIDE_LINKS = ["/alias.git", "/alias", "/grp/inner.git", "/grp/inner", "/up/root/basic.git"]
OUTSIDE_LINKS = ["/escape.git", "/escape", "/relescape.git", "/linkdir/basic.git",
                 "/linkdir/basic", "/up/outside/basic.git", "/loop.git", "/dangling.git",
                 "/rootlink" + "/tmp", "/rootlink/etc"]


@pytest.mark.parametrize("repo_path", INSIDE_LINKS)
def test_symlink_to_repo_inside_root_is_served(symlink_server: LiveServer,
                                               repo_path: str) -> None:
    resp = _info_refs(symlink_server.port, repo_path)
    assert resp.status == 200, (repo_path, resp.status, resp.body[:200])
    assert resp.body.startswith(SERVICE_PREAMBLE)
    assert _upload(symlink_server.port, repo_path).status == 200


@pytest.mark.parametrize("repo_path", OUTSIDE_LINKS)
def test_symlink_leaving_root_is_404(symlink_server: LiveServer, repo_path: str) -> None:
    for resp in (_info_refs(symlink_server.port, repo_path),
                 _upload(symlink_server.port, repo_path)):
        assert resp.status == 404, (repo_path, resp.status, resp.body[:200])
    assert symlink_server.alive()
    assert_serving(symlink_server.port)


def test_symlink_outside_root_even_for_rootlink_to_served_repo(symlink_server: LiveServer,
                                                               symlink_root: Path) -> None:
    # /rootlink/<absolute path of root>/basic.git reaches a served repository through a
    # link to "/"; its real path is inside the root, so serving it is safe either way.
    # What matters is that the outside copy stays unreachable through the same link.
    outside = symlink_root.parent / "outside" / "basic.git"
    resp = _info_refs(symlink_server.port, "/rootlink" + str(outside))
    assert resp.status == 404


def test_git_ls_remote_through_inside_symlink(git: Git, symlink_server: LiveServer,
                                             symlink_root: Path) -> None:
    via_link = git.out("ls-remote", f"{symlink_server.url}/alias.git")
    direct = git.out("ls-remote", f"file://{symlink_root / 'basic.git'}")
    assert via_link == direct
    bad = git.run("ls-remote", f"{symlink_server.url}/escape.git", check=False)
    assert bad.returncode != 0
    assert b"not found" in bad.stderr.lower() or b"404" in bad.stderr


# ------------------------------------------------------------------ in-process app

def test_symlinks_with_aiohttp_test_client(symlink_root: Path) -> None:
    async def check(client: Any) -> dict[str, int]:
        statuses = {}
        for repo_path in INSIDE_LINKS + OUTSIDE_LINKS + ["/basic.git", "/nope.git"]:
            resp = await client.get(repo_path + INFO_REFS)
            await resp.read()
            statuses[repo_path] = resp.status
        return statuses

    statuses = run_with_client(symlink_root, check)
    for repo_path in INSIDE_LINKS + ["/basic.git"]:
        assert statuses[repo_path] == 200, repo_path
    for repo_path in OUTSIDE_LINKS + ["/nope.git"]:
        assert statuses[repo_path] == 404, repo_path


def test_traversal_against_in_process_app(fixture_root: Path) -> None:
    def probe(port: int) -> dict[str, int]:
        out = {p: _info_refs(port, p).status for p in TRAVERSAL}
        assert_serving(port)
        return out

    statuses = run_with_port(fixture_root, probe)
    assert statuses == {p: 404 for p in TRAVERSAL}


def test_v2_ls_refs_through_symlink(symlink_server: LiveServer) -> None:
    body = pkt_lines("command=ls-refs", "object-format=sha1") + b"0001" + \
        pkt_lines("ref-prefix refs/heads/") + b"0000"
    resp = request(symlink_server.port, "POST", "/alias.git/git-upload-pack",
                   {"Content-Type": UPLOAD_CT, "Git-Protocol": "version=2"}, body)
    assert resp.status == 200
    assert b" refs/heads/main\n" in resp.body
    resp = request(symlink_server.port, "POST", "/escape.git/git-upload-pack",
                   {"Content-Type": UPLOAD_CT, "Git-Protocol": "version=2"}, body)
    assert resp.status == 404
