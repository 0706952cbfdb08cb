"""Clones and fetches from gitspout equal the same commands against C git over file://."""

from __future__ import annotations

import pytest
from compare import VERSIONS, assert_same, clone_both, fsck, http_url, repo_state

CLONE_REPOS = ["basic.git", "plain.git", "revert.git", "revert-bitmap.git", "multipack.git",
               "sha256.git", "team/app", "manyrefs.git"]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("repo", CLONE_REPOS)
def test_clone(git, server, tmp_path, repo, version):
    ours, theirs = clone_both(git, server, repo, tmp_path, version)
    state = assert_same(git, ours, theirs)
    assert state.objects == repo_state(git, theirs).objects


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("repo", ["basic.git", "plain.git", "hidden.git", "multipack.git"])
@pytest.mark.parametrize("mode", ["--mirror", "--bare"])
def test_clone_mirror_bare(git, server, tmp_path, version, mode, repo):
    ours, theirs = clone_both(git, server, repo, tmp_path, version, mode)
    assert_same(git, ours, theirs)


@pytest.mark.parametrize("version", VERSIONS)
def test_clone_single_branch(git, server, tmp_path, version):
    ours, theirs = clone_both(git, server, "basic.git", tmp_path, version,
                              "--single-branch", "--branch", "feature")
    assert_same(git, ours, theirs)


@pytest.mark.parametrize("version", VERSIONS)
def test_empty_repo_clone(git, server, tmp_path, version):
    ours, theirs = clone_both(git, server, "empty.git", tmp_path, version)
    a, b = repo_state(git, ours), repo_state(git, theirs)
    assert a == b
    assert a.head == "ref: refs/heads/main"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("repo", ["long-plain.git", "long-refdelta.git"])
def test_deep_shallow_clone_of_a_long_history(git, long_server, tmp_path, repo, version):
    """--depth 300 of a 1,500-commit history (a big file's versions stored as one delta
    chain whose root the clone does not get), then deepened by 500: the same commits,
    boundary and objects as over file://, and the packs pass fsck. (Not long.git: C git's
    own v2 shallow clone of it fails, as that one allows ref-in-want.)"""
    ours, theirs = clone_both(git, long_server, repo, tmp_path, version,
                              "--depth", "300", "--no-single-branch")
    state = assert_same(git, ours, theirs)
    assert state.shallow
    assert git.out("rev-list", "--count", "main", cwd=ours).strip() == "300"
    for path in (ours, theirs):
        git.run("-c", f"protocol.version={version}", "fetch", "-q", "--deepen", "500", cwd=path)
    assert_same(git, ours, theirs)
    assert git.out("rev-list", "--count", "main", cwd=ours).strip() == "800"


@pytest.mark.parametrize("version", VERSIONS)
def test_depth_then_deepen(git, server, tmp_path, version):
    ours, theirs = clone_both(git, server, "basic.git", tmp_path, version, "--depth", "1")
    state = assert_same(git, ours, theirs)
    assert state.shallow
    for path in (ours, theirs):
        git.run("-c", f"protocol.version={version}", "fetch", "-q", "--deepen", "3", cwd=path)
    assert_same(git, ours, theirs)
    for path in (ours, theirs):
        git.run("-c", f"protocol.version={version}", "fetch", "-q", "--depth", "5", cwd=path)
    assert_same(git, ours, theirs)
    for path in (ours, theirs):
        git.run("-c", f"protocol.version={version}", "fetch", "-q", "--unshallow", cwd=path)
    final = assert_same(git, ours, theirs, tags=False)
    assert not final.shallow


@pytest.mark.parametrize("version", VERSIONS)
def test_shallow_since(git, server, tmp_path, version):
    # Commit dates in the fixture start at 1600000000 and step one hour.
    ours, theirs = clone_both(git, server, "basic.git", tmp_path, version,
                              "--shallow-since", "1600060000")
    state = assert_same(git, ours, theirs)
    assert state.shallow


@pytest.mark.parametrize("version", VERSIONS)
def test_shallow_exclude(git, server, tmp_path, version):
    ours, theirs = clone_both(git, server, "basic.git", tmp_path, version,
                              "--shallow-exclude", "v1.0")
    state = assert_same(git, ours, theirs)
    assert state.shallow


FILTER_SPECS = [(v, spec) for spec in ["blob:none", "blob:limit=1k", "tree:0", "tree:1",
                                        "object:type=commit", "combine:blob:none+tree:2"]
                for v in VERSIONS]
# Every other filter the bitmaps answer (basic.git) as the walk does (plain.git), over v2.
FILTER_SPECS += [("2", spec) for spec in ["blob:limit=0", "object:type=tree", "object:type=blob",
                                          "object:type=tag", "combine:tree:0+blob:limit=1k",
                                          "combine:blob:limit=1k+object:type=blob",
                                          # a number as C git reads it: hexadecimal (a
                                          # client sends a combine:'s parts as written)
                                          "combine:blob:limit=0x400+tree:3"]]


@pytest.mark.parametrize("repo", ["basic.git", "plain.git"])
@pytest.mark.parametrize(("version", "spec"), FILTER_SPECS)
def test_filtered_clone(git, server, tmp_path, version, spec, repo):
    ours, theirs = clone_both(git, server, repo, tmp_path, version,
                              f"--filter={spec}", "--no-checkout")
    a, b = repo_state(git, ours), repo_state(git, theirs)
    assert a == b
    # The checkout fetches missing blobs lazily, by id, from the promisor remote. C git
    # refuses such wants over v0/v1 unless allowAnySHA1InWant is set, so the file://
    # side uses v2 for that step; gitspout serves them in every version.
    git.run("-c", f"protocol.version={version}", "checkout", "-q", "main", cwd=ours)
    git.run("-c", "protocol.version=2", "checkout", "-q", "main", cwd=theirs)
    a, b = repo_state(git, ours), repo_state(git, theirs)
    assert a.objects == b.objects
    fsck(git, ours)
    assert (ours / "README.md").read_text() == (theirs / "README.md").read_text()


@pytest.mark.parametrize("version", ["0", "2"])
@pytest.mark.parametrize("repo", ["basic.git", "plain.git"])
@pytest.mark.parametrize("spec", ["blob:none", "tree:0", "blob:limit=1k"])
def test_filtered_clone_then_checkout_elsewhere(git, server, tmp_path, version, spec, repo):
    """A partial clone checks out main, then an older commit: each checkout fetches what it
    lacks on demand, by id, through gitspout; the files and the objects present end up as
    over file://, and fsck passes."""
    ours, theirs = clone_both(git, server, repo, tmp_path, version, f"--filter={spec}",
                              "--no-checkout")
    for rev in ("main", "v1.0", "feature"):
        git.run("-c", f"protocol.version={version}", "checkout", "-q", rev, cwd=ours)
        git.run("-c", "protocol.version=2", "checkout", "-q", rev, cwd=theirs)
        assert repo_state(git, ours).objects == repo_state(git, theirs).objects
        for name in ("README.md", "big.bin", "src/mod3.py"):
            assert (ours / name).read_bytes() == (theirs / name).read_bytes()
    fsck(git, ours)


def test_filtered_clone_lazy_fetch_blob_none(git, server, tmp_path):
    ours, _ = clone_both(git, server, "basic.git", tmp_path, "2", "--filter=blob:none")
    blob = git.out("rev-parse", "v1.0:big.bin", cwd=ours).strip()
    git.run("cat-file", "-p", blob, cwd=ours)  # lazy fetch of one old blob
    fsck(git, ours)


@pytest.mark.parametrize("version", VERSIONS)
def test_push_is_refused(git, server, tmp_path, version):
    work = tmp_path / "w"
    git.run("clone", "-q", http_url(server, "basic.git"), str(work))
    git.run("commit", "-q", "--allow-empty", "-m", "x", cwd=work)
    proc = git.run("-c", f"protocol.version={version}", "push", "origin", "main",
                   cwd=work, check=False)
    assert proc.returncode != 0
    assert b"403" in proc.stderr or b"read-only" in proc.stderr


def _pack_kib(git, path) -> int:  # type: ignore[no-untyped-def]
    out = dict(line.split(": ") for line in git.out("count-objects", "-v", cwd=path).splitlines())
    assert out["count"] == "0"  # nothing unpacked: the pack is as it was sent
    return int(out["size-pack"])


@pytest.mark.parametrize("version", ["0", "2"])
def test_depth1_of_many_branches_deltifies_what_lost_its_base(git, server, tmp_path, version):
    """A --depth 1 clone of every branch, where each branch's version of a big file is
    stored as a delta against an older version the clone does not get: those are sent as
    new deltas against another tip's version (packgen/delta.py), not whole. The same
    objects as over file://, fsck-clean, and a pack near the size of C git's (whole, it is
    several times that)."""
    import random
    import shutil
    import uuid

    name = f"branches-{uuid.uuid4().hex[:8]}.git"
    work = tmp_path / "work"
    git.run("init", "-q", "-b", "main", str(work))
    rng = random.Random(7)
    lines = [f"{i:05d} {rng.getrandbits(128):032x}\n" for i in range(3000)]
    f = work / "big.txt"

    def commit(msg: str) -> None:
        f.write_text("".join(lines))
        git.run("add", "big.txt", cwd=work)
        git.run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", msg, cwd=work)

    history = []
    for v in range(12):  # main's history, growing: the versions the topics' are stored
        lines += [f"main {v} {rng.getrandbits(64):016x}\n" for _ in range(40)]  # against
        commit(f"main {v}")
        history.append(list(lines))
    for b in range(6):  # each a smaller version of an older main's (git deltifies it)
        git.run("checkout", "-q", "-b", f"topic{b}", f"main~{2 + b}", cwd=work)
        lines = history[-3 - b]
        for _ in range(3):
            del lines[rng.randrange(len(lines))]
        commit(f"topic {b}")
        git.run("checkout", "-q", "main", cwd=work)
    # main's tip drops the file: the largest version, which git makes the base of the
    # others, is then main~1's, not sent.
    (work / "small.txt").write_text("x\n")
    git.run("add", "small.txt", cwd=work)
    git.run("rm", "-q", "big.txt", cwd=work)
    git.run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "drop", cwd=work)
    bare = server.root / name
    git.run("clone", "-q", "--bare", "--no-local", str(work), str(bare))
    git.run("repack", "-adfq", "--window=50", "--depth=50", cwd=bare)
    try:
        ours, theirs = clone_both(git, server, name, tmp_path, version, "--depth", "1",
                                  "--no-single-branch", "--config", "fetch.unpackLimit=1")
        state = assert_same(git, ours, theirs)
        assert state.shallow
        whole = 6 * len("".join(lines)) // 2 // 1024  # the topics' versions, deflated (hex)
        assert _pack_kib(git, ours) < min(2 * _pack_kib(git, theirs) + 8, whole // 2)
    finally:
        shutil.rmtree(bare, ignore_errors=True)
