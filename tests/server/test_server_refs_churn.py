"""Ref advertisements while the refs change (issue 11): a loop of pushes, ref deletions,
tag creations and ``git pack-refs --all`` runs beside ``git ls-remote`` over v0 and v2
(with and without ``--heads``, a ref-prefix), three at a time, against a live server. Every answer must equal
the refs as ``git ls-remote file://`` saw them at a moment between the request's start and
its end: no ref rolled back, none lost, none from a state that never was.

The repository has a few thousand packed refs, so that answers are made of many segments
(server/store/refs.py) and loose refs land in the middle of packed ones. Bounded: about
60 changes, 127.0.0.1 only.
"""

from __future__ import annotations

import random
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from gitutil import Git, LiveServer

CHANGES = 60
PACKED = 3000
READERS = 3


@dataclass
class _State:
    started: float  # when the change that led to it started (0: the initial state)
    done: float  # when that change's command returned
    refs: frozenset[str]  # ls-remote lines


def _ls_remote(git: Git, url: str, *args: str, version: int = 2) -> frozenset[str]:
    out = git.out("-c", f"protocol.version={version}", "ls-remote", *args, url)
    return frozenset(line for line in out.splitlines() if line)


@pytest.fixture()
def churn_repo(git: Git, server: LiveServer) -> Iterator[Path]:
    path = server.root / f"churn-{uuid.uuid4().hex[:8]}.git"
    shutil.copytree(server.root / "basic.git", path)
    gd = ["--git-dir", str(path)]
    main = git.out(*gd, "rev-parse", "refs/heads/main").strip()
    commits = git.out(*gd, "rev-list", "--all").split()
    lines = "".join(f"create refs/heads/many/b{i:05d} {commits[i % len(commits)]}\n"
                    for i in range(0, 2 * PACKED, 2))
    git.run(*gd, "update-ref", "--stdin", input=lines.encode())
    git.run(*gd, "pack-refs", "--all")
    git.run(*gd, "update-ref", "refs/heads/loose-main", main)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _changes(git: Git, repo: Path, work: Path, states: list[_State], stop: threading.Event,
             errors: list[BaseException]) -> None:
    """Change the refs CHANGES times; after each change, record the state it led to."""
    try:
        rng = random.Random(11)
        gd = ["--git-dir", str(repo)]
        clone = work / "pusher"
        git.run("clone", "-q", str(repo), str(clone))
        tree = git.out(*gd, "rev-parse", "main^{tree}").strip()
        parent = git.out(*gd, "rev-parse", "main").strip()
        for step in range(CHANGES):
            if stop.is_set():
                return
            started = time.monotonic()
            op = rng.randrange(6)
            names = [line.split()[1] for line in states[-1].refs
                     if "\trefs/heads/" in line]
            if op == 0:  # a push through receive-pack, of a new commit
                git.run("-C", str(clone), "commit", "-q", "--allow-empty", "-m", f"c{step}")
                branch = rng.choice(["main", "loose-main", f"many/b{rng.randrange(2 * PACKED):05d}"])
                git.run("-C", str(clone), "push", "-q", "-f", "origin", f"HEAD:refs/heads/{branch}")
            elif op == 1:  # a ref moved in place (loose write over a packed ref)
                commit = git.out(*gd, "commit-tree", tree, "-p", parent, "-m", f"u{step}").strip()
                git.run(*gd, "update-ref", rng.choice(names), commit)
            elif op == 2 and len(names) > 10:  # a deletion (of a packed ref: packed-refs rewritten)
                git.run(*gd, "update-ref", "-d", rng.choice(names))
            elif op == 3:
                git.run(*gd, "pack-refs", "--all")
            elif op == 4:  # an annotated tag (a peeled line)
                git.run(*gd, "tag", "-a", "-m", f"t{step}", f"t{step}", parent)
            else:  # a new branch between packed ones
                git.run(*gd, "update-ref", f"refs/heads/many/b{2 * rng.randrange(PACKED) + 1:05d}",
                        parent)
            done = time.monotonic()
            states.append(_State(started, done, _ls_remote(git, f"file://{repo}")))
            # The scenario: pushes come at uneven gaps (nothing waits on this sleep; the
            # answers are checked against the states' intervals, whatever they are).
            time.sleep(rng.choice([0.0, 0.01, 0.05]))
    except BaseException as exc:  # reported by the test
        errors.append(exc)


def _allowed(states: list[_State], t0: float, t1: float) -> list[frozenset[str]]:
    """The states that may have held at some moment in [t0, t1]: a state holds from (at
    the earliest) the start of its change until (at the latest) the next change is done."""
    out = []
    for i, st in enumerate(states):
        nxt = states[i + 1].done if i + 1 < len(states) else float("inf")
        if st.started <= t1 and nxt >= t0:
            out.append(st.refs)
    return out


def test_ls_remote_under_churn_matches_a_moment(git: Git, server: LiveServer,
                                                churn_repo: Path, tmp_path: Path) -> None:
    states = [_State(0.0, 0.0, _ls_remote(git, f"file://{churn_repo}"))]
    assert len(states[0].refs) > PACKED
    stop = threading.Event()
    errors: list[BaseException] = []
    changer = threading.Thread(target=_changes,
                               args=(git, churn_repo, tmp_path, states, stop, errors))
    url = f"{server.url}/{churn_repo.name}"
    variants = [(0, ()), (2, ()), (2, ("--heads",))]
    answers: list[tuple[int, tuple[str, ...], float, float, frozenset[str]]] = []

    def reader(first: int) -> None:
        # Several at once: concurrent requests share ref reads (RefCache.shared_read),
        # and none may be given a read that began before it did.
        try:
            i = first
            while changer.is_alive() or i < first + 3:
                version, args = variants[i % len(variants)]
                i += 1
                t0 = time.monotonic()
                got = _ls_remote(git, url, *args, version=version)
                answers.append((version, args, t0, time.monotonic(), got))
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    readers = [threading.Thread(target=reader, args=(k,)) for k in range(READERS)]
    changer.start()
    try:
        for t in readers:
            t.start()
    finally:
        for t in readers:
            t.join(timeout=300)
        stop.set()
        changer.join(timeout=120)
    assert not errors, errors
    assert len(states) == CHANGES + 1
    # Checked once every state is recorded (one is appended after its ls-remote).
    for version, args, t0, t1, got in answers:
        allowed = _allowed(states, t0, t1)
        if args:
            allowed = [frozenset(x for x in s if "\trefs/heads/" in x) for s in allowed]
        if got not in allowed:
            nearest = min(allowed, key=lambda s: len(s ^ got))
            pytest.fail(f"v{version} {args} answered a state that never was between "
                        f"its start and end: extra {sorted(got - nearest)[:5]}, "
                        f"missing {sorted(nearest - got)[:5]}")
    assert len(answers) >= 3 * 10, len(answers)
