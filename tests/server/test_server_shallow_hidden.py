"""Client ``shallow`` lines that name hidden commits must not open a way round the want check.

A shallow commit is "unshallowed" by deepening, and its parents go into the pack with their
trees and blobs. The repository here has ``S``, a commit reachable only from a hidden ref,
and ``S2``, its child, behind another hidden ref. A client that names ``S2`` in a shallow
line and asks to deepen must not receive ``S`` (issue: hidden objects through shallow lines).
Both forms, ``deepen 1`` + ``deepen-relative`` and ``deepen 2147483647`` (``--unshallow``),
in protocol v0 and v2.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gitutil import Git, LiveServer, start_server
from hidden_fixture import INFINITE, Leak, build_leak_repo
from packutil import pack_bytes, pack_object_ids
from rawhttp import FLUSH, pkt_lines, post_upload_pack, v2_command


@pytest.fixture(scope="module")
def leak(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Leak:
    return build_leak_repo(git, tmp_path_factory.mktemp("leakroot"), tmp_path_factory.mktemp("leakwork"))


@pytest.fixture(scope="module")
def leak_server(leak: Leak) -> Iterator[LiveServer]:
    srv = start_server(leak.root)
    yield srv
    srv.stop()


def _v2_fetch(leak: Leak, *deepen: str) -> list[str]:
    return [f"want {leak.tip}", f"shallow {leak.s2}", *deepen, "ofs-delta", "no-progress", "done"]


def _v0_fetch(leak: Leak, caps: str, *deepen: str) -> bytes:
    first = f"want {leak.tip} multi_ack_detailed side-band-64k ofs-delta no-progress {caps}".strip()
    return pkt_lines(first, f"shallow {leak.s2}", *deepen) + FLUSH + pkt_lines("done")


def _objects(git: Git, body: bytes) -> set[str]:
    pack = pack_bytes(body)
    assert pack is not None, body[:400]
    return pack_object_ids(git, pack)


def _assert_no_hidden(leak: Leak, body: bytes, got: set[str]) -> None:
    assert not got & leak.hidden_only, f"hidden objects served: {sorted(got & leak.hidden_only)}"
    assert got <= leak.visible
    # The hidden commits are not even acknowledged as shallow boundaries.
    assert leak.s2.encode() not in body and leak.s.encode() not in body


@pytest.mark.parametrize("deepen", [("deepen 1", "deepen-relative"), (f"deepen {INFINITE}",)],
                         ids=["deepen-relative", "unshallow"])
def test_v2_shallow_line_naming_hidden_commit(git: Git, leak: Leak, leak_server: LiveServer,
                                              deepen: tuple[str, ...]) -> None:
    body = v2_command("fetch", args=tuple(_v2_fetch(leak, *deepen)))
    resp = post_upload_pack(leak_server.port, body, repo="leak.git", version=2)
    assert resp.status == 200
    got = _objects(git, resp.body)
    _assert_no_hidden(leak, resp.body, got)
    assert leak.tip in got


@pytest.mark.parametrize("caps,deepen", [("shallow deepen-relative", ("deepen 1",)),
                                         ("shallow", (f"deepen {INFINITE}",))],
                         ids=["deepen-relative", "unshallow"])
def test_v0_shallow_line_naming_hidden_commit(git: Git, leak: Leak, leak_server: LiveServer,
                                              caps: str, deepen: tuple[str, ...]) -> None:
    resp = post_upload_pack(leak_server.port, _v0_fetch(leak, caps, *deepen), repo="leak.git")
    assert resp.status == 200
    got = _objects(git, resp.body)
    _assert_no_hidden(leak, resp.body, got)
    assert leak.tip in got


def test_visible_shallow_line_still_deepens(git: Git, leak: Leak, leak_server: LiveServer) -> None:
    """The fix must not stop legitimate deepening: a visible shallow commit is unshallowed."""
    parent = git.out("rev-parse", "refs/heads/main~1", cwd=leak.gitdir).strip()
    args = (f"want {leak.tip}", f"shallow {leak.tip}", "deepen 1", "deepen-relative",
            "ofs-delta", "no-progress", "done")
    resp = post_upload_pack(leak_server.port, v2_command("fetch", args=args), repo="leak.git",
                            version=2)
    assert resp.status == 200
    assert b"unshallow " + leak.tip.encode() in resp.body
    assert parent in _objects(git, resp.body)
