"""Damaged repositories (docs/ARCHITECTURE.md "Errors"): a pack truncated, or one entry's
zlib data turned to garbage, after the advertisement went out.

A damaged pack is a storage fault, never the client's: a 500 when it is met before the
response starts, an ``ERR`` line or side-band 3 message after it. The client is told which
repository failed (not "not our ref", and no file-system path); the log line names the
repository and the pack; the other repositories keep serving.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import Git, LiveServer, copy_repo, fsck, start_server
from rawhttp import FLUSH, pkt_lines, post_upload_pack, v2_command

DAMAGED = "damaged.git"


@pytest.fixture
def served(tmp_path: Path, fixture_root: Path) -> Iterator[LiveServer]:
    """A fresh server (nothing cached) for damaged.git (a copy of plain.git: one pack, no
    bitmap, no commit-graph, so commits and trees are read from the pack) and good.git."""
    root = tmp_path / "root"
    root.mkdir()
    copy_repo(fixture_root / "plain.git", root / DAMAGED)
    copy_repo(fixture_root / "basic.git", root / "good.git")
    # No pack cache: a pack damaged after a first clone must be met by the next one (the
    # cache would serve the intact pack that first clone produced).
    srv = start_server(root, ["--pack-cache-size", "0"])
    yield srv
    srv.stop()


def _pack(repo: Path) -> Path:
    (pack,) = (repo / "objects" / "pack").glob("pack-*.pack")
    return pack


def _truncate(pack: Path) -> None:
    """Cut the pack in half, in place (same inode, as a failing disk or copy would)."""
    with open(pack, "r+b") as fh:
        fh.truncate(pack.stat().st_size // 2)


def _garble_first(pack: Path, type_name: str) -> str:
    """Overwrite the start of the zlib stream of the first whole ``type_name`` entry with
    garbage (the pack's header and trailer stay as they were). Returns the object id."""
    listing = subprocess.run(["git", "verify-pack", "-v", str(pack.with_suffix(".idx"))],
                             capture_output=True, check=True, timeout=60, text=True).stdout
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) == 5 and fields[1] == type_name:  # not a delta: no depth, no base
            oid, offset = fields[0], int(fields[4])
            break
    else:
        raise AssertionError(f"no whole {type_name} in {pack}")
    data = bytearray(pack.read_bytes())
    at = offset
    while data[at] & 0x80:  # the entry header: type and size, a varint
        at += 1
    data[at + 1 : at + 9] = b"\xff" * 8
    pack.write_bytes(bytes(data))
    return oid


def _main(git: Git, srv: LiveServer) -> str:
    out = git.out("ls-remote", f"{srv.url}/{DAMAGED}", "refs/heads/main")  # the advertisement
    return out.split()[0]


def _clone(git: Git, srv: LiveServer, repo: str, dest: Path, version: int = 2) -> str:
    """Clone; on failure return git's stderr (empty when the clone worked)."""
    proc = git.run("-c", f"protocol.version={version}", "clone", "-q", f"{srv.url}/{repo}",
                   str(dest), check=False)
    return "" if proc.returncode == 0 else proc.stderr.decode(errors="replace") or "failed"


def _assert_still_serving(git: Git, srv: LiveServer, dest: Path) -> None:
    assert srv.alive()
    assert _clone(git, srv, "good.git", dest) == ""
    fsck(git, dest)


def _assert_logged(srv: LiveServer, pack: Path) -> None:
    line = srv.wait_for_line(f"storage fault in /{DAMAGED}")
    assert pack.name in line, line
    assert "Traceback" not in "\n".join(srv.lines)


@pytest.mark.parametrize("version", [0, 2])
def test_truncated_pack_before_the_response_is_a_500(git: Git, served: LiveServer,
                                                     tmp_path: Path, version: int) -> None:
    main = _main(git, served)
    pack = _pack(served.root / DAMAGED)
    _truncate(pack)
    if version == 2:
        body = v2_command("fetch", args=(f"want {main}", "ofs-delta", "done"))
    else:
        body = pkt_lines(f"want {main} side-band-64k ofs-delta") + FLUSH + pkt_lines("done")
    resp = post_upload_pack(served.port, body, repo=DAMAGED, version=version)
    assert resp.status == 500, (resp.status, resp.body[:200])
    assert f"repository /{DAMAGED}".encode() in resp.body, resp.body
    assert str(served.root).encode() not in resp.body and b"not our ref" not in resp.body
    _assert_logged(served, pack)

    err = _clone(git, served, DAMAGED, tmp_path / "c", version)
    assert err and "not our ref" not in err
    assert "HTTP 500" in err, err  # git shows the status of a failed POST, not its body
    logged = served.wait_for_line(" status=500 ")  # the access line (text format)
    assert " command=fetch " in logged, logged
    _assert_still_serving(git, served, tmp_path / "good")


def test_pack_truncated_while_open_is_an_in_band_error(git: Git, served: LiveServer,
                                                       tmp_path: Path) -> None:
    assert _clone(git, served, DAMAGED, tmp_path / "first") == ""  # the pack is open now
    pack = _pack(served.root / DAMAGED)
    _truncate(pack)
    err = _clone(git, served, DAMAGED, tmp_path / "c")
    assert f"upload-pack: cannot read repository /{DAMAGED}: corrupt pack" in err, err
    assert str(served.root) not in err and "not our ref" not in err
    _assert_logged(served, pack)
    _assert_still_serving(git, served, tmp_path / "good")


@pytest.mark.parametrize("version", [0, 2])
def test_garbage_entry_is_an_in_band_error(git: Git, served: LiveServer, tmp_path: Path,
                                           version: int) -> None:
    _main(git, served)
    pack = _pack(served.root / DAMAGED)
    _garble_first(pack, "tree")  # trees are first read while enumerating: after the 200
    err = _clone(git, served, DAMAGED, tmp_path / "c", version)
    assert f"remote: upload-pack: cannot read repository /{DAMAGED}: corrupt pack" in err, err
    assert str(served.root) not in err and "not our ref" not in err
    _assert_logged(served, pack)
    _assert_still_serving(git, served, tmp_path / "good")


def test_garbage_entry_before_the_response_is_a_500(git: Git, served: LiveServer) -> None:
    """A have that is a commit is read while negotiating, before the 200."""
    main = _main(git, served)
    pack = _pack(served.root / DAMAGED)
    oid = _garble_first(pack, "commit")
    body = v2_command("fetch", args=(f"want {main}", f"have {oid}", "done"))
    resp = post_upload_pack(served.port, body, repo=DAMAGED, version=2)
    assert resp.status == 500, (resp.status, resp.body[:200])
    assert f"repository /{DAMAGED}".encode() in resp.body
    _assert_logged(served, pack)


def test_unreadable_pack_holding_nothing_needed_is_skipped(git: Git, served: LiveServer,
                                                          tmp_path: Path) -> None:
    """A broken pack fails a request only when an object it may hold is needed: a broken
    copy of a pack whose objects are all elsewhere is passed over, as before."""
    pack = _pack(served.root / DAMAGED)
    stray = pack.with_name("pack-" + "0" * 40 + ".pack")
    shutil.copyfile(pack, stray)
    shutil.copyfile(pack.with_suffix(".idx"), stray.with_suffix(".idx"))
    _truncate(stray)
    assert _clone(git, served, DAMAGED, tmp_path / "c") == ""
    fsck(git, tmp_path / "c")
    assert not any("storage fault" in line for line in served.lines)
