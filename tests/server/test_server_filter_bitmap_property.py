"""Property: a filtered fetch gives the same objects from the bitmaps as from the walk.

Random histories (merges, root commits, annotated tags on commits, trees and blobs, files of
many sizes), bitmapped in one pack with later commits in a second pack outside the bitmap;
random requests: wants (refs, tags, a tree or a blob named by id as a lazy fetch does), haves,
include-tag, and every filter the bitmaps answer (combine: too). Both packs are indexed by
C git, so the verdict rests on the bytes sent, not on our own lists.

Without haves the two paths send exactly the same objects. With haves the bitmap path knows
the client's whole closure and the walk only the boundary's trees (git's walk is the same),
so the bitmap set is a subset of the walk's, and whatever it leaves out the client has.
"""

from __future__ import annotations

import itertools
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from dags import draw_parents
from gitspout.protocol.fetch_request import parse_v2_fetch_args
from gitspout.server.app.config import load_config
from gitspout.server.app.metrics import RequestRecord
from gitspout.server.app.state import ServerState
from gitspout.server.core import answers
from gitspout.server.core.fetch import plan_fetch
from gitspout.server.graph.bitmapwalk import open_bitmap_index
from gitspout.server.packgen import choose, layout, reuse, sources
from gitutil import Git, LiveServer, fsck, repo_state
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from packutil import pack_object_ids
from rawhttp import parse_pkts, post_upload_pack, v2_command

START = 1_660_000_000
FILTERS = ["blob:none", "blob:limit=0", "blob:limit=60", "blob:limit=200", "tree:0", "object:type=commit",
           "object:type=tree", "object:type=blob", "object:type=tag",
           "combine:blob:none+object:type=tree", "combine:tree:0+blob:limit=60",
           "combine:blob:limit=200+object:type=blob"]
_names = itertools.count()


@dataclass(frozen=True)
class History:
    parents: tuple[tuple[int, ...], ...]
    files: tuple[tuple[tuple[str, int], ...], ...]  # per commit: (path, size seed) changes
    tags: tuple[tuple[int, str], ...]               # (commit, "commit" | "tree" | "blob")
    split: int                                      # commits from here on: outside the bitmap


@st.composite
def histories(draw: st.DrawFn) -> History:
    parents = draw_parents(draw, 2, 9)
    n = len(parents)
    paths = st.sampled_from(["a.txt", "b.bin", "d/c.txt", "d/e/f.txt", "g/h.txt"])
    change = st.tuples(paths, st.integers(0, 12))
    files = tuple(tuple(draw(st.lists(change, min_size=1, max_size=3))) for _ in range(n))
    tags = tuple(draw(st.lists(st.tuples(st.integers(0, n - 1),
                                         st.sampled_from(["commit", "commit", "tree", "blob"])),
                               max_size=3)))
    return History(parents, files, tags, draw(st.integers(1, n)))


@dataclass(frozen=True)
class Ask:
    wants: tuple[int, ...]      # indexes into the repository's refs, then its direct ids
    haves: tuple[int, ...]      # commits
    filter: str
    include_tag: bool


asks = st.builds(
    Ask,
    wants=st.lists(st.integers(0, 30), min_size=1, max_size=3, unique=True).map(tuple),
    haves=st.one_of(st.just(()), st.lists(st.integers(0, 8), max_size=2, unique=True).map(tuple)),
    filter=st.sampled_from(FILTERS),
    include_tag=st.booleans(),
)


def _content(path: str, seed: int) -> bytes:
    # Sizes from a few bytes to a few hundred, so blob:limit cuts somewhere; similar
    # versions of one path, so the packs hold deltas whose bases the filters leave out.
    return b"".join(b"%s line %d\n" % (path.encode(), k) for k in range(seed * seed + 1))


def _fast_import(h: History, first: int, last: int) -> bytes:
    out = []
    for i in range(first, last):
        when = START + 3600 * i
        out.append(f"commit refs/tmp/c{i}\nmark :{i + 1}\n"
                   f"committer T <t@example.com> {when} +0000\ndata 3\nc{i}\n".encode())
        if h.parents[i]:
            out.append(f"from {_ref(h.parents[i][0], first)}\n".encode())
            for p in h.parents[i][1:]:
                out.append(f"merge {_ref(p, first)}\n".encode())
        for path, seed in h.files[i]:
            data = _content(path, seed)
            out.append(f"M 100644 inline {path}\ndata {len(data)}\n".encode() + data + b"\n")
    return b"".join(out)


def _ref(commit: int, first: int) -> str:
    return f":{commit + 1}" if commit >= first else f"refs/tmp/c{commit}"


def _build(git: Git, root: Path, h: History) -> Path:
    gitdir = root / f"fb-{next(_names)}.git"
    git.run("init", "-q", "--bare", str(gitdir))
    n = len(h.parents)
    git.run("fast-import", "--quiet", cwd=gitdir, input=_fast_import(h, 0, h.split))
    git.run("repack", "-adqb", cwd=gitdir)
    if h.split < n:  # a second pack, outside the bitmap
        git.run("fast-import", "--quiet", cwd=gitdir, input=_fast_import(h, h.split, n))
    ids = git.out("rev-parse", *[f"refs/tmp/c{i}" for i in range(n)], cwd=gitdir).split()
    updates = [f"delete refs/tmp/c{i}" for i in range(n)]
    updates += [f"create refs/heads/b{i} {oid}" for i, oid in enumerate(ids)
                if not any(i in ps for ps in h.parents)]
    git.run("update-ref", "--stdin", cwd=gitdir, input=("\n".join(updates) + "\n").encode())
    for k, (c, kind) in enumerate(h.tags):
        target = {"commit": ids[c], "tree": f"{ids[c]}^{{tree}}",
                  "blob": f"{ids[c]}:{h.files[c][0][0]}"}[kind]
        git.run("tag", "-a", "-m", f"tag {k}", f"t{k}", target, cwd=gitdir)
    head = next(i for i in range(n) if not any(i in ps for ps in h.parents))
    (gitdir / "HEAD").write_text(f"ref: refs/heads/b{head}\n")
    return gitdir


def _request_lines(git: Git, gitdir: Path, ask: Ask) -> tuple[list[bytes], bool]:
    refs = git.out("for-each-ref", "--format=%(objectname)", cwd=gitdir).split()
    typed = [line.split() for line in git.out(
        "cat-file", "--batch-all-objects", "--batch-check=%(objectname) %(objecttype)",
        cwd=gitdir).splitlines()]
    reachable = {line.split()[0] for line in git.out("rev-list", "--objects", "--all",
                                                     cwd=gitdir).splitlines()}
    commits = [oid for oid, kind in typed if kind == "commit" and oid in reachable]
    direct = [oid for oid, kind in typed if kind in ("tree", "blob") and oid in reachable]
    choices = refs + direct
    wants = list(dict.fromkeys(choices[w % len(choices)] for w in ask.wants))
    haves = [commits[x % len(commits)] for x in ask.haves]
    lines = [b"want " + w.encode() for w in wants] + [b"have " + h.encode() for h in haves]
    lines.append(b"filter " + ask.filter.encode())
    if ask.include_tag:
        lines.append(b"include-tag")
    return lines + [b"ofs-delta", b"no-progress", b"done"], bool(haves)


def _pack(source: sources.PackSource | None) -> bytes:
    assert source is not None
    return b"".join(c for c in source.chunks() if isinstance(c, (bytes, bytearray, memoryview)))


def _closure(git: Git, gitdir: Path, haves: list[str]) -> set[str]:
    if not haves:
        return set()
    out = git.out("rev-list", "--objects", *haves, cwd=gitdir)
    return {line.split()[0] for line in out.splitlines()}


def _closure_and_its_tags(git: Git, gitdir: Path, haves: list[str]) -> set[str]:
    """What the walk may send beyond the bitmaps: the haves' closure (the bitmaps subtract
    all of it; a walk, as git's without bitmaps, only the haves' own trees), and the
    annotated tags include-tag adds for such an object (a tag of a tree the walk sent
    because it did not know the client had it: git's two paths differ the same way)."""
    closure = _closure(git, gitdir, haves)
    tags = git.out("for-each-ref", "--format=%(objectname) %(*objectname)", "refs/tags",
                   cwd=gitdir).split("\n")
    return closure | {t.split()[0] for t in tags if len(t.split()) == 2 and t.split()[1] in closure}


@pytest.fixture(scope="module")
def fb_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fbroot")


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(h=histories(), ask=asks, window=st.sampled_from([64, 300, 4 << 20]))
# Small versions of two paths stored as deltas against large ones blob:limit drops: they are
# written whole, one after the other.
@example(h=History(((), (0,), (1,)), ((("a.txt", 12), ("b.bin", 12)), (("a.txt", 3), ("b.bin", 3)),
                                       (("a.txt", 2), ("b.bin", 2))), (), 3),
         ask=Ask((0,), (), "blob:limit=200", False), window=4 << 20)
# A want that is a tree of a commit the client has, tagged: the walk sends the tree, and
# include-tag its tag; the bitmaps know the client has the tree, and send neither.
@example(h=History(((), (0,), (1,), (2,), (), (0,)),
                   ((("b.bin", 0),), (("a.txt", 2), ("d/c.txt", 7)), (("a.txt", 3), ("d/c.txt", 4)),
                    (("a.txt", 4), ("b.bin", 1)), (("d/c.txt", 1),), (("a.txt", 0), ("d/c.txt", 0))),
                   ((0, "commit"), (0, "commit"), (2, "tree")), 1),
         ask=Ask((25,), (0,), "blob:none", True), window=64)
def test_bitmap_and_walk_send_the_same_objects(git: Git, fb_root: Path, h: History,
                                               ask: Ask, window: int) -> None:
    gitdir = _build(git, fb_root, h)
    # Small read windows: entries and segments straddle them, or are larger than one.
    saved = layout.WINDOW, reuse.READ_WINDOW
    layout.WINDOW = reuse.READ_WINDOW = window
    try:
        lines, with_haves = _request_lines(git, gitdir, ask)
        state = ServerState.create(load_config({"root": str(fb_root)}, env={}))
        ctx = state.view(state.scope(RequestRecord()), state.resolver.resolve(gitdir.name))
        req = parse_v2_fetch_args(lines, answers.v2_features(ctx), ctx.hash_len * 2)
        plan = plan_fetch(ctx, req)
        bi = open_bitmap_index(ctx.src)
        assert bi is not None
        assert plan.order is not None
        walked = pack_object_ids(git, _pack(choose._from_walk(plan.order, ctx.objects())))
        from_bitmaps = pack_object_ids(git, _pack(choose._from_bitmaps(plan.order, ctx.objects(),
                                                                      bi)))
        if not with_haves:
            assert from_bitmaps == walked, (sorted(from_bitmaps - walked), sorted(walked - from_bitmaps))
        else:
            haves = [line[5:].decode() for line in lines if line.startswith(b"have ")]
            assert from_bitmaps <= walked, sorted(from_bitmaps - walked)
            assert walked - from_bitmaps <= _closure_and_its_tags(git, gitdir, haves)
    finally:
        layout.WINDOW, reuse.READ_WINDOW = saved
        shutil.rmtree(gitdir, ignore_errors=True)


@pytest.mark.parametrize("version", ["0", "2"])
def test_blobless_closure_answers_no_blob_question(git: Git, server: LiveServer, tmp_path: Path,
                                                   version: str) -> None:
    """A blob:none clone of commits outside the bitmap keeps a closure without their blobs
    (bitmapwalk.TREES). Right after it, by the same tips, object-info and a lazy fetch ask
    about such blobs: they are answered from the whole closure, not that one."""
    name = "revert-bitmap.git"
    repo = server.root / name
    ours, theirs = tmp_path / "ours.git", tmp_path / "theirs.git"
    for url, dest in ((f"{server.url}/{name}", ours), (f"file://{repo}", theirs)):
        git.run("-c", f"protocol.version={version}", "clone", "-q", "--mirror",
                "--filter=blob:none", url, str(dest))
    assert repo_state(git, ours).objects == repo_state(git, theirs).objects
    blobs = [git.out("rev-parse", path, cwd=repo).strip()
             for path in ("main:e/z.txt", "main~2:d/y.txt")]  # added after the bitmap
    body = v2_command("object-info", args=("size", *(f"oid {b}" for b in blobs)))
    resp = post_upload_pack(server.port, body, repo=name, version=2)
    assert resp.status == 200 and resp.complete
    sizes = [p.decode().split(" ") for p in parse_pkts(resp.body)[1:-1] if p is not None]
    assert sizes == [[b, git.out("cat-file", "-s", b, cwd=repo).strip()] for b in blobs]
    for blob in blobs:  # lazy fetches, by id
        text = git.out("-c", f"protocol.version={version}", "cat-file", "-p", blob, cwd=ours)
        assert text == git.out("cat-file", "-p", blob, cwd=repo)
    fsck(git, ours)
