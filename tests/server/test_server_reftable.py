"""Reftable repositories (``git init --ref-format=reftable``) served as C git serves them.

The fixtures (``tests/fixtures/reftable``) were recorded with git 2.55 (``make.py``): each
case is a bare repository, the tables of each of its ref states, and C git's own answers
for that state (the v0 advertisement; v2 ls-refs plain, with symrefs and peel, with
prefixes, with unborn). The CI's git cannot read a reftable, so gitspout's answers are
compared with those recordings: byte for byte for ls-refs, line for line (with the
symref capability) for v0, whose other capabilities differ on purpose. The ``churn`` case
moves through its states on one live server, as git does it (new tables first, then
``tables.list`` renamed into place, then the old tables removed): a table appended,
compaction, HEAD moved to an unborn branch. Before this, gitspout read the ``refs/heads``
*file* of a reftable repository as a loose ref and answered with ``this repository uses
the reftable format refs/heads`` and no HEAD.
"""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import Git, LiveServer, fsck, start_server
from rawhttp import DELIM, FLUSH, get_info_refs, parse_pkts, pkt_lines, post_upload_pack

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "reftable"
ANSWERS = json.loads((FIXTURES / "answers.json").read_text())
CASES = ANSWERS["cases"]


def put_state(gitdir: Path, case: str, state: str) -> None:
    """The tables of ``state`` into ``gitdir/reftable`` as git writes them: new tables,
    then tables.list renamed into place, then the tables it no longer names removed."""
    rdir = gitdir / "reftable"
    tables = CASES[case]["states"][state]["tables"]
    for name, data in tables.items():
        if name != "tables.list" and not (rdir / name).exists():
            (rdir / name).write_bytes(bytes.fromhex(data))
    (rdir / "tables.list.lock").write_bytes(bytes.fromhex(tables["tables.list"]))
    os.rename(rdir / "tables.list.lock", rdir / "tables.list")
    for old in rdir.iterdir():
        if old.name not in tables:
            old.unlink()


@pytest.fixture(scope="module")
def rt_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rtroot")
    for case in CASES:
        with tarfile.open(FIXTURES / f"{case}.tar.gz") as tar:
            tar.extractall(root, filter="data")
        put_state(root / f"{case}.git", case, "0")
    return root


@pytest.fixture(scope="module")
def rt_server(rt_root: Path) -> Iterator[LiveServer]:
    srv = start_server(rt_root)
    yield srv
    srv.stop()


def _ls_refs(srv: LiveServer, repo: str, fmt: str, args: list[str]) -> bytes:
    body = pkt_lines("command=ls-refs", f"object-format={fmt}") + DELIM + pkt_lines(*args) + FLUSH
    resp = post_upload_pack(srv.port, body, repo=repo, version=2)
    assert resp.status == 200 and resp.complete, resp.body[:200]
    return resp.body


def _v0_refs(body: bytes) -> tuple[list[bytes], set[bytes]]:
    """The ref lines of a v0 advertisement, and its symref capabilities."""
    lines = [p for p in parse_pkts(body) if p is not None]
    if lines and lines[0].startswith(b"# service="):
        lines = lines[1:]
    refs, caps = [], set()
    for i, line in enumerate(lines):
        if i == 0 and b"\0" in line:
            line, cap_text = line.split(b"\0", 1)
            caps = {c for c in cap_text.split() if c.startswith(b"symref=")}
            line += b"\n"
        refs.append(line)
    return refs, caps


def _check_state(srv: LiveServer, case: str, state: str) -> None:
    fmt = CASES[case]["format"]
    recorded = CASES[case]["states"][state]["answers"]
    for name, args in ANSWERS["ls_refs"].items():
        ours = _ls_refs(srv, f"{case}.git", fmt, args)
        assert ours == bytes.fromhex(recorded[name]), (case, state, name)
    resp = get_info_refs(srv.port, repo=f"{case}.git", version=0)
    assert resp.status == 200
    assert _v0_refs(resp.body) == _v0_refs(bytes.fromhex(recorded["v0"])), (case, state)


@pytest.mark.parametrize("case", sorted(CASES))
def test_answers_equal_c_git(rt_server: LiveServer, case: str) -> None:
    _check_state(rt_server, case, "0")


def test_stack_changes_are_seen(tmp_path: Path) -> None:
    """A table appended (a branch moved, one deleted), compaction into one table, and
    HEAD pointed at an unborn branch, on one live server: each answer is C git's for the
    state it was asked in, never a cached one of an earlier state."""
    with tarfile.open(FIXTURES / "churn.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    gitdir = tmp_path / "churn.git"
    srv = start_server(tmp_path)
    try:
        for state in sorted(CASES["churn"]["states"]):
            put_state(gitdir, "churn", state)
            for _ in range(2):  # read, then from what the server kept
                _check_state(srv, "churn", state)
    finally:
        srv.stop()


@pytest.mark.parametrize("case", ["stack", "sha256"])
def test_clone_of_a_reftable_repository(git: Git, rt_server: LiveServer, rt_root: Path,
                                        tmp_path: Path, case: str) -> None:
    """The real client clones it: the refs C git advertised (hidden ones left out), HEAD
    on main, and fsck-clean."""
    dest = tmp_path / "clone.git"
    git.run("clone", "-q", "--mirror", f"{rt_server.url}/{case}.git", str(dest))
    fsck(git, dest)
    got = git.out("for-each-ref", "--format=%(objectname) %(refname)", cwd=dest).splitlines()
    refs, _ = _v0_refs(bytes.fromhex(CASES[case]["states"]["0"]["answers"]["v0"]))
    wanted = [r.decode().strip() for r in refs if not r.rstrip().endswith(b"^{}")
              and not r.rstrip().endswith(b" HEAD")]
    assert sorted(got) == sorted(wanted)
    assert git.out("symbolic-ref", "HEAD", cwd=dest).strip() == "refs/heads/main"


def test_unreadable_stack_is_refused_then_served_again(rt_root: Path, tmp_path: Path) -> None:
    """A damaged table is refused with a storage error naming the file, and a ref format
    gitspout does not know as a repository it cannot serve (403: C git refuses to open
    it), never read as loose refs; once mended, it serves."""
    with tarfile.open(FIXTURES / "stack.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    gitdir = tmp_path / "stack.git"
    put_state(gitdir, "stack", "0")
    srv = start_server(tmp_path)
    try:
        table = next(p for p in (gitdir / "reftable").iterdir() if p.suffix == ".ref")
        good = table.read_bytes()
        table.chmod(0o644)
        os.replace(table, table.with_suffix(".old"))
        table.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # footer checksum broken
        resp = get_info_refs(srv.port, repo="stack.git", version=2)
        body = _ls_refs_status(srv, "stack.git")
        assert body == 500 and resp.status == 200
        srv.wait_for_line("footer checksum mismatch")
        os.replace(table.with_suffix(".old"), table)
        _check_state(srv, "stack", "0")
        config = gitdir / "config"
        config.write_text(config.read_text().replace("refstorage = reftable",
                                                     "refstorage = someday"))
        assert _ls_refs_status(srv, "stack.git") == 403
        assert get_info_refs(srv.port, repo="stack.git", version=2).status == 403
        srv.wait_for_line("refusing /stack.git: unsupported ref storage format 'someday'")
    finally:
        srv.stop()


def _ls_refs_status(srv: LiveServer, repo: str) -> int:
    body = pkt_lines("command=ls-refs", "object-format=sha1") + DELIM + FLUSH
    return post_upload_pack(srv.port, body, repo=repo, version=2).status


def _packed_lines_of(answer: bytes) -> bytes:
    """C git's ls-refs answer (symrefs, peel) as packed-refs lines: every plain ref, with
    its peeled line; HEAD and symrefs left out (a table keeps them as other records)."""
    out = []
    for line in parse_pkts(answer):
        if line is None:
            continue
        oid, name, *attrs = line.split()
        if name == b"HEAD" or any(a.startswith(b"symref-target:") for a in attrs):
            continue
        out.append(oid + b" " + name + b"\n")
        out += [b"^" + a[7:] + b"\n" for a in attrs if a.startswith(b"peeled:")]
    return b"".join(out)


@pytest.mark.parametrize("segment_bytes", [1, 1000, 1 << 20])
def test_table_cut_into_segments_while_read(monkeypatch: pytest.MonkeyPatch,
                                            segment_bytes: int) -> None:
    """The ``blocks`` table (300 refs in 256-byte blocks), its segments cut as its blocks
    are read, after every block (1), after a few, or once at the end: the refs and peeled
    tags C git lists, in its order, each segment whole lines (hidden refs aside: gitspout
    hides them later, when it answers)."""
    from gitspout.server.store import reftable

    monkeypatch.setattr(reftable, "SEGMENT_BYTES", segment_bytes)
    tables = CASES["blocks"]["states"]["0"]["tables"]
    (name,) = bytes.fromhex(tables["tables.list"]).decode().split()
    table = reftable.parse_table(bytes.fromhex(tables[name]), 20)
    segments = table.packed.segments
    assert (len(segments) == 1) == (segment_bytes == 1 << 20)
    assert not any(seg.raw.startswith(b"^") for seg in segments)  # peeled beside its ref
    raw = b"".join(seg.raw for seg in segments)
    ours = b"".join(ln for ln in raw.splitlines(keepends=True) if b" refs/hidden/" not in ln)
    recorded = bytes.fromhex(CASES["blocks"]["states"]["0"]["answers"]["symrefs-peel"])
    assert ours == _packed_lines_of(recorded)
    assert [r.name for seg in segments for r in seg.refs()] == \
        [ln.split()[1] for ln in raw.splitlines() if not ln.startswith(b"^")]
