"""Derive the two on-disk shapes the benchmark serves from one source repo.

* **gc**: what a well-maintained server has -- a single pack (optionally with
  deltas recomputed), a reachability bitmap, a commit-graph, packed refs.
* **unmaintained**: what a neglected one has -- several packs of different
  ages (older history first), the newest commits as loose objects, loose
  refs, no bitmap, no commit-graph, ``gc.auto=0``.

The unmaintained shape is cut along history: commits are listed oldest
first (``rev-list --all --date-order --reverse``, so every prefix is closed
under ancestry); pack *k* holds the objects reachable from prefix *k* but not
from prefix *k-1* (``pack-objects --revs`` with the prefixes' tips), and the
objects of the last ``loose_commits`` commits plus every remaining ref target
(e.g. annotated tags) are exploded into loose objects with
``unpack-objects``.

Both are built in a temporary directory next to the target and renamed into
place when complete; an existing target is reused (never rebuilt) so the
expensive work happens once.  The source repository is only read.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

GIT_TIMEOUT = 3600.0  # git/git repack with bitmaps takes minutes on 2 cores


class VariantError(RuntimeError):
    """Building or checking a repository variant failed."""


def git(repo: Path, *args: str, input: bytes | None = None, timeout: float = GIT_TIMEOUT,
        stdout: int | None = subprocess.PIPE) -> bytes:
    """Run ``git --git-dir REPO ARGS``; raise :class:`VariantError` on failure."""
    cmd = ["git", "--git-dir", str(repo), *args]
    try:
        res = subprocess.run(cmd, input=input, stdout=stdout, stderr=subprocess.PIPE,
                             timeout=timeout, env=_git_env())
    except subprocess.TimeoutExpired as e:
        raise VariantError(f"timeout after {timeout}s: {' '.join(cmd)}") from e
    if res.returncode != 0:
        raise VariantError(f"exit {res.returncode}: {' '.join(cmd)}\n"
                           f"{res.stderr.decode(errors='replace')[-3000:]}")
    return res.stdout or b""


def _git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    return env


@dataclass
class RepoInfo:
    """What a repository looks like on disk."""

    path: Path
    in_pack: int
    loose: int
    packs: int
    size_pack_kib: int
    bitmaps: int
    commit_graph: bool
    loose_refs: int
    packed_refs: int
    seconds: float = 0.0
    note: str = ""

    def summary(self) -> str:
        """One line for humans."""
        return (f"{self.path.name}: in-pack {self.in_pack}, loose {self.loose}, "
                f"packs {self.packs} ({self.size_pack_kib / 1024:.1f} MiB), bitmaps "
                f"{self.bitmaps}, commit-graph {'yes' if self.commit_graph else 'no'}, "
                f"refs {self.loose_refs} loose + {self.packed_refs} packed"
                + (f", built in {self.seconds:.1f}s" if self.seconds else "")
                + (f" [{self.note}]" if self.note else ""))


def describe_repo(repo: Path) -> RepoInfo:
    """Inspect packs, loose objects, bitmap, commit-graph and refs of *repo*."""
    counts = {k: int(v) for k, v in (line.split(": ") for line in
                                     git(repo, "count-objects", "-v").decode().splitlines())}
    packdir = repo / "objects" / "pack"
    info = repo / "objects" / "info"
    packed = repo / "packed-refs"
    n_packed = 0
    if packed.exists():
        n_packed = sum(1 for line in packed.read_text().splitlines()
                       if line and line[0] not in "#^")
    return RepoInfo(
        path=repo, in_pack=counts["in-pack"], loose=counts["count"], packs=counts["packs"],
        size_pack_kib=counts["size-pack"], bitmaps=len(list(packdir.glob("*.bitmap"))),
        commit_graph=(info / "commit-graph").exists() or (info / "commit-graphs").exists(),
        loose_refs=sum(1 for p in (repo / "refs").rglob("*") if p.is_file()),
        packed_refs=n_packed)


def init_bare(dest: Path, config: dict[str, str]) -> None:
    """``git init --bare`` *dest* and set *config*."""
    subprocess.run(["git", "init", "-q", "--bare", str(dest)], check=True, timeout=60,
                   env=_git_env(), stdout=subprocess.DEVNULL)
    for key, value in config.items():
        git(dest, "config", key, value)


def copy_refs(src: Path, dest: Path, exclude: frozenset[str] = frozenset()) -> int:
    """Copy every ref not in *exclude* (as loose refs, one transaction) and HEAD."""
    lines = git(src, "for-each-ref", "--format=%(objectname) %(refname)").decode().splitlines()
    pairs = [(oid, ref) for oid, ref in (ln.split(" ", 1) for ln in lines)
             if ref not in exclude]
    stdin = "".join(f"create {ref} {oid}\n" for oid, ref in pairs)
    git(dest, "update-ref", "--stdin", input=stdin.encode())
    head = subprocess.run(["git", "--git-dir", str(src), "symbolic-ref", "-q", "HEAD"],
                          capture_output=True, timeout=60, env=_git_env())
    if head.returncode == 0:
        git(dest, "symbolic-ref", "HEAD", head.stdout.decode().strip())
    else:  # detached HEAD
        (dest / "HEAD").write_text(git(src, "rev-parse", "HEAD").decode())
    return len(pairs)


def missing_objects(src: Path) -> set[str]:
    """Objects reachable from refs but absent (e.g. a mirror fetched with a filter)."""
    out = git(src, "rev-list", "--objects", "--all", "--missing=print").decode()
    return {line[1:] for line in out.splitlines() if line.startswith("?")}


def incomplete_refs(src: Path) -> tuple[frozenset[str], int]:
    """Refs whose history reaches a missing object, and how many objects are missing.

    Commits that introduce a missing tree/blob are found with one ``git log
    --raw`` pass (no blob content needed); badness is then propagated to
    descendants in topological order and mapped to the refs (tags peeled).
    """
    missing = missing_objects(src)
    if not missing:
        return frozenset(), 0
    bad = _commits_introducing(src, missing) | (missing & _all_commits(src))
    out = git(src, "rev-list", "--all", "--topo-order", "--reverse", "--parents").decode()
    for line in out.splitlines():
        oid, *parents = line.split()
        if any(p in bad or p in missing for p in parents):
            bad.add(oid)
    refs = git(src, "for-each-ref", "--format=%(refname) %(objectname) %(*objectname)")
    excluded = {ref for ref, oid, *peeled in (ln.split(" ") for ln in refs.decode().splitlines())
                if oid in bad or oid in missing or (peeled and peeled[0] in bad)}
    return frozenset(excluded), len(missing)


def _all_commits(src: Path) -> set[str]:
    return set(git(src, "rev-list", "--all", "--missing=allow-any").decode().split())


def _commits_introducing(src: Path, objects: set[str]) -> set[str]:
    """Commits whose (first-parent) diff adds or changes to one of *objects*."""
    cmd = ["git", "--git-dir", str(src), "log", "--all", "--raw", "-t", "--no-renames",
           "--no-abbrev", "--root", "--diff-merges=first-parent", "--format=commit %H"]
    found: set[str] = set()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, env=_git_env()) as proc:
        assert proc.stdout is not None
        current = ""
        for raw in proc.stdout:
            if raw.startswith(b"commit "):
                current = raw[7:].strip().decode()
            elif raw.startswith(b":"):
                new_oid = raw.split(b"\t", 1)[0].split()[3].decode()
                if new_oid in objects:
                    found.add(current)
    if proc.returncode != 0:
        raise VariantError(f"{' '.join(cmd)} failed with status {proc.returncode}")
    return found


def _copy_objects(src: Path, dest: Path) -> None:
    """Copy packs (.pack/.idx only: no .promisor/.bitmap) and loose objects."""
    if (src / "objects" / "info" / "alternates").exists():
        raise VariantError(f"{src} uses alternates; not supported")
    for pack in sorted((src / "objects" / "pack").glob("*.pack")):
        for ext in (".pack", ".idx"):
            shutil.copyfile(pack.with_suffix(ext), dest / "objects" / "pack" / (pack.stem + ext))
    for d in (src / "objects").glob("[0-9a-f][0-9a-f]"):
        shutil.copytree(d, dest / "objects" / d.name, dirs_exist_ok=True)


def _build(dest: Path, builder: object) -> RepoInfo:
    """Run ``builder(tmp)`` in a temp dir next to *dest*, then rename into place."""
    if dest.exists():
        return _with_note(describe_repo(dest))
    t0 = time.monotonic()
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        builder(tmp)  # type: ignore[operator]
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    info = _with_note(describe_repo(dest))
    info.seconds = time.monotonic() - t0
    return info


def _with_note(info: RepoInfo) -> RepoInfo:
    """Mention refs that were left out when the repository was built."""
    marker = info.path / "bench-excluded-refs"
    if marker.exists():
        info.note = f"{len(marker.read_text().split())} refs left out (see {marker.name})"
    return info


def make_gc_variant(src: Path, dest: Path, *, recompute_deltas: bool = False) -> RepoInfo:
    """One pack + bitmap + commit-graph + packed refs (reused if *dest* exists)."""
    def builder(tmp: Path) -> None:
        init_bare(tmp, {"gc.auto": "0", "repack.writeBitmaps": "true",
                        "pack.writeBitmapHashCache": "true"})
        excluded, n_missing = incomplete_refs(src)
        if excluded:
            note = (f"source lacks {n_missing} objects; left out {len(excluded)} refs "
                    "whose history needs them")
            print(f"{dest.name}: {note}", flush=True)
            (tmp / "bench-excluded-refs").write_text("".join(f"{r}\n" for r in sorted(excluded)))
        _copy_objects(src, tmp)
        copy_refs(src, tmp, excluded)
        args = ["repack", "-a", "-d", "-b", "-q"] + (["-f"] if recompute_deltas else [])
        git(tmp, *args)
        git(tmp, "prune", "--expire=now")
        git(tmp, "commit-graph", "write", "--reachable", "--no-progress")
        git(tmp, "pack-refs", "--all", "--prune")
        info = describe_repo(tmp)
        if info.packs != 1 or info.bitmaps != 1 or not info.commit_graph or info.loose:
            raise VariantError(f"gc variant has unexpected shape: {info.summary()}")
    return _build(dest, builder)


def history_cuts(src: Path) -> tuple[list[str], dict[str, list[str]]]:
    """All commits oldest-first (ancestry-closed prefixes) and their parents."""
    out = git(src, "rev-list", "--all", "--date-order", "--reverse", "--parents").decode()
    order: list[str] = []
    parents: dict[str, list[str]] = {}
    for line in out.splitlines():
        oid, *ps = line.split()
        order.append(oid)
        parents[oid] = ps
    return order, parents


def prefix_tips(order: Sequence[str], parents: dict[str, list[str]], n: int) -> list[str]:
    """Commits among the first *n* of *order* that no other of them has as parent."""
    prefix = order[:n]
    inner = {p for c in prefix for p in parents[c]}
    return [c for c in prefix if c not in inner]


def make_unmaintained_variant(src: Path, dest: Path, *,
                              fractions: Sequence[float] = (0.5, 0.75, 0.9),
                              loose_commits: int = 50) -> RepoInfo:
    """Several packs (cut at *fractions* of history) + loose newest objects."""
    def builder(tmp: Path) -> None:
        init_bare(tmp, {"gc.auto": "0", "repack.writeBitmaps": "false",
                        "core.commitGraph": "false", "fetch.writeCommitGraph": "false"})
        order, parents = history_cuts(src)
        n = len(order)
        cuts = sorted({max(1, int(n * f)) for f in fractions} | {max(1, n - loose_commits)})
        prev: list[str] = []
        packs: list[str] = []
        for cut in cuts:
            tips = prefix_tips(order, parents, cut)
            revs = "".join(f"{t}\n" for t in tips) + "".join(f"^{t}\n" for t in prev)
            name = git(src, "pack-objects", "--revs", "-q", "--delta-base-offset",
                       str(tmp / "objects" / "pack" / "pack"), input=revs.encode())
            packs.append(name.decode().strip())
            prev = tips
        _unpack_rest(src, tmp, prev)  # may freshen pack mtimes: age them afterwards
        if (src / "bench-excluded-refs").exists():
            shutil.copyfile(src / "bench-excluded-refs", tmp / "bench-excluded-refs")
        for age, pack_hash in enumerate(reversed(packs), start=1):
            _age_pack(tmp, pack_hash, time.time() - age * 30 * 86400)
        copy_refs(src, tmp)
        info = describe_repo(tmp)
        if info.packs < 2 or info.bitmaps or info.commit_graph or not info.loose:
            raise VariantError(f"unmaintained variant has unexpected shape: {info.summary()}")
    return _build(dest, builder)


def _age_pack(repo: Path, pack_hash: str, mtime: float) -> None:
    """Give a pack an older mtime (older history in older packs, as in real life)."""
    for f in (repo / "objects" / "pack").glob(f"pack-{pack_hash}.*"):
        os.utime(f, (mtime, mtime))


def _unpack_rest(src: Path, dest: Path, exclude_tips: list[str]) -> None:
    """Objects reachable from any ref but not from *exclude_tips* -> loose objects."""
    revs = "".join(f"^{t}\n" for t in exclude_tips).encode()
    pack = git(src, "pack-objects", "--revs", "--all", "-q", "--stdout", input=revs)
    git(dest, "unpack-objects", "-q", input=pack)


def make_variants(src: Path, out: Path, name: str, *, recompute_deltas: bool = False,
                  unmaintained: bool = True) -> Iterator[tuple[str, RepoInfo]]:
    """Build ``out/<name>-gc.git`` and ``out/<name>-unmaintained.git`` from *src*.

    The unmaintained variant is cut from the gc one, so its packs reuse good
    deltas (as packs received from a well-packed upstream would).
    """
    gc = make_gc_variant(src, out / f"{name}-gc.git", recompute_deltas=recompute_deltas)
    yield "gc", gc
    if unmaintained:
        yield "unmaintained", make_unmaintained_variant(gc.path, out / f"{name}-unmaintained.git")


def verify_same_content(a: Path, b: Path) -> int:
    """Check that two repos have identical refs and reachable object sets; return count."""
    refs_a = git(a, "for-each-ref", "--format=%(objectname) %(refname)")
    refs_b = git(b, "for-each-ref", "--format=%(objectname) %(refname)")
    if refs_a != refs_b:
        raise VariantError(f"refs differ between {a} and {b}")
    objs = [sorted(git(r, "rev-list", "--objects", "--all").split(b"\n")) for r in (a, b)]
    if objs[0] != objs[1]:
        raise VariantError(f"reachable objects differ between {a} and {b}")
    return len(objs[0]) - 1
