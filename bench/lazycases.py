"""Bench cases of issue 23: lazy fetches after a blobless clone, and a deepen.

* ``lazy-blob``: a ``--filter=blob:none`` bare clone asks for one old blob by id (what
  ``git cat-file`` or ``git log -p`` on a partial clone does): one promisor fetch.
* ``lazy-checkout``: ``git checkout`` in a ``--filter=blob:none --no-checkout`` clone: the
  batched promisor fetch of every blob of the tip.
* ``blobless-checkout``: ``git clone --filter=blob:none`` with its checkout, in one go.
* ``deepen-1-20``: a ``--depth 1`` clone of every branch fetches with ``--depth=20``.

Each run starts from a ``cp -a`` of a template made once per repository over ``file://``
(before any timing), its remote pointed at the side measured. Besides CPU, wall and bytes,
each sample records the objects the server sent (``objects``): the entries of the packs
the run added (``fetch.unpackLimit=1`` keeps every received pack, duplicates included).
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

from bench.client import client_env, git_out, run_git
from bench.run import Bench, Case, Side

KEEP_PACKS = ("-c", "fetch.unpackLimit=1", "-c", "transfer.unpackLimit=1")
OLD_COMMITS = 200  # the lazy blob comes from this many first-parent commits below HEAD


def make_case(name: str, bench: Bench, repo: str, served: Path) -> Case:
    """The case called ``name`` (one of ``bench.run.LAZY_CASES``)."""
    return {"lazy-blob": LazyBlobCase, "lazy-checkout": LazyCheckoutCase,
            "blobless-checkout": BloblessCheckoutCase,
            "deepen-1-20": DeepenCase}[name](bench, repo, served)


def pack_entries(objects: Path) -> dict[str, int]:
    """Entries of each pack index under ``objects/pack`` (version 2: the last fan-out word)."""
    out = {}
    for idx in sorted((objects / "pack").glob("pack-*.idx")):
        with idx.open("rb") as fh:
            head = fh.read(8 + 256 * 4)
        if head[:4] != b"\xfftOc":
            raise AssertionError(f"{idx}: not a version 2 pack index")
        out[idx.name] = struct.unpack(">I", head[-4:])[0]
    return out


def loose_count(objects: Path) -> int:
    return sum(1 for d in objects.glob("[0-9a-f][0-9a-f]") for _ in d.iterdir())


class _FromTemplate(Case):
    """A case whose runs each start from a copy of one template clone."""

    clone_args: tuple[str, ...] = ()
    gitdir = "."  # where the git directory is inside a copy

    def __init__(self, bench: Bench, repo: str, served: Path) -> None:
        super().__init__(bench, repo, served)
        self.head = git_out(["--git-dir", str(served), "symbolic-ref", "--short", "HEAD"])
        self.template = bench.tmp / f"template-{self.name}-{repo}"
        if not self.template.exists():
            run_git(["clone", "--quiet", *self.clone_args, f"file://{served}",
                     str(self.template)], timeout=self.timeout)
        self.before = pack_entries(self.template / self.gitdir / "objects")
        self.loose_before = loose_count(self.template / self.gitdir / "objects")

    def prepare(self, side: Side, run: int) -> Path:
        dest = self.bench.scratch_path(f"{side.label}-{self.name}-{run}")
        subprocess.run(["cp", "-a", str(self.template), str(dest)], check=True,
                       timeout=self.timeout)
        run_git(["--git-dir", str(dest / self.gitdir), "remote", "set-url", "origin",
                 side.url(self.repo)])
        return dest

    def objects_sent(self, state: Path) -> int:
        objects = state / self.gitdir / "objects"
        new = {k: v for k, v in pack_entries(objects).items() if k not in self.before}
        return sum(new.values()) + loose_count(objects) - self.loose_before

    def cleanup(self, state: Any) -> None:
        shutil.rmtree(state, ignore_errors=True)


class LazyBlobCase(_FromTemplate):
    name = "lazy-blob"
    clone_args = ("--bare", "--filter=blob:none")

    def __init__(self, bench: Bench, repo: str, served: Path) -> None:
        super().__init__(bench, repo, served)
        old = git_out(["--git-dir", str(served), "rev-list", "--first-parent",
                       f"--skip={OLD_COMMITS}", "--max-count=1", "HEAD"]) or \
            git_out(["--git-dir", str(served), "rev-list", "--max-parents=0", "--max-count=1",
                     "HEAD"])
        listing = git_out(["--git-dir", str(served), "ls-tree", "-r", old])
        self.blob = next(line.split()[2] for line in listing.splitlines()
                         if line.split()[1] == "blob")

    def op(self, side: Side, state: Path) -> None:
        run_git([*KEEP_PACKS, "--git-dir", str(state), "cat-file", "-e", self.blob],
                timeout=self.timeout)

    def verify(self, side: Side, state: Path, check: bool) -> str:
        sent = self.objects_sent(state)
        if sent < 1:
            raise AssertionError(f"no object arrived for {self.blob}")
        # Present locally now: no promisor remote to fall back on.
        run_git(["--git-dir", str(state), "-c", "remote.origin.promisor=false",
                 "-c", "extensions.partialClone=", "cat-file", "-e", self.blob])
        return f"blob {self.blob[:12]} local, {sent} object(s)"


class LazyCheckoutCase(_FromTemplate):
    name = "lazy-checkout"
    clone_args = ("--filter=blob:none", "--no-checkout")
    gitdir = ".git"

    def op(self, side: Side, state: Path) -> None:
        run_git([*KEEP_PACKS, "-C", str(state), "checkout", "--quiet", "--force", self.head],
                timeout=self.timeout)

    def verify(self, side: Side, state: Path, check: bool) -> str:
        return _verify_checkout(state, self.timeout)


def _verify_checkout(work: Path, timeout: float) -> str:
    files = git_out(["-C", str(work), "ls-files"]).splitlines()
    tree = git_out(["-C", str(work), "ls-tree", "-r", "--name-only", "HEAD"]).splitlines()
    if files != tree or git_out(["-C", str(work), "status", "--porcelain"]):
        raise AssertionError(f"checkout incomplete: {len(files)} of {len(tree)} files")
    return f"{len(files)} files checked out"


class BloblessCheckoutCase(Case):
    """``git clone --filter=blob:none URL`` (with its checkout): clone and lazy fetch."""

    name = "blobless-checkout"

    def prepare(self, side: Side, run: int) -> Path:
        return self.bench.scratch_path(f"{side.label}-{self.name}-{run}")

    def op(self, side: Side, state: Path) -> None:
        run_git([*KEEP_PACKS, "-c", "protocol.version=2", "clone", "--quiet",
                 "--filter=blob:none", side.url(self.repo), str(state)], timeout=self.timeout)

    def verify(self, side: Side, state: Path, check: bool) -> str:
        return _verify_checkout(state, self.timeout)

    def objects_sent(self, state: Path) -> int:
        objects = state / ".git" / "objects"
        return sum(pack_entries(objects).values()) + loose_count(objects)

    def cleanup(self, state: Any) -> None:
        shutil.rmtree(state, ignore_errors=True)


class DeepenCase(_FromTemplate):
    """A ``--depth 1`` clone of every branch (no checkout) fetching with ``--depth=20``,
    as a CI job that needs more history does. Reports how many of the objects sent the
    client had already (git-http-backend: none)."""

    name = "deepen-1-20"
    clone_args = ("--no-checkout", "--depth", "1", "--no-single-branch")
    gitdir = ".git"

    def __init__(self, bench: Bench, repo: str, served: Path) -> None:
        super().__init__(bench, repo, served)
        self.had = set(git_out(["-C", str(self.template), "cat-file", "--batch-all-objects",
                                "--batch-check=%(objectname)"]).split())

    def op(self, side: Side, state: Path) -> None:
        # GIT_TRACE_PACKFILE keeps the pack as it came off the wire: index-pack --fix-thin
        # then appends the thin bases the client already had, and those were never sent.
        env = {**client_env(), "GIT_TRACE_PACKFILE": str(self._wire(state))}
        run_git([*KEEP_PACKS, "-c", "protocol.version=2", "-C", str(state), "fetch",
                 "--quiet", "--depth=20", "origin"], timeout=self.timeout, env=env)

    @staticmethod
    def _wire(state: Path) -> Path:
        return state / ".git" / "wire.pack"

    def objects_sent(self, state: Path) -> int:
        """Objects in the pack on the wire (its header), not the fixed-up pack on disk."""
        with self._wire(state).open("rb") as fh:
            head = fh.read(12)
        return int(struct.unpack(">I", head[8:12])[0])

    def verify(self, side: Side, state: Path, check: bool) -> str:
        gitdir = state / ".git"
        before = (self.template / ".git" / "shallow").read_text().split()
        after = (gitdir / "shallow").read_text().split()
        if sorted(before) == sorted(after):
            raise AssertionError("the shallow boundary did not move")
        # Entries below the wire pack's end came over the wire; those after it are the
        # bases index-pack appended (a thin pack's bases, which the client had).
        wire_end = self._wire(state).stat().st_size - 20
        resent = appended = 0
        for idx in (gitdir / "objects" / "pack").glob("pack-*.idx"):
            if idx.name in self.before:
                continue
            with idx.open("rb") as fh:
                listing = subprocess.run(["git", "show-index"], stdin=fh, capture_output=True,
                                         check=True, timeout=self.timeout).stdout.decode()
            for line in listing.splitlines():
                offset, oid = line.split()[:2]
                if int(offset) >= wire_end:
                    appended += 1
                elif oid in self.had:
                    resent += 1
        note = (f"{len(after)} shallow, {resent} objects sent that the client had, "
                f"{appended} thin bases")
        if check:
            run_git(["-C", str(state), "fsck", "--no-progress", "--connectivity-only"],
                    timeout=self.timeout)
            return f"clean (connectivity), {note}"
        return note
