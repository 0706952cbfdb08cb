"""Generate a deterministic, realistic fixture repository for the benchmark.

The content is real text -- the Python standard library sources of this
machine (a fixed, sorted file list) -- edited over a long history: every
commit inserts, deletes and modifies lines in a few files (frequently edited
"hot" files get most changes, as in real projects); files are added over
time, occasionally removed or renamed; feature branches fork from ``main``,
some are merged back (merge commits), some stay open; maintenance branches
and annotated/lightweight tags mark releases.  Everything derives from a
seeded :class:`random.Random` and fixed names/dates, so the same source files,
``--commits`` and ``--seed`` always give the same object ids.

The history is streamed into ``git fast-import`` (seconds, not thousands of
``git commit`` calls).  Then :mod:`bench.variants` derives

* ``<name>-gc.git``: one pack with deltas recomputed, bitmap, commit-graph,
  packed refs;
* ``<name>-unmaintained.git``: several packs + loose objects + loose refs,
  no bitmap, no commit-graph.

    python bench/make_repo.py [OUTDIR] [--commits N] [--seed S] [--name NAME]
                              [--many-refs N]

``--many-refs N`` also makes ``<name>-manyrefs-N.git``: the gc variant plus N packed
branches ``refs/heads/many/bNNNNNNN`` (on the history's commits, in turn), written
straight into ``packed-refs`` (sorted, fully peeled): 1,000,000 refs take seconds, not a
million ``git update-ref`` calls.

OUTDIR defaults to bench/work/synthetic; existing repositories are reused
unless ``--force``.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from random import Random
from typing import IO

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.variants import RepoInfo, make_variants  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_OUT = BENCH_DIR / "work" / "synthetic"
DEFAULT_SOURCE = Path("/root/.pyenv/versions/3.11.7/lib/python3.11")
BASE_DATE = 1262304000  # 2010-01-01T00:00:00Z
MAX_FILE_BYTES = 256 * 1024
AUTHORS = [
    ("Ada Lovelace", "ada@example.org", "+0000"),
    ("Alan Turing", "alan@example.org", "+0100"),
    ("Grace Hopper", "grace@example.org", "-0500"),
    ("Edsger Dijkstra", "edsger@example.org", "+0200"),
    ("Barbara Liskov", "barbara@example.org", "-0500"),
    ("Donald Knuth", "don@example.org", "-0800"),
    ("Frances Allen", "fran@example.org", "-0500"),
    ("Ken Thompson", "ken@example.org", "-0700"),
    ("Margaret Hamilton", "margaret@example.org", "-0400"),
    ("Niklaus Wirth", "niklaus@example.org", "+0100"),
    ("Radia Perlman", "radia@example.org", "-0700"),
    ("Tony Hoare", "tony@example.org", "+0000"),
]
VERBS = ["Fix", "Refactor", "Add", "Remove", "Document", "Simplify", "Optimize", "Clean up",
         "Handle", "Support", "Rework", "Test", "Update", "Deprecate", "Improve"]
NOUNS = ["error handling", "edge case", "docstring", "type hints", "parser", "cache",
         "buffer handling", "timeout", "encoding", "locking", "logging", "tests",
         "argument parsing", "unicode handling", "performance", "API", "comments"]
_WORD_RE = re.compile(rb"\b[a-z_][a-z0-9_]{3,}\b")
_NUM_RE = re.compile(rb"\b\d+\b")


def source_files(source: Path, limit: int | None = None) -> dict[str, list[bytes]]:
    """Sorted ``.py`` files under *source* (no site-packages) -> their lines."""
    files: dict[str, list[bytes]] = {}
    for p in sorted(source.rglob("*.py")):
        rel = p.relative_to(source).as_posix()
        if rel.startswith("site-packages/") or "/__pycache__/" in rel or not p.is_file():
            continue
        data = p.read_bytes()
        if 0 < len(data) <= MAX_FILE_BYTES:
            files[rel] = data.splitlines(keepends=True)
        if limit and len(files) >= limit:
            break
    if len(files) < 50:
        raise SystemExit(f"too few source files under {source} ({len(files)})")
    return files


@dataclass
class Branch:
    """A branch being written: its files and its tip mark."""

    name: str
    files: dict[str, tuple[bytes, ...]]
    tip: int | None = None
    touched: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)
    commits_left: int = 0


class HistoryWriter:
    """Writes a fast-import stream of a synthetic but realistic history."""

    def __init__(self, sources: dict[str, list[bytes]], seed: int, out: IO[bytes]) -> None:
        self.rng = Random(seed)
        self.sources = sources
        self.donors = list(sources)
        self.out = out
        self.mark = itertools.count(1)
        self.now = BASE_DATE
        pool = list(sources)
        self.rng.shuffle(pool)
        self.pending = pool  # files not yet added, popped from the end
        self.weights: dict[str, float] = {}
        self._cum: tuple[list[str], list[float]] | None = None
        self.main = Branch("main", {})
        self.features: list[Branch] = []
        self.counter = itertools.count(1)
        self.commits = 0

    # -- low level stream output ----------------------------------------------
    def _w(self, *chunks: bytes) -> None:
        for c in chunks:
            self.out.write(c)

    def _data(self, payload: bytes) -> None:
        self._w(b"data %d\n" % len(payload), payload, b"\n")

    def _ident(self, who: tuple[str, str, str]) -> bytes:
        return f"{who[0]} <{who[1]}> {self.now} {who[2]}".encode()

    def _commit(self, br: Branch, msg: str, changes: list[tuple[str, bytes | None]],
                merge: int | None = None) -> int:
        """Emit one commit on *br* with file *changes* (content None = delete)."""
        self.now += self.rng.randint(600, 2 * 86400)
        author = self.rng.choice(AUTHORS)
        committer = author if self.rng.random() < 0.8 else self.rng.choice(AUTHORS)
        mark = next(self.mark)
        self._w(b"commit refs/heads/%s\nmark :%d\n" % (br.name.encode(), mark))
        self._w(b"author ", self._ident(author), b"\ncommitter ", self._ident(committer), b"\n")
        self._data(msg.encode())
        if br.tip is not None:
            self._w(b"from :%d\n" % br.tip)
        if merge is not None:
            self._w(b"merge :%d\n" % merge)
        for path, content in changes:
            if content is None:
                self._w(b"D %s\n" % path.encode())
            else:
                self._w(b"M 100644 inline %s\n" % path.encode())
                self._data(content)
        self._w(b"\n")
        br.tip = mark
        self.commits += 1
        return mark

    # -- weighted choice of "hot" files ---------------------------------------
    def _pick_path(self, br: Branch) -> str | None:
        if self._cum is None:
            paths = sorted(self.weights)
            self._cum = (paths, list(itertools.accumulate(self.weights[p] for p in paths)))
        paths, cum = self._cum
        for _ in range(20):
            i = bisect.bisect_left(cum, self.rng.random() * cum[-1])
            path = paths[min(i, len(paths) - 1)]
            if path in br.files:
                return path
        return None

    def _set_weight(self, path: str, w: float | None) -> None:
        if w is None:
            self.weights.pop(path, None)
        else:
            self.weights[path] = w
        self._cum = None

    # -- content edits -----------------------------------------------------------
    def _edit(self, lines: tuple[bytes, ...]) -> tuple[bytes, ...]:
        """Apply 1-4 realistic hunks (insert / delete / modify lines)."""
        out = list(lines)
        for _ in range(self.rng.randint(1, 4)):
            op = self.rng.random()
            if op < 0.4 or len(out) < 10:
                donor = self.sources[self.rng.choice(self.donors)]
                start = self.rng.randrange(max(1, len(donor)))
                chunk = donor[start:start + self.rng.randint(1, 12)] or [b"\n"]
                pos = self.rng.randint(0, len(out))
                out[pos:pos] = chunk
            elif op < 0.65:
                pos = self.rng.randrange(len(out))
                del out[pos:pos + self.rng.randint(1, 8)]
            else:
                for _ in range(self.rng.randint(1, 3)):
                    pos = self.rng.randrange(len(out))
                    out[pos] = self._modify_line(out[pos])
        return tuple(out)

    def _modify_line(self, line: bytes) -> bytes:
        r = self.rng.random()
        words = _WORD_RE.findall(line)
        if r < 0.5 and words:
            old = self.rng.choice(words)
            new = self.rng.choice(_WORD_RE.findall(b" ".join(self.sources[
                self.rng.choice(self.donors)][:40])) or [b"value"])
            return line.replace(old, new, 1)
        if r < 0.7 and _NUM_RE.search(line):
            return _NUM_RE.sub(lambda m: b"%d" % (int(m.group()) + 1), line, count=1)
        indent = line[: len(line) - len(line.lstrip())]
        note = self.rng.choice(NOUNS).encode()
        return line + indent + b"# TODO: revisit " + note + b"\n"

    def _message(self, paths: list[str]) -> str:
        mod = paths[0].rsplit("/", 1)[-1].removesuffix(".py") if paths else "misc"
        subject = f"{mod}: {self.rng.choice(VERBS).lower()} {self.rng.choice(NOUNS)}"
        body = "" if self.rng.random() < 0.5 else (
            f"\n\nThis touches {len(paths)} file(s): {', '.join(paths[:4])}.\n"
            f"Reviewed-by: {self.rng.choice(AUTHORS)[0]}\n")
        return subject + body + "\n"

    # -- commit kinds -------------------------------------------------------------
    def _add_files(self, br: Branch, count: int) -> list[tuple[str, bytes | None]]:
        changes: list[tuple[str, bytes | None]] = []
        for _ in range(min(count, len(self.pending))):
            src = self.pending.pop()
            path = "Lib/" + src
            br.files[path] = tuple(self.sources[src])
            self._set_weight(path, self.rng.paretovariate(1.2))
            changes.append((path, b"".join(br.files[path])))
        return changes

    def _edit_files(self, br: Branch, count: int) -> list[tuple[str, bytes | None]]:
        changes: dict[str, bytes | None] = {}
        for _ in range(count):
            path = self._pick_path(br)
            if path is None:
                continue
            br.files[path] = self._edit(br.files[path])
            changes[path] = b"".join(br.files[path])
        return list(changes.items())

    def _rename_file(self, br: Branch) -> list[tuple[str, bytes | None]]:
        old = self._pick_path(br)
        if old is None:
            return []
        stem, _, _ = old.rpartition(".")
        new = f"{stem}_{self.rng.choice(['old', 'impl', 'compat', 'v2', 'base'])}.py"
        if new in br.files:
            return []
        br.files[new] = self._edit(br.files.pop(old))
        self._set_weight(new, self.weights.get(old, 1.0))
        br.deleted.add(old)
        return [(old, None), (new, b"".join(br.files[new]))]

    def _delete_file(self, br: Branch) -> list[tuple[str, bytes | None]]:
        path = self._pick_path(br)
        if path is None or len(br.files) < 100:
            return []
        del br.files[path]
        br.deleted.add(path)
        return [(path, None)]

    def step(self) -> None:
        """Write one ordinary commit on main or on an open feature branch."""
        br = self.main
        if self.features and self.rng.random() < 0.3:
            br = self.rng.choice(self.features)
        r = self.rng.random()
        changes: list[tuple[str, bytes | None]] = []
        if r < 0.05 and self.pending:
            changes = self._add_files(br, self.rng.randint(1, 8))
        elif r < 0.06:
            changes = self._delete_file(br)
        elif r < 0.075:
            changes = self._rename_file(br)
        if not changes:
            changes = self._edit_files(br, min(1 + int(self.rng.expovariate(0.6)), 8))
        br.touched.update(p for p, c in changes if c is not None)
        self._commit(br, self._message([p for p, _ in changes]), changes)
        if br is not self.main:
            br.commits_left -= 1
            if br.commits_left <= 0:
                self._finish_feature(br)
        else:
            self._after_main_commit()

    def _after_main_commit(self) -> None:
        if self.rng.random() < 1 / 40:
            name = f"feature/{self.rng.choice(NOUNS).replace(' ', '-')}-{next(self.counter)}"
            self.features.append(Branch(name, dict(self.main.files), self.main.tip,
                                        commits_left=self.rng.randint(2, 40)))
        if self.rng.random() < 1 / 300:
            self._tag_release()

    def _finish_feature(self, br: Branch) -> None:
        """Merge a finished feature into main (75%) or leave it unmerged."""
        self.features.remove(br)
        if br.name.startswith("maint/") or self.rng.random() >= 0.75:
            if self.rng.random() < 0.3 and br.tip is not None:
                self._w(b"reset refs/tags/snapshot-%d\nfrom :%d\n\n" % (br.tip, br.tip))
            return
        changes: list[tuple[str, bytes | None]] = []
        for path in sorted(br.touched):
            if path in br.files:
                self.main.files[path] = br.files[path]
                changes.append((path, b"".join(br.files[path])))
        for path in sorted(br.deleted):
            if path not in br.files and self.main.files.pop(path, None) is not None:
                changes.append((path, None))
        msg = f"Merge branch '{br.name}'\n\n* {br.name}: {len(changes)} file(s)\n"
        self._commit(self.main, msg, changes, merge=br.tip)
        self._after_main_commit()

    def _tag_release(self) -> None:
        """Annotated release tag on main; every third release gets a maint branch."""
        n = next(self.counter)
        version = f"v{1 + n // 40}.{n % 40}"
        who = self.rng.choice(AUTHORS)
        self._w(b"tag %s\nfrom :%d\ntagger %s\n" % (version.encode(), self.main.tip or 0,
                                                   self._ident(who)))
        self._data(f"Release {version}\n\nHighlights: {self.rng.choice(NOUNS)}.\n".encode())
        if self.rng.random() < 0.35:
            self.features.append(Branch(f"maint/{version}", dict(self.main.files),
                                        self.main.tip, commits_left=self.rng.randint(5, 30)))

    def write(self, commits: int) -> None:
        """The whole history: initial import, then *commits* more commits."""
        initial = self._add_files(self.main, max(50, len(self.pending) // 6))
        self._commit(self.main, "Initial import\n", initial)
        while self.commits < commits:
            self.step()
        self._w(b"done\n")


def fast_import(dest: Path, sources: dict[str, list[bytes]], commits: int, seed: int,
                timeout: float = 1800.0) -> None:
    """Create bare repo *dest* holding the generated history (via fast-import)."""
    subprocess.run(["git", "init", "-q", "--bare", "--initial-branch=main", str(dest)],
                   check=True, timeout=60)
    env = dict(os.environ, GIT_AUTHOR_DATE=f"{BASE_DATE} +0000",
               GIT_COMMITTER_DATE=f"{BASE_DATE} +0000", GIT_AUTHOR_NAME="bench",
               GIT_AUTHOR_EMAIL="bench@example.org", GIT_COMMITTER_NAME="bench",
               GIT_COMMITTER_EMAIL="bench@example.org")
    proc = subprocess.Popen(["git", "--git-dir", str(dest), "fast-import", "--quiet", "--done"],
                            stdin=subprocess.PIPE, env=env)
    assert proc.stdin is not None
    try:
        HistoryWriter(sources, seed, proc.stdin).write(commits)
        proc.stdin.close()
        rc = proc.wait(timeout=timeout)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if rc != 0:
        raise RuntimeError(f"git fast-import failed with status {rc}")


def build(out: Path, name: str, commits: int, seed: int, source: Path,
          force: bool = False) -> Iterator[tuple[str, RepoInfo]]:
    """Build ``<name>-src.git`` then the gc/unmaintained variants under *out*."""
    out.mkdir(parents=True, exist_ok=True)
    src = out / f"{name}-src.git"
    if force:
        for suffix in ("src", "gc", "unmaintained"):
            shutil.rmtree(out / f"{name}-{suffix}.git", ignore_errors=True)
    if not src.exists():
        t0 = time.monotonic()
        files = source_files(source)
        tmp = out / f".{name}-src.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        fast_import(tmp, files, commits, seed)
        tmp.rename(src)
        print(f"fast-import: {len(files)} source files, {commits} commits in "
              f"{time.monotonic() - t0:.1f}s", flush=True)
    yield from make_variants(src, out, name, recompute_deltas=True)


def add_many_refs(src: Path, dest: Path, count: int) -> Path:
    """*dest*: a copy of the bare repository *src* (objects hard-linked) whose packed-refs
    also holds *count* branches ``refs/heads/many/bNNNNNNN``, each on one of the commits
    of ``git rev-list --all`` in turn. Reused when present."""
    if dest.exists():
        return dest
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, copy_function=os.link)
    subprocess.run(["git", "--git-dir", str(tmp), "pack-refs", "--all"], check=True, timeout=600)
    commits = subprocess.run(["git", "--git-dir", str(tmp), "rev-list", "--all"], check=True,
                             capture_output=True, timeout=600).stdout.split()
    packed = tmp / "packed-refs"
    old = packed.read_bytes().splitlines(keepends=True) if packed.exists() else []
    entries: dict[bytes, list[bytes]] = {}
    last = b""
    for line in old:
        if line.startswith(b"#"):
            continue
        if line.startswith(b"^"):
            entries[last].append(line)
            continue
        last = line.split(b" ", 1)[1].rstrip(b"\n")
        entries[last] = [line]
    for i in range(count):
        name = b"refs/heads/many/b%07d" % i
        entries[name] = [commits[i % len(commits)] + b" " + name + b"\n"]
    # Written via a new file and a rename, as git does; the header matches git's.
    new = tmp / "packed-refs.new"
    with new.open("wb") as f:
        f.write(b"# pack-refs with: peeled fully-peeled sorted \n")
        for name in sorted(entries):
            f.writelines(entries[name])
    new.replace(packed)
    tmp.rename(dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description="Generate the synthetic benchmark repository")
    ap.add_argument("outdir", nargs="?", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--commits", type=int, default=7000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--name", default="synthetic")
    ap.add_argument("--source", type=Path, default=None,
                    help=f"directory of .py files (default {DEFAULT_SOURCE} or this "
                         "interpreter's stdlib)")
    ap.add_argument("--force", action="store_true", help="rebuild even if present")
    ap.add_argument("--many-refs", type=int, default=0, metavar="N",
                    help="also make <name>-manyrefs-N.git: the gc variant plus N packed refs")
    args = ap.parse_args(argv)
    source = args.source or (DEFAULT_SOURCE if DEFAULT_SOURCE.is_dir()
                             else Path(sysconfig.get_paths()["stdlib"]))
    t0 = time.monotonic()
    for label, info in build(args.outdir.resolve(), args.name, args.commits, args.seed, source,
                             args.force):
        print(f"{label}: {info.summary()}", flush=True)
    if args.many_refs:
        out = args.outdir.resolve()
        dest = out / f"{args.name}-manyrefs-{args.many_refs}.git"
        if args.force:
            shutil.rmtree(dest, ignore_errors=True)
        t1 = time.monotonic()
        add_many_refs(out / f"{args.name}-gc.git", dest, args.many_refs)
        print(f"{dest.name}: {args.many_refs} more packed refs in {time.monotonic() - t1:.1f}s",
              flush=True)
    print(f"total {time.monotonic() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
