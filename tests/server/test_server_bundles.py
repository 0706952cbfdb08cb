"""Bundles of gitspout's own (``--bundles``), with real clients on 127.0.0.1:

* after ``--bundle-after`` full clones gitspout writes a bundle of the visible branches
  and tags, offers it through the v2 ``bundle-uri`` command (``bundle.mode=all``, a
  ``creationToken``) and serves it: ``git clone --bundle-uri`` (the CI git) and
  ``transfer.bundleURI`` (git >= 2.41) clone with it, fsck, refs as over file://;
* ``Range`` resumes a download (curl ``-C``);
* a hidden ref is never in the bundle, and once a ref in it is hidden (whatever its tip)
  the bundle is neither offered nor served; refs moved past ``--bundle-refresh-refs``, or
  past a quarter of the refs it holds, make it stale; a stale bundle, or one that can no
  longer be offered, is replaced by the next clone.
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from appkit import APP_TIMEOUT, make_state
from gitspout.server.app.bundleshare import Bundle
from gitspout.server.app.http import RUNNER_KWARGS, make_app
from gitspout.server.store.packedrefs import RefSegment
from gitspout.server.store.refsnapshot import RefSnapshot
from gitutil import (
    Committer,
    Git,
    LiveServer,
    damage_blob,
    fsck,
    git_env,
    objects_received,
    poll,
    repo_state,
    start_server,
)
from netnskit import SlowProxy
from offloadkit import new_git
from rawhttp import FLUSH, metric, parse_pkts, pkt_lines, post_upload_pack, request

BUNDLE_CMD = pkt_lines("command=bundle-uri", "object-format=sha1") + FLUSH


@pytest.fixture(scope="module")
def b_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    root = tmp_path_factory.mktemp("broot")
    work = tmp_path_factory.mktemp("bwork") / "w"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    for i in range(5):
        c.commit({"f.txt": f"line {i}\n" * (i + 1), f"d/{i}.txt": f"{i}\n"}, f"c{i}")
    c.tag("v1", "tag one")
    git.run("branch", "side", "HEAD~2", cwd=work)
    for name in ("repo.git", "moving.git"):
        git.run("clone", "-q", "--bare", str(work), str(root / name))
        git.run("update-ref", "refs/hidden/secret", "HEAD~1", cwd=root / name)
        git.run("config", "uploadpack.hideRefs", "refs/hidden", cwd=root / name)
    return root


@pytest.fixture(scope="module")
def b_server(b_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    srv = start_server(b_root, extra_args=[
        "--bundles", "--bundle-after", "2", "--bundle-refresh-refs", "1",
        "--bundle-dir", str(tmp_path_factory.mktemp("bundles"))])
    yield srv
    srv.stop()


def _clone(git: Git, url: str, dest: Path, *extra: str) -> None:
    git.run("-c", "protocol.version=2", "clone", "-q", *extra, url, str(dest))


def _bundle_list(srv: LiveServer, repo: str) -> dict[str, str]:
    resp = post_upload_pack(srv.port, BUNDLE_CMD, repo, version=2)
    assert resp.status == 200
    out = {}
    for p in parse_pkts(resp.body):
        if p is not None:
            key, _, value = p.decode().partition("=")
            # rawhttp sends "Host: 127.0.0.1": the URL is built on the Host the client sent
            out[key] = value.replace("http://127.0.0.1/", f"{srv.url}/")
    return out


def _written(git: Git, srv: LiveServer, repo: str, tmp_path: Path, count: int) -> dict[str, str]:
    """Full clones until the bundle is due, then its list once written."""
    for i in range(count):
        _clone(git, f"{srv.url}/{repo}", tmp_path / f"warm{i}")
    return poll(lambda: _bundle_list(srv, repo) or None, 20, "a bundle offered")


def _refs(git: Git, path: Path) -> list[str]:
    return [line for line in repo_state(git, path).refs.splitlines()
            if " refs/bundles/" not in line]


def test_bundle_written_offered_and_cloned(git: Git, tmp_path: Path, b_root: Path,
                                           b_server: LiveServer) -> None:
    assert _bundle_list(b_server, "repo.git") == {}
    listed = _written(git, b_server, "repo.git", tmp_path, 2)
    assert listed["bundle.version"] == "1" and listed["bundle.mode"] == "all"
    assert listed["bundle.heuristic"] == "creationToken"
    (uri_key,) = [k for k in listed if k.endswith(".uri")]
    assert listed[uri_key.removesuffix(".uri") + ".creationtoken"] == "1"
    uri = listed[uri_key]
    assert uri.startswith(f"{b_server.url}/repo.git/gitspout-bundle/")
    # The bundle itself: the visible branches and tags, never the hidden ref.
    data = tmp_path / "b.bundle"
    subprocess.run(["curl", "-sf", "-o", str(data), uri], check=True, timeout=60)
    assert data.read_bytes().startswith(b"# v2 git bundle\n")
    heads = git.out("bundle", "list-heads", str(data), cwd=b_root / "repo.git")
    names = sorted(line.split()[1] for line in heads.splitlines())
    assert names == ["refs/heads/main", "refs/heads/side", "refs/tags/v1"]
    ref = tmp_path / "ref"
    git.run("clone", "-q", "--no-local", f"file://{b_root / 'repo.git'}", str(ref))
    # The CI git: --bundle-uri downloads it, then fetches the rest.
    served = metric(b_server.port, 'gitspout_bundle_requests_total{result="served"}', 0)
    dest = tmp_path / "c1"
    _clone(git, f"{b_server.url}/repo.git", dest, f"--bundle-uri={uri}")
    fsck(git, dest)
    assert _refs(git, dest) == _refs(git, ref)
    assert metric(b_server.port, 'gitspout_bundle_requests_total{result="served"}') == served + 1
    newer = new_git()
    if newer is None:
        pytest.skip("transfer.bundleURI needs a git >= 2.41 (GITSPOUT_TEST_NEW_GIT)")
    dest2 = tmp_path / "c2"
    subprocess.run([newer, "-c", "transfer.bundleURI=true", "-c", "protocol.version=2", "clone",
                    "-q", f"{b_server.url}/repo.git", str(dest2)], env=git_env(git.home),
                   check=True, capture_output=True, timeout=120)
    fsck(git, dest2)
    assert _refs(git, dest2) == _refs(git, ref)
    assert metric(b_server.port, 'gitspout_bundle_requests_total{result="served"}') == served + 2


def test_range_resume(git: Git, tmp_path: Path, b_server: LiveServer) -> None:
    listed = _written(git, b_server, "repo.git", tmp_path,
                      0 if _bundle_list(b_server, "repo.git") else 2)
    uri = next(v for k, v in listed.items() if k.endswith(".uri"))
    whole = tmp_path / "whole"
    subprocess.run(["curl", "-sf", "-o", str(whole), uri], check=True, timeout=60)
    part = tmp_path / "part"
    subprocess.run(["curl", "-sf", "-r", "0-99", "-o", str(part), uri], check=True, timeout=60)
    assert part.stat().st_size == 100
    out = subprocess.run(["curl", "-sf", "-C", "-", "-o", str(part), "-w", "%{http_code}", uri],
                         check=True, timeout=60, capture_output=True).stdout
    assert out == b"206"
    assert part.read_bytes() == whole.read_bytes()
    tail = tmp_path / "tail"
    subprocess.run(["curl", "-sf", "-r", "-100", "-o", str(tail), uri], check=True, timeout=60)
    assert tail.read_bytes() == whole.read_bytes()[-100:]
    path = uri.split(str(b_server.port), 1)[1]
    size = whole.stat().st_size
    bad = request(b_server.port, "GET", path, {"Range": f"bytes={size}-"})
    assert bad.status == 416 and bad.header("content-range") == f"bytes */{size}"
    head = request(b_server.port, "HEAD", path)
    assert head.status == 200 and head.header("content-length") == str(size)
    assert head.header("accept-ranges") == "bytes"



def test_route_honours_service_switches(git: Git, tmp_path: Path, b_root: Path,
                                        b_server: LiveServer) -> None:
    """A bundle is refused with its repository's upload-pack (http.uploadpack=false: 403,
    as info/refs), not served from the bundle directory regardless."""
    listed = _written(git, b_server, "repo.git", tmp_path,
                      0 if _bundle_list(b_server, "repo.git") else 2)
    uri = next(v for k, v in listed.items() if k.endswith(".uri"))
    path = uri.split(str(b_server.port), 1)[1]
    assert request(b_server.port, "HEAD", path).status == 200
    git.run("config", "http.uploadpack", "false", cwd=b_root / "repo.git")
    try:
        assert request(b_server.port, "GET", path).status == 403
        assert request(b_server.port, "HEAD", path).status == 403
    finally:
        git.run("config", "--unset", "http.uploadpack", cwd=b_root / "repo.git")
    assert request(b_server.port, "HEAD", path).status == 200

def test_hidden_and_stale(git: Git, tmp_path: Path, b_root: Path, b_server: LiveServer) -> None:
    repo = b_root / "moving.git"
    listed = _written(git, b_server, "moving.git", tmp_path, 2)
    uri = next(v for k, v in listed.items() if k.endswith(".uri"))
    path = uri.split(str(b_server.port), 1)[1]
    assert request(b_server.port, "GET", path).status == 200
    # A ref in the bundle hidden now: neither offered nor served.
    git.run("config", "--add", "uploadpack.hideRefs", "refs/tags", cwd=repo)
    assert _bundle_list(b_server, "moving.git") == {}
    assert request(b_server.port, "GET", path).status == 404
    git.run("config", "--unset", "uploadpack.hideRefs", "refs/tags", cwd=repo)
    assert _bundle_list(b_server, "moving.git") == listed
    # A ref moved (threshold 1): stale; the next --bundle-after (2) full clones, counted
    # since the bundle was written, write token 2.
    git.run("update-ref", "refs/heads/side", "refs/heads/main", cwd=repo)
    assert _bundle_list(b_server, "moving.git") == {}
    for n in range(2):
        _clone(git, f"{b_server.url}/moving.git", tmp_path / f"again{n}")
    newer = poll(lambda: _bundle_list(b_server, "moving.git") or None, 20, "a new bundle")
    assert [v for k, v in newer.items() if k.endswith(".creationtoken")] == ["2"]
    # The one replaced is still served a while (to a client offered it just before).
    assert request(b_server.port, "GET", path).status == 200


def test_base_url_and_namespace(git: Git, tmp_path: Path, b_root: Path,
                                tmp_path_factory: pytest.TempPathFactory) -> None:
    """--bundle-base-url: the list names the file under that base; a namespace URL of the
    same repository is offered nothing (the bundle was written from every ref)."""
    srv = start_server(b_root, extra_args=[
        "--bundles", "--bundle-after", "1", "--bundle-base-url", "https://cdn.example/b/",
        "--bundle-dir", str(tmp_path_factory.mktemp("bundles2")),
        "--namespaces", "ns.git=repo.git#ns"])
    try:
        listed = _written(git, srv, "repo.git", tmp_path, 1)
        uri = next(v for k, v in listed.items() if k.endswith(".uri"))
        assert uri.startswith("https://cdn.example/b/") and uri.endswith("-1.bundle")
        assert "/" not in uri.removeprefix("https://cdn.example/b/")
        caps = parse_pkts(request(srv.port, "GET", "/ns.git/info/refs?service=git-upload-pack",
                                  {"Git-Protocol": "version=2"}).body)
        assert b"bundle-uri\n" not in caps
    finally:
        srv.stop()


def test_over_size_cap_not_kept(git: Git, tmp_path: Path, b_root: Path,
                                tmp_path_factory: pytest.TempPathFactory) -> None:
    """A bundle over --bundle-size is dropped, never offered; the directory is left empty."""
    where = tmp_path_factory.mktemp("bundles3")
    srv = start_server(b_root, extra_args=[
        "--bundles", "--bundle-after", "1", "--bundle-size", "200", "--bundle-dir", str(where)])
    try:
        _clone(git, f"{srv.url}/repo.git", tmp_path / "c")
        srv.wait_for_line("over --bundle-size", timeout=20)
        assert _bundle_list(srv, "repo.git") == {}
        (mine,) = (where / "gitspout-bundles").iterdir()
        assert [p.name for p in mine.iterdir() if p.suffix in (".bundle", ".json", ".tmp")] == []
    finally:
        srv.stop()
    assert list((where / "gitspout-bundles").iterdir()) == []  # removed at shutdown


def _closure(root: object) -> list[object]:
    """Every object ``root`` keeps alive (strong references only: a weakref is a leaf)."""
    seen: dict[int, object] = {}
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) not in seen:
            seen[id(obj)] = obj
            todo.extend(gc.get_referents(obj))
    return list(seen.values())


def test_verdict_pins_no_refs(git: Git, tmp_path: Path, b_root: Path) -> None:
    """In-process, against the real app on 127.0.0.1: the verdict kept for a repository
    holds a digest of its ref state, not its ref segments (nothing of the refs is kept
    alive by it), and a moved ref, a hidden ref or a hideRefs change gets a new verdict
    with a real clone and real bundle-uri requests."""
    root = tmp_path / "root"
    root.mkdir()
    repo = root / "keyed.git"
    git.run("clone", "-q", "--bare", str(b_root / "repo.git"), str(repo))
    git.run("config", "uploadpack.hideRefs", "refs/hidden", cwd=repo)
    state = make_state(root, bundles=True, bundle_after=1, bundle_refresh_refs=1,
                       bundle_dir=str(tmp_path / "bundles"))
    store = state.bundles
    assert store is not None

    def listed(port: int) -> dict[str, str]:
        resp = post_upload_pack(port, BUNDLE_CMD, "keyed.git", version=2)
        assert resp.status == 200
        return dict(p.decode().partition("=")[::2] for p in parse_pkts(resp.body)
                    if p is not None)

    def entry() -> tuple[object, ...]:
        (verdict,) = store._verdicts.values()
        return verdict

    def body(port: int) -> None:
        _clone(git, f"http://127.0.0.1:{port}/keyed.git", tmp_path / "c1")
        first = poll(lambda: listed(port) or None, 20, "a bundle offered")
        verdict = entry()
        assert isinstance(verdict[0], bytes) and len(verdict[0]) == 32
        kept = _closure(verdict)
        assert not [o for o in kept if isinstance(o, (RefSegment, RefSnapshot, Bundle))]
        assert sum(sys.getsizeof(o) for o in kept) < 512
        assert listed(port) == first and entry()[0] == verdict[0]  # same state: kept
        # A ref hidden now that the bundle holds: a new verdict, nothing offered.
        git.run("config", "--add", "uploadpack.hideRefs", "refs/tags", cwd=repo)
        assert listed(port) == {}
        hidden = entry()[0]
        assert hidden != verdict[0]
        git.run("config", "--unset", "uploadpack.hideRefs", "refs/tags", cwd=repo)
        assert listed(port) == first
        # A moved ref (threshold 1): stale, a new verdict; moved back, offered again.
        side = git.out("rev-parse", "refs/heads/side", cwd=repo).strip()
        git.run("update-ref", "refs/heads/side", "refs/heads/main", cwd=repo)
        assert listed(port) == {}
        assert entry()[0] not in (verdict[0], hidden)
        git.run("update-ref", "refs/heads/side", side, cwd=repo)
        assert listed(port) == first

    async def serve() -> None:
        server = TestServer(make_app(state), host="127.0.0.1", **RUNNER_KWARGS)
        async with TestClient(server) as client:
            port = client.server.port
            assert port is not None
            await asyncio.to_thread(body, port)

    asyncio.run(asyncio.wait_for(serve(), APP_TIMEOUT))


def _bundle_server(git: Git, tmp_path: Path, *extra: str) -> tuple[LiveServer, str]:
    """A server with one repository of a 6 MiB bundle (incompressible: more than the
    socket buffers hold), written; the bundle's path on it."""
    root, work = tmp_path / "root", tmp_path / "w"
    root.mkdir()
    git.run("init", "-q", "-b", "main", str(work))
    (work / "big.bin").write_bytes(os.urandom(6 << 20))
    Committer(git, work).commit({"f.txt": "x\n"}, "big")
    git.run("clone", "-q", "--bare", str(work), str(root / "repo.git"))
    srv = start_server(root, extra_args=[
        "--bundles", "--bundle-after", "1", "--bundle-dir", str(tmp_path / "bundles"), *extra])
    try:
        listed = _written(git, srv, "repo.git", tmp_path, 1)
    except BaseException:
        srv.stop()
        raise
    uri = next(v for k, v in listed.items() if k.endswith(".uri"))
    return srv, uri.split(str(srv.port), 1)[1]


def _get_slowly(port: int, path: str, rate: int) -> tuple[bytes, float]:
    """GET ``path`` through a proxy passing about ``rate`` bytes/s from a 16 KiB receive
    buffer (netnskit.SlowProxy: a slow client); the answer and how long it took."""
    proxy = SlowProxy("127.0.0.1", port, rate, rcvbuf=16 << 10)
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
                         .encode())
            start = time.monotonic()
            raw = bytearray()
            try:
                while chunk := sock.recv(1 << 20):
                    raw += chunk
            except ConnectionResetError:
                pass
            return bytes(raw), time.monotonic() - start
    finally:
        proxy.close()


def test_a_slow_download_outlasting_the_send_timeout_is_not_cut(
        git: Git, tmp_path: Path) -> None:
    """A bundle read slowly but steadily (~1.5 MB/s) for several times ``--send-timeout``
    arrives whole: the send watch sees its bytes leave. Before, a download was cut once
    one wait for the socket outlasted the timeout (the socket takes more only when a third
    of its megabytes of buffer are free), and the send watch saw none of the file's bytes:
    at the default 60 s, any client slower than about 20 KB/s."""
    srv, path = _bundle_server(git, tmp_path, "--send-timeout", "0.5")
    try:
        raw, took = _get_slowly(srv.port, path, 1_500_000)
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        length = int(re.search(rb"Content-Length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
        assert len(body) == length > 6 << 20 and body.startswith(b"# v2 git bundle\n")
        assert took > 1.0, "the download must outlast --send-timeout to mean anything"
    finally:
        srv.stop()


def test_a_bundle_reader_that_stops_is_cut(git: Git, tmp_path: Path) -> None:
    """A client that never reads its bundle is cut by the send watch after
    ``--send-timeout``, as any response's, and its request ends."""
    srv, path = _bundle_server(git, tmp_path, "--send-timeout", "0.5")
    kind = 'gitspout_connection_timeouts_total{kind="send"}'
    try:
        before = metric(srv.port, kind, 0)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: h\r\n\r\n".encode())
            poll(lambda: metric(srv.port, kind, 0) == before + 1, 30, "the reader cut")
            poll(lambda: metric(srv.port, "gitspout_requests_in_flight", 0) == 0, 30,
                 "the request ended")
    finally:
        srv.stop()


# -- a bundle that can no longer be offered, few refs, a ref hidden later ---------------


@pytest.fixture(scope="module")
def d_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty root: each test below makes its repositories in it, as an operator would."""
    return tmp_path_factory.mktemp("droot")


@pytest.fixture(scope="module")
def d_server(d_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """--bundle-after 1 with the default --bundle-refresh-refs (16)."""
    srv = start_server(d_root, extra_args=[
        "--bundles", "--bundle-after", "1",
        "--bundle-dir", str(tmp_path_factory.mktemp("dbundles"))])
    yield srv
    srv.stop()


def _token(listed: dict[str, str]) -> str:
    (token,) = [v for k, v in listed.items() if k.endswith(".creationtoken")]
    return token


def _next_bundle(git: Git, srv: LiveServer, repo: str, dest: Path, token: str) -> dict[str, str]:
    """A full clone, then the list once it offers the bundle of creation token ``token``."""
    _clone(git, f"{srv.url}/{repo}", dest)
    return poll(lambda: (listed := _bundle_list(srv, repo)) and _token(listed) == token
                and listed, 20, f"bundle {token} of {repo} offered")


def _heads(git: Git, srv: LiveServer, listed: dict[str, str], dest: Path) -> list[str]:
    """The ref names in the offered bundle, downloaded."""
    uri = next(v for k, v in listed.items() if k.endswith(".uri"))
    subprocess.run(["curl", "-sf", "-o", str(dest), uri], check=True, timeout=60)
    out = git.out("bundle", "list-heads", str(dest))
    return sorted(line.split()[1] for line in out.splitlines())


def _path(srv: LiveServer, listed: dict[str, str]) -> str:
    uri = next(v for k, v in listed.items() if k.endswith(".uri"))
    return uri.split(str(srv.port), 1)[1]


def _tagged_work(git: Git, work: Path) -> Committer:
    """A work repository of 5 commits on main and 40 tags of its second-last commit."""
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    for i in range(5):
        c.commit({"f.txt": f"{i}\n"}, f"c{i}")
    for i in range(40):
        git.run("tag", f"t{i:02}", "HEAD~1", cwd=work)
    return c


def test_a_bundle_that_can_no_longer_be_offered_is_rewritten(
        git: Git, tmp_path: Path, d_root: Path, d_server: LiveServer) -> None:
    """A bundle one of whose tips no visible ref reaches any more (its branch deleted, or
    force-pushed away; the repository made anew at its path) is withdrawn, and the next
    full clone writes its successor, as for a missing one. It holds 43 refs, so one moved
    ref leaves it short of stale (11): before, such a bundle stayed withdrawn and was never
    rewritten, however many clones followed."""
    work = tmp_path / "w"
    c = _tagged_work(git, work)
    for branch in ("feature", "topic"):  # each a commit no other ref reaches
        git.run("checkout", "-q", "-b", branch, "main", cwd=work)
        c.commit({f"{branch}.txt": "x\n"}, branch)
    git.run("checkout", "-q", "main", cwd=work)
    repo = d_root / "stuck.git"
    git.run("clone", "-q", "--bare", str(work), str(repo))
    first = _next_bundle(git, d_server, "stuck.git", tmp_path / "c1", "1")
    assert len(_heads(git, d_server, first, tmp_path / "b1")) == 43
    # Deleted: the bundle's feature tip is reachable from no visible ref.
    git.run("branch", "-q", "-D", "feature", cwd=repo)
    assert _bundle_list(d_server, "stuck.git") == {}
    assert request(d_server.port, "GET", _path(d_server, first)).status == 404
    second = _next_bundle(git, d_server, "stuck.git", tmp_path / "c2", "2")
    names = _heads(git, d_server, second, tmp_path / "b2")
    assert "refs/heads/feature" not in names and "refs/heads/topic" in names
    assert len(names) == 42
    # Force-pushed: topic's tip of bundle 2 is left unreachable.
    git.run("update-ref", "refs/heads/topic", "refs/heads/main", cwd=repo)
    assert _bundle_list(d_server, "stuck.git") == {}
    third = _next_bundle(git, d_server, "stuck.git", tmp_path / "c3", "3")
    # Replaced, and not served in its grace either: a tip of it is reachable no more.
    assert request(d_server.port, "GET", _path(d_server, second)).status == 404
    ref = tmp_path / "ref"
    git.run("clone", "-q", "--no-local", f"file://{repo}", str(ref))
    dest = tmp_path / "c4"
    _clone(git, f"{d_server.url}/stuck.git", dest,
           f"--bundle-uri={next(v for k, v in third.items() if k.endswith('.uri'))}")
    fsck(git, dest)
    assert _refs(git, dest) == _refs(git, ref)
    # Made anew at the same path with another history: withdrawn, then rewritten.
    other = tmp_path / "w2"
    git.run("init", "-q", "-b", "main", str(other))
    Committer(git, other, start=1_700_000_000).commit({"g.txt": "other\n"}, "other")
    git.run("tag", "t00", cwd=other)
    shutil.rmtree(repo)
    git.run("clone", "-q", "--bare", str(other), str(repo))
    assert _bundle_list(d_server, "stuck.git") == {}
    fourth = _next_bundle(git, d_server, "stuck.git", tmp_path / "c5", "4")
    assert _heads(git, d_server, fourth, tmp_path / "b4") == ["refs/heads/main",
                                                              "refs/tags/t00"]


def test_a_bundle_of_few_refs_goes_stale(git: Git, tmp_path: Path, d_root: Path,
                                         d_server: LiveServer) -> None:
    """A repository of 5 branches, which never has 16 refs to move: its bundle is stale
    once a quarter of them (2) moved, and the next full clone writes its successor. Before,
    pushes never made it stale, and clients were sent an ever older bundle."""
    work = tmp_path / "w"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    for i in range(5):
        c.commit({"f.txt": f"{i}\n"}, f"c{i}")
    for i in range(1, 5):
        git.run("branch", f"b{i}", f"HEAD~{i}", cwd=work)
    repo = d_root / "few.git"
    git.run("clone", "-q", "--bare", str(work), str(repo))
    first = _next_bundle(git, d_server, "few.git", tmp_path / "c1", "1")
    c.commit({"f.txt": "5\n"}, "c5")
    git.run("push", "-q", str(repo), "main", cwd=work)
    assert _bundle_list(d_server, "few.git") == first  # one of five moved: still fresh
    git.run("push", "-q", str(repo), "main:b1", cwd=work)
    assert _bundle_list(d_server, "few.git") == {}  # two: stale
    second = _next_bundle(git, d_server, "few.git", tmp_path / "c2", "2")
    bundle = tmp_path / "b2.bundle"
    subprocess.run(["curl", "-sf", "-o", str(bundle), next(
        v for k, v in second.items() if k.endswith(".uri"))], check=True, timeout=60)
    main = git.out("rev-parse", "refs/heads/main", cwd=repo).strip()
    listed = git.out("bundle", "list-heads", str(bundle))
    assert f"{main} refs/heads/b1" in listed and f"{main} refs/heads/main" in listed


def test_a_ref_hidden_after_the_bundle_was_written_withdraws_it(
        git: Git, tmp_path: Path, d_root: Path, d_server: LiveServer) -> None:
    """A branch hidden after its bundle was written, whose tip a visible ref still reaches:
    the bundle is withdrawn at once (neither listed nor served, whatever the protocol of
    the request), and the next full clone writes one of the visible refs only. Before, it
    was still offered, and a client with transfer.bundleURI stored the hidden branch's
    name as refs/bundles/heads/security/embargoed-fix."""
    work = tmp_path / "w"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    for i in range(5):
        c.commit({"f.txt": f"{i}\n"}, f"c{i}")
    repo = d_root / "leak.git"
    git.run("clone", "-q", "--bare", str(work), str(repo))
    git.run("update-ref", "refs/heads/security/embargoed-fix", "main~1", cwd=repo)
    first = _next_bundle(git, d_server, "leak.git", tmp_path / "c1", "1")
    assert "refs/heads/security/embargoed-fix" in _heads(git, d_server, first,
                                                          tmp_path / "b1")
    git.run("config", "uploadpack.hideRefs", "refs/heads/security", cwd=repo)
    for version in ("0", "2"):
        out = git.out("-c", f"protocol.version={version}", "ls-remote",
                      f"{d_server.url}/leak.git")
        assert "security" not in out
    assert _bundle_list(d_server, "leak.git") == {}
    path = _path(d_server, first)
    assert request(d_server.port, "GET", path).status == 404
    assert request(d_server.port, "GET", path, {"Git-Protocol": "version=2"}).status == 404
    assert request(d_server.port, "HEAD", path, {"Git-Protocol": "version=1"}).status == 404
    newer = new_git()
    clone = [newer, "-c", "transfer.bundleURI=true"] if newer else ["git"]
    dest = tmp_path / "c2"
    subprocess.run([*clone, "-c", "protocol.version=2", "clone", "-q", "--bare",
                    f"{d_server.url}/leak.git", str(dest)], env=git_env(git.home),
                   check=True, capture_output=True, timeout=120)
    assert "security" not in git.out("for-each-ref", cwd=dest)
    # That full clone writes the successor, of the visible refs only.
    second = poll(lambda: (listed := _bundle_list(d_server, "leak.git"))
                  and _token(listed) == "2" and listed, 20, "bundle 2 offered")
    assert _heads(git, d_server, second, tmp_path / "b2") == ["refs/heads/main"]
    # Replaced now, but never served again: it names the hidden ref.
    assert request(d_server.port, "GET", path).status == 404
    if newer is None:
        pytest.skip("transfer.bundleURI needs a git >= 2.41 (GITSPOUT_TEST_NEW_GIT)")
    served = metric(d_server.port, 'gitspout_bundle_requests_total{result="served"}', 0)
    dest = tmp_path / "c3"
    subprocess.run([newer, "-c", "transfer.bundleURI=true", "-c", "protocol.version=2",
                    "clone", "-q", "--bare", f"{d_server.url}/leak.git", str(dest)],
                   env=git_env(git.home), check=True, capture_output=True, timeout=120)
    assert metric(d_server.port, 'gitspout_bundle_requests_total{result="served"}') \
        == served + 1
    refs = git.out("for-each-ref", "--format=%(refname)", cwd=dest).split()
    assert "refs/bundles/heads/main" in refs and not [r for r in refs if "security" in r]


def test_a_bundle_of_a_damaged_pack_is_not_kept(git: Git, tmp_path: Path) -> None:
    """A bundle is made of data copied as stored: one written while a pack of the
    repository was damaged was offered, and failed every bundle download, after the
    repository's repair, until its refs moved. Its pack is checked as it is written now
    (packgen/verify.py): not kept, and the next full clone after the repair writes a whole
    one."""
    root, work = tmp_path / "root", tmp_path / "w"
    root.mkdir()
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    c.commit({"big.bin": os.urandom(200_000), "f.txt": "x\n"}, "one")
    c.commit({"f.txt": "y\n"}, "two")
    good = tmp_path / "good.git"
    git.run("clone", "-q", "--bare", str(work), str(good))
    git.run("repack", "-q", "-ad", cwd=good)
    repo = root / "repo.git"
    git.run("clone", "-q", "--bare", "--no-local", str(good), str(repo))
    git.run("repack", "-q", "-ad", cwd=repo)
    damage_blob(git, repo, "main:big.bin", 1000)
    srv = start_server(root, extra_args=[
        "--bundles", "--bundle-after", "1", "--bundle-dir", str(tmp_path / "bundles")])
    try:
        assert git.run("-c", "protocol.version=2", "clone", "-q", f"{srv.url}/repo.git",
                       str(tmp_path / "c1"), check=False).returncode != 0
        poll(lambda: any("not kept: its pack is damaged" in line for line in srv.lines), 20,
             "the damaged bundle refused")
        assert _bundle_list(srv, "repo.git") == {}
        assert not list((tmp_path / "bundles").rglob("*.bundle"))
        for f in (repo / "objects" / "pack").iterdir():  # repaired: the same objects
            f.unlink()
        for f in (good / "objects" / "pack").iterdir():
            (repo / "objects" / "pack" / f.name).write_bytes(f.read_bytes())
        listed = _written(git, srv, "repo.git", tmp_path, 1)
        uri = next(v for k, v in listed.items() if k.endswith(".uri"))
        dest = tmp_path / "c2"
        _clone(git, f"{srv.url}/repo.git", dest, f"--bundle-uri={uri}")
        fsck(git, dest)
    finally:
        srv.stop()


def test_the_clones_counted_start_again_after_a_write(git: Git, tmp_path: Path) -> None:
    """A bundle's successor is due after --bundle-after full clones counted since it was
    written: the count starts again with each write. It did not, so within
    --bundle-window the first full clone after any push to a repository of few refs
    wrote a whole new bundle."""
    root, work, bdir = tmp_path / "root", tmp_path / "w", tmp_path / "bundles"
    root.mkdir()
    git.run("init", "-q", "-b", "main", str(work))
    Committer(git, work).commit({"f.txt": "x\n"}, "one")
    git.run("clone", "-q", "--bare", str(work), str(root / "repo.git"))
    srv = start_server(root, extra_args=["--bundles", "--bundle-after", "2",
                                         "--bundle-dir", str(bdir)])
    try:
        _clone(git, f"{srv.url}/repo.git", tmp_path / "c1")
        counted = poll(lambda: list(bdir.rglob("*.clones")), 20, "the clone counted")
        _written(git, srv, "repo.git", tmp_path, 1)
        poll(lambda: not any(f.exists() for f in counted), 20, "the count started again")
    finally:
        srv.stop()


def test_a_replaced_bundle_is_served_a_while(git: Git, tmp_path: Path) -> None:
    """A client offered a bundle just before it was replaced (a push made it stale, the
    next full clone wrote its successor) still downloads it, and fetches only what is
    newer: before, it got a 404 and fetched everything. One replaced bundle is kept per
    repository, and it goes with the next replacement; a stale bundle not yet replaced
    is served too (not offered). It is served by the rule that serves the current one:
    once a ref in it is hidden, it is not."""
    root, bundles = tmp_path / "root", tmp_path / "bundles"
    root.mkdir()
    bundles.mkdir()
    work = tmp_path / "w"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    for i in range(30):
        c.commit({"f.txt": f"{i}\n" * 50, f"d/{i}.txt": f"{i}\n"}, f"c{i}")
    git.run("branch", "side", "HEAD~3", cwd=work)
    repo = root / "grace.git"
    git.run("clone", "-q", "--bare", str(work), str(repo))
    srv = start_server(root, extra_args=["--bundles", "--bundle-after", "1",
                                         "--bundle-dir", str(bundles)])
    try:
        first = _next_bundle(git, srv, "grace.git", tmp_path / "c1", "1")

        def push(n: int) -> None:  # both refs move: stale (a quarter of 2 refs is 1)
            c.commit({"f.txt": f"new {n}\n"}, f"n{n}")
            git.run("push", "-q", "-f", str(repo), "main", "main:side", cwd=work)

        push(1)
        assert _bundle_list(srv, "grace.git") == {}
        assert request(srv.port, "GET", _path(srv, first)).status == 200  # stale, served
        second = _next_bundle(git, srv, "grace.git", tmp_path / "c2", "2")
        served = metric(srv.port, 'gitspout_bundle_requests_total{result="served"}', 0)
        # A clone with the replaced bundle's URI, as a client offered it just before.
        ref = tmp_path / "ref"
        git.run("clone", "-q", "--bare", f"file://{repo}", str(ref))
        dest = tmp_path / "late"
        trace = tmp_path / "trace.pack"
        got = objects_received(git, ["-c", "protocol.version=2", "clone", "-q", "--bare",
                                     f"--bundle-uri={first['bundle.gitspout-1.uri']}",
                                     f"{srv.url}/grace.git", str(dest)], tmp_path, trace)
        assert metric(srv.port, 'gitspout_bundle_requests_total{result="served"}') \
            == served + 1
        fsck(git, dest)
        assert _refs(git, dest) == _refs(git, ref)
        total = int(git.out("rev-list", "--all", "--objects", "--count", cwd=repo))
        assert got < total // 2, f"{got} of {total} objects fetched: the bundle was not used"
        # The next replacement removes it: one replaced bundle kept.
        push(2)
        _next_bundle(git, srv, "grace.git", tmp_path / "c3", "3")
        assert request(srv.port, "GET", _path(srv, first)).status == 404
        assert request(srv.port, "GET", _path(srv, second)).status == 200
        assert sorted(p.name.split("-", 1)[1] for p in bundles.rglob("*.bundle")) \
            == ["2.bundle", "3.bundle"]
        # A ref of it hidden: not served, whatever its tips.
        git.run("config", "uploadpack.hideRefs", "refs/heads/side", cwd=repo)
        assert request(srv.port, "GET", _path(srv, second)).status == 404
    finally:
        srv.stop()


def test_a_bundle_goes_stale_with_age_once_a_ref_moved(git: Git, tmp_path: Path) -> None:
    """With ``--bundle-refresh-age``, a bundle of many refs of which one moved (``main``,
    by many pushes: one moved ref) is stale once it is that old, and the next full clone
    writes its successor; one whose refs did not move stays offered whatever its age.
    Before, such a repository (40 tags, one branch moving) kept its first bundle for
    good: it never had 11 refs to move."""
    root = tmp_path / "root"
    root.mkdir()
    work = tmp_path / "w"
    c = _tagged_work(git, work)
    for name in ("moving.git", "still.git"):
        git.run("clone", "-q", "--bare", str(work), str(root / name))
    srv = start_server(root, extra_args=["--bundles", "--bundle-after", "1",
                                         "--bundle-refresh-age", "3",
                                         "--bundle-dir", str(tmp_path / "bundles")])
    try:
        still = _next_bundle(git, srv, "still.git", tmp_path / "s1", "1")
        first = _next_bundle(git, srv, "moving.git", tmp_path / "c1", "1")
        for n in range(3):
            c.commit({"f.txt": f"new {n}\n"}, f"n{n}")
            git.run("push", "-q", str(root / "moving.git"), "main", cwd=work)
        assert _bundle_list(srv, "moving.git") == first  # one moved ref of 41: fresh
        poll(lambda: _bundle_list(srv, "moving.git") == {}, 20, "the bundle stale by age")
        second = _next_bundle(git, srv, "moving.git", tmp_path / "c2", "2")
        main = git.out("rev-parse", "main", cwd=work).strip()
        bundle = tmp_path / "b2.bundle"
        subprocess.run(["curl", "-sf", "-o", str(bundle), second["bundle.gitspout-2.uri"]],
                       check=True, timeout=60)
        assert f"{main} refs/heads/main" in git.out("bundle", "list-heads", str(bundle))
        # still.git's bundle is older than the age now, and none of its refs moved.
        assert _bundle_list(srv, "still.git") == still
    finally:
        srv.stop()
