"""Realistic fixture histories for the interoperability suite, built with git from scratch.

A seeded generator writes a ``git fast-import`` stream: a dozen source-like text files
edited a few lines at a time over a few hundred commits (so a repack makes long delta
chains), a feature branch merged back, a release branch, branches whose tips sit one to
four commits below main (a depth-1 fetch of all of them then has objects that are each
other's delta bases), annotated tags, a tag of a tag and a lightweight tag.

Shapes of the same history (:func:`make_shape`):

* ``gc``: ``git repack -adf --depth=50 --window=250 -b`` (git gc --aggressive's delta
  search, one pack with a bitmap), a commit-graph, packed refs: a maintained server repo.
* ``nobitmap``: the same without the bitmap (gitspout walks).
* ``pushed``: what a server that only ever received pushes holds: a pack per large push,
  each completed by ``index-pack --fix-thin`` (REF_DELTA entries whose bases were appended
  at the end of the pack), the last small push as loose objects; no bitmap, no
  commit-graph.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gitutil import Committer, Git

WORDS = ("alpha beta gamma delta epsilon value index buffer result stream client server "
         "object commit tree blob pack offset window cache limit depth filter shallow "
         "request answer header socket reader writer config path parse encode").split()


@dataclass(frozen=True)
class Spec:
    """What to generate: ``commits`` (at least 8) on main, ``files`` text files, ``seed``."""

    commits: int = 300
    files: int = 12
    seed: int = 23
    object_format: str = "sha1"
    tag_every: int = 50  # an annotated tag v0.N every this many commits on main


def _line(rng: random.Random) -> str:
    indent = "    " * rng.randrange(3)
    return indent + " ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 9))) + "\n"


def _edit(rng: random.Random, lines: list[str]) -> list[str]:
    """A few lines changed, inserted and deleted, as a developer's commit would."""
    out = list(lines)
    for _ in range(rng.randrange(1, 4)):
        at = rng.randrange(len(out))
        kind = rng.random()
        if kind < 0.5:
            out[at] = _line(rng)
        elif kind < 0.8 or len(out) < 20:
            out[at:at] = [_line(rng) for _ in range(rng.randrange(1, 5))]
        else:
            del out[at : at + rng.randrange(1, 3)]
    return out


class _Stream:
    """A fast-import stream under construction, with fixed identities and dates."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.mark = 0
        self.when = 1_600_000_000

    def data(self, payload: bytes) -> None:
        self.parts.append(b"data %d\n" % len(payload) + payload + b"\n")

    def commit(self, ref: str, message: str, parents: list[int],
               files: dict[str, str | None]) -> int:
        self.mark += 1
        self.when += 3600
        who = f"{self.when} +0000"
        self.parts.append(f"commit {ref}\nmark :{self.mark}\n"
                          f"author A U Thor <author@example.com> {who}\n"
                          f"committer C O Mitter <committer@example.com> {who}\n".encode())
        self.data(message.encode() + b"\n")
        for i, p in enumerate(parents):
            self.parts.append(f"{'from' if i == 0 else 'merge'} :{p}\n".encode())
        for path, content in sorted(files.items()):
            if content is None:
                self.parts.append(f"D {path}\n".encode())
            else:
                self.parts.append(f"M 100644 inline {path}\n".encode())
                self.data(content.encode())
        self.parts.append(b"\n")
        return self.mark

    def reset(self, ref: str, mark: int) -> None:
        self.parts.append(f"reset {ref}\nfrom :{mark}\n\n".encode())

    def tag(self, name: str, mark: int, message: str) -> None:
        self.parts.append(f"tag {name}\nfrom :{mark}\n"
                          f"tagger T Agger <tagger@example.com> {self.when} +0000\n".encode())
        self.data(message.encode() + b"\n")

    def bytes(self) -> bytes:
        return b"".join(self.parts) + b"done\n"


def _stream(spec: Spec) -> tuple[bytes, list[int]]:
    """The fast-import stream of ``spec``, and the marks of main's commits in order."""
    rng = random.Random(spec.seed)
    st = _Stream()
    tree: dict[str, list[str]] = {
        f"src/mod{i:02d}.py": [_line(rng) for _ in range(rng.randrange(80, 240))]
        for i in range(spec.files)
    }
    main = [st.commit("refs/heads/main", "initial import", [],
                      {p: "".join(v) for p, v in tree.items()})]
    feature: list[int] = []
    for n in range(1, spec.commits):
        files: dict[str, str | None] = {}
        for path in rng.sample(sorted(tree), min(len(tree), rng.randrange(1, 4))):
            tree[path] = _edit(rng, tree[path])
            files[path] = "".join(tree[path])
        if n % 97 == 0:  # now and then a new file
            path = f"doc/notes{n}.txt"
            tree[path] = [_line(rng) for _ in range(30)]
            files[path] = "".join(tree[path])
        parents = [main[-1]]
        if feature and n == spec.commits * 4 // 5:
            parents.append(feature[-1])  # the feature branch merged back
        main.append(st.commit("refs/heads/main", f"change {n}", parents, files))
        if n == spec.commits * 2 // 3:
            feature = _branch(st, rng, "refs/heads/feature", main[-1], dict(tree), 12)
        if n % spec.tag_every == 0:
            st.tag(f"v0.{n // spec.tag_every}", main[-1], f"release 0.{n // spec.tag_every}")
    _branch(st, rng, "refs/heads/release", main[-6], {}, 3)
    for k in range(1, 5):  # tips one to four commits below main
        st.reset(f"refs/heads/b{k}", main[-1 - k])
    st.reset("refs/tags/light", main[len(main) // 3])
    st.reset("refs/heads/main", main[-1])
    return st.bytes(), main


def _branch(st: _Stream, rng: random.Random, ref: str, start: int,
            tree: dict[str, list[str]], count: int) -> list[int]:
    marks: list[int] = []
    parent = start
    files = {p: list(v) for p, v in tree.items()} if tree else {"RELEASE.txt": ["release\n"]}
    for n in range(count):
        path = rng.choice(sorted(files))
        files[path] = _edit(rng, files[path]) if len(files[path]) > 1 else files[path] + [f"{n}\n"]
        parent = st.commit(ref, f"{ref.rsplit('/', 1)[-1]} {n}", [parent],
                           {path: "".join(files[path])})
        marks.append(parent)
    return marks


def build_source(git: Git, dest: Path, spec: Spec) -> Path:
    """A bare repository holding the whole history (loose-ish, fast-import's pack)."""
    git.run("init", "-q", "--bare", f"--object-format={spec.object_format}", str(dest))
    stream, _main = _stream(spec)
    git.run("fast-import", "--quiet", "--done", cwd=dest, input=stream)
    # A tag of a tag: include-tag and peeling follow chains.
    git.run("tag", "-a", "-m", "signed-off release", "v0.1-final", "v0.1", cwd=dest,
            env={"GIT_COMMITTER_DATE": "1700000000 +0000"})
    git.run("symbolic-ref", "HEAD", "refs/heads/main", cwd=dest)
    return dest


def make_shape(git: Git, src: Path, dest: Path, shape: str) -> Path:
    """A copy of ``src`` laid out as ``shape`` (``gc``, ``nobitmap`` or ``pushed``)."""
    if shape in ("gc", "nobitmap"):
        shutil.copytree(src, dest, symlinks=True)
        # A bare repository writes a bitmap unless told not to (repack.writeBitmaps).
        bitmap = ["-b"] if shape == "gc" else ["--no-write-bitmap-index"]
        git.run("repack", "-adf", "--depth=50", "--window=250", *bitmap, cwd=dest)
        git.run("commit-graph", "write", "--reachable", cwd=dest)
        git.run("pack-refs", "--all", cwd=dest)
        git.run("prune", cwd=dest)
        return dest
    if shape == "pushed":
        return _pushed(git, src, dest)
    raise ValueError(shape)


def _pushed(git: Git, src: Path, dest: Path) -> Path:
    fmt = git.out("rev-parse", "--show-object-format", cwd=src).strip()
    git.run("init", "-q", "--bare", f"--object-format={fmt}", str(dest))
    git.run("config", "receive.unpackLimit", "100", cwd=dest)
    git.run("config", "gc.auto", "0", cwd=dest)
    main = git.out("rev-list", "--first-parent", "--reverse", "main", cwd=src).split()
    steps = sorted({len(main) // 3, 2 * len(main) // 3, len(main) - 4})
    for commit in (main[k] for k in steps):  # large pushes: kept as packs, completed with --fix-thin
        git.run("push", "-q", str(dest), f"{commit}:refs/heads/main", cwd=src)
    refs = git.out("for-each-ref", "--format=%(refname)", "refs/heads", "refs/tags", cwd=src).split()
    # The rest (three commits, branches, tags): a small push, unpacked as loose objects.
    git.run("push", "-q", "--force", str(dest), *(f"{r}:{r}" for r in refs), cwd=src)
    git.run("symbolic-ref", "HEAD", "refs/heads/main", cwd=dest)
    return dest


def object_count(path: Path) -> int:
    out = subprocess.run(["git", "-C", str(path), "count-objects", "-v"], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    vals = dict(line.split(": ") for line in out.splitlines())
    return int(vals["count"]) + int(vals["in-pack"])


def push_new_commits(git: Git, served: Path, work: Path) -> None:
    """Three commits editing files, a new annotated tag, and branch b1 moved: pushed into
    ``served`` the way a developer would (its objects arrive loose)."""
    git.run("clone", "-q", str(served), str(work))
    c = Committer(git, work, start=1_700_000_000)
    for n in range(3):
        path = work / "src" / f"mod0{n}.py"
        text = path.read_text().splitlines(True)
        text[len(text) // 2] = f"    changed after the clone {n}\n"
        c.commit({f"src/mod0{n}.py": "".join(text) + f"# more {n}\n"}, f"after clone {n}")
    c.tag("v9.9", "after the clone")
    git.run("push", "-q", "origin", "main", "v9.9", "main:b1", "--force", cwd=work)
