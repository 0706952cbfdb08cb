"""Object ids past the parsers are binary (docs/ARCHITECTURE.md, "Object ids"): the fetch
plan takes the parsed ids as they are, and the visible tips are converted once a request."""

from __future__ import annotations

from pathlib import Path

from gitspout.protocol.advertise import v0_request_capabilities
from gitspout.protocol.fetch_request import parse_v0_request
from gitspout.protocol.negotiate import V0Answer
from gitspout.protocol.pktline import FLUSH_PKT, encode_pkt
from gitspout.server.core.context import RequestContext
from gitspout.server.core.fetch import plan_fetch
from gitspout.server.store.odb import PackRegistry
from gitspout.server.store.repos import RepoResolver
from gitutil import Git


def _context(root: Path, name: str) -> RequestContext:
    return RequestContext(RepoResolver(str(root)).resolve(name), PackRegistry(), b"test")


def test_tips_are_binary_and_computed_once_per_request(git: Git, fixture_root: Path) -> None:
    ctx = _context(fixture_root, "basic.git")
    head, refs = ctx.visible()
    tips = ctx.tips()  # from the ref segments' bytes, not from the Ref objects
    assert tips is ctx.tips()
    expected = {bytes.fromhex(r.oid.decode()) for r in refs}
    assert head is not None and head.oid is not None
    expected.add(bytes.fromhex(head.oid.decode()))
    assert tips == expected and all(len(t) == 20 for t in tips)
    main = git.out("--git-dir", str(fixture_root / "basic.git"), "rev-parse", "main").strip()
    assert bytes.fromhex(main) in tips


def test_plan_takes_parsed_binary_wants_and_haves(git: Git, fixture_root: Path) -> None:
    repo = fixture_root / "basic.git"
    main = git.out("--git-dir", str(repo), "rev-parse", "main").strip().encode()
    parent = git.out("--git-dir", str(repo), "rev-parse", "main~1").strip().encode()
    body = (encode_pkt(b"want " + main.upper() + b" multi_ack_detailed\n") + FLUSH_PKT
            + encode_pkt(b"have " + parent + b"\n") + encode_pkt(b"have " + b"e" * 40 + b"\n")
            + FLUSH_PKT)
    req = parse_v0_request(body, v0_request_capabilities(False))
    plan = plan_fetch(_context(fixture_root, "basic.git"), req)
    assert plan.wants == [bytes.fromhex(main.decode())]
    assert plan.common == [bytes.fromhex(parent.decode())]
    assert isinstance(plan.answer, V0Answer)
    assert plan.answer.lines[0] == b"ACK " + parent + b" common\n"
