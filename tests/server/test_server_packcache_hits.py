"""Pack-cache hits at the cost of their bytes (issue 28; server/app/cacheread.py,
sendregion.py, samefetch.py).

Cache files hold the pack framed as side-band-64k: a client of side-band-64k (every v2
fetch, v0/v1 with ``side-band-64k``) gets it by sendfile, a client of side-band's small
packets or of no side-band gets it unframed in Python. A fetch seen before is answered
without being planned again while the repository stands as it did: a ref update, a hidden
or deleted ref, another namespace is answered as planned for it, never from another
state's or scope's answer. A drain finishes a pack in mid-sendfile; a reader that stalls
there is cut by the send watch.

Real clients throughout (C git over v2 and v0, pygit2, dulwich) and raw requests for what
they do not send; every clone fsck-clean and equal in objects to the same clone over
file://; which path served what is read from /metrics, never from timings.
"""

from __future__ import annotations

import io
import random
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import Committer, Git, LiveServer, copy_repo, fsck, git_env, poll, repo_state, start_server
from netnskit import SlowProxy
from packutil import InBandError, objects_reachable, pack_bytes, pack_object_ids
from rawhttp import (
    FLUSH,
    UPLOAD_CT,
    build_request,
    connect,
    metric,
    parse_pkts,
    parse_response,
    pkt_lines,
    post_upload_pack,
    read_head,
    read_until_close,
    request,
    server_side,
    v2_command,
)

REPO = "hits.git"
BLOBS = 3  # incompressible blobs of BLOB_BYTES: a pack of ~9 MiB, more than socket buffers
BLOB_BYTES = 3 << 20
TIMEOUT = 60


@pytest.fixture(scope="module")
def hits_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    """hits.git: text history with a tag, a branch ``side`` whose last commit only it
    reaches, and large incompressible blobs on main; one pack without a bitmap (a clone's
    pack goes through the cache file, not sent whole from the pack)."""
    root = tmp_path_factory.mktemp("hitsroot")
    work = tmp_path_factory.mktemp("hitswork") / "w"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    rng = random.Random(28)
    for i in range(6):
        c.commit({"a.txt": f"line {i}\n" * (i + 1)}, f"text {i}")
    c.tag("v1", "version one")
    git.run("checkout", "-q", "-b", "side", cwd=work)
    c.commit({"side.txt": "only on side\n"}, "side only")
    git.run("checkout", "-q", "main", cwd=work)
    for i in range(BLOBS):
        c.commit({f"big{i}.bin": rng.randbytes(BLOB_BYTES)}, f"big {i}")
    repo = root / REPO
    git.run("clone", "-q", "--bare", "--no-local", str(work), str(repo))
    git.run("--git-dir", str(repo), "repack", "-adq", "--no-write-bitmap-index")
    git.run("--git-dir", str(repo), "config", "uploadpack.allowRefInWant", "true")
    return root


@pytest.fixture
def own_root(hits_root: Path, tmp_path: Path) -> Path:
    """A copy of the root, for a test that changes the repository."""
    root = tmp_path / "root"
    root.mkdir()
    copy_repo(hits_root / REPO, root / REPO)
    return root


@pytest.fixture
def hits_server(hits_root: Path, cache_dir: Path) -> Iterator[LiveServer]:
    srv = start_server(hits_root, ["--pack-cache-dir", str(cache_dir)])
    yield srv
    srv.stop()


def cache_metrics(port: int) -> dict[str, float]:
    """``gitspout_pack_cache_*`` samples, by name and labels as written."""
    text = request(port, "GET", "/metrics").text
    return {name: float(value) for name, value in
            re.findall(r"^(gitspout_pack_cache_\S+) (\S+)$", text, re.M)}


def lookups(port: int) -> dict[str, int]:
    m = cache_metrics(port)
    return {r: int(m.get(f'gitspout_pack_cache_lookups_total{{result="{r}"}}', 0))
            for r in ("hit", "miss", "joined", "bypass")}


def same(port: int) -> dict[str, int]:
    m = cache_metrics(port)
    return {r: int(m.get(f'gitspout_pack_cache_same_requests_total{{result="{r}"}}', 0))
            for r in ("hit", "stale", "gone")}


def served(port: int) -> dict[str, int]:
    m = cache_metrics(port)
    return {p: int(m.get(f'gitspout_pack_cache_served_bytes_total{{path="{p}"}}', 0))
            for p in ("sendfile", "python")}


def cache_file_size(cache_dir: Path) -> int:
    (sub,) = cache_dir.glob("gitspout-packcache-*")
    sizes = [f.stat().st_size for f in sub.iterdir()]
    assert len(sizes) == 1, sizes
    return sizes[0]


def tip(git: Git, root: Path, rev: str = "main") -> str:
    return git.out("--git-dir", str(root / REPO), "rev-parse", rev).strip()


def assert_like_file_clone(git: Git, root: Path, ours: Path, *args: str) -> None:
    """``ours`` is fsck-clean and holds what the same clone over file:// holds."""
    theirs = ours.parent / (ours.name + "-file")
    git.run("clone", "-q", *args, f"file://{root / REPO}", str(theirs))
    fsck(git, ours)
    a, b = repo_state(git, ours), repo_state(git, theirs)
    assert a.objects == b.objects
    assert a.refs == b.refs


def v2_fetch(*args: str) -> bytes:
    return v2_command("fetch", args=("ofs-delta", *args, "done"))


def v2_pack(resp_body: bytes) -> bytes:
    pack = pack_bytes(resp_body)
    assert pack is not None, resp_body[:300]
    return pack


# -- which path serves -------------------------------------------------------------------


def test_clients_read_the_cache_by_sendfile_and_repeats_are_not_planned(
        git: Git, hits_root: Path, hits_server: LiveServer, cache_dir: Path,
        tmp_path: Path) -> None:
    """C git (v2 and v0), pygit2 (libgit2, v0) and dulwich all ask for side-band-64k: the
    cache file goes out by sendfile to each, and a repeated clone is answered without
    being planned (same_requests hit)."""
    url = f"{hits_server.url}/{REPO}"
    dests = [tmp_path / f"v2-{i}.git" for i in range(3)]
    for dest in dests:
        git.run("-c", "protocol.version=2", "clone", "-q", "--mirror", url, str(dest))
    for dest in dests:
        assert_like_file_clone(git, hits_root, dest, "--mirror")
    assert lookups(hits_server.port) == {"hit": 2, "miss": 1, "joined": 0, "bypass": 0}
    assert same(hits_server.port)["hit"] == 2
    size = cache_file_size(cache_dir)
    assert served(hits_server.port) == {"sendfile": 3 * size, "python": 0}

    v0 = tmp_path / "v0.git"
    git.run("-c", "protocol.version=0", "clone", "-q", "--mirror", url, str(v0))
    assert_like_file_clone(git, hits_root, v0, "--mirror")

    import pygit2
    libgit2 = tmp_path / "pygit2.git"
    pygit2.clone_repository(url, str(libgit2), bare=True)
    from dulwich import porcelain
    dul = tmp_path / "dulwich.git"
    porcelain.clone(url, str(dul), bare=True, errstream=io.BytesIO())
    everything = repo_state(git, dests[0]).objects
    for other in (libgit2, dul):
        fsck(git, other)
        assert repo_state(git, other).objects == everything
    assert served(hits_server.port)["python"] == 0
    assert served(hits_server.port)["sendfile"] >= 5 * size


def test_v0_side_band_and_no_side_band_are_framed_in_python(
        git: Git, hits_root: Path, hits_server: LiveServer) -> None:
    """The same pack (the same cache entry) to a v0 client of side-band-64k (sendfile), of
    side-band (1000-byte packets, progress on band 2) and of no side-band (the raw pack
    after NAK): byte for byte the same, whole, with every object of main."""
    main = tip(git, hits_root)

    def body(caps: str) -> bytes:
        return pkt_lines(f"want {main} {caps}".rstrip()) + FLUSH + pkt_lines("done")

    large = post_upload_pack(hits_server.port, body("side-band-64k ofs-delta"), REPO,
                             timeout=TIMEOUT)
    assert large.status == 200 and large.complete
    pack = v2_pack(large.body)
    assert served(hits_server.port)["python"] == 0

    small = post_upload_pack(hits_server.port, body("side-band ofs-delta"), REPO,
                             timeout=TIMEOUT)
    assert small.status == 200 and small.complete
    pkts = [p for p in parse_pkts(small.body) if p is not None]
    assert pkts[0] == b"NAK\n"
    bands = pkts[1:]
    assert all(len(p) <= 1000 - 4 for p in bands)  # side-band: at most 1000-byte packets
    assert any(p.startswith(b"\x02") and b"objects" in p for p in bands)  # progress
    assert b"".join(p[1:] for p in bands if p[:1] == b"\x01") == pack

    plain = post_upload_pack(hits_server.port, body("ofs-delta"), REPO, timeout=TIMEOUT)
    assert plain.status == 200 and plain.complete
    assert plain.body.startswith(b"0008NAK\n")
    assert plain.body[len(b"0008NAK\n"):] == pack

    assert lookups(hits_server.port) == {"hit": 2, "miss": 1, "joined": 0, "bypass": 0}
    assert served(hits_server.port)["python"] > 2 * len(pack)
    assert pack_object_ids(git, pack) == objects_reachable(git, hits_root / REPO, main)


def test_http_10_client_gets_the_file_unchunked(git: Git, hits_root: Path,
                                                hits_server: LiveServer) -> None:
    """An HTTP/1.0 response has no chunked coding: the regions go out as they are, and
    the end of the response is the end of the connection."""
    body = v2_fetch(f"want {tip(git, hits_root)}", "no-progress")
    for _ in range(2):  # a miss, then a hit of the complete entry
        sock = connect(hits_server.port, TIMEOUT)
        try:
            head = build_request("POST", f"/{REPO}/git-upload-pack", {
                "Content-Type": UPLOAD_CT, "Git-Protocol": "version=2"}, body)
            sock.sendall(head.replace(b" HTTP/1.1\r\n", b" HTTP/1.0\r\n", 1))
            data, closed = read_until_close(sock, TIMEOUT)
        finally:
            sock.close()
        assert closed
        resp = parse_response(data)
        assert resp.status == 200 and resp.header("transfer-encoding") is None
        pack = v2_pack(resp.body)
        assert pack_object_ids(git, pack) == objects_reachable(git, hits_root / REPO, "main")
    assert same(hits_server.port)["hit"] == 1
    assert served(hits_server.port)["python"] == 0


def test_identical_requests_at_once_are_planned_once(
        git: Git, hits_root: Path, hits_server: LiveServer) -> None:
    """Eight identical fetches sent at the same instant: the first is planned, the others
    wait for that plan and read its pack (none plans for itself: every one but the
    first is answered from the first), and every answer is the same whole pack."""
    body = v2_fetch(f"want {tip(git, hits_root)}", f"want {tip(git, hits_root, 'side')}")
    request_bytes = build_request("POST", f"/{REPO}/git-upload-pack", {
        "Content-Type": UPLOAD_CT, "Git-Protocol": "version=2"}, body)
    socks = [connect(hits_server.port, TIMEOUT) for _ in range(8)]
    go = threading.Barrier(len(socks))
    answers: list[bytes] = [b""] * len(socks)

    def fetch(i: int) -> None:
        go.wait()
        socks[i].sendall(request_bytes)
        answers[i] = read_until_close(socks[i], TIMEOUT)[0]

    threads = [threading.Thread(target=fetch, args=(i,)) for i in range(len(socks))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
    finally:
        for sock in socks:
            sock.close()
    packs = {v2_pack(parse_response(a).body) for a in answers}
    assert len(packs) == 1
    assert pack_object_ids(git, packs.pop()) == objects_reachable(
        git, hits_root / REPO, "main", "side")
    assert same(hits_server.port) == {"hit": 7, "stale": 0, "gone": 0}
    assert lookups(hits_server.port)["miss"] == 1


# -- the same request under another state or scope --------------------------------------


def test_a_ref_update_between_identical_requests_is_answered_fresh(
        git: Git, own_root: Path, cache_dir: Path, tmp_path: Path) -> None:
    """``want-ref refs/heads/main``, the same body before and after main moves: the second
    is answered from the first, the third is stale and planned again: the new tip in
    wanted-refs and its objects in the pack. A clone after it equals file://."""
    srv = start_server(own_root, ["--pack-cache-dir", str(cache_dir)])
    try:
        body = v2_fetch("want-ref refs/heads/main", "no-progress")
        answers = [post_upload_pack(srv.port, body, REPO, version=2, timeout=TIMEOUT)
                   for _ in range(2)]
        assert answers[0].body == answers[1].body
        assert same(srv.port) == {"hit": 1, "stale": 0, "gone": 0}
        repo = own_root / REPO
        old = tip(git, own_root)
        tree = git.out("--git-dir", str(repo), "rev-parse", "main^{tree}").strip()
        new = git.out("--git-dir", str(repo), "commit-tree", tree, "-p", old, "-m", "moved",
                      env={"GIT_AUTHOR_DATE": "1700000000 +0000",
                           "GIT_COMMITTER_DATE": "1700000000 +0000"}).strip()
        git.run("--git-dir", str(repo), "update-ref", "refs/heads/main", new, old)
        fresh = post_upload_pack(srv.port, body, REPO, version=2, timeout=TIMEOUT)
        assert same(srv.port)["stale"] == 1
        assert f"{new} refs/heads/main".encode() in fresh.body
        assert new in pack_object_ids(git, v2_pack(fresh.body))
        assert f"{old} refs/heads/main".encode() in answers[0].body
        clone = tmp_path / "after.git"
        git.run("-c", "protocol.version=2", "clone", "-q", "--mirror", f"{srv.url}/{REPO}",
                str(clone))
        assert_like_file_clone(git, own_root, clone, "--mirror")
    finally:
        srv.stop()


def test_an_answer_whose_pack_expired_is_planned_again(
        git: Git, hits_root: Path, cache_dir: Path) -> None:
    """The answer of a fetch is kept beyond its pack: once the pack has left the cache
    (its TTL), the same request is planned and produced again (``gone``), the same pack."""
    srv = start_server(hits_root, ["--pack-cache-dir", str(cache_dir), "--pack-cache-ttl", "1"])
    try:
        body = v2_fetch(f"want {tip(git, hits_root, 'side')}", "no-progress")
        first = post_upload_pack(srv.port, body, REPO, version=2, timeout=TIMEOUT)
        assert post_upload_pack(srv.port, body, REPO, version=2, timeout=TIMEOUT).body \
            == first.body
        # The scenario: the entry grows older than its TTL (it expires at the next
        # lookup). Its age shows on the disk: past the newest write in the cache
        # directory (the entry was completed at or after its last write) by the TTL.
        newest = max(f.stat().st_mtime for f in cache_dir.rglob("*") if f.is_file())
        poll(lambda: time.time() - newest > 1.25, TIMEOUT, "the cache entry past its TTL")
        again = post_upload_pack(srv.port, body, REPO, version=2, timeout=TIMEOUT)
        assert v2_pack(again.body) == v2_pack(first.body)
        assert same(srv.port) == {"hit": 1, "stale": 0, "gone": 1}
        assert lookups(srv.port) == {"hit": 1, "miss": 2, "joined": 0, "bypass": 0}
    finally:
        srv.stop()


def _refused(resp_body: bytes) -> bool:
    """No pack, and an error (ERR or side-band 3): what a want of a hidden object gets."""
    try:
        return pack_bytes(resp_body) is None and b"ERR" in resp_body
    except InBandError:
        return True


def test_a_hidden_or_deleted_ref_is_not_answered_from_before(
        git: Git, own_root: Path, cache_dir: Path) -> None:
    """A commit only ``side`` reaches, asked for by id twice (the second answered from the
    first); then ``side`` is hidden (uploadpack.hideRefs): the identical request is
    refused, not answered as before; shown again, it is served; deleted, refused."""
    srv = start_server(own_root, ["--pack-cache-dir", str(cache_dir)])
    repo = own_root / REPO
    side = tip(git, own_root, "side")
    body = v2_fetch(f"want {side}", "no-progress")

    def fetch() -> bytes:
        resp = post_upload_pack(srv.port, body, REPO, version=2, timeout=TIMEOUT)
        assert resp.status == 200
        return resp.body

    try:
        first = fetch()
        assert side in pack_object_ids(git, v2_pack(first))
        assert fetch() == first
        assert same(srv.port)["hit"] == 1
        git.run("--git-dir", str(repo), "config", "uploadpack.hideRefs", "refs/heads/side")
        assert _refused(fetch())
        assert same(srv.port)["stale"] == 1
        git.run("--git-dir", str(repo), "config", "--unset", "uploadpack.hideRefs")
        assert v2_pack(fetch()) == v2_pack(first)
        git.run("--git-dir", str(repo), "update-ref", "-d", "refs/heads/side")
        assert _refused(fetch())
        assert same(srv.port)["hit"] == 1  # never answered from before once things changed
    finally:
        srv.stop()


def test_users_never_share_an_answer_and_access_comes_first(
        git: Git, hits_root: Path, cache_dir: Path, tmp_path: Path) -> None:
    """With --auth-file, the same body from two users: each is answered from its own
    first request, never from the other's (the pack is shared all the same); a user the
    repository is not open to is refused before any answer is looked at."""
    import base64

    import bcrypt
    passwords = {"alice": "al1ce-pw", "bob": "b0b-pw", "carol": "car0l-pw"}
    auth = tmp_path / "auth.toml"
    auth.write_text('[users]\n' + "".join(
        f'{u} = "{bcrypt.hashpw(p.encode(), bcrypt.gensalt(4)).decode()}"\n'
        for u, p in passwords.items())
        + f'[[access]]\nrepos = ["{REPO}"]\nusers = ["alice", "bob"]\n')
    srv = start_server(hits_root, ["--pack-cache-dir", str(cache_dir), "--auth-file", str(auth)])
    body = v2_fetch(f"want {tip(git, hits_root, 'side')}", "no-progress")

    def fetch(user: str) -> tuple[int, bytes]:
        token = base64.b64encode(f"{user}:{passwords[user]}".encode()).decode()
        resp = post_upload_pack(srv.port, body, REPO, version=2, timeout=TIMEOUT,
                                headers={"Authorization": f"Basic {token}"})
        return resp.status, resp.body

    try:
        status, first = fetch("alice")
        assert status == 200 and tip(git, hits_root, "side") in pack_object_ids(
            git, v2_pack(first))
        assert fetch("alice") == (200, first)
        assert same(srv.port)["hit"] == 1
        assert fetch("bob") == (200, first)
        assert same(srv.port)["hit"] == 1  # bob's first is planned for bob
        assert lookups(srv.port)["hit"] == 2  # and reads the pack alice's produced
        assert fetch("bob") == (200, first)
        assert same(srv.port)["hit"] == 2
        assert fetch("carol")[0] == 403
        assert same(srv.port)["hit"] == 2
    finally:
        srv.stop()


@pytest.fixture
def ns_root(tmp_path: Path, git: Git, hits_root: Path) -> tuple[Path, str, str]:
    """ns.git: namespace ``a`` shows main, namespace ``b`` shows main~1 only. Returns the
    root and the two tips."""
    root = tmp_path / "nsroot"
    root.mkdir()
    repo = copy_repo(hits_root / REPO, root / "ns.git")
    a, b = tip(git, hits_root, "main"), tip(git, hits_root, "main~1")
    for ns, rev in (("a", a), ("b", b)):
        git.run("--git-dir", str(repo), "update-ref", f"refs/namespaces/{ns}/refs/heads/main",
                rev)
        git.run("--git-dir", str(repo), "symbolic-ref", f"refs/namespaces/{ns}/HEAD",
                f"refs/namespaces/{ns}/refs/heads/main")
    return root, a, b


def test_namespaces_never_share_an_answer(git: Git, ns_root: tuple[Path, str, str],
                                          cache_dir: Path, tmp_path: Path) -> None:
    """The same body to two URLs of one repository: the namespace that shows the wanted
    commit gets it (twice, the second from the first); the one whose refs do not reach it
    is refused, not given the other's answer. A clone of each has its namespace's tip."""
    root, a, b = ns_root
    srv = start_server(root, ["--pack-cache-dir", str(cache_dir),
                              "--namespaces", "a.git=ns.git#a,b.git=ns.git#b"])
    try:
        body = v2_fetch(f"want {a}", "no-progress")
        first = post_upload_pack(srv.port, body, "a.git", version=2, timeout=TIMEOUT)
        assert a in pack_object_ids(git, v2_pack(first.body))
        again = post_upload_pack(srv.port, body, "a.git", version=2, timeout=TIMEOUT)
        assert again.body == first.body
        assert same(srv.port)["hit"] == 1
        other = post_upload_pack(srv.port, body, "b.git", version=2, timeout=TIMEOUT)
        assert _refused(other.body)
        assert same(srv.port)["hit"] == 1
        for ns, want in (("a", a), ("b", b), ("a", a), ("b", b)):
            dest = tmp_path / f"{ns}-{want[:7]}-{len(list(tmp_path.iterdir()))}.git"
            git.run("-c", "protocol.version=2", "clone", "-q", "--bare",
                    f"{srv.url}/{ns}.git", str(dest))
            fsck(git, dest)
            assert git.out("--git-dir", str(dest), "rev-parse", "main").strip() == want
            if ns == "b":
                assert a not in repo_state(git, dest).objects
        assert same(srv.port)["hit"] == 3  # each namespace's clone, the second time
    finally:
        srv.stop()


# -- drain and stall in mid-sendfile ------------------------------------------------------


def test_drain_in_mid_sendfile_finishes_the_pack(git: Git, hits_root: Path, cache_dir: Path,
                                                 tmp_path: Path) -> None:
    """A clone answered from the cache by sendfile, slowed by a proxy, when SIGTERM comes:
    it completes, fsck-clean and equal to file://, and the process exits 0."""
    srv = start_server(hits_root, ["--pack-cache-dir", str(cache_dir), "--drain-timeout", "60"])
    proxy = SlowProxy("127.0.0.1", srv.port, rate=3 << 20, stall=TIMEOUT)  # 9 MiB: ~3 s
    dest = tmp_path / "slow.git"
    try:
        git.run("-c", "protocol.version=2", "clone", "-q", "--mirror", f"{srv.url}/{REPO}",
                str(tmp_path / "warm.git"))
        clone = subprocess.Popen(
            ["git", "-c", "protocol.version=2", "clone", "-q", "--mirror",
             f"http://127.0.0.1:{proxy.port}/{REPO}", str(dest)],
            env=git_env(git.home), stderr=subprocess.PIPE)
        try:
            poll(lambda: proxy.relayed >= 1 << 20, TIMEOUT, "1 MiB of the pack through the proxy")
            assert lookups(srv.port)["hit"] == 1 and same(srv.port)["hit"] == 1
            assert served(srv.port)["python"] == 0
            srv.proc.send_signal(signal.SIGTERM)
            srv.wait_for_line("draining: 1 requests in flight")
            assert clone.poll() is None, "the clone ended before the signal could matter"
            _out, err = clone.communicate(timeout=TIMEOUT)
            assert clone.returncode == 0, err.decode(errors="replace")
            assert srv.proc.wait(timeout=TIMEOUT) == 0
        finally:
            clone.kill()
            clone.wait()
    finally:
        proxy.close()
        srv.stop()
    assert_like_file_clone(git, hits_root, dest, "--mirror")
    assert not [line for line in srv.lines if "Traceback" in line]


def test_a_reader_stalled_in_sendfile_is_cut_by_the_send_watch(
        git: Git, hits_root: Path, cache_dir: Path, tmp_path: Path) -> None:
    """A hit whose client stops reading after the head: the send watch sees no progress
    for --send-timeout and cuts it (its pack slot comes back), and the server goes on
    serving the same entry by sendfile."""
    srv = start_server(hits_root, ["--pack-cache-dir", str(cache_dir), "--send-timeout", "1"])
    body = v2_fetch(f"want {tip(git, hits_root)}", "no-progress")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        assert post_upload_pack(srv.port, body, REPO, version=2, timeout=TIMEOUT).status == 200
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(TIMEOUT)
        sock.connect(("127.0.0.1", srv.port))
        sock.sendall(build_request("POST", f"/{REPO}/git-upload-pack", {
            "Content-Type": UPLOAD_CT, "Git-Protocol": "version=2"}, body))
        assert read_head(sock).startswith(b"HTTP/1.1 200")  # then never read again
        poll(lambda: metric(srv.port, 'gitspout_connection_timeouts_total{kind="send"}', 0) == 1,
             TIMEOUT, "the stalled reader to be cut")
        poll(lambda: server_side(srv.port, sock) is None
             or server_side(srv.port, sock).state != "ESTABLISHED",  # type: ignore[union-attr]
             TIMEOUT, "the server's end of the stalled connection to close")
        assert same(srv.port)["hit"] == 1 and served(srv.port)["python"] == 0
        assert metric(srv.port, "gitspout_admission_in_progress") == 0
        dest = tmp_path / "after.git"
        git.run("-c", "protocol.version=2", "clone", "-q", "--mirror", f"{srv.url}/{REPO}",
                str(dest))
        assert_like_file_clone(git, hits_root, dest, "--mirror")
    finally:
        sock.close()
        srv.stop()
    assert not [line for line in srv.lines if "Traceback" in line]


def test_damaged_packet_length_is_a_storage_error(tmp_path: Path) -> None:
    """A cache file whose packet length is not hex is damaged (OSError: the reader's
    storage path), not an internal error (ValueError)."""
    import os

    from gitspout.server.app.cacheread import pack_bytes_before

    path = tmp_path / "damaged"
    path.write_bytes(b"0009abcd\nzzzzabc")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert pack_bytes_before(fd, 9) == 4
        with pytest.raises(OSError, match="damaged"):
            pack_bytes_before(fd, 16)
    finally:
        os.close(fd)
