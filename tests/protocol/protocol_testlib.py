"""Helpers for tests/protocol: the recorded fixtures, and a fake HaveOracle built from them.

Nothing here runs git or touches a repository: ``tests/fixtures/facts.json`` holds what the
recording script learned about the fixture repositories.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from gitspout.protocol.refs import HeadInfo, Ref

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@dataclass(frozen=True)
class Exchange:
    name: str
    kind: str
    description: str
    repo: str
    git_protocol: str | None
    config: tuple[str, ...]
    request: bytes | None
    response: bytes
    stderr: bytes | None
    exit_code: int

    def config_bool(self, key: str) -> bool:
        """True if ``-c key=true`` was in effect (keys compared case-insensitively)."""
        return any(c.lower() == f"{key.lower()}=true" for c in self.config)

    def config_value(self, key: str) -> str | None:
        for c in self.config:
            k, _, v = c.partition("=")
            if k.lower() == key.lower():
                return v
        return None


@cache
def manifest() -> dict[str, Any]:
    return json.loads((FIXTURES / "manifest.json").read_text())


@cache
def facts(repo: str = "repo") -> dict[str, Any]:
    return json.loads((FIXTURES / "facts.json").read_text())[repo]


def _read(rel: str | None) -> bytes | None:
    return None if rel is None else (FIXTURES / rel).read_bytes()


@cache
def exchanges() -> dict[str, Exchange]:
    out = {}
    for e in manifest()["exchanges"]:
        out[e["name"]] = Exchange(
            name=e["name"],
            kind=e["kind"],
            description=e["description"],
            repo=e["repo"],
            git_protocol=e["git_protocol"],
            config=tuple(e["config"]),
            request=_read(e["request"]),
            response=_read(e["response"]) or b"",
            stderr=_read(e["stderr"]),
            exit_code=e["exit_code"],
        )
    return out


def names_of(kind: str) -> list[str]:
    return [n for n, e in exchanges().items() if e.kind == kind]


def label(name: str) -> bytes:
    """The id of a commit label (A B C E F) or ``blob`` in the fixture repository, in hex
    (as on the wire)."""
    return facts()["labels"][name].encode()


def label_id(name: str) -> bytes:
    """The binary id of :func:`label` (as parsed requests carry it)."""
    return bytes.fromhex(facts()["labels"][name])


UNKNOWN = b"deadbeef" * 5
SERVER_AGENT = b"git/2.39.5"


def split_pkts(body: bytes) -> list[bytes]:
    """An independent pkt-line splitter for recorded responses: data payloads, and the
    special packets as their four-byte text (``b"0000"``, ``b"0001"``)."""
    out = []
    pos = 0
    while pos < len(body):
        n = int(body[pos : pos + 4], 16)
        if n < 4:
            out.append(body[pos : pos + 4])
            pos += 4
        else:
            out.append(body[pos + 4 : pos + n])
            pos += n
    assert pos == len(body), "recorded response is not whole pkt-lines"
    return out


def recorded_agent(body: bytes) -> bytes:
    """The ``agent=`` value C git advertised in a recorded response."""
    i = body.index(b"agent=") + len(b"agent=")
    end = min(j for j in (body.find(b" ", i), body.find(b"\n", i)) if j != -1)
    return body[i:end]


def head_and_refs(repo: str = "repo") -> tuple[HeadInfo, list[Ref]]:
    """HEAD and the sorted refs of a fixture repository, as the server would pass them."""
    f = facts(repo)
    head = HeadInfo(
        target=f["head"]["target"].encode() if f["head"]["target"] else None,
        oid=f["head"]["oid"].encode() if f["head"]["oid"] else None,
    )
    refs = [
        Ref(
            name=r["name"].encode(),
            oid=r["oid"].encode(),
            peeled=r["peeled"].encode() if r["peeled"] else None,
            symref_target=r["symref_target"].encode() if r["symref_target"] else None,
        )
        for r in f["refs"]
    ]
    return head, sorted(refs, key=lambda r: r.name)


class GraphOracle:
    """A :class:`protocol.negotiate.HaveOracle` over the recorded commit graph (binary ids
    in, as parsed requests carry them; the recorded facts are hex).

    It follows upload-pack.c: ``do_got_oid`` (a commit have and its parents get THEY_HAVE;
    a have already marked THEY_HAVE is common but not counted again) and ``ok_to_give_up``
    (``can_all_from_reach_with_flag``: every commit want reaches THEY_HAVE, walking only
    through parents not older than the oldest common have; non-commit wants are ignored).
    """

    def __init__(self, wants: list[bytes] | tuple[bytes, ...], repo: str = "repo") -> None:
        f = facts(repo)
        self.objects: dict[str, dict[str, Any]] = f["objects"]
        self.commits: dict[str, dict[str, Any]] = f["commits"]
        self.peel = {r["oid"]: r["peeled"] for r in f["refs"] if r["peeled"]}
        assert all(len(w) in (20, 32) for w in wants), "wants are binary ids"
        self.wants = [w.hex() for w in wants]
        self.they_have: set[str] = set()
        self.have_obj: list[str] = []
        self.oldest: int | None = None
        self.calls: list[tuple[str, bytes]] = []

    def note_have(self, oid: bytes) -> bool:
        assert len(oid) in (20, 32), "haves are binary ids"
        self.calls.append(("note_have", oid))
        h = oid.hex()
        if h not in self.objects:
            return False
        knew = False
        if h in self.commits:
            knew = h in self.they_have
            self.they_have.add(h)
            t = self.commits[h]["time"]
            if self.oldest is None or t < self.oldest:
                self.oldest = t
            self.they_have.update(self.commits[h]["parents"])
        if not knew:
            self.have_obj.append(h)
        return True

    def have_count(self) -> int:
        return len(self.have_obj)

    def ok_to_give_up(self) -> bool:
        if not self.have_obj:
            return False
        cutoff = self.oldest or 0
        for want in self.wants:
            commit = self.peel.get(want, want)
            if commit not in self.commits:
                continue
            if not self._reaches(commit, cutoff):
                return False
        return True

    def _reaches(self, start: str, cutoff: int) -> bool:
        stack, seen = [start], {start}
        while stack:
            c = stack.pop()
            if c in self.they_have:
                return True
            for p in self.commits[c]["parents"]:
                if p in self.they_have:
                    return True
                if p not in seen and self.commits[p]["time"] >= cutoff:
                    seen.add(p)
                    stack.append(p)
        return False


class ScriptedOracle:
    """A HaveOracle with hand-written answers: ``common`` ids exist, ``ready_after`` is how
    many distinct common haves make ``ok_to_give_up`` true (None: never)."""

    def __init__(self, common: set[bytes], ready_after: int | None = 1) -> None:
        self.common = common
        self.ready_after = ready_after
        self.seen: list[bytes] = []

    def note_have(self, oid: bytes) -> bool:
        assert len(oid) in (20, 32), "haves are binary ids"
        if oid not in self.common:
            return False
        if oid not in self.seen:
            self.seen.append(oid)
        return True

    def have_count(self) -> int:
        return len(self.seen)

    def ok_to_give_up(self) -> bool:
        return self.ready_after is not None and len(self.seen) >= self.ready_after
