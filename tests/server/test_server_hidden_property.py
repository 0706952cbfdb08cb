"""Property: whatever a client asks, no object reachable only from hidden refs is ever sent.

Random histories (merges, root commits, bitmapped or loose), random visible and hidden refs,
and random requests: wants, haves, client ``shallow`` lines naming any commit (hidden ones
included), every deepen form, filters, protocol v0 and v2. Each response is either a refusal
or a pack, and the pack, indexed by C git, holds nothing from the hidden-only set.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from dags import draw_parents
from gitutil import Git, LiveServer, start_server
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from packutil import InBandError, hidden_only_objects, pack_bytes, pack_object_ids
from rawhttp import FLUSH, pkt_lines, post_upload_pack, v2_command

START = 1_650_000_000
_names = itertools.count()


@dataclass(frozen=True)
class History:
    parents: tuple[tuple[int, ...], ...]   # per commit, indexes of earlier commits
    files: tuple[tuple[str, int], ...]      # per commit, one (path, content seed) change
    visible: tuple[int, ...]                # commits with a visible branch
    hidden: tuple[int, ...]                 # commits with a hidden ref
    layout: str                             # "bitmap", "pack" or "loose"


def _closure(parents: Sequence[tuple[int, ...]], tips: tuple[int, ...]) -> set[int]:
    seen: set[int] = set()
    stack = list(tips)
    while stack:
        c = stack.pop()
        if c not in seen:
            seen.add(c)
            stack.extend(parents[c])
    return seen


@st.composite
def histories(draw: st.DrawFn) -> History:
    parents = draw_parents(draw, 2, 10)
    n = len(parents)
    paths = ["a.txt", "b.txt", "d/c.txt", "d/e/f.txt"]
    files = tuple((draw(st.sampled_from(paths)), draw(st.integers(0, 5))) for _ in range(n))
    commits = st.integers(0, n - 1)
    visible = tuple(draw(st.lists(commits, min_size=1, max_size=3, unique=True)))
    # Hidden refs lean towards commits that the visible refs do not reach and whose parent
    # they do not reach either: those are the ones a leak would give away.
    public = _closure(parents, visible)
    secret = [c for c in range(n) if c not in public and any(p not in public for p in parents[c])]
    pick = st.one_of(st.sampled_from(secret), commits) if secret else commits
    hidden = tuple(draw(st.lists(pick, min_size=1, max_size=3, unique=True)))
    layout = draw(st.sampled_from(["bitmap", "pack", "loose"]))
    return History(parents, files, visible, hidden, layout)


@dataclass(frozen=True)
class Ask:
    version: int
    wants: tuple[int, ...]          # indexes into History.visible
    haves: tuple[int, ...]          # any commits
    shallows: tuple[int, ...]       # any commits; negative: the tips of hidden refs
    deepen: str                     # "", "deepen N", "relative N", "since K", "infinite"
    filter: str                     # "" or a filter spec


asks = st.builds(
    Ask,
    version=st.sampled_from([0, 2]),
    wants=st.lists(st.integers(0, 2), min_size=1, max_size=2, unique=True).map(tuple),
    haves=st.lists(st.integers(0, 9), max_size=3, unique=True).map(tuple),
    shallows=st.lists(st.one_of(st.integers(-3, -1), st.integers(0, 9)), max_size=4,
                      unique=True).map(tuple),
    # The forms that unshallow (infinite, relative) are drawn twice as often as the others.
    deepen=st.one_of(st.just(""), st.just("infinite"), st.just("infinite"),
                     st.integers(1, 3).map(lambda d: f"relative {d}"),
                     st.integers(1, 3).map(lambda d: f"relative {d}"),
                     st.integers(1, 4).map(lambda d: f"deepen {d}"),
                     st.integers(0, 9).map(lambda k: f"since {k}")),
    filter=st.sampled_from(["", "blob:none", "tree:0", "blob:limit=3", "object:type=commit"]),
)


def _fast_import(h: History) -> bytes:
    out = []
    for i, (parents, (path, seed)) in enumerate(zip(h.parents, h.files, strict=True)):
        content = f"content {seed} of {path}\n".encode() * (seed + 1)
        when = START + 3600 * i
        out.append(f"commit refs/tmp/c{i}\nmark :{i + 1}\n"
                   f"committer T <t@example.com> {when} +0000\ndata 3\nc{i}\n".encode())
        if parents:
            out.append(f"from :{parents[0] + 1}\n".encode())
            for p in parents[1:]:
                out.append(f"merge :{p + 1}\n".encode())
        out.append(f"M 100644 inline {path}\ndata {len(content)}\n".encode() + content + b"\n")
    return b"".join(out)


def _build(git: Git, root: Path, h: History) -> tuple[Path, list[str]]:
    gitdir = root / f"prop-{next(_names)}.git"
    git.run("init", "-q", "--bare", str(gitdir))
    git.run("fast-import", "--quiet", cwd=gitdir, input=_fast_import(h))
    ids = [git.out("rev-parse", f"refs/tmp/c{i}", cwd=gitdir).strip() for i in range(len(h.parents))]
    updates = [f"delete refs/tmp/c{i}" for i in range(len(ids))]
    updates += [f"create refs/heads/v{i} {ids[i]}" for i in h.visible]
    updates += [f"create refs/hidden/h{i} {ids[i]}" for i in h.hidden]
    git.run("update-ref", "--stdin", cwd=gitdir, input=("\n".join(updates) + "\n").encode())
    git.run("symbolic-ref", "HEAD", f"refs/heads/v{h.visible[0]}", cwd=gitdir)
    git.run("config", "uploadpack.hideRefs", "refs/hidden", cwd=gitdir)
    if h.layout == "bitmap":
        # Bitmaps over every ref, hidden ones included: the bitmap path must mask them out.
        git.run("repack", "-adqb", cwd=gitdir)
        git.run("commit-graph", "write", "--reachable", cwd=gitdir)
    elif h.layout == "pack":
        git.run("-c", "repack.writeBitmaps=false", "repack", "-adq", cwd=gitdir)
    return gitdir, ids


def _request(h: History, ids: list[str], ask: Ask) -> bytes:
    tips = [ids[h.visible[w % len(h.visible)]] for w in ask.wants]
    wants = list(dict.fromkeys(tips))
    lines = []
    for s in ask.shallows:
        at = h.hidden[(-s - 1) % len(h.hidden)] if s < 0 else s % len(ids)
        lines.append(f"shallow {ids[at]}")
    caps = ["ofs-delta", "no-progress"]
    kind, _, arg = ask.deepen.partition(" ")
    if kind == "infinite":
        lines.append("deepen 2147483647")
    elif kind == "deepen":
        lines.append(f"deepen {arg}")
    elif kind == "relative":
        lines.append(f"deepen {arg}")
        caps.append("deepen-relative")
    elif kind == "since":
        lines.append(f"deepen-since {START + 3600 * (int(arg) % len(ids))}")
        caps.append("deepen-since")
    if ask.filter:
        lines.append(f"filter {ask.filter}")
        caps.append("filter")
    haves = [f"have {ids[x % len(ids)]}" for x in ask.haves]
    if ask.version == 2:
        # v2 sends deepen-relative, ofs-delta and no-progress as arguments; deepen-since and
        # filter need no capability word at all.
        words = [c for c in caps if c not in ("deepen-since", "filter")]
        args = [f"want {w}" for w in wants] + lines + words + haves + ["done"]
        return v2_command("fetch", args=tuple(args))
    first = f"want {wants[0]} multi_ack_detailed side-band-64k shallow {' '.join(caps)}"
    body = pkt_lines(first, *[f"want {w}" for w in wants[1:]], *lines) + FLUSH
    return body + pkt_lines(*haves, "done")


@pytest.fixture(scope="module")
def prop_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("proproot")


@pytest.fixture(scope="module")
def prop_server(prop_root: Path) -> Iterator[LiveServer]:
    srv = start_server(prop_root)
    yield srv
    srv.stop()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(h=histories(), ask=asks)
# The smallest leak: main at c0; c2 (hidden) is a child of c1 (hidden-only); shallow c2.
@example(h=History(((), (0,), (1,)), (("a", 1), ("b", 2), ("a", 3)), (0,), (2,), "loose"),
         ask=Ask(2, (0,), (), (-1,), "infinite", ""))
def test_no_hidden_object_in_any_pack(git: Git, prop_root: Path, prop_server: LiveServer,
                                      h: History, ask: Ask) -> None:
    gitdir, ids = _build(git, prop_root, h)
    try:
        visible = [f"refs/heads/v{i}" for i in h.visible]
        hidden = [f"refs/hidden/h{i}" for i in h.hidden]
        secret = hidden_only_objects(git, gitdir, visible, hidden)
        resp = post_upload_pack(prop_server.port, _request(h, ids, ask), repo=gitdir.name,
                                version=ask.version)
        assert resp.status == 200, (resp.status, resp.body[:300])
        try:
            pack = pack_bytes(resp.body)
        except InBandError:
            return  # a refusal (say, deepen-since selecting nothing) sends no object at all
        if pack is None:
            return
        sent = pack_object_ids(git, pack)
        assert not sent & secret, f"hidden-only objects sent: {sorted(sent & secret)}"
    finally:
        shutil.rmtree(gitdir, ignore_errors=True)
