"""Histories with clock skew (a commit dated before its parent): the date-ordered walk
must pass "uninteresting" on to commits it already walked as interesting, as revision.c
does, or a fetch sends history the client has and ``deepen-not`` (``--shallow-exclude``)
sends shallow lines for commits it does not send.

Every request is answered by gitspout and by C git's own upload-pack
(``--stateless-rpc``, the ground truth); without bitmaps (the walk), the packs must hold
the same objects and the shallow-info the same lines.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import Git, LiveServer, start_server
from packutil import c_git_v2_answer, shallow_info_and_objects
from rawhttp import DELIM, FLUSH, pkt_lines, post_upload_pack


def _linear(n: int = 50) -> str:
    """c0..c49 an hour apart, c49 dated an hour before c48; ``feature``: one commit on c48."""
    out = []
    for i in range(n):
        t = 1_600_000_000 + 3600 * (i if i < n - 1 else i - 2)
        out.append(f"commit refs/heads/main\nmark :{i + 1}\ncommitter a <a@a> {t} +0000\n"
                   f"data 3\nc{i}\n" + (f"from :{i}\n" if i else "")
                   + f"M 100644 inline f{i % 5}\ndata 6\nv{i:04d}\n")
    t = 1_600_000_000 + 3600 * (n + 1)
    out.append(f"commit refs/heads/feature\nmark :{n + 1}\ncommitter a <a@a> {t} +0000\n"
               f"data 3\nnew\nfrom :{n - 1}\nM 100644 inline f0\ndata 4\nnew\n")
    out.append(f"reset refs/tags/c48\nfrom :{n - 1}\n")
    return "".join(out)


def _dag(seed: int = 7, n: int = 40) -> str:
    """40 commits on three branches, with merges, some dated 5,000 s early or 3,000 late."""
    rnd = random.Random(seed)
    out: list[str] = []
    heads: list[int] = []
    for i in range(n):
        mark = i + 1
        t = 1_600_000_000 + i * 1000 + rnd.choice([0, 0, 0, -5000, 3000])
        parents: list[int] = []
        if heads:
            parents.append(rnd.choice(heads[-4:]))
            if rnd.random() < 0.3 and len(heads) > 2:
                other = rnd.choice(heads[:-1])
                if other not in parents:
                    parents.append(other)
        out.append(f"commit refs/heads/b{i % 3}\nmark :{mark}\ncommitter a <a@a> {t} +0000\n"
                   f"data 3\nc{i}\n")
        if parents:
            out.append(f"from :{parents[0]}\n" + "".join(f"merge :{p}\n" for p in parents[1:]))
        out.append(f"M 100644 inline f{i % 7}\ndata {len(str(i)) + 8}\ncontent {i}\n")
        heads.append(mark)
    out.append(f"reset refs/heads/main\nfrom :{heads[-1]}\n")
    out.append(f"reset refs/tags/t10\nfrom :{heads[10]}\nreset refs/tags/t25\nfrom :{heads[25]}\n")
    return "".join(out)


@pytest.fixture(scope="module")
def skew_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    root = tmp_path_factory.mktemp("skewroot")
    for name, stream in (("linear.git", _linear()), ("dag.git", _dag())):
        repo = root / name
        git.run("init", "-q", "--bare", str(repo))
        git.run("fast-import", "--quiet", cwd=repo, input=stream.encode())
        git.run("symbolic-ref", "HEAD", "refs/heads/main", cwd=repo)
        git.run("-c", "repack.writeBitmaps=false", "repack", "-adq", cwd=repo)
    return root


@pytest.fixture(scope="module")
def skew_server(skew_root: Path) -> Iterator[LiveServer]:
    srv = start_server(skew_root)
    yield srv
    srv.stop()


def _both(git: Git, srv: LiveServer, root: Path, repo: str, args: list[str]
          ) -> tuple[tuple[list[str], set[str]], tuple[list[str], set[str]]]:
    body = pkt_lines("command=fetch", "object-format=sha1") + DELIM + \
        pkt_lines(*args, "ofs-delta", "no-progress", "done") + FLUSH
    ours = post_upload_pack(srv.port, body, repo=repo, version=2)
    theirs = c_git_v2_answer(git, root / repo, body)
    if theirs.returncode:  # C git dies (deepen-not leaving no commit): so do we
        refused = "no commits selected for shallow requests"
        assert refused.encode() in theirs.stderr and refused.encode() in ours.body, ours.body[:200]
        return ([refused], set()), ([refused], set())
    assert ours.status == 200 and ours.complete
    return shallow_info_and_objects(git, ours.body), shallow_info_and_objects(git, theirs.stdout)


def _rev(git: Git, root: Path, repo: str, name: str) -> str:
    return git.out("rev-parse", name, cwd=root / repo).strip()


def test_a_have_dated_before_its_parent(git: Git, skew_server: LiveServer,
                                        skew_root: Path) -> None:
    """The client has main (c49, dated before c48): fetching feature (on c48) is one
    commit, and c48 itself nothing, not the 48 commits under it."""
    main, feature, c48 = (_rev(git, skew_root, "linear.git", n)
                          for n in ("main", "feature", "c48"))
    ours, theirs = _both(git, skew_server, skew_root, "linear.git",
                         [f"want {feature}", f"have {main}"])
    assert ours == theirs and len(ours[1]) == 3  # commit, tree, blob
    ours, theirs = _both(git, skew_server, skew_root, "linear.git",
                         [f"want {c48}", f"have {main}"])
    assert ours == theirs == ([], set())


TIPS = ["b0", "b1", "b2", "main", "t10", "t25"]


@pytest.mark.parametrize("want", TIPS)
def test_fetches_and_deepen_not_on_a_skewed_dag(git: Git, skew_server: LiveServer,
                                                skew_root: Path, want: str) -> None:
    """Every pair of tips: ``want X`` with ``have Y``, and ``want X`` with
    ``deepen-not Y``, give C git's objects and shallow lines."""
    w = _rev(git, skew_root, "dag.git", want)
    for other in TIPS:
        if other == want:
            continue
        o = _rev(git, skew_root, "dag.git", other)
        ours, theirs = _both(git, skew_server, skew_root, "dag.git", [f"want {w}", f"have {o}"])
        assert ours == theirs, (want, "have", other)
        ref = f"refs/tags/{other}" if other.startswith("t") else f"refs/heads/{other}"
        ours, theirs = _both(git, skew_server, skew_root, "dag.git",
                             [f"want {w}", f"deepen-not {ref}"])
        assert ours == theirs, (want, "deepen-not", other)
