"""Real git clients against gitspout and against git-http-backend, side by side (issue 23).

Clients: C git, libgit2 (pygit2), dulwich, isomorphic-git, JGit (clients.py). Operations:
ls-remote, clone, fetch after new commits, depth 1, deepen (depth 1 then 20), blobless
clone with lazy fetches, sha256, Basic auth right and wrong. Every result is judged
against the same client's result from git-http-backend (scenario.py): fsck, refs, HEAD,
shallow boundary, and the objects each server sent.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from clients import CLIENTS, Client, ClientFailed, Creds, Unsupported
from gitutil import Git
from history import push_new_commits
from scenario import (
    BACKEND,
    GITSPOUT,
    USERS,
    InteropRoot,
    Side,
    assert_clean,
    attempt,
    attempt_both,
    judge,
    record,
    refs_of,
)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(params=list(CLIENTS))
def client(request: pytest.FixtureRequest, git: Git) -> Client:
    c = CLIENTS[request.param](git)
    why = c.available()
    if why:
        pytest.skip(why)
    return c


def _source_listing(git: Git, served: Path) -> dict[str, str]:
    out = git.out("ls-remote", "--symref", str(served))
    refs: dict[str, str] = {}
    for line in out.splitlines():
        left, _, name = line.partition("\t")
        if left.startswith("ref: "):
            refs[f"{name} ->"] = left[5:]
        else:
            refs[name] = left
    return refs


def test_ls_remote(client: Client, sides: dict[str, Side], interop_root: InteropRoot,
                   git: Git) -> None:
    listed: dict[str, dict[str, str] | str] = {}
    for name, side in sides.items():
        try:
            listed[name] = client.ls_remote(side.url("hist.git"))
        except Unsupported as exc:
            pytest.skip(str(exc))
        except ClientFailed as exc:
            listed[name] = f"fails: {exc}"
        side.proxy.take()
    back, ours = listed[BACKEND], listed[GITSPOUT]
    if isinstance(back, str):
        record(client.name, "ls-remote", BACKEND, back[:160])
        pytest.skip(f"{client.name} cannot ls-remote git-http-backend either: {back}")
    record(client.name, "ls-remote", BACKEND, f"ok, {len(back)} refs")
    source = _source_listing(git, interop_root.root / "hist.git")
    problems = []
    if isinstance(ours, str):
        problems.append(ours)
    else:
        if ours != back:
            problems.append(f"listing differs: {sorted(set(ours.items()) ^ set(back.items()))[:6]}")
        wrong = {k: v for k, v in ours.items() if source.get(k) != v}
        if wrong:
            problems.append(f"not what the repository holds: {sorted(wrong.items())[:6]}")
    record(client.name, "ls-remote", GITSPOUT,
           f"ok, {len(ours)} refs" if not problems else "FAIL: " + problems[0][:160])
    assert not problems, problems


@pytest.mark.parametrize("repo", ["hist.git", "pushed.git", "gcpushed.git"])
def test_clone(client: Client, sides: dict[str, Side], interop_root: InteropRoot, git: Git,
               tmp_path: Path, repo: str) -> None:
    """A full clone; of ``pushed.git`` too: packs completed by --fix-thin, whose REF_DELTA
    entries have their bases later in the pack file, and loose objects; and of
    ``gcpushed.git``, the bitmapped pack whole (its body copied as one run) and what a
    push left loose."""
    back, ours = attempt_both(sides, tmp_path,
                              lambda side, dest: client.clone(side.url(repo), dest))
    op = {"hist.git": "clone", "pushed.git": "clone pushed"}.get(repo, "clone after a push")
    assert_clean(judge(git, client.name, op, back, ours, interop_root.root / repo))


@pytest.mark.parametrize("source", ["hist.git", "nobitmap.git"])
def test_fetch_new_commits(client: Client, sides: dict[str, Side], interop_root: InteropRoot,
                           git: Git, tmp_path: Path, source: str) -> None:
    """Clone, new commits and a tag pushed, fetch; then fetch again with nothing new. From
    a bitmapped repository, and from one without (gitspout walks)."""
    repo = f"fetch-{client.name}-{source}"
    served = interop_root.fresh_copy(repo, source)
    suffix = "" if source == "hist.git" else " nobitmap"
    back, ours = attempt_both(sides, tmp_path / "clone",
                              lambda side, dest: client.clone(side.url(repo), dest))
    if not back.ok:
        pytest.skip(f"{client.name} cannot clone git-http-backend: {back.error}")
    assert ours.ok, f"{client.name} clone from gitspout failed: {ours.error}"
    push_new_commits(git, served, tmp_path / "work")
    problems = []
    dest_back, dest_ours = back.dest, ours.dest
    for op in ("fetch", "fetch again"):
        back = attempt(sides[BACKEND], dest_back, lambda: client.fetch(dest_back))
        ours = attempt(sides[GITSPOUT], dest_ours, lambda: client.fetch(dest_ours))
        j = judge(git, client.name, op + suffix, back, ours, served, local_heads=False)
        tip = refs_of(git, served)["refs/heads/main"]
        if ours.ok and refs_of(git, ours.dest).get("refs/remotes/origin/main") != tip:
            j.problems.append("the fetch did not bring the new main")
        problems += [f"{op}: {p}" for p in j.problems]
    assert not problems, "\n".join(problems)


def test_depth1(client: Client, sides: dict[str, Side], interop_root: InteropRoot, git: Git,
                tmp_path: Path) -> None:
    back, ours = attempt_both(sides, tmp_path,
                              lambda side, dest: client.clone(side.url("hist.git"), dest, depth=1))
    assert_clean(judge(git, client.name, "depth 1", back, ours, interop_root.root / "hist.git",
                       shallow=True))


def test_deepen(client: Client, sides: dict[str, Side], interop_root: InteropRoot, git: Git,
                tmp_path: Path) -> None:
    back, ours = attempt_both(sides, tmp_path,
                              lambda side, dest: client.clone(side.url("hist.git"), dest, depth=1))
    if not back.ok:
        record(client.name, "deepen 1->20", BACKEND, f"depth 1 fails: {back.error}"[:160])
        pytest.skip(f"{client.name}: depth 1 clone fails against git-http-backend: {back.error}")
    if not ours.ok:
        record(client.name, "deepen 1->20", GITSPOUT, f"FAIL: depth 1 clone: {ours.error}"[:160])
        pytest.fail(f"depth 1 clone from gitspout failed: {ours.error}")
    back = attempt(sides[BACKEND], back.dest, lambda: client.fetch(back.dest, depth=20))
    ours = attempt(sides[GITSPOUT], ours.dest, lambda: client.fetch(ours.dest, depth=20))
    assert_clean(judge(git, client.name, "deepen 1->20", back, ours,
                       interop_root.root / "hist.git", shallow=True, local_heads=False))


def test_blobless_lazy(client: Client, sides: dict[str, Side], interop_root: InteropRoot,
                       git: Git, tmp_path: Path) -> None:
    served = interop_root.root / "hist.git"
    old_blob = git.out("rev-parse", "main~150:src/mod00.py", cwd=served).strip()
    back, ours = attempt_both(sides, tmp_path, lambda side, dest: client.blobless(
        side.url("hist.git"), dest, old_blob))
    assert_clean(judge(git, client.name, "blobless+lazy", back, ours, served))


def test_sha256(client: Client, sides: dict[str, Side], interop_root: InteropRoot, git: Git,
                tmp_path: Path) -> None:
    back, ours = attempt_both(sides, tmp_path,
                              lambda side, dest: client.clone(side.url("sha256.git"), dest))
    assert_clean(judge(git, client.name, "sha256 clone", back, ours,
                       interop_root.root / "sha256.git", object_format="sha256"))


def test_auth_right(client: Client, sides: dict[str, Side], interop_root: InteropRoot,
                    git: Git, tmp_path: Path) -> None:
    creds = Creds("alice", USERS["alice"])
    back, ours = attempt_both(sides, tmp_path, lambda side, dest: client.clone(
        side.url("private/hist.git"), dest, creds=creds))
    assert_clean(judge(git, client.name, "auth right", back, ours,
                       interop_root.root / "private" / "hist.git"))


def test_auth_wrong(client: Client, sides: dict[str, Side], tmp_path: Path) -> None:
    creds = Creds("alice", "not-the-password")
    back, ours = attempt_both(sides, tmp_path, lambda side, dest: client.clone(
        side.url("private/hist.git"), dest, creds=creds))
    for run in (back, ours):
        statuses = sorted({ex.status for ex in run.exchanges})
        packs = [ex for ex in run.exchanges if ex.pack()]
        text = f"refused, HTTP {statuses}" if not run.ok and not packs else \
            f"FAIL: {'cloned' if run.ok else 'failed'} with {len(packs)} packs, HTTP {statuses}"
        record(client.name, "auth wrong", run.side.name, text)
    assert not back.ok, "git-http-backend accepted a wrong password: the fixture is broken"
    assert not ours.ok, "gitspout let a wrong password clone"
    assert not any(ex.pack() for ex in ours.exchanges), "gitspout sent a pack"
    assert all(ex.status in (200, 401) for ex in ours.exchanges), \
        [(ex.path, ex.status) for ex in ours.exchanges]
    assert any(ex.status == 401 for ex in ours.exchanges)
