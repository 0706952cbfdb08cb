"""C git's offload settings, honoured as C git honours them (git's t5601.113-115, t5702.74-82):

* ``uploadpack.advertiseBundleURIs`` and ``bundle.*``: the v2 ``bundle-uri`` capability
  and command, answered byte for byte as C git's upload-pack answers the same config (with
  a git >= 2.41, GITSPOUT_TEST_NEW_GIT; the CI git 2.39 has no such command), and a real
  clone with ``transfer.bundleURI`` that downloads the bundle.
* ``uploadpack.blobPackfileUri``: with ``packfile-uris`` the configured blob leaves the pack
  and a ``packfile-uris`` section names it, the lines before the pack as C git sends them;
  a real clone with ``fetch.uriprotocols=http`` downloads that pack from a static server and
  fscks equal to file://. A blob reachable only from a hidden ref is never named.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import Committer, Git, LiveServer, fsck, git_env, repo_state, start_server
from offloadkit import (
    StaticServer,
    c_upload_pack,
    new_git,
    pack_count,
    sections,
    static_server,
)
from rawhttp import DELIM, FLUSH, get_info_refs, parse_pkts, pkt_lines, post_upload_pack


@pytest.fixture(scope="module")
def www(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StaticServer]:
    with static_server(tmp_path_factory.mktemp("www")) as srv:
        yield srv


def _exclude(git: Git, repo: Path, www: StaticServer, path: str) -> tuple[str, str]:
    """configure_exclusion of t5702: a pack of one blob under www, named in the config."""
    oid = git.out("hash-object", path, cwd=repo).strip()
    pack = git.run("pack-objects", str(www.root / "mypack"), cwd=repo,
                   input=oid.encode() + b"\n").stdout.decode().strip()
    git.run("config", "--add", "uploadpack.blobpackfileuri",
            f"{oid} {pack} {www.url}/mypack-{pack}.pack", cwd=repo)
    return oid, pack


@pytest.fixture(scope="module")
def off_root(tmp_path_factory: pytest.TempPathFactory, git: Git,
             www: StaticServer) -> dict[str, object]:
    """``loose``: objects loose, as t5702 makes them; ``bitmap`` and ``walk``: the same,
    packed with and without bitmaps; each with my-blob configured; ``hidden``: a blob
    configured that only a hidden ref reaches."""
    root = tmp_path_factory.mktemp("offroot")
    loose = root / "loose"
    git.run("init", "-q", "-b", "main", str(loose))
    c = Committer(git, loose)
    c.commit({"my-blob": "my-blob\n", "other-blob": "other-blob\n"}, "x")
    git.run("config", "uploadpack.allowsidebandall", "true", cwd=loose)
    oid, pack = _exclude(git, loose, www, "my-blob")
    for name, flags in (("bitmap", ["-adb"]), ("walk", ["-ad"])):
        git.run("clone", "-q", "--bare", str(loose), str(root / f"{name}.git"))
        git.run("repack", "-q", *flags, cwd=root / f"{name}.git")
        for key in ("uploadpack.allowsidebandall", "uploadpack.blobpackfileuri"):
            value = git.out("config", key, cwd=loose).strip()
            git.run("config", key, value, cwd=root / f"{name}.git")
    hidden = root / "hidden"
    git.run("clone", "-q", str(loose), str(hidden))
    Committer(git, hidden).commit({"secret": "only hidden\n"}, "secret")
    git.run("update-ref", "refs/hidden/s", "HEAD", cwd=hidden)
    git.run("reset", "-q", "--hard", "HEAD~1", cwd=hidden)
    git.run("config", "transfer.hideRefs", "refs/hidden", cwd=hidden)
    git.run("config", "uploadpack.allowsidebandall", "true", cwd=hidden)
    blob = git.out("rev-parse", "refs/hidden/s:secret", cwd=hidden).strip()
    spack = git.run("pack-objects", str(www.root / "secret"), cwd=hidden,
                    input=blob.encode() + b"\n").stdout.decode().strip()
    git.run("config", "--add", "uploadpack.blobpackfileuri",
            f"{blob} {spack} {www.url}/secret-{spack}.pack", cwd=hidden)
    bundles = root / "bundles.git"
    git.run("clone", "-q", "--bare", str(loose), str(bundles))
    return {"root": root, "oid": oid, "pack": pack, "secret": blob}


@pytest.fixture(scope="module")
def off_server(off_root: dict[str, object]) -> Iterator[LiveServer]:
    srv = start_server(off_root["root"])  # type: ignore[arg-type]
    yield srv
    srv.stop()


def _fetch_body(git: Git, gitdir: Path, protocols: str = "http") -> bytes:
    head = git.out("rev-parse", "HEAD", cwd=gitdir).strip()
    args = [f"want {head}", "ofs-delta", "sideband-all", "no-progress", "done"]
    if protocols:
        args.insert(1, f"packfile-uris {protocols}")
    return pkt_lines("command=fetch", "object-format=sha1") + DELIM + pkt_lines(*args) + FLUSH


def _gitdir(off_root: dict[str, object], name: str) -> Path:
    root = off_root["root"]
    assert isinstance(root, Path)
    path = root / name
    return path / ".git" if (path / ".git").is_dir() else path


def test_packfile_uris_answer_as_c_git(git: Git, off_root: dict[str, object],
                                       off_server: LiveServer, www: StaticServer) -> None:
    """Loose objects (t5702's repositories): the lines before the pack are C git's, and
    the pack holds one object fewer than without packfile-uris."""
    gitdir = _gitdir(off_root, "loose")
    body = _fetch_body(git, gitdir)
    ours = post_upload_pack(off_server.port, body, "loose", version=2)
    assert ours.status == 200
    head, pack = sections(parse_pkts(ours.body))
    c_head, c_pack = sections(parse_pkts(c_upload_pack(git, gitdir, body)))
    assert head == c_head
    line = f"{off_root['pack']} {www.url}/mypack-{off_root['pack']}.pack\n".encode()
    assert head[:3] == [b"packfile-uris\n", line, None]
    assert pack_count(pack) == pack_count(c_pack) == 3  # commit, tree, other-blob
    plain = post_upload_pack(off_server.port, _fetch_body(git, gitdir, ""), "loose", version=2)
    p_head, p_pack = sections(parse_pkts(plain.body))
    assert p_head == [b"packfile\n"] and pack_count(p_pack) == 4


@pytest.mark.parametrize("name", ["bitmap.git", "walk.git"])
def test_packfile_uris_from_packs(git: Git, off_root: dict[str, object],
                                  off_server: LiveServer, name: str) -> None:
    """From packs (with bitmaps, and walked) the blob leaves the pack too. C git 2.55
    checks the setting only for loose objects and sends it whole here (core/offload.py)."""
    gitdir = _gitdir(off_root, name)
    body = _fetch_body(git, gitdir)
    head, pack = sections(parse_pkts(post_upload_pack(off_server.port, body, name,
                                                      version=2).body))
    assert head[0] == b"packfile-uris\n" and len(head) == 4
    assert pack_count(pack) == 3
    _, c_pack = sections(parse_pkts(c_upload_pack(git, gitdir, body)))
    assert pack_count(c_pack) == 4


def test_other_protocol_gets_whole_pack(git: Git, off_root: dict[str, object],
                                        off_server: LiveServer) -> None:
    gitdir = _gitdir(off_root, "bitmap.git")
    body = _fetch_body(git, gitdir, "https,ftp")
    head, pack = sections(parse_pkts(post_upload_pack(off_server.port, body, "bitmap.git",
                                                      version=2).body))
    assert head == [b"packfile\n"] and pack_count(pack) == 4
    assert b"packfile-uris" in get_info_refs(off_server.port, "bitmap.git", 2).body


@pytest.mark.parametrize("name", ["loose", "bitmap.git", "walk.git"])
def test_clone_downloads_packfile_uri(git: Git, tmp_path: Path, off_root: dict[str, object],
                                      off_server: LiveServer, www: StaticServer,
                                      name: str) -> None:
    """A real clone takes the blob from the static server: fsck, and the same refs and
    objects as a file:// clone."""
    before = len([p for p in www.paths if p.startswith("/mypack-")])
    dest = tmp_path / "c"
    git.run("-c", "protocol.version=2", "-c", "fetch.uriprotocols=http", "clone", "-q",
            f"{off_server.url}/{name}", str(dest))
    assert len([p for p in www.paths if p.startswith("/mypack-")]) == before + 1
    fsck(git, dest)
    ref = tmp_path / "ref"
    git.run("clone", "-q", "--no-local", f"file://{_gitdir(off_root, name)}", str(ref))
    ours, theirs = repo_state(git, dest), repo_state(git, ref)
    assert ours.refs == theirs.refs and ours.objects == theirs.objects
    assert len(list((dest / ".git" / "objects" / "pack").glob("*.pack"))) == 2


def test_hidden_blob_never_named(git: Git, tmp_path: Path, off_root: dict[str, object],
                                 off_server: LiveServer, www: StaticServer) -> None:
    """The configured blob only a hidden ref reaches is in no answer: a clone gets no
    packfile-uris section and never downloads it."""
    gitdir = _gitdir(off_root, "hidden")
    body = _fetch_body(git, gitdir)
    head, _ = sections(parse_pkts(post_upload_pack(off_server.port, body, "hidden",
                                                   version=2).body))
    assert head == [b"packfile\n"]
    git.run("-c", "protocol.version=2", "-c", "fetch.uriprotocols=http", "clone", "-q",
            f"{off_server.url}/hidden", str(tmp_path / "c"))
    assert not [p for p in www.paths if p.startswith("/secret-")]
    objs = git.out("cat-file", "--batch-all-objects", "--batch-check=%(objectname)",
                   cwd=tmp_path / "c")
    assert str(off_root["secret"]) not in objs


BUNDLE_CONFIG = [
    ("uploadpack.advertiseBundleURIs", "true"),
    ("bundle.version", "1"),
    ("bundle.mode", "all"),
    ("bundle.heuristic", "creationToken"),
    ("bundle.Everything.uri", "{url}/all.bundle"),
    ("bundle.Everything.creationToken", "1"),
]


def _bundle_repo(git: Git, off_root: dict[str, object], www: StaticServer) -> Path:
    gitdir = _gitdir(off_root, "bundles.git")
    if not (www.root / "all.bundle").exists():
        git.run("bundle", "create", str(www.root / "all.bundle"), "--all", cwd=gitdir)
        for key, value in BUNDLE_CONFIG:
            git.run("config", key, value.format(url=www.url), cwd=gitdir)
        # what C git writes as is: a bare key, and the section spelled [Bundle "x"]
        with open(gitdir / "config", "a") as f:
            f.write('[Bundle "Extra"]\n\tURI = other\n\tbare\n')
    return gitdir


def test_bundle_uri_capability(git: Git, off_root: dict[str, object], off_server: LiveServer,
                               www: StaticServer) -> None:
    _bundle_repo(git, off_root, www)
    caps = parse_pkts(get_info_refs(off_server.port, "bundles.git", 2).body)
    assert caps[-2:] == [b"bundle-uri\n", None]
    assert b"bundle-uri\n" not in parse_pkts(get_info_refs(off_server.port, "loose", 2).body)


def test_bundle_uri_answer_as_c_git(git: Git, off_root: dict[str, object],
                                    off_server: LiveServer, www: StaticServer) -> None:
    gitdir = _bundle_repo(git, off_root, www)
    body = pkt_lines("command=bundle-uri", "object-format=sha1") + FLUSH
    ours = post_upload_pack(off_server.port, body, "bundles.git", version=2)
    lines = parse_pkts(ours.body)
    assert lines[:6] == [b"bundle.version=1", b"bundle.mode=all",
                         b"bundle.heuristic=creationToken",
                         f"bundle.Everything.uri={www.url}/all.bundle".encode(),
                         b"bundle.Everything.creationtoken=1", b"bundle.Extra.uri=other"]
    newer = new_git()
    if newer is None:
        pytest.skip("C git's answer needs a git >= 2.41 (GITSPOUT_TEST_NEW_GIT)")
    assert ours.body == c_upload_pack(git, gitdir, body, newer)
    bad = post_upload_pack(off_server.port, pkt_lines("command=bundle-uri") + DELIM
                           + pkt_lines("x") + FLUSH, "bundles.git", version=2)
    assert bad.status == 400 and b"bundle-uri: unexpected argument: 'x'" in bad.body


def test_clone_with_bundle_uri(git: Git, tmp_path: Path, off_root: dict[str, object],
                               off_server: LiveServer, www: StaticServer) -> None:
    """transfer.bundleURI: the client asks bundle-uri, downloads the bundle, then fetches
    what is newer; fsck and refs as over file://."""
    newer = new_git()
    if newer is None:
        pytest.skip("transfer.bundleURI needs a git >= 2.41 (GITSPOUT_TEST_NEW_GIT)")
    gitdir = _bundle_repo(git, off_root, www)
    before = www.paths.count("/all.bundle")
    dest = tmp_path / "c"
    subprocess.run([newer, "-c", "transfer.bundleURI=true", "-c", "protocol.version=2",
                    "clone", "-q", f"{off_server.url}/bundles.git", str(dest)],
                   env=git_env(git.home), check=True, capture_output=True, timeout=120)
    assert www.paths.count("/all.bundle") == before + 1
    fsck(git, dest)
    ref = tmp_path / "ref"
    git.run("clone", "-q", "--no-local", f"file://{gitdir}", str(ref))
    assert _refs(git, dest) == _refs(git, ref)


def _refs(git: Git, path: Path) -> list[str]:
    """The clone's refs, without the refs/bundles/ a bundle download leaves."""
    return [line for line in repo_state(git, path).refs.splitlines()
            if " refs/bundles/" not in line]


def test_malformed_blob_uri_is_refused(git: Git, off_root: dict[str, object],
                                       off_server: LiveServer) -> None:
    """A value pack-objects dies on: the fetch that would use it gets a clear error, never
    a pack without its objects; a fetch without packfile-uris is served as ever."""
    root = off_root["root"]
    assert isinstance(root, Path)
    bad = root / "bad.git"
    if not bad.exists():
        git.run("clone", "-q", "--bare", str(_gitdir(off_root, "loose")), str(bad))
        git.run("config", "uploadpack.allowsidebandall", "true", cwd=bad)
        git.run("config", "uploadpack.blobpackfileuri", "not-an-id http://x/p.pack", cwd=bad)
    body = _fetch_body(git, bad)
    resp = post_upload_pack(off_server.port, body, "bad.git", version=2)
    assert b"uploadpack.blobpackfileuri must be of the form" not in resp.body  # no path leak
    assert resp.status == 500 and b"PACK" not in resp.body
    plain = post_upload_pack(off_server.port, _fetch_body(git, bad, ""), "bad.git", version=2)
    head, pack = sections(parse_pkts(plain.body))
    assert head == [b"packfile\n"] and pack_count(pack) == 4
    assert any("uploadpack.blobpackfileuri must be of the form" in line
               for line in off_server.lines)
