"""Nothing the client has: gitspout sends no object C git's upload-pack would leave out.

The same request body goes to gitspout (over HTTP) and to ``git upload-pack
--stateless-rpc`` on the same repository (the ground truth), in protocol v2 and v0, from a
repository with a bitmap and from one without (gitspout walks): the two packs must hold the
same objects. The requests are those real clients send (issue 23):

* haves that are not commits: an annotated tag the client has (isomorphic-git sends
  ``want T``, ``have T`` for every tag on every fetch), a tree, a blob;
* a deepen: the client's ``shallow`` commits are objects it has (a depth-1 clone fetching
  with depth 20 must not get its tips again).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import Git, LiveServer, start_server
from history import Spec, build_source, make_shape
from packcheck import CatFile
from packparse import object_ids, parse_pack
from proxy import pack_of
from rawhttp import FLUSH, pkt_lines, post_upload_pack, v2_command

SHAPES = ("gc", "nobitmap")


@pytest.fixture(scope="module")
def haves_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    root = tmp_path_factory.mktemp("haves")
    src = build_source(git, tmp_path_factory.mktemp("haves-src") / "src.git",
                       Spec(commits=80, files=6, seed=5, tag_every=10))
    for shape in SHAPES:
        make_shape(git, src, root / f"{shape}.git", shape)
    return root


@pytest.fixture(scope="module")
def haves_server(haves_root: Path) -> Iterator[LiveServer]:
    srv = start_server(haves_root)
    yield srv
    srv.stop()


def _body(version: int, wants: list[str], haves: list[str], extra: list[str],
          shallow: list[str] = ()) -> bytes:  # type: ignore[assignment]
    if version == 2:
        args = [f"want {w}" for w in wants] + [f"shallow {s}" for s in shallow] + \
            [f"have {h}" for h in haves] + extra + ["done"]
        return v2_command("fetch", args=tuple(args))
    caps = "ofs-delta side-band-64k" + (" shallow" if shallow or any(
        e.startswith("deepen") for e in extra) else "")
    lines = [f"want {wants[0]} {caps}"] + [f"want {w}" for w in wants[1:]] + \
        [f"shallow {s}" for s in shallow] + [e for e in extra if e != "ofs-delta"]
    return pkt_lines(*lines) + FLUSH + pkt_lines(*[f"have {h}" for h in haves], "done")


def _objects(pack: bytes | None, repo: Path) -> list[str]:
    if pack is None:
        return []
    cat = CatFile(repo)
    try:
        return sorted(object_ids(parse_pack(pack), cat).values())
    finally:
        cat.close()


def _compare(server: LiveServer, root: Path, shape: str, version: int, body: bytes,
             client_has: frozenset[str] = frozenset()) -> None:
    """The same object set as C git's upload-pack, or fewer by objects in ``client_has``
    (what the client has though it did not say so object by object)."""
    repo = root / f"{shape}.git"
    resp = post_upload_pack(server.port, body, repo=repo.name, version=version)
    assert resp.status == 200, (resp.status, resp.body[:300])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_CONFIG_NOSYSTEM": "1"}
    if version == 2:
        env["GIT_PROTOCOL"] = "version=2"
    import subprocess

    theirs = subprocess.run(["git", "upload-pack", "--stateless-rpc", str(repo)], input=body,
                            env=env, capture_output=True, timeout=120)
    assert theirs.returncode == 0, theirs.stderr.decode(errors="replace")
    ours_ids, their_ids = _objects(pack_of(resp.body), repo), _objects(pack_of(theirs.stdout), repo)
    extra = sorted(set(ours_ids) - set(their_ids))
    left_out = set(their_ids) - set(ours_ids)
    assert len(ours_ids) <= len(their_ids) and not extra and left_out <= client_has, (
        f"gitspout sent {len(ours_ids)} objects, C git {len(their_ids)}; "
        f"{len(extra)} that C git did not send: {extra[:5]}; "
        f"{len(set(their_ids) - set(ours_ids))} that C git sent and gitspout did not")


def _rev(git: Git, repo: Path, name: str) -> str:
    return git.out("rev-parse", name, cwd=repo).strip()


@pytest.mark.parametrize("version", [2, 0])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("have", ["tag", "tags", "tree", "blob"])
def test_non_commit_haves_count(haves_server: LiveServer, haves_root: Path, git: Git,
                                shape: str, version: int, have: str) -> None:
    repo = haves_root / f"{shape}.git"
    main, old = _rev(git, repo, "main"), _rev(git, repo, "main~3")
    tags = git.out("for-each-ref", "--format=%(objectname)", "refs/tags", cwd=repo).split()
    if have == "tag":  # the request: want T, want main, have T, have main
        tag = _rev(git, repo, "refs/tags/v0.1")  # an annotated tag
        wants, haves = [tag, main], [tag, main]
    elif have == "tags":  # isomorphic-git's fetch with nothing new: every ref, every tag
        wants = haves = tags + [main]
    elif have == "tree":  # the client has main's tree (say, from a blobless clone's checkout)
        wants, haves = [main], [_rev(git, repo, "main^{tree}"), old]
    else:
        wants, haves = [main], [_rev(git, repo, "main:src/mod00.py"), old]
    _compare(haves_server, haves_root, shape, version, _body(version, wants, haves, ["ofs-delta"]))


@pytest.mark.parametrize("version", [2, 0])
@pytest.mark.parametrize("shape", SHAPES)
def test_deepen_does_not_resend_shallow_tips(haves_server: LiveServer, haves_root: Path,
                                             git: Git, shape: str, version: int) -> None:
    """A depth-1 clone of every branch fetching with depth 20, as git, libgit2 and dulwich
    ask: ``shallow`` and ``have`` for each tip, ``deepen 20``."""
    repo = haves_root / f"{shape}.git"
    heads = git.out("for-each-ref", "--format=%(objectname)", "refs/heads", cwd=repo).split()
    body = _body(version, heads, heads, ["deepen 20", "ofs-delta"], shallow=heads)
    # A shallow client has the whole tree of each commit it is shallow at: C git resends
    # some of those files (upload-pack.c passes them as edges only), gitspout does not.
    tips = git.out("rev-list", "--objects", "--no-walk", *heads, cwd=repo).split("\n")
    _compare(haves_server, haves_root, shape, version, body,
             frozenset(line.split()[0] for line in tips if line))
