"""Small requests that used to cost the server a lot (issue 8, item 3), each answered
correctly within a timeout and compared with C git's ``upload-pack --stateless-rpc`` for the
same request bytes where C git answers them too.

Served from ``long_root`` (conftest.py, repos_fixture.build_long_root): a 1,500-commit
history with a hidden ref, with a bitmap (long.git) and without (long-plain.git).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gitspout.protocol.fetch_request import MAX_DEEPEN_NOT
from gitspout.protocol.object_info import MAX_OBJECT_INFO_OIDS
from gitutil import Git, LiveServer
from rawhttp import DELIM, FLUSH, parse_pkts, pkt, pkt_lines, post_upload_pack, v2_command

REPOS = ["long.git", "long-plain.git"]
# Generous for a 2-core CI machine; the quadratic or per-id walks these tests guard
# against took minutes for the same requests.
SLOW = 30.0


def c_upload_pack(git: Git, repo: Path, body: bytes, version: int) -> bytes:
    """C git's answer to the same stateless request (the ground truth; it may exit 128
    after an ERR line)."""
    env = {"GIT_PROTOCOL": "version=2"} if version == 2 else {}
    return git.run("upload-pack", "--stateless-rpc", str(repo), input=body, env=env,
                   timeout=SLOW, check=False).stdout


def rev(git: Git, repo: Path, name: str) -> str:
    return git.out("rev-parse", name, cwd=repo).strip()


def sizes(git: Git, repo: Path, ids: list[str]) -> dict[str, int]:
    out = git.out("cat-file", "--batch-check=%(objectname) %(objectsize)", cwd=repo,
                  input=("\n".join(ids) + "\n").encode())
    return {oid: int(size) for oid, size in (line.split() for line in out.splitlines())}


def pack_section(body: bytes) -> tuple[list[bytes], bytes]:
    """(lines of a v2 fetch answer before ``packfile``, the pack from side-band 1)."""
    head: list[bytes] = []
    pack: list[bytes] = []
    in_pack = False
    for p in parse_pkts(body):
        if p is None:
            continue
        if in_pack:
            if p[:1] == b"\x01":
                pack.append(p[1:])
        elif p == b"packfile\n":
            in_pack = True
        else:
            head.append(p)
    return head, b"".join(pack)


# ---------------------------------------------------------------- object-info


@pytest.mark.parametrize("repo", REPOS)
def test_object_info_for_every_object_in_one_request(git: Git, long_server: LiveServer,
                                                     long_root: Path, repo: str) -> None:
    """Every object of the repository (about 6,400, hidden ones included) in one request:
    sizes as ``git cat-file`` gives them for what the visible refs reach, nothing for
    objects only the hidden ref reaches, nor for unknown ids."""
    path = long_root / repo
    every = git.out("cat-file", "--batch-all-objects", "--batch-check=%(objectname)",
                    cwd=path).split()
    listing = git.out("rev-list", "--objects", "--branches", "--tags", cwd=path)
    visible = {line.split(" ")[0] for line in listing.splitlines()}
    hidden_only = set(every) - visible
    assert len(hidden_only) >= 20  # the secret commits, their trees and blobs
    bogus = ["0123456789" * 4, "f" * 40]
    ids = every + bogus
    assert len(ids) <= MAX_OBJECT_INFO_OIDS
    body = v2_command("object-info", args=("size", *(f"oid {i}" for i in ids)))
    resp = post_upload_pack(long_server.port, body, repo=repo, version=2, timeout=SLOW)
    assert resp.status == 200 and resp.complete
    pkts = parse_pkts(resp.body)
    assert pkts[0] == b"size" and pkts[-1] is None
    answers = [p.decode().split(" ") for p in pkts[1:-1] if p is not None]
    assert [a[0] for a in answers] == ids  # one line per id, in order
    expected = sizes(git, path, sorted(visible))
    got = {a[0]: a[1] for a in answers}
    assert {i: int(got[i]) for i in visible} == expected
    assert all(got[i] == "" for i in [*hidden_only, *bogus])


def test_object_info_over_the_cap_is_refused(long_server: LiveServer) -> None:
    ids = [f"{k:040x}" for k in range(MAX_OBJECT_INFO_OIDS + 1)]
    body = v2_command("object-info", args=("size", *(f"oid {i}" for i in ids)))
    resp = post_upload_pack(long_server.port, body, repo="long.git", version=2, timeout=SLOW)
    assert resp.status == 400
    assert f"too many object ids (at most {MAX_OBJECT_INFO_OIDS:,}" in resp.text


# ---------------------------------------------------------------- many shallow/want-ref lines


@pytest.mark.parametrize("repo", REPOS)
def test_eighty_thousand_shallow_lines(git: Git, long_server: LiveServer, long_root: Path,
                                       repo: str) -> None:
    """80k distinct shallow lines naming unknown commits, each sent twice, plus real ones:
    parsed in one pass (a list lookup per line took minutes), and the answer is C git's."""
    path = long_root / repo
    unknown = [f"shallow {k + 0xABC000:040x}" for k in range(80_000)]
    real = [f"shallow {rev(git, path, f'main~{n}')}" for n in (3, 5)]
    args = [f"want {rev(git, path, 'main')}", *unknown, *real, *unknown, "deepen 2",
            "no-progress", "done"]
    body = pkt_lines("command=fetch", "object-format=sha1") + DELIM + pkt_lines(*args) + FLUSH
    resp = post_upload_pack(long_server.port, body, repo=repo, version=2, timeout=SLOW)
    assert resp.status == 200 and resp.complete
    ours_head, ours_pack = pack_section(resp.body)
    theirs_head, theirs_pack = pack_section(c_upload_pack(git, path, body, 2))
    assert ours_head[0] == b"shallow-info\n"
    assert sorted(ours_head) == sorted(theirs_head)
    assert ours_pack[:12] == theirs_pack[:12]  # same number of objects


def test_eighty_thousand_want_ref_lines(git: Git, long_server: LiveServer,
                                        long_root: Path) -> None:
    refs = [f"want-ref refs/heads/nope-{k:06d}" for k in range(80_000)]
    body = pkt_lines("command=fetch", "object-format=sha1") + DELIM + pkt_lines(*refs, "done") + FLUSH
    resp = post_upload_pack(long_server.port, body, repo="long.git", version=2, timeout=SLOW)
    assert resp.status == 200
    theirs = c_upload_pack(git, long_root / "long.git", body, 2)
    ours_err, theirs_err = parse_pkts(resp.body)[0], parse_pkts(theirs)[0]
    assert ours_err is not None and theirs_err is not None
    # C git ends its ERR line with LF, gitspout does not (either is valid pkt-line text).
    assert ours_err.rstrip(b"\n") == theirs_err.rstrip(b"\n") == b"ERR unknown ref refs/heads/nope-000000"


def test_deepen_not_over_the_cap_is_refused(long_server: LiveServer) -> None:
    args = ["want " + "1" * 40, *(f"deepen-not refs/heads/x{k}" for k in range(MAX_DEEPEN_NOT + 1))]
    body = pkt_lines("command=fetch", "object-format=sha1") + DELIM + pkt_lines(*args) + FLUSH
    resp = post_upload_pack(long_server.port, body, repo="long.git", version=2, timeout=SLOW)
    assert resp.status == 400
    assert "too many deepen-not lines" in resp.text


# ---------------------------------------------------------------- repeated haves


def _v0_body(want: str, haves: list[str]) -> bytes:
    return (pkt(f"want {want} multi_ack_detailed side-band-64k ofs-delta\n".encode()) + FLUSH
            + pkt_lines(*(f"have {h}" for h in haves)) + FLUSH)


def _v2_body(want: str, haves: list[str]) -> bytes:
    return (pkt_lines("command=fetch", "object-format=sha1") + DELIM
            + pkt_lines(f"want {want}", *(f"have {h}" for h in haves)) + FLUSH)


@pytest.mark.parametrize("version", [0, 2])
@pytest.mark.parametrize("repo", REPOS)
def test_repeated_haves_are_acked_once(git: Git, long_server: LiveServer, long_root: Path,
                                       repo: str, version: int) -> None:
    """Each distinct have is answered once. C git 2.39 repeats its answer for each repeated
    line (2.45+ ACKs each object once in v2): its answer with the repeats dropped."""
    path = long_root / repo
    common = [rev(git, path, "main~40"), rev(git, path, "main~41"), rev(git, path, "main~900")]
    unknown = "0123456789" * 4
    haves = [common[0]] * 3000 + [unknown] * 3000 + [common[1], common[2]] * 2000
    body = (_v0_body if version == 0 else _v2_body)(rev(git, path, "main"), haves)
    resp = post_upload_pack(long_server.port, body, repo=repo, version=version, timeout=SLOW)
    assert resp.status == 200
    ours = _answer_lines(resp.body)
    theirs = _answer_lines(c_upload_pack(git, path, body, version))
    assert len(theirs) > 6000  # C git repeats
    assert ours == list(dict.fromkeys(theirs))
    # The three common haves, and in v0 "ACK <unknown> ready" once.
    assert len([p for p in ours if p.startswith(b"ACK ")]) == (4 if version == 0 else 3)


def _answer_lines(body: bytes) -> list[bytes]:
    """The ACK/NAK section: lines up to the first flush or delimiter."""
    out: list[bytes] = []
    for p in parse_pkts(body):
        if p is None:
            break
        out.append(p)
    return out


# ---------------------------------------------------------------- deepen N


@pytest.mark.parametrize("repo", [*REPOS, "long-refdelta.git"])
def test_deepen_pack_reuses_stored_deltas(git: Git, long_server: LiveServer, long_root: Path,
                                          repo: str) -> None:
    """deepen 20: the oldest version of the big file in the pack lacks its stored base,
    but the newer versions are stored as deltas against each other and must stay deltas.
    Regenerating everything below a missing base made such packs 2-3 times C git's."""
    path = long_root / repo
    args = [f"want {rev(git, path, 'main')}", "deepen 20", "ofs-delta", "no-progress", "done"]
    body = pkt_lines("command=fetch", "object-format=sha1") + DELIM + pkt_lines(*args) + FLUSH
    resp = post_upload_pack(long_server.port, body, repo=repo, version=2, timeout=SLOW)
    assert resp.status == 200 and resp.complete
    ours_head, ours_pack = pack_section(resp.body)
    theirs_head, theirs_pack = pack_section(c_upload_pack(git, path, body, 2))
    assert sorted(ours_head) == sorted(theirs_head)
    assert ours_pack[:12] == theirs_pack[:12]
    assert len(ours_pack) < 1.5 * len(theirs_pack), (len(ours_pack), len(theirs_pack))
