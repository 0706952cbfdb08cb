"""Damaged files of every kind, met by the real git client (docs/ARCHITECTURE.md "Errors",
docs/operations.md "Serving repositories").

- A damaged ``.idx`` (truncated, or its checksum wrong) or ``packed-refs`` (garbage, one
  bad line, a bad object id, a truncated last line) is a server fault: 500, a message that
  names the repository and no path, a log line with the path, and
  ``gitspout_storage_faults_total{kind,outcome="failed"}``.
- A damaged ``.bitmap`` or ``commit-graph`` has a sound fallback (a walk, parsed commits):
  the clone works and is fsck-clean and the same as over ``file://``; the file is logged
  once (not once per request) and counted as ``outcome="fallback"``.
- The other repositories keep serving.
"""

from __future__ import annotations

import os
import re
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from gitutil import Git, LiveServer, copy_repo, fsck, repo_state, start_server
from rawhttp import get_info_refs, post_upload_pack, v2_command

REPO = "damaged.git"


@pytest.fixture
def served(tmp_path: Path, fixture_root: Path) -> Iterator[LiveServer]:
    """A fresh server for damaged.git (a copy of basic.git: one pack with a bitmap, a
    commit-graph, packed-refs) and good.git."""
    root = tmp_path / "root"
    root.mkdir()
    copy_repo(fixture_root / "basic.git", root / REPO)
    copy_repo(fixture_root / "basic.git", root / "good.git")
    srv = start_server(root)
    yield srv
    srv.stop()


def _only(repo: Path, pattern: str) -> Path:
    (path,) = repo.glob(pattern)
    return path


def _rewrite(path: Path, change: Callable[[bytearray], None]) -> None:
    """Change a file in place; the fixture's files are read-only, as git leaves them."""
    data = bytearray(path.read_bytes())
    change(data)
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))


def _flip(at: int) -> Callable[[bytearray], None]:
    def change(data: bytearray) -> None:
        data[at] ^= 0xFF
    return change


def _clone(git: Git, srv: LiveServer, repo: str, dest: Path, version: int = 2) -> str:
    """Clone; git's stderr on failure, "" when it worked."""
    proc = git.run("-c", f"protocol.version={version}", "clone", "-q", "--mirror",
                   f"{srv.url}/{repo}", str(dest), check=False)
    return "" if proc.returncode == 0 else proc.stderr.decode(errors="replace") or "failed"


def _faults(srv: LiveServer) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(f"{srv.url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {(k, o): float(v) for k, o, v in re.findall(
        r'^gitspout_storage_faults_total\{kind="([^"]+)",outcome="([^"]+)"\} (\S+)$', text, re.M)}


def _assert_server_fault(git: Git, srv: LiveServer, tmp_path: Path, kind: str,
                         logged: str) -> None:
    """Both protocol versions fail with a 500 naming the repository (no path), the log
    names the file, the metric counts it, and good.git still clones."""
    for version in (2, 0):
        err = _clone(git, srv, REPO, tmp_path / f"bad{version}", version)
        assert err, f"protocol {version}: the clone of a damaged repository worked"
        assert "HTTP 500" in err or f"cannot read repository /{REPO}" in err, err
        assert str(srv.root) not in err and "not our ref" not in err, err
        assert "empty repository" not in err, err
    line = srv.wait_for_line(logged)
    assert f"/{REPO}" in line and "Traceback" not in "\n".join(srv.lines)
    assert _faults(srv)[(kind, "failed")] >= 2
    assert srv.alive()
    assert _clone(git, srv, "good.git", tmp_path / "good") == ""
    fsck(git, tmp_path / "good")


def test_truncated_idx_is_a_500(git: Git, served: LiveServer, tmp_path: Path) -> None:
    idx = _only(served.root / REPO, "objects/pack/pack-*.idx")
    _rewrite(idx, lambda d: d.__delitem__(slice(len(d) // 2, None)))
    _assert_server_fault(git, served, tmp_path, "idx", f"{idx.name}: truncated index")
    # the pack skipped is reported once, with its path, whatever the number of requests
    skipped = [x for x in served.lines if "gitspout: unusable idx" in x]
    assert len(skipped) == 1 and str(idx.with_suffix("")) in skipped[0], skipped
    body = v2_command("fetch", args=(f"want {'1' * 40}", "done"))
    resp = post_upload_pack(served.port, body, repo=REPO, version=2)
    assert resp.status == 500 and f"/{REPO}".encode() in resp.body, resp
    assert str(served.root).encode() not in resp.body


def test_idx_checksum_mismatch_is_a_500(git: Git, served: LiveServer, tmp_path: Path) -> None:
    """One byte of the CRC table changed: every lookup would still work, but the index is
    not what git wrote (the same damage elsewhere would send wrong entries)."""
    idx = _only(served.root / REPO, "objects/pack/pack-*.idx")
    count = int.from_bytes(idx.read_bytes()[8 + 1020 : 8 + 1024], "big")
    _rewrite(idx, _flip(8 + 1024 + count * 20 + 1))
    _assert_server_fault(git, served, tmp_path, "idx", "index checksum does not match")


@pytest.mark.parametrize("damage", ["garbage", "one-line", "bad-id", "unterminated"])
def test_damaged_packed_refs_is_a_500(git: Git, served: LiveServer, tmp_path: Path,
                                      damage: str) -> None:
    packed = served.root / REPO / "packed-refs"
    text = packed.read_bytes()
    assert text.count(b"\n") >= 3
    head, _, rest = text.partition(b"\n")
    lines = rest.splitlines(keepends=True)
    if damage == "garbage":  # once an empty repository with exit 0
        new = b"garbage\nmore garbage\n"
    elif damage == "one-line":  # once that ref silently dropped
        new = head + b"\n" + lines[0] + b"this is not a ref\n" + b"".join(lines[1:])
    elif damage == "bad-id":  # once advertised as it was
        new = text + b"z" * 40 + b" refs/heads/zz\n"
    else:  # a write cut inside the last name
        new = text[:-3]
    os.chmod(packed, 0o644)
    packed.write_bytes(new)
    ls = git.run("ls-remote", f"{served.url}/{REPO}", check=False)
    assert ls.returncode != 0 and not ls.stdout, ls
    resp = get_info_refs(served.port, REPO, version=0)
    assert resp.status == 500, resp
    assert resp.body.decode().strip() == \
        f"upload-pack: cannot read repository /{REPO}: corrupt packed-refs"
    _assert_server_fault(git, served, tmp_path, "packed-refs",
                         f"storage fault in /{REPO} ({packed})")


@pytest.mark.parametrize("kind", ["bitmap", "commit-graph"])
def test_damaged_auxiliary_file_falls_back(git: Git, served: LiveServer, tmp_path: Path,
                                           kind: str, fixture_root: Path) -> None:
    repo = served.root / REPO
    if kind == "bitmap":
        path = _only(repo, "objects/pack/pack-*.bitmap")
        # garbage where the type bitmaps' run lengths are: once a walk that never ended
        _rewrite(path, lambda d: d.__setitem__(slice(40, 240), b"\xa5" * 200))
        logged = f"unusable bitmap {path}"
    else:
        # without the bitmap, so that the walk reads commits (from the graph)
        _only(repo, "objects/pack/pack-*.bitmap").unlink()
        path = repo / "objects" / "info" / "commit-graph"
        size = path.stat().st_size
        _rewrite(path, _flip(size - 40))  # inside the last chunk: only the checksum tells
        logged = f"unusable commit-graph {path}"
    want = repo_state(git, _mirror(git, fixture_root / "basic.git", tmp_path / "file"))
    for i, version in enumerate((2, 0, 2)):
        dest = tmp_path / f"c{i}"
        assert _clone(git, served, REPO, dest, version) == ""
        fsck(git, dest)
        assert repo_state(git, dest) == want
    assert len([x for x in served.lines if f"gitspout: unusable {kind}" in x]) == 1
    served.wait_for_line(logged)
    assert not any("storage fault" in x for x in served.lines)
    faults = _faults(served)
    assert faults[(kind, "fallback")] >= 1 and faults[(kind, "failed")] == 0


def _mirror(git: Git, src: Path, dest: Path) -> Path:
    git.run("clone", "-q", "--mirror", f"file://{src}", str(dest))
    return dest


def test_damaged_rev_file_falls_back(git: Git, served: LiveServer, tmp_path: Path,
                                     fixture_root: Path) -> None:
    """A ``.rev`` (pack order of the index positions) with a wrong byte: the offsets are
    sorted instead; a wrong order would cut entries at the wrong places."""
    repo = tmp_path / "root" / "rev.git"
    copy_repo(fixture_root / "plain.git", repo)
    git.run("-c", "pack.writeReverseIndex=true", "repack", "-adq", cwd=repo)
    rev = _only(repo, "objects/pack/pack-*.rev")
    _rewrite(rev, _flip(12 + 4))  # the second position
    want = repo_state(git, _mirror(git, repo, tmp_path / "file"))
    for i in range(2):
        dest = tmp_path / f"c{i}"
        assert _clone(git, served, "rev.git", dest) == ""
        fsck(git, dest)
        assert repo_state(git, dest) == want
    assert len([x for x in served.lines if "gitspout: unusable rev" in x]) == 1
    served.wait_for_line(f"unusable rev {rev}")
    assert _faults(served)[("rev", "fallback")] == 1
