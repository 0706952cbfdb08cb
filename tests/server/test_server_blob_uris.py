"""Large blobs as packfile URIs to one-blob packs gitspout writes (``--blob-uri-threshold``;
server/app/blobpacks.py, server/core/bigblobs.py), with real clients on 127.0.0.1:

* C git 2.39 with ``fetch.uriprotocols=http`` clones: the blobs over the threshold come
  as packfile URIs from gitspout's route, the rest in the pack; fsck-clean, the same refs
  and objects as a ``file://`` clone; the metrics count it;
* the ``packfile-uris`` section as C git frames it (``<pack-hash> <uri>`` lines before the
  ``packfile`` section), each pack's hash its trailer;
* a blob only a hidden ref reaches is never listed, and the route answers 404 for it even
  once its pack was written; bad names, other methods and namespaces get 4xx;
* ``Range`` resumes a download.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import random
import re
import subprocess
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import Committer, Git, LiveServer, damage_blob, fsck, git_env, poll, repo_state, start_server
from offloadkit import c_upload_pack, pack_count, sections
from rawhttp import DELIM, FLUSH, get_info_refs, metric, parse_pkts, pkt_lines, post_upload_pack, request

BIG = 150_000  # bytes of each large blob (random: stored whole, not compressed much)
THRESHOLD = "100000"
URI = re.compile(r"([0-9a-f]{40}) (https?://[^ ]+/gitspout-blobpack/([0-9a-f]{40})-([0-9a-f]{40})\.pack)")


@pytest.fixture(scope="module")
def bu_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> dict[str, object]:
    """``repo.git``: two large blobs on main, one on a tag only, small files; ``secret``:
    a large blob only ``refs/hidden/s`` reaches (hidden by transfer.hideRefs)."""
    root = tmp_path_factory.mktemp("buroot")
    work = tmp_path_factory.mktemp("buwork") / "w"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    rnd = random.Random(29)
    c.commit({"a.bin": rnd.randbytes(BIG), "small.txt": "small\n"}, "a")
    c.commit({"b.bin": rnd.randbytes(BIG), "small.txt": "smaller\n"}, "b")
    a2 = bytearray((work / "a.bin").read_bytes())
    a2[1000:1010] = b"x" * 10
    c.commit({"a.bin": bytes(a2)}, "a2: one version of the two is stored as a delta")
    git.run("checkout", "-q", "-b", "side", cwd=work)
    c.commit({"t.bin": rnd.randbytes(BIG)}, "tagged")
    git.run("tag", "-a", "-m", "v", "v1", cwd=work)
    c.commit({"s.bin": rnd.randbytes(BIG)}, "secret")
    git.run("update-ref", "refs/hidden/s", "HEAD", cwd=work)
    git.run("checkout", "-q", "main", cwd=work)
    git.run("branch", "-D", "side", cwd=work)
    repo = root / "repo.git"
    git.run("clone", "-q", "--bare", "--mirror", str(work), str(repo))
    git.run("repack", "-q", "-adb", cwd=repo)
    git.run("config", "transfer.hideRefs", "refs/hidden", cwd=repo)
    secret = git.out("rev-parse", "refs/hidden/s:s.bin", cwd=repo).strip()
    large = {git.out("rev-parse", f"{rev}:{path}", cwd=repo).strip()
             for rev, path in (("main", "a.bin"), ("main~1", "a.bin"), ("main", "b.bin"),
                               ("v1", "t.bin"))}
    # Of the two versions of a.bin, one is a delta in the pack: it stays in the fetch's.
    check = git.out("cat-file", "--batch-check=%(objectname) %(deltabase)", cwd=repo,
                    input="\n".join(sorted(large)).encode())
    whole = {line.split()[0] for line in check.splitlines() if set(line.split()[1]) == {"0"}}
    assert len(whole) == 3
    return {"root": root, "repo": repo, "secret": secret, "large": whole}


@pytest.fixture(scope="module")
def bu_server(bu_root: dict[str, object],
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    srv = start_server(bu_root["root"], extra_args=[  # type: ignore[arg-type]
        "--blob-uri-threshold", THRESHOLD, "--bundle-dir", str(tmp_path_factory.mktemp("bp")),
        "--namespaces", "ns.git=repo.git#ns"])
    yield srv
    srv.stop()


def _fetch_body(wants: list[str], protocols: str = "http") -> bytes:
    args = [*(f"want {w}" for w in wants), f"packfile-uris {protocols}", "ofs-delta",
            "sideband-all", "no-progress", "done"]
    return pkt_lines("command=fetch", "object-format=sha1") + DELIM + pkt_lines(*args) + FLUSH


def _uris(srv: LiveServer, wants: list[str], repo: str = "repo.git",
          headers: dict[str, str] | None = None, protocols: str = "http",
          ) -> tuple[list[re.Match[str]], bytes]:
    resp = post_upload_pack(srv.port, _fetch_body(wants, protocols), repo, version=2,
                            headers=headers)
    assert resp.status == 200
    head, pack = sections(parse_pkts(resp.body))
    if head[0] != b"packfile-uris\n":
        assert head == [b"packfile\n"]
        return [], pack
    end = head.index(None)
    assert head[end + 1:] == [b"packfile\n"]
    found = [URI.fullmatch(line.decode().rstrip("\n")) for line in head[1:end]]  # type: ignore[union-attr]
    assert all(found), head
    return [m for m in found if m is not None], pack


def _path(srv: LiveServer, m: re.Match[str]) -> str:
    # rawhttp sends "Host: 127.0.0.1": the URI is built on the Host the client sent
    return m.group(2).removeprefix("http://127.0.0.1")


def _objects(git: Git, gitdir: Path) -> set[str]:
    return set(git.out("cat-file", "--batch-all-objects", "--batch-check=%(objectname)",
                       cwd=gitdir).split())


def test_clone_takes_large_blobs_by_uri(git: Git, tmp_path: Path, bu_root: dict[str, object],
                                        bu_server: LiveServer) -> None:
    repo = bu_root["repo"]
    assert isinstance(repo, Path)
    assert b"packfile-uris" in get_info_refs(bu_server.port, "repo.git", 2).body
    before = {n: metric(bu_server.port, n, 0) for n in (
        "gitspout_packfile_uris_total", 'gitspout_blob_pack_requests_total{result="served"}',
        "gitspout_packfile_uri_served_bytes_total")}
    dest = tmp_path / "c"
    proc = subprocess.run(["git", "-c", "protocol.version=2", "-c", "fetch.uriprotocols=http",
                           "clone", "-q", "--bare", f"{bu_server.url}/repo.git", str(dest)],
                          env=git_env(git.home, {"GIT_TRACE_PACKET": "1", "GIT_TRACE_REDACT": "0"}),
                          capture_output=True, timeout=120, check=True)
    fsck(git, dest)
    ref = tmp_path / "ref"
    git.run("clone", "-q", "--bare", "--no-local", f"file://{repo}", str(ref))
    assert repo_state(git, dest) == repo_state(git, ref)
    assert _objects(git, dest) == _objects(git, ref)
    assert str(bu_root["secret"]) not in _objects(git, dest)
    # One pack from the fetch, one per large blob from gitspout's route.
    listed = re.findall(r"clone< (?:\\1)?([0-9a-f]{40}) (http://\S+)", proc.stderr.decode())
    blobs = {re.search(r"gitspout-blobpack/([0-9a-f]{40})-", u).group(1)  # type: ignore[union-attr]
             for _, u in listed}
    assert blobs == bu_root["large"]
    assert len(list((dest / "objects" / "pack").glob("*.pack"))) == 1 + len(blobs)
    assert metric(bu_server.port, "gitspout_packfile_uris_total") == \
        before["gitspout_packfile_uris_total"] + 3
    assert metric(bu_server.port, 'gitspout_blob_pack_requests_total{result="served"}') == \
        before['gitspout_blob_pack_requests_total{result="served"}'] + 3
    assert metric(bu_server.port, "gitspout_packfile_uri_served_bytes_total") > \
        before["gitspout_packfile_uri_served_bytes_total"] + 3 * BIG
    assert metric(bu_server.port, "gitspout_blob_packs_written_total") >= 3


def test_section_and_packs(git: Git, tmp_path: Path, bu_root: dict[str, object],
                           bu_server: LiveServer) -> None:
    """The section before the pack names each pack by its trailer; each pack holds its
    blob alone, as git index-pack reads it; the pack sent lacks exactly those blobs."""
    repo = bu_root["repo"]
    assert isinstance(repo, Path)
    main = git.out("rev-parse", "main", cwd=repo).strip()
    found, pack = _uris(bu_server, [main])
    assert len(found) == 2
    plain = post_upload_pack(bu_server.port, _fetch_body([main], "https"), "repo.git", version=2)
    p_head, p_pack = sections(parse_pkts(plain.body))
    assert p_head == [b"packfile\n"] and pack_count(pack) == pack_count(p_pack) - 2
    # C git's answer when its config names the same packs (uploadpack.blobPackfileUri;
    # C git honours it for loose objects only): the same section, the same pack count.
    loose = tmp_path / "loose.git"
    git.run("init", "-q", "--bare", str(loose))
    packs = list((repo / "objects" / "pack").glob("*.pack"))
    for p in packs:
        git.run("unpack-objects", "-q", cwd=loose, input=p.read_bytes())
    git.run("fetch", "-q", str(repo), "main:refs/heads/main", cwd=loose)
    git.run("config", "uploadpack.allowsidebandall", "true", cwd=loose)
    for m in found:
        git.run("config", "--add", "uploadpack.blobpackfileuri",
                f"{m.group(3)} {m.group(1)} {m.group(2)}", cwd=loose)
    c_head, c_pack = sections(parse_pkts(c_upload_pack(git, loose, _fetch_body([main]))))
    ours = post_upload_pack(bu_server.port, _fetch_body([main]), "repo.git", version=2)
    head, _ = sections(parse_pkts(ours.body))
    assert c_head[0] == head[0] == b"packfile-uris\n"
    assert sorted(c_head[1:3]) == sorted(head[1:3])  # type: ignore[type-var]
    assert c_head[3:] == head[3:] == [None, b"packfile\n"]
    assert pack_count(c_pack) == pack_count(pack)
    for m in found:
        data = request(bu_server.port, "GET", _path(bu_server, m)).body
        assert data[-20:].hex() == m.group(1) == m.group(4)
        assert hashlib.sha1(data[:-20]).hexdigest() == m.group(1)
        assert pack_count(data) == 1
        file = tmp_path / f"{m.group(3)}.pack"
        file.write_bytes(data)
        assert git.out("index-pack", "--strict", str(file), cwd=tmp_path).split()[-1] == m.group(1)
        assert git.out("cat-file", "-s", m.group(3), cwd=repo).strip() == str(BIG)


def test_hidden_blob_never_listed_nor_served(git: Git, bu_root: dict[str, object],
                                             bu_server: LiveServer) -> None:
    repo = bu_root["repo"]
    assert isinstance(repo, Path)
    secret = str(bu_root["secret"])
    tips = git.out("for-each-ref", "--format=%(objectname)", cwd=repo).split()
    visible = [t for t in tips if t != git.out("rev-parse", "refs/hidden/s", cwd=repo).strip()]
    found, _ = _uris(bu_server, visible)
    assert secret not in {m.group(3) for m in found}
    # Shown for a moment, its pack is written and served; hidden again, never served.
    git.run("config", "--unset", "transfer.hideRefs", cwd=repo)
    try:
        found, _ = _uris(bu_server, [git.out("rev-parse", "refs/hidden/s", cwd=repo).strip()])
    finally:
        git.run("config", "transfer.hideRefs", "refs/hidden", cwd=repo)
    (m,) = [m for m in found if m.group(3) == secret]
    path = _path(bu_server, m)
    git.run("config", "--unset", "transfer.hideRefs", cwd=repo)
    try:
        assert request(bu_server.port, "GET", path).status == 200
    finally:
        git.run("config", "transfer.hideRefs", "refs/hidden", cwd=repo)
    missing = metric(bu_server.port, 'gitspout_blob_pack_requests_total{result="missing"}', 0)
    assert request(bu_server.port, "GET", path).status == 404
    assert request(bu_server.port, "HEAD", path).status == 404
    assert metric(bu_server.port, 'gitspout_blob_pack_requests_total{result="missing"}') == \
        missing + 2
    # Under a namespace nothing is offloaded nor served (the URI would name the repository).
    assert b"packfile-uris" not in get_info_refs(bu_server.port, "ns.git", 2).body
    assert request(bu_server.port, "GET", path.replace("/repo.git/", "/ns.git/")).status == 404


def test_bad_route_input(git: Git, bu_root: dict[str, object], bu_server: LiveServer) -> None:
    repo = bu_root["repo"]
    assert isinstance(repo, Path)
    found, _ = _uris(bu_server, [git.out("rev-parse", "main", cwd=repo).strip()])
    good = _path(bu_server, found[0])
    name = good.rsplit("/", 1)[1]
    base = "/repo.git/gitspout-blobpack/"
    for path in (base + "x", base + name.upper(), base + name[:-5], base + name + "x",
                 base + "../" + name, base + "..%2f" + name, base,
                 base + "0" * 40 + "-" + "0" * 40 + ".pack",
                 "/nothere.git/gitspout-blobpack/" + name,
                 base + name.replace(name[:40], str(bu_root["secret"]))):
        status = request(bu_server.port, "GET", path).status
        assert 400 <= status < 500, (path, status)
    assert request(bu_server.port, "POST", good).status == 405
    assert request(bu_server.port, "GET", good).status == 200


def test_range_resumes(git: Git, tmp_path: Path, bu_root: dict[str, object],
                       bu_server: LiveServer) -> None:
    repo = bu_root["repo"]
    assert isinstance(repo, Path)
    found, _ = _uris(bu_server, [git.out("rev-parse", "main", cwd=repo).strip()])
    uri = f"{bu_server.url}{_path(bu_server, found[0])}"
    whole, part = tmp_path / "whole", tmp_path / "part"
    subprocess.run(["curl", "-sf", "-o", str(whole), uri], check=True, timeout=60)
    subprocess.run(["curl", "-sf", "-r", "0-999", "-o", str(part), uri], check=True, timeout=60)
    assert part.stat().st_size == 1000
    out = subprocess.run(["curl", "-sf", "-C", "-", "-o", str(part), "-w", "%{http_code}", uri],
                         check=True, timeout=60, capture_output=True).stdout
    assert out == b"206" and part.read_bytes() == whole.read_bytes()
    size = whole.stat().st_size
    resp = request(bu_server.port, "GET", _path(bu_server, found[0]), {"Range": f"bytes={size}-"})
    assert resp.status == 416


def test_off_by_default(git: Git, bu_root: dict[str, object]) -> None:
    """Without --blob-uri-threshold: no packfile-uris, the whole pack, no route."""
    srv = start_server(bu_root["root"])  # type: ignore[arg-type]
    try:
        assert b"packfile-uris" not in get_info_refs(srv.port, "repo.git", 2).body
        name = "0" * 40 + "-" + "0" * 40 + ".pack"
        assert request(srv.port, "GET", f"/repo.git/gitspout-blobpack/{name}").status == 404
    finally:
        srv.stop()


def test_route_honours_service_switches(git: Git, bu_root: dict[str, object],
                                        bu_server: LiveServer) -> None:
    """The blob-pack route answers to the same switches as the fetch that named it:
    http.uploadpack=false refuses it (403, as info/refs), as git-http-backend would."""
    repo = bu_root["repo"]
    assert isinstance(repo, Path)
    found, _ = _uris(bu_server, [git.out("rev-parse", "main", cwd=repo).strip()])
    path = _path(bu_server, found[0])
    assert request(bu_server.port, "GET", path).status == 200
    git.run("config", "http.uploadpack", "false", cwd=repo)
    try:
        assert get_info_refs(bu_server.port, "repo.git", 2).status == 403
        assert request(bu_server.port, "GET", path).status == 403
        assert request(bu_server.port, "HEAD", path).status == 403
    finally:
        git.run("config", "--unset", "http.uploadpack", cwd=repo)
    assert request(bu_server.port, "GET", path).status == 200


def test_fetch_never_waits_for_another_blob_pack(git: Git, tmp_path: Path,
                                                 bu_root: dict[str, object]) -> None:
    """While a blob pack is being written (its lock held: here by the test, as by another
    worker's long copy), a fetch does not wait for it: a large blob not kept yet goes in
    its own pack, listed by no URI, and the clone is whole; once the writer is done, it is
    offloaded too."""
    repo = bu_root["repo"]
    assert isinstance(repo, Path)
    bpdir = tmp_path / "bp"
    srv = start_server(bu_root["root"], extra_args=[  # type: ignore[arg-type]
        "--blob-uri-threshold", THRESHOLD, "--bundle-dir", str(bpdir)])
    try:
        main = git.out("rev-parse", "main", cwd=repo).strip()
        tagged = git.out("rev-parse", "v1^{}", cwd=repo).strip()
        # main's blobs are kept now (and the lock, made by the first write, is there).
        on_main = {m.group(3) for m in _uris(srv, [main])[0]}
        assert on_main and on_main < bu_root["large"]  # type: ignore[operator]
        (lock,) = bpdir.rglob("write.lock")
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # Before the change this waited for the lock: the request timed out.
            assert {m.group(3) for m in _uris(srv, [tagged])[0]} == on_main
            dest = tmp_path / "held"
            subprocess.run(["git", "-c", "protocol.version=2", "-c", "fetch.uriprotocols=http",
                            "clone", "-q", "--bare", f"{srv.url}/repo.git", str(dest)],
                           env=git_env(git.home), capture_output=True, timeout=120, check=True)
            fsck(git, dest)
            assert len(list((dest / "objects" / "pack").glob("*.pack"))) == 1 + len(on_main)
        finally:
            os.close(fd)
        assert {m.group(3) for m in _uris(srv, [tagged])[0]} == bu_root["large"]
    finally:
        srv.stop()


def test_a_damaged_blob_is_never_kept_for_other_repositories(
        git: Git, tmp_path: Path, bu_root: dict[str, object]) -> None:
    """A blob pack is keyed by the blob's id and shared by every repository holding the
    blob: one copied from a damaged pack outlived the damaged repository's repair, and
    failed every packfile-URI clone of a healthy repository holding the same blob, until a
    restart. The data copied is now inflated and hashed: the damaged repository's clone
    fails (as over file://), the healthy one's is whole, before and after the repair."""
    repo = bu_root["repo"]
    assert isinstance(repo, Path)
    root = tmp_path / "root"
    root.mkdir()
    healthy = root / "healthy.git"
    damaged = root / "damaged.git"
    for dest in (healthy, damaged):
        git.run("clone", "-q", "--bare", "--mirror", "--no-local", f"file://{repo}", str(dest))
        git.run("repack", "-q", "-adb", cwd=dest)
    damage_blob(git, damaged, "main:b.bin", 5000)
    srv = start_server(root, extra_args=[
        "--blob-uri-threshold", THRESHOLD, "--bundle-dir", str(tmp_path / "bp")])

    def clone(name: str, dest: Path) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["git", "-c", "protocol.version=2", "-c", "fetch.uriprotocols=http",
                               "clone", "-q", "--bare", f"{srv.url}/{name}", str(dest)],
                              env=git_env(git.home), capture_output=True, timeout=120)

    try:
        assert clone("damaged.git", tmp_path / "d1").returncode != 0
        assert git.run("clone", "-q", "--bare", "--no-local", f"file://{damaged}",
                       str(tmp_path / "f1"), check=False).returncode != 0
        for n in (1, 2):
            ok = clone("healthy.git", tmp_path / f"h{n}")
            assert ok.returncode == 0, ok.stderr.decode(errors="replace")
            fsck(git, tmp_path / f"h{n}")
        # The damaged repository repaired from the healthy one: its clones are whole too.
        for f in (damaged / "objects" / "pack").iterdir():
            f.unlink()
        for f in (healthy / "objects" / "pack").iterdir():
            (damaged / "objects" / "pack" / f.name).write_bytes(f.read_bytes())
        ok = clone("damaged.git", tmp_path / "d2")
        assert ok.returncode == 0, ok.stderr.decode(errors="replace")
        fsck(git, tmp_path / "d2")
    finally:
        srv.stop()


@pytest.mark.parametrize("name", ["sp ace.git", "pct%41.git", "hash#q?.git"])
def test_names_needing_percent_encoding(git: Git, tmp_path: Path, bu_root: dict[str, object],
                                        name: str) -> None:
    """A repository whose name holds a space, '%', '#' or '?': its blob-pack URLs are
    percent-encoded. They were not, and every packfile-URI clone failed (``pct%41.git``'s
    pointed at ``pctA.git``)."""
    repo = bu_root["repo"]
    assert isinstance(repo, Path)
    root = tmp_path / "root"
    root.mkdir()
    git.run("clone", "-q", "--bare", "--mirror", "--no-local", f"file://{repo}", str(root / name))
    srv = start_server(root, extra_args=[
        "--blob-uri-threshold", THRESHOLD, "--bundle-dir", str(tmp_path / "bp")])
    try:
        quoted = urllib.parse.quote(name)
        dest = tmp_path / "c"
        proc = subprocess.run(["git", "-c", "protocol.version=2", "-c", "fetch.uriprotocols=http",
                               "clone", "-q", "--bare", f"{srv.url}/{quoted}", str(dest)],
                              env=git_env(git.home), capture_output=True, timeout=120)
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")
        fsck(git, dest)
        assert len(list((dest / "objects" / "pack").glob("*.pack"))) > 1, "no blob by URI"
        assert metric(srv.port, 'gitspout_blob_pack_requests_total{result="served"}', 0) > 0
    finally:
        srv.stop()


def test_urls_behind_a_trusted_tls_proxy(git: Git, tmp_path: Path,
                                         bu_root: dict[str, object]) -> None:
    """Behind a proxy that terminates TLS, the URLs handed out take the scheme and host of
    its ``X-Forwarded-Proto`` and ``X-Forwarded-Host`` when it is trusted
    (``--trusted-proxies``), and only then. They were ``http://`` to its TLS port: an
    ``https``-only client was offered nothing, a mixed one failed."""
    repo = bu_root["repo"]
    assert isinstance(repo, Path)
    main = git.out("rev-parse", "main", cwd=repo).strip()
    proxied = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "git.example.org:8443"}
    for trusted in (True, False):
        srv = start_server(bu_root["root"], extra_args=[  # type: ignore[arg-type]
            "--blob-uri-threshold", THRESHOLD, "--bundle-dir", str(tmp_path / f"bp{trusted}"),
            *(["--trusted-proxies", "127.0.0.1"] if trusted else [])])
        try:
            https, _ = _uris(srv, [main], headers=proxied, protocols="https")
            mixed, _ = _uris(srv, [main], headers=proxied, protocols="http,https")
            if trusted:
                assert https and all(m.group(2).startswith("https://git.example.org:8443/")
                                     for m in https + mixed)
            else:
                assert https == []
                assert mixed and all(m.group(2).startswith("http://127.0.0.1/") for m in mixed)
            junk, _ = _uris(srv, [main], headers={"X-Forwarded-Proto": "gopher",
                                                   "X-Forwarded-Host": "a b/c"})
            assert junk and all(m.group(2).startswith("http://127.0.0.1/") for m in junk)
        finally:
            srv.stop()


@pytest.fixture
def replicas(git: Git, tmp_path: Path, bu_root: dict[str, object]
             ) -> Iterator[tuple[LiveServer, LiveServer, list[re.Match[str]]]]:
    """Two servers of the same root, each with its own blob-pack directory (bp0, bp1),
    and the URIs the first listed for a fetch of main."""
    repo = bu_root["repo"]
    assert isinstance(repo, Path)
    main = git.out("rev-parse", "main", cwd=repo).strip()
    servers = [start_server(bu_root["root"], extra_args=[  # type: ignore[arg-type]
        "--blob-uri-threshold", THRESHOLD, "--bundle-dir", str(tmp_path / f"bp{n}")])
        for n in range(2)]
    try:
        found, _ = _uris(servers[0], [main])
        assert found
        yield servers[0], servers[1], found
    finally:
        for srv in servers:
            srv.stop()


def test_any_replica_serves_a_listed_pack(
        tmp_path: Path, bu_root: dict[str, object],
        replicas: tuple[LiveServer, LiveServer, list[re.Match[str]]]) -> None:
    """A fleet without affinity for the blob-pack URLs (round robin, or a replica
    restarted): the replica asked for a pack another one listed writes it from the
    repository and serves it, the same bytes. It answered 404, and the clone failed. A
    name with another checksum, or a blob only a hidden ref reaches, still gets 404."""
    lister, other, found = replicas
    for m in found:
        path = _path(lister, m)
        mine = request(lister.port, "GET", path)
        theirs = request(other.port, "GET", path)
        assert mine.status == theirs.status == 200
        assert theirs.body == mine.body
        assert hashlib.sha1(theirs.body[:-20]).hexdigest() == m.group(1) == m.group(4)
    m = found[0]
    wrong = _path(lister, m).replace(m.group(4), "0" * 40)
    assert request(other.port, "GET", wrong).status == 404
    secret = bu_root["secret"]
    assert isinstance(secret, str)
    assert request(other.port, "GET", f"/repo.git/gitspout-blobpack/{secret}-{'1' * 40}.pack"
                   ).status == 404
    assert list((tmp_path / "bp1").rglob(f"{secret}*")) == []


def test_a_download_of_a_pack_not_held_waits_for_another_write(
        tmp_path: Path, replicas: tuple[LiveServer, LiveServer, list[re.Match[str]]]) -> None:
    """The replica asked for a pack it does not hold writes it; while another blob pack is
    being written there (its lock held: here by the test) it waits for that write, where
    a fetch deciding would not: a 404 fails the client's whole clone."""
    import threading

    lister, other, found = replicas
    # The other replica's blob-pack directory (made at its start): its writers' lock.
    (blobdir,) = [d for d in (tmp_path / "bp1" / "gitspout-blobpacks").iterdir()
                  if d.is_dir()]
    fd = os.open(blobdir / "write.lock", os.O_RDWR | os.O_CREAT, 0o600)
    got: list[int] = []
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        t = threading.Thread(target=lambda: got.append(
            request(other.port, "GET", _path(lister, found[0]), timeout=60).status))
        t.start()
        poll(lambda: metric(other.port, "gitspout_requests_in_flight") == 1, 20,
             "the download waiting")
        assert not got
    finally:
        os.close(fd)  # the other write is over
    t.join(60)
    assert got == [200]


def test_checking_a_blob_takes_bounded_memory() -> None:
    """A blob of zeros compresses a thousandfold: its check inflated each 1 MiB piece of
    stored data whole (1 GiB); it inflates in bounded pieces."""
    import tracemalloc
    import zlib
    from types import SimpleNamespace

    from gitspout.server.app.blobpacks import _BlobCheck

    size = 256 << 20
    zeros = bytes(1 << 20)
    comp = zlib.compressobj(6)
    stored = b"".join(comp.compress(zeros) for _ in range(size >> 20)) + comp.flush()
    digest = hashlib.sha1(b"blob %d\0" % size)
    for _ in range(size >> 20):
        digest.update(zeros)
    del zeros
    check = _BlobCheck(SimpleNamespace(oid=digest.digest(), size=size))  # type: ignore[arg-type]
    tracemalloc.start()
    try:
        check.feed(stored)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert check.fault() is None
    assert peak < 16 << 20, peak
