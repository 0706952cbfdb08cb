"""The pack cache (server/app/packcache.py, docs/ARCHITECTURE.md "Pack cache"): identical
fetches share one generation, each reader at its own pace; a failing producer fails every
reader in-band and is not kept; the byte cap holds; a push or a repack is a new key.

Real clients throughout: ``git clone`` against a live server, raw sockets for the readers
that stall or hang up, a truncated loose object for the producer that fails midway.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import Git, LiveServer, copy_repo, fsck, start_server
from rawhttp import (
    UPLOAD_CT,
    abort,
    build_request,
    parse_pkts,
    parse_response,
    read_until_close,
    v2_command,
)

STORM = "storm.git"
BLOB_BYTES = 3 << 20  # x4 blobs: a 12 MiB pack, more than a stalled socket takes in


def _blob_commits(git: Git, repo: Path, sizes: list[int], seed: int, branch: str = "main",
                  parent: str | None = None) -> str:
    """Commits on ``branch``, each adding one incompressible blob (plumbing: fast)."""
    rng = random.Random(seed)
    gd = ["--git-dir", str(repo)]
    when = 1_600_000_000 + seed
    entries: list[str] = []
    if parent is not None:
        entries = git.out(*gd, "ls-tree", parent).splitlines()
    for i, size in enumerate(sizes):
        blob = git.out(*gd, "hash-object", "-w", "--stdin", input=rng.randbytes(size)).strip()
        entries.append(f"100644 blob {blob}\t{branch}-{seed}-{i}.bin")
        tree = git.out(*gd, "mktree", input="\n".join(entries).encode() + b"\n").strip()
        when += 60
        env = {"GIT_AUTHOR_DATE": f"{when} +0000", "GIT_COMMITTER_DATE": f"{when} +0000"}
        args = ["-p", parent] if parent else []
        parent = git.out(*gd, "commit-tree", tree, *args, "-m", f"c{i}", env=env).strip()
    assert parent is not None
    git.run(*gd, "update-ref", f"refs/heads/{branch}", parent)
    return parent


def _bare(git: Git, path: Path) -> Path:
    git.run("init", "-q", "--bare", "-b", "main", str(path))
    return path


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    """storm.git: 4 commits of 3 MiB incompressible blobs, one pack without a bitmap: a
    clone's pack is made of the stored entries and goes through the cache file (a whole
    pack on disk over 4 MiB would be sent from the pack: test_large_whole_pack_is_not_copied)."""
    root = tmp_path_factory.mktemp("packcache")
    repo = _bare(git, root / STORM)
    _blob_commits(git, repo, [BLOB_BYTES] * 4, seed=1)
    git.run("--git-dir", str(repo), "repack", "-adq", "--no-write-bitmap-index")
    return root


@pytest.fixture
def storm_server(cache_root: Path, cache_dir: Path) -> Iterator[LiveServer]:
    srv = start_server(cache_root, ["--pack-cache-dir", str(cache_dir)])
    yield srv
    srv.stop()


def metrics(srv: LiveServer) -> dict[str, float]:
    """``gitspout_pack_cache_*`` samples, by name and labels as written."""
    with urllib.request.urlopen(f"{srv.url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("gitspout_pack_cache_"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def lookups(srv: LiveServer) -> dict[str, int]:
    m = metrics(srv)
    return {r: int(m.get(f'gitspout_pack_cache_lookups_total{{result="{r}"}}', 0))
            for r in ("hit", "miss", "joined", "bypass")}


def clone_procs(git: Git, url: str, dests: list[Path], *extra: str) -> list[subprocess.Popen[bytes]]:
    from gitutil import git_env

    procs = []
    for i, dest in enumerate(dests):
        quiet = ["--quiet"] if i % 2 else []  # progress or not: the same entry
        procs.append(subprocess.Popen(
            ["git", "-c", "protocol.version=2", "clone", "--mirror", *quiet, *extra, url,
             str(dest)], env=git_env(git.home), stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE))
    return procs


def wait_all(procs: list[subprocess.Popen[bytes]], timeout: float = 90) -> list[tuple[int, str]]:
    out = []
    for p in procs:
        _, err = p.communicate(timeout=timeout)
        out.append((p.returncode, err.decode(errors="replace")))
    return out


def framed(size: int) -> int:
    """A cache file's size for a pack of ``size`` bytes: side-band-64k packets of 65515
    bytes each, the last one shorter (server/app/packcache.py ``_Framer``)."""
    return size + 5 * -(-size // 65515)


def pack_of(clone: Path) -> bytes:
    (pack,) = (clone / "objects" / "pack").glob("pack-*.pack")
    return pack.read_bytes()


def fetch_body(git: Git, repo: Path) -> bytes:
    """The v2 fetch a mirror clone of ``repo`` sends (every ref tip, no haves)."""
    tips = sorted(set(git.out("--git-dir", str(repo), "for-each-ref",
                              "--format=%(objectname)").split()))
    args = ("thin-pack", "ofs-delta", *(f"want {t}" for t in tips), "done")
    return v2_command("fetch", args=args)


def open_fetch(port: int, repo: str, body: bytes, rcvbuf: int = 4096) -> socket.socket:
    """A raw v2 fetch on a socket with a small receive buffer, nothing read yet."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(15)
    sock.connect(("127.0.0.1", port))
    sock.sendall(build_request("POST", f"/{repo}/git-upload-pack",
                               {"Content-Type": UPLOAD_CT, "Git-Protocol": "version=2"}, body))
    return sock


def pack_from_v2(body: bytes) -> bytes:
    """The pack data (band 1 after ``packfile``) of a v2 fetch response."""
    pkts = parse_pkts(body)
    start = pkts.index(b"packfile\n") + 1
    data = [p[1:] for p in pkts[start:] if p is not None and p[:1] == b"\x01"]
    errors = [p[1:] for p in pkts[start:] if p is not None and p[:1] == b"\x03"]
    assert not errors, errors
    return b"".join(data)


def test_identical_clones_share_one_generation(git: Git, cache_root: Path, cache_dir: Path,
                                               storm_server: LiveServer, tmp_path: Path) -> None:
    n = 6
    dests = [tmp_path / f"c{i}.git" for i in range(n)]
    results = wait_all(clone_procs(git, f"{storm_server.url}/{STORM}", dests))
    assert all(rc == 0 for rc, _ in results), results
    packs = {hashlib.sha256(pack_of(d)).hexdigest() for d in dests}
    assert len(packs) == 1, "every clone got the same pack, byte for byte"
    for d in dests:
        fsck(git, d)
    seen = lookups(storm_server)
    assert seen["miss"] == 1 and seen["hit"] + seen["joined"] == n - 1, seen
    m = metrics(storm_server)
    size = len(pack_of(dests[0]))
    assert m["gitspout_pack_cache_generated_bytes_total"] == framed(size)  # one generation
    assert m['gitspout_pack_cache_served_bytes_total{path="sendfile"}'] == n * framed(size)
    assert m['gitspout_pack_cache_served_bytes_total{path="python"}'] == 0
    # A later identical clone is a hit; the file is in the server's own subdirectory.
    assert wait_all(clone_procs(git, f"{storm_server.url}/{STORM}", [tmp_path / "late.git"]))[0][0] == 0
    assert lookups(storm_server)["hit"] >= 1
    (sub,) = cache_dir.glob("gitspout-packcache-*")
    assert [f.stat().st_size for f in sub.iterdir()] == [framed(size)]


def test_stalled_and_hung_up_readers(git: Git, cache_root: Path, storm_server: LiveServer,
                                     tmp_path: Path) -> None:
    """A reader that reads nothing, and one that hangs up after 64 KiB, while clones of
    the same pack complete; then the stalled one reads the whole pack, intact."""
    body = fetch_body(git, cache_root / STORM)
    stalled = open_fetch(storm_server.port, STORM, body)
    hung = open_fetch(storm_server.port, STORM, body)
    try:
        got = b""
        while len(got) < 65536:
            chunk = hung.recv(65536)
            assert chunk
            got += chunk
        abort(hung)
        dests = [tmp_path / f"c{i}.git" for i in range(3)]
        results = wait_all(clone_procs(git, f"{storm_server.url}/{STORM}", dests), timeout=60)
        assert all(rc == 0 for rc, _ in results), results
        for d in dests:
            fsck(git, d)
        data, closed = read_until_close(stalled, timeout=60)
        assert closed
    finally:
        stalled.close()
    pack = pack_from_v2(parse_response(data).body)
    assert hashlib.sha1(pack[:-20]).digest() == pack[-20:]
    assert pack == pack_of(dests[0])
    seen = lookups(storm_server)
    assert seen["miss"] == 1 and seen["hit"] + seen["joined"] == 4, seen


@pytest.fixture
def fault_root(tmp_path: Path, git: Git) -> tuple[Path, Path]:
    """fault.git: a packed history (no bitmap: a walk) and, on top, one commit whose 1 MiB
    blob is loose: the last entry of the pack it is sent in. Returns root and that loose
    file."""
    root = tmp_path / "root"
    root.mkdir()
    repo = _bare(git, root / "fault.git")
    tip = _blob_commits(git, repo, [1 << 20] * 2, seed=7)
    git.run("--git-dir", str(repo), "-c", "repack.writeBitmaps=false", "repack", "-adq")
    top = _blob_commits(git, repo, [1 << 20], seed=8, parent=tip)
    blob = git.out("--git-dir", str(repo), "rev-parse", f"{top}:main-8-0.bin").strip()
    loose = repo / "objects" / blob[:2] / blob[2:]
    assert loose.exists()
    return root, loose


def test_producer_failure_fails_every_reader_and_is_not_kept(
        git: Git, fault_root: tuple[Path, Path], cache_dir: Path, tmp_path: Path) -> None:
    root, loose = fault_root
    good = loose.read_bytes()
    loose.chmod(0o644)
    loose.write_bytes(good[: len(good) // 2])  # its header inflates; its body ends early
    srv = start_server(root, ["--pack-cache-dir", str(cache_dir)])
    try:
        url = f"{srv.url}/fault.git"
        dests = [tmp_path / f"f{i}.git" for i in range(3)]
        results = wait_all(clone_procs(git, url, dests))
        for rc, err in results:
            assert rc != 0
            assert "cannot read repository /fault.git" in err, err
        # Midway: the pack had started (the packed part precedes the loose blob).
        assert metrics(srv)["gitspout_pack_cache_generated_bytes_total"] > 1 << 20
        body = fetch_body(git, root / "fault.git")
        raw = open_fetch(srv.port, "fault.git", body, rcvbuf=1 << 20)
        data, _ = read_until_close(raw, timeout=30)
        raw.close()
        pkts = [p for p in parse_pkts(parse_response(data).body) if p is not None]
        assert pkts[-1][:1] == b"\x03" and b"cannot read repository" in pkts[-1], pkts[-1][:200]
        m = metrics(srv)
        assert m['gitspout_pack_cache_evictions_total{reason="failed"}'] >= 1
        assert m["gitspout_pack_cache_entries"] == 0
        assert not list(next(cache_dir.glob("gitspout-packcache-*")).iterdir())
        misses = lookups(srv)["miss"]
        loose.write_bytes(good)  # repaired: the next request generates again
        ok = tmp_path / "ok.git"
        assert wait_all(clone_procs(git, url, [ok]))[0][0] == 0
        fsck(git, ok)
        assert lookups(srv)["miss"] == misses + 1
    finally:
        srv.stop()


def test_cap_is_respected(git: Git, tmp_path: Path, cache_dir: Path) -> None:
    """Four branches of 600 KiB each under a 1.5 MB cap: old entries go, least recently
    used first; a pack bigger than the cap is served whole and not kept."""
    root = tmp_path / "root"
    root.mkdir()
    repo = _bare(git, root / "cap.git")
    for b in range(4):
        _blob_commits(git, repo, [600 << 10], seed=20 + b, branch=f"b{b}")
    git.run("--git-dir", str(repo), "repack", "-adq", "--write-bitmap-index")
    cap = 1_500_000
    srv = start_server(root, ["--pack-cache-dir", str(cache_dir), "--pack-cache-size", str(cap)])
    try:
        sub = next(cache_dir.glob("gitspout-packcache-*"))
        for b in range(4):
            dest = tmp_path / f"b{b}.git"
            git.run("clone", "--bare", "-q", "--single-branch", "-b", f"b{b}",
                    f"{srv.url}/cap.git", str(dest))
            fsck(git, dest)
            assert sum(f.stat().st_size for f in sub.iterdir()) <= cap
        m = metrics(srv)
        assert m['gitspout_pack_cache_evictions_total{reason="size"}'] >= 2
        assert m["gitspout_pack_cache_bytes"] <= cap
        whole = tmp_path / "whole.git"  # ~2.4 MB: over the cap
        git.run("clone", "--mirror", "-q", f"{srv.url}/cap.git", str(whole))
        fsck(git, whole)
        assert sum(f.stat().st_size for f in sub.iterdir()) <= cap
        assert metrics(srv)["gitspout_pack_cache_bytes"] <= cap
    finally:
        srv.stop()


def test_push_and_repack_give_new_keys(git: Git, fixture_root: Path, tmp_path: Path,
                                       cache_dir: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    served = copy_repo(fixture_root / "basic.git", root / "basic.git")
    srv = start_server(root, ["--pack-cache-dir", str(cache_dir)])
    try:
        url = f"{srv.url}/basic.git"
        git.run("clone", "--mirror", "-q", url, str(tmp_path / "one.git"))
        work = tmp_path / "work"
        git.run("clone", "-q", str(served), str(work))
        (work / "pushed.txt").write_text("after the first clone\n")
        git.run("add", "pushed.txt", cwd=work)
        git.run("commit", "-qm", "pushed", cwd=work)
        git.run("push", "-q", "origin", "HEAD:main", cwd=work)
        new = git.out("rev-parse", "HEAD", cwd=work).strip()
        two = tmp_path / "two.git"
        git.run("clone", "--mirror", "-q", url, str(two))
        assert git.out("--git-dir", str(two), "rev-parse", "main").strip() == new
        fsck(git, two)
        assert lookups(srv)["miss"] == 2
        git.run("--git-dir", str(served), "repack", "-adq")  # same refs, new pack set
        three = tmp_path / "three.git"
        git.run("clone", "--mirror", "-q", url, str(three))
        fsck(git, three)
        assert lookups(srv) == {"hit": 0, "miss": 3, "joined": 0, "bypass": 0}
    finally:
        srv.stop()


TTL_S = 3


def test_ttl_and_second_occurrence(git: Git, fixture_root: Path, tmp_path: Path,
                                   cache_dir: Path) -> None:
    # The third clone must come within the TTL of the second's entry: TTL_S is 30x the
    # ~0.1 s a clone of basic.git takes, for a busy machine.
    srv = start_server(fixture_root, ["--pack-cache-dir", str(cache_dir), "--pack-cache-ttl",
                                      str(TTL_S), "--pack-cache-on", "second"])
    try:
        url = f"{srv.url}/basic.git"
        for i in range(3):
            git.run("clone", "--mirror", "-q", url, str(tmp_path / f"c{i}.git"))
        assert lookups(srv) == {"hit": 1, "miss": 1, "joined": 0, "bypass": 1}
        # The scenario: the entry grows older than its TTL. Nothing to poll (it expires at
        # the next lookup); a sleep never ends early, so this cannot come too soon.
        time.sleep(TTL_S + 0.2)
        git.run("clone", "--mirror", "-q", url, str(tmp_path / "late.git"))
        assert lookups(srv) == {"hit": 1, "miss": 2, "joined": 0, "bypass": 1}
        assert metrics(srv)['gitspout_pack_cache_evictions_total{reason="ttl"}'] == 1
    finally:
        srv.stop()


def test_cache_dir_inside_root_is_refused(fixture_root: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gitspout.server.app.cli", "serve", "--root", str(fixture_root),
         "--port", "0", "--pack-cache-dir", str(fixture_root / "cache")],
        capture_output=True, timeout=30, text=True)
    assert proc.returncode != 0
    assert re.search("pack_cache_dir must not be inside the served root", proc.stderr + proc.stdout)


def test_settings_as_flag_env_and_toml(tmp_path: Path) -> None:
    from gitspout.server.app.config import ConfigError, load_config

    root = tmp_path / "root"
    root.mkdir()
    cfg = load_config({"root": str(root), "pack_cache_size": "64MiB", "pack_cache_on": "second"},
                      env={})
    assert (cfg.pack_cache_size, cfg.pack_cache_on) == (64 << 20, "second")
    cfg = load_config({"root": str(root)}, env={"GITSPOUT_PACK_CACHE_TTL": "30",
                                                "GITSPOUT_PACK_CACHE_DIR": str(tmp_path / "c")})
    assert (cfg.pack_cache_ttl, cfg.pack_cache_dir) == (30.0, str(tmp_path / "c"))
    toml = tmp_path / "g.toml"
    toml.write_text('pack-cache-size = "1GiB"\npack_cache_ttl = 5\n')
    cfg = load_config({"root": str(root), "config": str(toml)}, env={})
    assert (cfg.pack_cache_size, cfg.pack_cache_ttl) == (1 << 30, 5.0)
    for bad in ({"pack_cache_on": "third"}, {"pack_cache_size": "-1"},
                {"pack_cache_dir": str(root / "x")}):
        with pytest.raises(ConfigError):
            load_config({"root": str(root), **bad}, env={})


def test_cache_file_removed_behind_its_back(git: Git, fixture_root: Path, tmp_path: Path,
                                            cache_dir: Path) -> None:
    """A temp-dir cleaner removed a finished entry's file: that fetch is served from the
    repository, the entry is forgotten, the next one generates again."""
    srv = start_server(fixture_root, ["--pack-cache-dir", str(cache_dir)])
    try:
        url = f"{srv.url}/basic.git"
        git.run("clone", "--mirror", "-q", url, str(tmp_path / "a.git"))
        for f in next(cache_dir.glob("gitspout-packcache-*")).iterdir():
            f.unlink()
        git.run("clone", "--mirror", "-q", url, str(tmp_path / "b.git"))
        fsck(git, tmp_path / "b.git")
        git.run("clone", "--mirror", "-q", url, str(tmp_path / "c.git"))
        git.run("clone", "--mirror", "-q", url, str(tmp_path / "d.git"))
        # b found the entry but not its file: counted as served without the cache
        assert lookups(srv) == {"hit": 1, "miss": 2, "joined": 0, "bypass": 1}
        assert metrics(srv)['gitspout_pack_cache_evictions_total{reason="failed"}'] == 1
    finally:
        srv.stop()


def test_new_tag_is_a_new_key_for_include_tag(git: Git, fixture_root: Path, tmp_path: Path,
                                              cache_dir: Path) -> None:
    """A single-branch clone sends include-tag and wants only main: the visible tags are
    in the key by value (read by prefix, not from every ref), so a new annotated tag on
    main's commit is generated again, and the clone gets the tag."""
    root = tmp_path / "root"
    root.mkdir()
    served = copy_repo(fixture_root / "basic.git", root / "basic.git")
    srv = start_server(root, ["--pack-cache-dir", str(cache_dir)])
    try:
        url = f"{srv.url}/basic.git"
        for name in ("a", "b"):
            git.run("clone", "-q", "--bare", "--single-branch", "-b", "main", url,
                    str(tmp_path / name))
        assert lookups(srv) == {"hit": 1, "miss": 1, "joined": 0, "bypass": 0}
        git.run("--git-dir", str(served), "tag", "-a", "-m", "new", "zz-new-tag", "main")
        c = tmp_path / "c"
        git.run("clone", "-q", "--bare", "--single-branch", "-b", "main", url, str(c))
        assert lookups(srv) == {"hit": 1, "miss": 2, "joined": 0, "bypass": 0}
        want = git.out("--git-dir", str(served), "rev-parse", "zz-new-tag").strip()
        assert git.out("--git-dir", str(c), "rev-parse", "zz-new-tag").strip() == want
        fsck(git, c)
    finally:
        srv.stop()


def test_large_whole_pack_is_not_copied(git: Git, tmp_path: Path, cache_dir: Path) -> None:
    """A clone that gets the pack on disk as it is (every object reachable, bitmapped), a
    pack larger than an eighth of the cap: concurrent clones decide it once (one miss, the
    others hits or joins), each gets the pack file's bytes, and nothing is written to the
    cache directory (a monorepo's clone would fill the cap with a copy of its pack)."""
    root = tmp_path / "root"
    repo = _bare(git, root / "whole.git")
    _blob_commits(git, repo, [BLOB_BYTES] * 2, seed=7)
    git.run("--git-dir", str(repo), "repack", "-adq", "--write-bitmap-index")
    (on_disk,) = (repo / "objects" / "pack").glob("pack-*.pack")
    srv = start_server(root, ["--pack-cache-dir", str(cache_dir), "--pack-cache-size", "16MiB"])
    try:
        dests = [tmp_path / f"w{i}.git" for i in range(4)]
        results = wait_all(clone_procs(git, f"{srv.url}/whole.git", dests))
        assert all(rc == 0 for rc, _ in results), results
        for d in dests:
            fsck(git, d)
            assert pack_of(d) == on_disk.read_bytes()
        seen = lookups(srv)
        assert seen["miss"] == 1 and seen["hit"] + seen["joined"] == 3, seen
        m = metrics(srv)
        assert m["gitspout_pack_cache_generated_bytes_total"] == 0
        assert m["gitspout_pack_cache_bytes"] == 0
        (sub,) = cache_dir.glob("gitspout-packcache-*")
        assert all(f.stat().st_size == 0 for f in sub.iterdir())
    finally:
        srv.stop()


def test_small_whole_pack_is_copied(git: Git, tmp_path: Path, cache_dir: Path) -> None:
    """A whole pack on disk of at most 4 MiB is copied into the cache like a generated one
    (its readers then read a local file on the loop, no pool round trips): the first clone
    writes it, the second is a hit, both get the pack file's bytes."""
    root = tmp_path / "root"
    repo = _bare(git, root / "small.git")
    _blob_commits(git, repo, [1 << 20], seed=11)
    git.run("--git-dir", str(repo), "repack", "-adq", "--write-bitmap-index")
    (on_disk,) = (repo / "objects" / "pack").glob("pack-*.pack")
    srv = start_server(root, ["--pack-cache-dir", str(cache_dir)])
    try:
        for i in range(2):
            dest = tmp_path / f"s{i}.git"
            assert wait_all(clone_procs(git, f"{srv.url}/small.git", [dest]))[0][0] == 0
            fsck(git, dest)
            assert pack_of(dest) == on_disk.read_bytes()
        assert lookups(srv) == {"hit": 1, "miss": 1, "joined": 0, "bypass": 0}
        m = metrics(srv)
        size = framed(on_disk.stat().st_size)
        assert m["gitspout_pack_cache_generated_bytes_total"] == size
        (sub,) = cache_dir.glob("gitspout-packcache-*")
        assert [f.stat().st_size for f in sub.iterdir()] == [size]
    finally:
        srv.stop()


def test_lone_clone_of_a_medium_whole_pack_is_not_copied(git: Git, tmp_path: Path,
                                                         cache_dir: Path) -> None:
    """A whole pack on disk over 4 MiB (and under an eighth of the cap) that one client
    alone asks for is sent from the pack the first time: nothing is written to the cache.
    The second lone clone of the same key copies it, and the third is a hit. Concurrent
    clones share a copy at once (bench.storm: readers of a local file beat pool round
    trips to the pack)."""
    root = tmp_path / "root"
    repo = _bare(git, root / "medium.git")
    _blob_commits(git, repo, [3 << 20, 3 << 20], seed=13)
    git.run("--git-dir", str(repo), "repack", "-adq", "--write-bitmap-index")
    (on_disk,) = (repo / "objects" / "pack").glob("pack-*.pack")
    size = on_disk.stat().st_size
    assert size > 4 << 20
    srv = start_server(root, ["--pack-cache-dir", str(cache_dir)])
    (sub,) = cache_dir.glob("gitspout-packcache-*")
    expected = [
        ({"hit": 0, "miss": 1, "joined": 0, "bypass": 0}, 0, []),
        ({"hit": 0, "miss": 2, "joined": 0, "bypass": 0}, framed(size), [framed(size)]),
        ({"hit": 1, "miss": 2, "joined": 0, "bypass": 0}, framed(size), [framed(size)]),
    ]
    try:
        for i, (seen, generated, files) in enumerate(expected):
            dest = tmp_path / f"m{i}.git"
            assert wait_all(clone_procs(git, f"{srv.url}/medium.git", [dest]))[0][0] == 0
            fsck(git, dest)
            assert pack_of(dest) == on_disk.read_bytes()
            assert lookups(srv) == seen, i
            assert metrics(srv)["gitspout_pack_cache_generated_bytes_total"] == generated, i
            assert [f.stat().st_size for f in sub.iterdir()] == files, i
    finally:
        srv.stop()


def test_directories_of_killed_servers_are_reclaimed(fixture_root: Path, tmp_path: Path) -> None:
    """A server killed with SIGKILL (an OOM kill keeps the emptyDir) never removed its
    directory; the next server in the same place removes it at once (a crash loop restarts
    within seconds), and leaves a live one's alone. A directory still being set up (its
    temporary name) is left alone while it is young."""
    cache_dir = tmp_path / "cache"
    killed = start_server(fixture_root, ["--pack-cache-dir", str(cache_dir)])
    (orphan,) = cache_dir.glob("gitspout-packcache-*")
    (orphan / "x.pack").write_bytes(b"left behind")
    killed.proc.kill()
    killed.proc.wait(timeout=10)
    young, old = cache_dir / ".gitspout-packcache-new-young", cache_dir / ".gitspout-packcache-new-old"
    young.mkdir()
    old.mkdir()
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    said: list[str] = []
    alive = start_server(fixture_root, ["--pack-cache-dir", str(cache_dir)], output=said)
    try:
        (mine,) = cache_dir.glob("gitspout-packcache-*")
        assert mine != orphan and young.exists() and not old.exists()
        assert any("removed 2 directories of stopped servers" in line for line in said)
        last = start_server(fixture_root, ["--pack-cache-dir", str(cache_dir)])
        try:
            left = set(cache_dir.glob("gitspout-packcache-*"))
            assert mine in left and len(left) == 2
        finally:
            last.stop()
    finally:
        alive.stop()
    assert not list(cache_dir.glob("gitspout-packcache-*"))  # each removed its own


def test_cache_directory_removed_is_made_again(git: Git, fixture_root: Path,
                                                tmp_path: Path) -> None:
    """A temp-dir cleaner removed the server's whole cache directory: the next fetch that
    would be cached makes a new one (it is not a bypass for the rest of the process)."""
    cache_dir = tmp_path / "cache"
    srv = start_server(fixture_root, ["--pack-cache-dir", str(cache_dir)])
    try:
        url = f"{srv.url}/basic.git"
        git.run("clone", "--mirror", "-q", url, str(tmp_path / "a.git"))
        (first,) = cache_dir.glob("gitspout-packcache-*")
        shutil.rmtree(first)
        git.run("clone", "--mirror", "-q", url, str(tmp_path / "b.git"))
        git.run("clone", "--mirror", "-q", url, str(tmp_path / "c.git"))
        git.run("clone", "--mirror", "-q", url, str(tmp_path / "d.git"))
        fsck(git, tmp_path / "d.git")
        assert lookups(srv) == {"hit": 1, "miss": 2, "joined": 0, "bypass": 1}
        (second,) = cache_dir.glob("gitspout-packcache-*")
        assert second != first and len(list(second.iterdir())) == 1
    finally:
        srv.stop()


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: room for the cache directory, not for a pack."""
    where = tmp_path / "small"
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                          capture_output=True, timeout=30)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], timeout=30, check=False)


def test_full_cache_disk_falls_back_to_streaming(git: Git, cache_root: Path, full_disk: Path,
                                                 tmp_path: Path) -> None:
    """The cache disk fills up mid-pack (ENOSPC): the clones reading that entry generate
    the rest themselves (checked against the bytes they already got) and complete; the
    next ones stream without the cache for a while. None fails, and the log blames the
    cache, not the repository."""
    said: list[str] = []
    srv = start_server(cache_root, ["--pack-cache-dir", str(full_disk)], output=said)
    try:
        url = f"{srv.url}/{STORM}"
        dests = [tmp_path / f"c{i}.git" for i in range(4)]
        results = wait_all(clone_procs(git, url, dests))
        results += wait_all(clone_procs(git, url, [tmp_path / "late.git"]))
        assert all(rc == 0 for rc, _ in results), results
        ref = tmp_path / "file.git"
        git.run("clone", "-q", "--mirror", f"file://{cache_root / STORM}", str(ref))
        for d in [*dests, tmp_path / "late.git"]:
            fsck(git, d)
            assert git.out("--git-dir", str(d), "rev-parse", "main") == git.out(
                "--git-dir", str(ref), "rev-parse", "main")
        assert any("pack cache: cannot write" in line for line in said), said[-5:]
        assert not any("cannot read repository" in line for line in said)
        seen = lookups(srv)
        assert seen["miss"] == 1 and seen["bypass"] >= 1, seen
    finally:
        srv.stop()


def test_alternates_are_part_of_the_key(git: Git, fixture_root: Path, tmp_path: Path,
                                        cache_dir: Path) -> None:
    """A repository whose objects come through ``objects/info/alternates``: once the file
    is removed, an identical clone is not answered from the cache (it fails, as C git's
    does over file://); put back, it is served again."""
    root = tmp_path / "root"
    root.mkdir()
    base = root / "base.git"
    git.run("clone", "-q", "--mirror", str(fixture_root / "basic.git"), str(base))
    borrower = root / "borrower.git"
    git.run("init", "-q", "--bare", str(borrower))
    alternates = borrower / "objects" / "info" / "alternates"
    alternates.write_text(str(base / "objects") + "\n")
    for line in git.out("--git-dir", str(base), "for-each-ref",
                        "--format=%(objectname) %(refname)").splitlines():
        oid, name = line.split()
        git.run("--git-dir", str(borrower), "update-ref", name, oid)
    srv = start_server(root, ["--pack-cache-dir", str(cache_dir)])
    try:
        url = f"{srv.url}/borrower.git"
        git.run("clone", "--mirror", "-q", url, str(tmp_path / "a.git"))
        fsck(git, tmp_path / "a.git")
        alternates.unlink()
        theirs = git.run("clone", "--mirror", "-q", f"file://{borrower}",
                         str(tmp_path / "file.git"), check=False)
        ours = git.run("clone", "--mirror", "-q", url, str(tmp_path / "b.git"), check=False)
        assert theirs.returncode != 0 and ours.returncode != 0
        assert lookups(srv)["hit"] == 0
        alternates.write_text(str(base / "objects") + "\n")
        git.run("clone", "--mirror", "-q", url, str(tmp_path / "c.git"))
        fsck(git, tmp_path / "c.git")
    finally:
        srv.stop()
