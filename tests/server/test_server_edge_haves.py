"""No more than C git sends when the client's haves are off the wanted commits' first-parent
line. Each answer is compared with C git's upload-pack for the same request (v0 and v2).

* **An orphan branch holding the client's files.** A commit walked against no tree the
  client has (a root: an orphan branch, an imported history) sent every file it holds,
  also those the client has at the same path. pack-objects' sparse walk compares the
  trees of every commit sent with the client's edge trees path by path
  (revision.c ``mark_trees_uninteresting_sparse``): ``want main, want orph, have H``
  got 6 objects from C git and 27 from gitspout.
* **A have dated older than its parents** (clock skew). The walk of what the client has
  stopped when the skewed have was taken, before its parents (newer) were queued:
  revision.c ``limit_list`` queues the parents first, then asks whether to go on. The
  merge of ``side`` into main was never reached, so ``want side, have m5, have skewed``
  sent side's three commits with their files; C git sends nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import Committer, Git, LiveServer, fsck, objects_received, start_server
from packutil import c_git_v2_answer, pack_bytes, pack_object_ids
from rawhttp import DELIM, FLUSH, pkt_lines, post_upload_pack

FILES = {f"lib/mod{i}.py": f"module {i}\n" * (20 + i) for i in range(12)}
FILES.update({f"doc/page{i}.md": f"page {i}\n" * 30 for i in range(8)})


@pytest.fixture(scope="module")
def eh_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    root = tmp_path_factory.mktemp("ehroot")
    work = tmp_path_factory.mktemp("ehwork")
    _orphan_work(git, work / "orphan")
    _skew_work(git, work / "skew")
    for name in ("orphan", "skew"):
        for bitmaps in (False, True):
            repo = root / f"{name}-{'bitmap' if bitmaps else 'plain'}.git"
            git.run("clone", "-q", "--bare", "--no-local", "--mirror", str(work / name), str(repo))
            git.run("-c", f"repack.writeBitmaps={str(bitmaps).lower()}", "repack", "-adq",
                    cwd=repo)
    return root


def _orphan_work(git: Git, work: Path) -> None:
    """main: base -> H -> H2; orph: a root holding base's files, one of them changed in a
    subdirectory, and one new file, dated before H (walked first, oldest first)."""
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work, start=1_650_000_000)
    c.commit(FILES, "base")
    git.run("checkout", "-q", "--orphan", "orph", cwd=work)
    c.commit({"lib/mod3.py": "module 3, rewritten on the orphan branch\n",
              "ORPHAN.md": "a history of its own\n"}, "orphan root")
    git.run("checkout", "-q", "-f", "main", cwd=work)
    git.run("clean", "-qfd", cwd=work)
    c.commit({"notes/n1.txt": "first note\n"}, "H")
    c.commit({"notes/n2.txt": "second note\n"}, "H2")


def _skew_work(git: Git, work: Path) -> None:
    """c1..c3; side s1..s3 from c3; main m4, m5, the merge of side, m6, m7; then a commit
    on main dated before every other."""
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work, start=1_650_000_000)
    for n in range(1, 4):
        c.commit({"a.txt": f"c{n}\n" * 10}, f"c{n}", step=86400)
    git.run("checkout", "-q", "-b", "side", cwd=work)
    for n in range(1, 4):
        c.commit({f"side/s{n}.txt": f"s{n}\n" * 10}, f"s{n}", step=86400)
    git.run("checkout", "-q", "main", cwd=work)
    for n in (4, 5):
        c.commit({"a.txt": f"m{n}\n" * 10}, f"m{n}", step=86400)
    c.when += 86400
    date = f"{c.when} +0000"
    git.run("merge", "-q", "--no-ff", "-m", "merge side", "side", cwd=work,
            env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date})
    for n in (6, 7):
        c.commit({"a.txt": f"m{n}\n" * 10}, f"m{n}", step=86400)
    c.commit({"b.txt": "skewed\n"}, "skewed", step=-30 * 86400)


@pytest.fixture(scope="module")
def eh_server(eh_root: Path) -> Iterator[LiveServer]:
    srv = start_server(eh_root)
    yield srv
    srv.stop()


def _body(version: int, wants: list[str], haves: list[str]) -> bytes:
    if version == 2:
        args = [f"want {w}" for w in wants] + [f"have {h}" for h in haves]
        return (pkt_lines("command=fetch", "object-format=sha1") + DELIM
                + pkt_lines(*args, "ofs-delta", "no-progress", "done") + FLUSH)
    first = f"want {wants[0]} multi_ack_detailed side-band-64k ofs-delta no-progress"
    return (pkt_lines(first, *(f"want {w}" for w in wants[1:])) + FLUSH
            + pkt_lines(*(f"have {h}" for h in haves), "done"))


CASES = {
    # name: (repository, wants, haves) as revisions
    "orphan branch": ("orphan", ["main", "orph"], ["main~1"]),
    "orphan branch alone": ("orphan", ["orph"], ["main~1"]),
    # main~4 is m5, before the merge; main is the skewed commit, after it
    "skewed have": ("skew", ["side"], ["main~4", "main"]),
    "skewed have, skewed first": ("skew", ["side"], ["main", "main~4"]),
}


@pytest.mark.parametrize("kind", ["plain", "bitmap"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("version", [0, 2])
def test_sends_what_c_git_sends(git: Git, eh_server: LiveServer, eh_root: Path,
                                case: str, kind: str, version: int) -> None:
    name, want_revs, have_revs = CASES[case]
    repo = f"{name}-{kind}.git"
    gitdir = eh_root / repo
    wants, haves = ([git.out("rev-parse", r, cwd=gitdir).strip() for r in revs]
                    for revs in (want_revs, have_revs))
    body = _body(version, wants, haves)
    if version == 2:
        theirs = c_git_v2_answer(git, gitdir, body).stdout
    else:
        theirs = git.run("upload-pack", "--stateless-rpc", str(gitdir), input=body,
                         check=False).stdout
    resp = post_upload_pack(eh_server.port, body, repo=repo, version=version)
    assert resp.status == 200 and resp.complete
    ours_pack, c_git_pack = pack_bytes(resp.body), pack_bytes(theirs)
    assert ours_pack is not None and c_git_pack is not None
    ours, c_git = pack_object_ids(git, ours_pack), pack_object_ids(git, c_git_pack)
    assert ours == c_git, (f"{len(ours)} objects, C git {len(c_git)}; "
                           f"{len(ours - c_git)} more, {len(c_git - ours)} fewer")
    if case.startswith("skewed"):
        assert ours == set(), "the client has side: the merge is under its have"


@pytest.mark.parametrize("version", [0, 2])
def test_real_fetch_of_an_orphan_branch(git: Git, eh_server: LiveServer, eh_root: Path,
                                        tmp_path: Path, version: int) -> None:
    """A client at H fetches main and the orphan branch: fsck-clean, the same refs, and a
    pack of no more objects than over file://."""
    received, tips = {}, {}
    for where, url in (("http", f"{eh_server.url}/orphan-plain.git"),
                       ("file", f"file://{eh_root / 'orphan-plain.git'}")):
        dest = tmp_path / where
        git.run("clone", "-q", "--bare", "--single-branch", "--branch", "main", url, str(dest))
        git.run("update-ref", "refs/heads/main", "main~1", cwd=dest)
        git.run("reflog", "expire", "--expire=now", "--all", cwd=dest)
        git.run("gc", "-q", "--prune=now", cwd=dest)
        received[where] = objects_received(
            git, ["-c", f"protocol.version={version}", "fetch", "-q", "origin",
                  "main:main", "orph:orph"], dest, tmp_path / f"{where}.pack")
        tips[where] = git.out("for-each-ref", "--format=%(objectname) %(refname)", cwd=dest)
        fsck(git, dest)
    assert tips["http"] == tips["file"]
    assert 0 < received["http"] <= received["file"], received
