"""Fixture repositories, built with the git CLI at fixed dates so ids are reproducible.

Layout of the served root::

    basic.git       linear main + a feature branch with a merge, tags, nested trees, a 4 KiB blob;
                    one pack with a bitmap and a commit-graph
    plain.git       the same history without bitmap or commit-graph (the walk path)
    hidden.git      basic + refs/hidden/secret (hidden by uploadpack.hideRefs) and
                    refs/other/* hidden by transfer.hideRefs except refs/other/visible
    empty.git       git init --bare
    multipack.git   history in three packs plus loose objects
    sha256.git      an object-format=sha256 repository
    manyrefs.git    100,000 packed refs
    team/app/.git   a non-bare repository, served as /team/app and /team/app.git

:func:`build_long_root` makes a second root (its own server) with a longer history.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from gitutil import Committer, Git

SECRET_TEXT = "only reachable from a hidden ref\n"


def _history(git: Git, work: Path, commits: int = 30) -> Committer:
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    for i in range(commits):
        files: dict[str, str | bytes] = {
            "README.md": f"# fixture\n\nrevision {i}\n",
            f"src/mod{i % 5}.py": "".join(f"line {j} of rev {i}\n" for j in range(40 + i)),
            f"docs/deep/er/page{i % 3}.txt": f"page text {i}\n" * 10,
        }
        if i == 3:
            files["big.bin"] = bytes((k * 7 + i) % 251 for k in range(4096))
        c.commit(files, f"commit {i}")
        if i == 10:
            c.tag("v1.0", "release 1.0")
        if i == 12:
            c.tag("light")
        if i == 15:
            git.run("checkout", "-q", "-b", "feature", cwd=work)
            for k in range(4):
                c.commit({f"feature/f{k}.txt": f"feature {k}\n"}, f"feature {k}")
            git.run("checkout", "-q", "main", cwd=work)
            c.when += 60
            d = f"{c.when} +0000"
            git.run("merge", "-q", "--no-ff", "-m", "merge feature", "feature", cwd=work,
                    env={"GIT_AUTHOR_DATE": d, "GIT_COMMITTER_DATE": d})
    c.tag("v2.0", "release 2.0")
    return c


def _bare_from(git: Git, work: Path, dest: Path, bitmaps: bool = True) -> Path:
    """A gc'ed bare copy: one pack, with a reachability bitmap and a commit-graph."""
    git.run("clone", "-q", "--bare", "--no-local", str(work), str(dest))
    if bitmaps:
        git.run("repack", "-adqb", cwd=dest)
        git.run("commit-graph", "write", "--reachable", cwd=dest)
    else:
        git.run("-c", "repack.writeBitmaps=false", "repack", "-adq", cwd=dest)
    return dest


def _hidden(git: Git, work: Path, root: Path) -> None:
    dest = _bare_from(git, work, root / "hidden.git")
    c = Committer(git, work, start=1_700_000_000)
    git.run("checkout", "-q", "-b", "secret", cwd=work)
    c.commit({"secret.txt": SECRET_TEXT}, "secret commit")
    git.run("push", "-q", str(dest), "secret:refs/hidden/secret", cwd=work)
    git.run("push", "-q", str(dest), "main:refs/other/thing", cwd=work)
    git.run("push", "-q", str(dest), "main:refs/other/visible", cwd=work)
    git.run("checkout", "-q", "main", cwd=work)
    git.run("branch", "-q", "-D", "secret", cwd=work)
    git.run("config", "--add", "uploadpack.hideRefs", "refs/hidden", cwd=dest)
    git.run("config", "--add", "transfer.hideRefs", "refs/other", cwd=dest)
    git.run("config", "--add", "transfer.hideRefs", "!refs/other/visible", cwd=dest)


def _multipack(git: Git, build: Path, root: Path) -> None:
    work = build / "mp-work"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work, start=1_650_000_000)
    dest = root / "multipack.git"
    git.run("init", "-q", "--bare", "-b", "main", str(dest))
    git.run("config", "gc.auto", "0", cwd=dest)
    for batch in range(4):
        for i in range(6):
            c.commit({f"b{batch}/file{i}.txt": f"batch {batch} item {i}\n" * 20,
                      "shared.txt": f"shared {batch}.{i}\n" * 30}, f"b{batch} c{i}")
        # Batches 0-2 arrive as packs; the last one is exploded into loose objects.
        limit = "1" if batch < 3 else "100000"
        git.run("config", "receive.unpackLimit", limit, cwd=dest)
        git.run("push", "-q", str(dest), "main", cwd=work)
    git.run("tag", "-a", "mp-tag", "-m", "tag in a multi-pack repo", cwd=work,
            env={"GIT_COMMITTER_DATE": f"{c.when} +0000"})
    git.run("push", "-q", str(dest), "mp-tag", cwd=work)


def _sha256(git: Git, build: Path, root: Path) -> None:
    work = build / "sha256-work"
    git.run("init", "-q", "-b", "main", "--object-format=sha256", str(work))
    c = Committer(git, work, start=1_660_000_000)
    for i in range(8):
        c.commit({"a.txt": f"sha256 revision {i}\n" * 5, f"d/f{i % 2}": f"{i}\n"}, f"s{i}")
    c.tag("s-tag", "sha256 tag")
    git.run("clone", "-q", "--bare", "--no-local", str(work), str(root / "sha256.git"))


def _manyrefs(git: Git, root: Path, basic: Path, count: int = 100_000) -> None:
    dest = root / "manyrefs.git"
    shutil.copytree(basic, dest)
    commits = git.out("rev-list", "main", cwd=dest).split()
    lines = ["# pack-refs with: peeled fully-peeled sorted \n"]
    names = sorted(f"refs/heads/many/b{i:06d}" for i in range(count))
    for i, name in enumerate(names):
        lines.append(f"{commits[i % len(commits)]} {name}\n")
    existing = (dest / "packed-refs").read_text().splitlines(keepends=True)[1:]
    (dest / "packed-refs").write_text(lines[0] + "".join(_keep_peel_order(existing, lines[1:])))


def _keep_peel_order(existing: list[str], extra: list[str]) -> list[str]:
    """Merge two packed-refs bodies by ref name, keeping each ^peeled line after its ref."""
    entries: list[tuple[str, list[str]]] = []
    for line in existing + extra:
        if line.startswith("^"):
            entries[-1][1].append(line)
        else:
            entries.append((line.split(" ", 1)[1].strip(), [line]))
    entries.sort(key=lambda e: e[0])
    return [line for _, group in entries for line in group]


def _revert(git: Git, build: Path, root: Path) -> None:
    """A directory that returns to an earlier state (same tree id in two commits with
    different parents), the shape that tripped a diffing walk into never sending a blob.
    revert.git has no bitmap (the walk path); revert-bitmap.git has a bitmap for the early
    history and the rest arrives as loose objects (the bitmap walk path)."""
    work = build / "revert-work"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work, start=1_670_000_000)
    c.commit({"d/x.txt": "x content\n" * 30, "top.txt": "top\n"}, "base")
    early = root / "revert-bitmap.git"
    git.run("clone", "-q", "--bare", "--no-local", str(work), str(early))
    git.run("repack", "-adqb", cwd=early)
    c.commit({"d/y.txt": "y content\n" * 30}, "add y")
    (work / "d" / "y.txt").unlink()
    c.commit({"top.txt": "top 2\n"}, "remove y: d is back to its first tree")
    c.commit({"e/z.txt": "z\n"}, "later")
    git.run("clone", "-q", "--bare", "--no-local", str(work), str(root / "revert.git"))
    git.run("config", "receive.unpackLimit", "100000", cwd=early)
    git.run("push", "-q", str(early), "main", cwd=work)


def _nonbare(git: Git, work: Path, root: Path) -> None:
    dest = root / "team" / "app"
    dest.parent.mkdir(parents=True, exist_ok=True)
    git.run("clone", "-q", "--no-local", str(work), str(dest))


def build_fixture_root(git: Git, root: Path, build: Path) -> None:
    work = build / "work"
    _history(git, work)
    basic = _bare_from(git, work, root / "basic.git")
    git.run("pack-refs", "--all", cwd=basic)
    plain = _bare_from(git, work, root / "plain.git", bitmaps=False)
    git.run("pack-refs", "--all", cwd=plain)
    _hidden(git, work, root)
    git.run("init", "-q", "--bare", "-b", "main", str(root / "empty.git"))
    _multipack(git, build, root)
    _sha256(git, build, root)
    _manyrefs(git, root, basic)
    _nonbare(git, work, root)
    _revert(git, build, root)
    # gitspout allows filters by default; C git (the file:// ground truth) needs this.
    for name in ("basic.git", "plain.git", "hidden.git", "multipack.git", "sha256.git", "team/app",
                 "revert.git", "revert-bitmap.git"):
        git.run("config", "uploadpack.allowFilter", "true", cwd=root / name)


LONG_COMMITS = 1500
SHRINK_COMMITS = 60


def _long_stream(start: int = 1_690_000_000) -> bytes:
    """A fast-import stream: LONG_COMMITS commits on main, each changing one of 200 small
    files in 20 directories, and in the last SHRINK_COMMITS commits a big file that loses
    lines each time. git deltifies smaller objects against larger ones, so each version of
    that file is stored as a delta against its (older) parent version, in one chain: a
    shallow fetch must send the oldest version it includes without its stored base, and
    the newer ones as the deltas they are."""
    out: list[bytes] = []

    def data(content: bytes) -> None:
        out.append(b"data %d\n" % len(content) + content + b"\n")

    big = [f"line {k:05d} {'abcdefghij'[k % 10] * (k % 23 + 10)}\n".encode() for k in range(4000)]
    for i in range(LONG_COMMITS):
        when = start + 60 * i
        out.append(b"commit refs/heads/main\n")
        out.append(b"committer Test Committer <committer@example.com> %d +0000\n" % when)
        data(b"commit %d" % i)
        if i == 0:
            for f in range(200):
                out.append(b"M 100644 inline d%02d/f%03d.txt\n" % (f // 10, f))
                data(b"file %d at commit 0\n" % f)
        f = i % 200
        out.append(b"M 100644 inline d%02d/f%03d.txt\n" % (f // 10, f))
        data(b"file %d at commit %d\n" % (f, i) * (1 + i % 7))
        left = LONG_COMMITS - i
        if left <= SHRINK_COMMITS:
            # Shorter each time, and one more line edited: the best stored base of each
            # version is its parent version, so they form one delta chain.
            del big[len(big) - 40 :]
            big[(left * 61) % len(big)] = b"edited in commit %d\n" % i
            out.append(b"M 100644 inline shrink.txt\n")
            data(b"".join(big))
    return b"".join(out)


def build_long_root(git: Git, root: Path) -> None:
    """long.git (one pack with a bitmap and a commit-graph, uploadpack.allowRefInWant) and
    long-plain.git (the same without either) and long-refdelta.git (deltas stored as
    REF_DELTA), all with refs/hidden/secret (hidden: 10 commits off main~100)."""
    repo = root / "long.git"
    git.run("init", "-q", "--bare", "-b", "main", str(repo))
    git.run("fast-import", "--quiet", cwd=repo, input=_long_stream())
    base = git.out("rev-parse", "main~100", cwd=repo).strip()
    tree = git.out("rev-parse", "main~100^{tree}", cwd=repo).strip()
    parent = base
    for k in range(10):
        blob = git.out("hash-object", "-w", "--stdin", cwd=repo,
                       input=f"{SECRET_TEXT}{k}\n".encode()).strip()
        listing = git.out("ls-tree", tree, cwd=repo) + f"100644 blob {blob}\tsecret{k}.txt\n"
        tree = git.out("mktree", cwd=repo, input=listing.encode()).strip()
        date = f"{1_695_000_000 + k} +0000"
        parent = git.out("commit-tree", tree, "-p", parent, "-m", f"secret {k}", cwd=repo,
                         env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}).strip()
    git.run("update-ref", "refs/hidden/secret", parent, cwd=repo)
    git.run("tag", "-a", "long-tag", "-m", "a tag", "main~700", cwd=repo,
            env={"GIT_COMMITTER_DATE": "1695100000 +0000"})
    git.run("repack", "-adfqb", cwd=repo)  # -f: git's own delta choices, not fast-import's
    git.run("commit-graph", "write", "--reachable", cwd=repo)
    plain = root / "long-plain.git"
    git.run("clone", "-q", "--mirror", "--no-local", str(repo), str(plain))
    git.run("-c", "repack.writeBitmaps=false", "repack", "-adq", cwd=plain)
    # The same again with every delta stored as REF_DELTA (packs of older or other tools).
    refdelta = root / "long-refdelta.git"
    git.run("clone", "-q", "--mirror", "--no-local", str(repo), str(refdelta))
    git.run("-c", "repack.writeBitmaps=false", "-c", "repack.useDeltaBaseOffset=false",
            "repack", "-adfq", cwd=refdelta)
    for dest in (repo, plain, refdelta):
        git.run("config", "uploadpack.hideRefs", "refs/hidden", cwd=dest)
    # Only here: C git 2.39's own v2 shallow clone fails when the server allows
    # ref-in-want (it sends wanted-refs before shallow-info, which its client refuses).
    git.run("config", "uploadpack.allowRefInWant", "true", cwd=repo)


def build_many_packs(git: Git, dest: Path, packs: int, seed: int = 0) -> Path:
    """A bare repository of ``packs`` packs (one commit, tree and blob each), the way an
    unmaintained repository that is pushed to and never repacked gets there: one
    ``git fast-import`` whose ``checkpoint`` after every commit starts a new pack
    (``fastimport.unpackLimit=0``: small packs are kept, not exploded into loose objects)."""
    out = []
    for i in range(packs):
        data = f"file {i} of seed {seed}\n" * 3
        out.append(f"commit refs/heads/main\nmark :{i + 1}\n"
                   f"committer T <t@example.com> {1_600_000_000 + i} +0000\n"
                   f"data {len(f'c{i}')}\nc{i}\n")
        if i:
            out.append(f"from :{i}\n")
        out.append(f"M 644 inline f{i % 50}.txt\ndata {len(data)}\n{data}\ncheckpoint\n\n")
    git.run("init", "-q", "--bare", str(dest))
    git.run("symbolic-ref", "HEAD", "refs/heads/main", cwd=dest)
    git.run("-c", "fastimport.unpackLimit=0", "fast-import", "--quiet", cwd=dest,
            input="".join(out).encode(), timeout=600)
    return dest
