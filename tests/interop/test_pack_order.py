"""Property: every pack gitspout sends, from every pack source, keeps C git's entry order.

Random histories (history.py: sizes and edits drawn by hypothesis), each laid out three
ways: ``gc`` (one pack with a bitmap: verbatim, copied by bitmap, filtered by bitmap),
``nobitmap`` (one pack, walked) and ``pushed`` (packs completed by ``--fix-thin``, whose
REF_DELTA bases sit after their deltas, and loose objects). On each, protocol v2 fetch
requests written by hand: a thin fetch first (while the pack has no reverse index, so
small fetches take the cold walk whose objects are written without a plan), clones with and
without ``ofs-delta``, one branch, ``blob:none``, ``blob:limit``, ``tree:0``, depth 1 and 3,
a deepen from a depth-1 client, a tag the client has, and the clone again (a pack cache
hit). Every pack goes through packcheck.check_pack: the order rule and the OFS/REF choice,
C git's index-pack, libgit2's indexer. The access log says which source each pack came
from; test_pack_sources_covered checks that all of them were met.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from gitutil import Git, LiveServer, start_server, wait_until
from history import Spec, build_source, make_shape
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from packcheck import Expect, check_pack
from proxy import pack_of
from rawhttp import post_upload_pack, v2_command

SHAPES = ("gc", "nobitmap", "pushed")
SOURCES_SEEN: set[str] = set()
_names = itertools.count()


@pytest.fixture(scope="module")
def order_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pack-order")


class OrderServer:
    """The module's gitspout (hypothesis prints its arguments on a failure: a short repr)."""

    def __init__(self, server: LiveServer) -> None:
        self.server = server

    def __repr__(self) -> str:
        return f"<gitspout on port {self.server.port}>"


@pytest.fixture(scope="module")
def order_server(order_root: Path) -> Iterator[OrderServer]:
    # --cold-walk-pack-entries 16: the first fetch with haves on each (small) repository
    # takes the cold walk, as a first fetch from a large pack does in production.
    srv = start_server(order_root, ["--cold-walk-pack-entries", "16", "--log-format", "json"])
    yield OrderServer(srv)
    srv.stop()


@dataclass(frozen=True)
class Ask:
    name: str
    args: tuple[str, ...]
    expect: Expect


def _revs(git: Git, repo: Path, *names: str) -> list[str]:
    return git.out("rev-parse", *names, cwd=repo).split()


def _asks(git: Git, repo: Path) -> list[Ask]:
    heads = git.out("for-each-ref", "--format=%(objectname)", "refs/heads", cwd=repo).split()
    tags = git.out("for-each-ref", "--format=%(objectname)", "refs/tags", cwd=repo).split()
    main, old, rel_old, rel, tag = _revs(git, repo, "main", "main~2", "release~1", "release",
                                         "refs/tags/v0.1")
    want_heads = tuple(f"want {h}" for h in heads)
    want_all = want_heads + tuple(f"want {t}" for t in tags)
    haves = (old, rel_old)
    thin = want_heads + tuple(f"have {h}" for h in haves) + ("thin-pack",)
    deepen = want_heads + tuple(f"shallow {h}" for h in heads) + \
        tuple(f"have {h}" for h in heads) + ("deepen 20", "thin-pack", "include-tag")
    asks = [
        Ask("thin (cold walk)", thin + ("ofs-delta",), Expect(True, thin=True, haves=haves)),
        Ask("clone", want_all + ("ofs-delta",), Expect(True)),
        Ask("clone, no ofs-delta", want_all, Expect(False)),
        Ask("one branch", (f"want {rel}", "ofs-delta"), Expect(True)),
        Ask("thin", thin + ("ofs-delta",), Expect(True, thin=True, haves=haves)),
        Ask("thin, no ofs-delta", thin, Expect(False, thin=True, haves=haves)),
        Ask("include-tag, tag have", (f"want {tag}", f"want {main}", f"have {tag}",
                                      f"have {old}", "include-tag", "ofs-delta"),
            Expect(True, haves=(tag, old))),
        Ask("depth 1", want_heads + ("deepen 1", "ofs-delta"), Expect(True, self_contained=False)),
        Ask("depth 3", want_heads + ("deepen 3", "ofs-delta"), Expect(True, self_contained=False)),
        Ask("depth 1, no ofs-delta", want_heads + ("deepen 1",), Expect(False, self_contained=False)),
        Ask("deepen 1->20", deepen + ("ofs-delta",),
            Expect(True, self_contained=False, thin=True, shallow=tuple(heads))),
    ]
    for spec in ("blob:none", "blob:limit=2000", "tree:0"):
        asks.append(Ask(spec, want_all + (f"filter {spec}", "ofs-delta"),
                        Expect(True, self_contained=False)))
    asks.append(Ask("clone again (pack cache)", want_all + ("ofs-delta",), Expect(True)))
    return asks


def _fetch(server: LiveServer, repo: str, args: tuple[str, ...]) -> tuple[bytes | None, str]:
    """The pack of a v2 fetch with ``args`` (and ``done``), and the access log's source."""
    before = len(server.lines)
    resp = post_upload_pack(server.port, v2_command("fetch", args=(*args, "done")), repo=repo,
                            version=2)
    assert resp.status == 200, (resp.status, resp.body[:300])

    def logged() -> list[dict[str, object]]:
        out = []
        for line in server.lines[before:]:
            if line.startswith("{") and '"command":"fetch"' in line:
                out.append(json.loads(line))
        return out

    assert wait_until(lambda: bool(logged()), 10.0), "no access log line for the fetch"
    return pack_of(resp.body), str(logged()[0]["pack_source"])


histories = st.builds(Spec, commits=st.integers(8, 60), files=st.integers(2, 8),
                      seed=st.integers(0, 10_000), tag_every=st.integers(2, 7))


# Each example builds three repositories and checks some forty packs (about 3 s): a few
# examples, and no shrinking (a failure names its Spec; the history is seeded from it).
@settings(max_examples=4, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(spec=histories)
@example(spec=Spec())  # the history of the interop suite (conftest.py), always run
def test_every_pack_keeps_bases_first(spec: Spec, git: Git, order_root: Path,
                                      order_server: OrderServer,
                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    build = tmp_path_factory.mktemp("order-src")
    src = build_source(git, build / "src.git", spec)
    problems: list[str] = []
    for shape in SHAPES:
        name = f"r{next(_names)}-{shape}.git"
        repo = make_shape(git, src, order_root / name, shape)
        for ask in _asks(git, repo):
            pack, source = _fetch(order_server.server, name, ask.args)
            SOURCES_SEEN.add(source)
            if pack is None:
                problems.append(f"{shape} {ask.name}: no pack")
                continue
            verdict = check_pack(pack, repo, ask.expect)
            if verdict.problems:
                problems.append(f"{shape} {ask.name} [{source}], {verdict.pack.count} objects: "
                                + verdict.summary())
    assert not problems, f"{spec}:\n" + "\n".join(problems)


def test_pack_sources_covered() -> None:
    """The property above met every pack source (runs after it, in file order)."""
    if not SOURCES_SEEN:
        pytest.skip("the property test did not run")
    assert {"verbatim", "bitmap", "walk", "cache-hit"} <= SOURCES_SEEN, SOURCES_SEEN
