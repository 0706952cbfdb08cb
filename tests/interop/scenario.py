"""One client operation against both servers, and the checks every result goes through.

A *side* is a server behind its recording proxy: gitspout, or C git's git-http-backend
behind nginx + fcgiwrap, serving the same root. :func:`attempt` runs an operation on one
side and keeps what went over the wire; :func:`judge` checks gitspout's result against
git-http-backend's for the same client and operation:

* the client succeeded on gitspout (a client that fails on git-http-backend too is skipped
  with git-http-backend's failure as the reason, never passed);
* ``git fsck --strict`` (plain ``git fsck`` for a shallow result) finds nothing;
* the same refs, HEAD and shallow boundary as the git-http-backend result, and every
  remote-tracking ref and tag at its value in the served repository;
* gitspout sent no more objects than git-http-backend (pack entries, duplicates counted),
  and exactly the same objects when the client's requests to both were the same.

Each verdict also goes into the client x operation table printed at the end of the run.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from clients import ClientFailed, Unsupported
from gitutil import Git, copy_repo
from packparse import CatFile, object_ids, parse_pack
from proxy import Exchange, RecordingProxy

GITSPOUT, BACKEND = "gitspout", "git-http-backend"
USERS = {"alice": "al1ce-interop-pw"}  # who may read private/ on both servers


@dataclass(frozen=True)
class InteropRoot:
    """The served root (conftest.py ``interop_root``)."""

    root: Path
    src: Path  # the unpacked source history (fast-import output)

    def fresh_copy(self, name: str, source: str = "hist.git") -> Path:
        """A copy of ``source`` under the root, for a test that changes it."""
        return copy_repo(self.root / source, self.root / name)


@dataclass
class Side:
    """One server as the clients reach it: through a recording proxy."""

    name: str
    proxy: RecordingProxy
    root: Path

    def url(self, repo: str) -> str:
        return f"{self.proxy.url}/{repo}"


@dataclass
class Sent:
    """What a side's upload-pack answers carried."""

    packs: int = 0
    objects: int = 0  # pack entries, duplicates included
    ids: Counter[str] = field(default_factory=Counter)
    requests: list[bytes] = field(default_factory=list)  # normalised request payloads
    statuses: list[int] = field(default_factory=list)

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.ids.values() if n > 1)


@dataclass
class Run:
    side: Side
    dest: Path
    error: str | None = None
    exchanges: list[Exchange] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None


def attempt(side: Side, dest: Path, op: Callable[[], object]) -> Run:
    """Run ``op`` (a client call against ``side``); keep its failure and its exchanges."""
    side.proxy.take()
    run = Run(side, dest)
    try:
        op()
    except ClientFailed as exc:
        run.error = str(exc)
    run.exchanges = side.proxy.take()
    return run


def attempt_both(sides: dict[str, Side], dest: Path,
                 op: Callable[[Side, Path], object]) -> tuple[Run, Run]:
    """``op(side, dest)`` against git-http-backend, then gitspout: (backend run, ours).
    An :class:`Unsupported` client is skipped before anything runs."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        back = attempt(sides[BACKEND], dest / "backend", lambda: op(sides[BACKEND], dest / "backend"))
    except Unsupported as exc:
        pytest.skip(str(exc))
    ours = attempt(sides[GITSPOUT], dest / "gitspout", lambda: op(sides[GITSPOUT], dest / "gitspout"))
    return back, ours


_AGENT = re.compile(rb"(?m)(^agent=[^\n]*\n|^session-id=[^\n]*\n| agent=\S+| session-id=\S+)")


def _normalise(payload: bytes) -> bytes:
    """A request without what names the client's build (agent, session id): pkt-line
    lengths dropped and lines sorted, so the rest compares as a set of text lines."""
    lines: list[bytes] = []
    pos = 0
    while pos + 4 <= len(payload):
        try:
            n = int(payload[pos : pos + 4], 16)
        except ValueError:
            break
        if n < 4:
            lines.append(b"%04d" % n)
            pos += 4
            continue
        lines.append(payload[pos + 4 : pos + n].rstrip(b"\n") + b"\n")
        pos += n
    # Sorted: a client may list its shallow or have lines in set order, different per run.
    return b"\n".join(sorted(_AGENT.sub(b"", b"\n".join(lines)).split(b"\n")))


def sent(run: Run, served: Path, object_format: str = "sha1") -> Sent:
    """Packs, objects and requests of a run's upload-pack exchanges. Object ids are
    resolved from the pack bytes, a thin pack's outside bases read from the served
    repository (packparse.object_ids), whatever the order of the entries."""
    out = Sent()
    hash_len = 32 if object_format == "sha256" else 20
    cat = CatFile(served)
    try:
        for ex in run.exchanges:
            if not ex.is_upload_pack:
                continue
            out.statuses.append(ex.status)
            pack = ex.pack()
            if pack is None:
                continue
            out.requests.append(_normalise(ex.request_payload()))
            parsed = parse_pack(pack, hash_len)
            out.packs += 1
            out.objects += parsed.count
            out.ids.update(object_ids(parsed, cat).values())
    finally:
        cat.close()
    return out


def request_diff(a: list[bytes], b: list[bytes]) -> str:
    """The first lines where two runs' requests differ (gitspout's -, git-http-backend's +)."""
    import difflib

    la = b"\n--\n".join(a).decode(errors="replace").splitlines()
    lb = b"\n--\n".join(b).decode(errors="replace").splitlines()
    diff = [d for d in difflib.unified_diff(la, lb, lineterm="", n=0) if d[:1] in "+-"]
    return "; ".join(diff[2:12])


# -- the table -------------------------------------------------------------------------

MATRIX: dict[tuple[str, str], dict[str, str]] = {}


def record(client: str, op: str, side: str, text: str) -> None:
    MATRIX.setdefault((client, op), {})[side] = text


def matrix_lines() -> list[str]:
    if not MATRIX:
        return []
    ops = list(dict.fromkeys(op for _c, op in MATRIX))
    clients = list(dict.fromkeys(c for c, _op in MATRIX))
    lines = ["interop: client x operation (gitspout | git-http-backend)"]
    for client in clients:
        for op in ops:
            cell = MATRIX.get((client, op))
            if cell is None:
                continue
            lines.append(f"  {client:8} {op:14} gitspout: {cell.get(GITSPOUT, '-')}"
                         f"  | git-http-backend: {cell.get(BACKEND, '-')}")
    return lines


def _short(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


# -- checks ------------------------------------------------------------------------------

def git_dir(git: Git, path: Path) -> Path:
    return Path(git.out("rev-parse", "--absolute-git-dir", cwd=path).strip())


def refs_of(git: Git, path: Path) -> dict[str, str]:
    out = git.out("for-each-ref", "--format=%(objectname) %(refname)", cwd=path)
    return {name: oid for oid, name in (line.split(" ", 1) for line in out.splitlines())}


def head_of(git: Git, path: Path) -> tuple[str, str]:
    """(what HEAD names, the commit it resolves to)."""
    sym = git.run("symbolic-ref", "-q", "HEAD", cwd=path, check=False).stdout.decode().strip()
    oid = git.run("rev-parse", "-q", "--verify", "HEAD", cwd=path, check=False).stdout.decode().strip()
    return sym, oid


def shallow_of(git: Git, path: Path) -> list[str]:
    f = git_dir(git, path) / "shallow"
    return sorted(f.read_text().split()) if f.exists() else []


def fsck_problems(git: Git, path: Path, shallow: bool) -> str | None:
    args = ["fsck", "--no-progress", "--no-dangling"] + ([] if shallow else ["--strict"])
    proc = git.run(*args, cwd=path, check=False)
    if proc.returncode != 0:
        said = (proc.stderr + proc.stdout).decode(errors="replace").strip()
        return f"git {' '.join(args)}: exit {proc.returncode}: {said[-600:]}"
    return None


def source_mismatches(result: dict[str, str], source: dict[str, str]) -> list[str]:
    """Refs of a result that do not hold the served repository's value."""
    bad = []
    for name, oid in sorted(result.items()):
        if name.startswith("refs/remotes/origin/"):
            branch = name.removeprefix("refs/remotes/origin/")
            if branch == "HEAD":
                continue
            want = source.get(f"refs/heads/{branch}")
        elif name.startswith(("refs/tags/", "refs/heads/")):
            want = source.get(name)
        else:
            continue
        if want != oid:
            bad.append(f"{name} is {oid}, the served repository has {want}")
    return bad


@dataclass
class Judged:
    """What :func:`judge` found for gitspout (problems) and the figures behind it."""

    problems: list[str]
    ours: Sent
    back: Sent


def judge(git: Git, client: str, op: str, back: Run, ours: Run, served: Path, *,
          shallow: bool = False, local_heads: bool = True, object_format: str = "sha1",
          check_result: bool = True) -> Judged:
    """Every check of the module docstring; records the table cell, then fails the test
    with all problems found (or skips it when git-http-backend failed too)."""
    if not back.ok:
        record(client, op, BACKEND, f"fails: {_short(back.error or '')}")
        record(client, op, GITSPOUT, "skipped" if ours.ok else f"fails too: {_short(ours.error or '')}")
        pytest.skip(f"{client} cannot {op} against git-http-backend either: {back.error}")
    s_back, s_ours = sent(back, served, object_format), sent(ours, served, object_format)
    record(client, op, BACKEND, f"ok, {s_back.objects} objects in {s_back.packs} packs")
    problems: list[str] = []
    if not ours.ok:
        problems.append(f"{client} failed against gitspout: {ours.error}")
    elif check_result:
        problems += _result_problems(git, back.dest, ours.dest, served, shallow, local_heads)
    if s_ours.objects > s_back.objects:
        known = set(s_back.ids)
        problems.append(f"gitspout sent {s_ours.objects} objects ({s_ours.duplicates} duplicates, "
                        f"{len(set(s_ours.ids) - known)} that git-http-backend did not send), "
                        f"git-http-backend {s_back.objects} ({s_back.duplicates} duplicates)"
                        + ("" if s_ours.requests == s_back.requests else
                           "; requests differ: " + request_diff(s_ours.requests, s_back.requests)))
    # Same requests: nothing C git would not send. Fewer is allowed (a deepen: C git resends
    # files of the commits the client is shallow at); the result's fsck and refs above say
    # the client got all it needs.
    extra = set(s_ours.ids) - set(s_back.ids)
    if s_ours.requests == s_back.requests and extra:
        missing = set(s_back.ids) - set(s_ours.ids)
        problems.append(f"same requests, other objects: {len(extra)} more "
                        f"({sorted(extra)[:3]}), {len(missing)} fewer ({sorted(missing)[:3]})")
    sameness = "same requests" if s_ours.requests == s_back.requests else "other requests"
    verdict = "ok" if not problems else "FAIL: " + _short(problems[0])
    record(client, op, GITSPOUT, f"{verdict} ({s_ours.objects} objects in {s_ours.packs} packs, "
                                 f"{sameness})")
    return Judged(problems, s_ours, s_back)


def _result_problems(git: Git, back: Path, ours: Path, served: Path, shallow: bool,
                     local_heads: bool) -> list[str]:
    problems: list[str] = []
    fs = fsck_problems(git, ours, shallow)
    if fs:
        problems.append(fs)
        if fsck_problems(git, back, shallow):
            problems[-1] += " (the git-http-backend result fails fsck too)"
    ref_ours, ref_back = refs_of(git, ours), refs_of(git, back)
    if ref_ours != ref_back:
        diff = sorted(set(ref_ours.items()) ^ set(ref_back.items()))
        problems.append(f"refs differ from the git-http-backend result: {diff[:6]}")
    source = refs_of(git, served)
    if not local_heads:  # after a fetch the local branch stays where it was
        ref_ours = {k: v for k, v in ref_ours.items() if not k.startswith("refs/heads/")}
    problems += source_mismatches(ref_ours, source)
    if head_of(git, ours) != head_of(git, back):
        problems.append(f"HEAD {head_of(git, ours)} differs from {head_of(git, back)}")
    if shallow_of(git, ours) != shallow_of(git, back):
        problems.append(f"shallow boundary {shallow_of(git, ours)[:4]} differs from "
                        f"{shallow_of(git, back)[:4]}")
    return problems


def assert_clean(j: Judged) -> None:
    assert not j.problems, "\n".join(j.problems)
