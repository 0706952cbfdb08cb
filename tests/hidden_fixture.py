"""A repository with commits reachable only from hidden refs, for hidden-object tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gitutil import Committer, Git
from packutil import hidden_only_objects, objects_reachable

INFINITE = "2147483647"


@dataclass
class Leak:
    root: Path
    gitdir: Path
    tip: str        # visible refs/heads/main
    s: str          # hidden commit S
    s2: str         # hidden child S2 of S
    hidden_only: set[str]
    visible: set[str]


def build_leak_repo(git: Git, root: Path, work: Path) -> Leak:
    """``ROOT/leak.git``: main is visible; S and its child S2 sit behind hidden refs."""
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    for i in range(4):
        c.commit({"README": f"v{i}\n", f"f{i}.txt": f"public {i}\n"}, f"public {i}")
    git.run("checkout", "-q", "-b", "secret", cwd=work)
    c.commit({"secret.txt": "top secret S\n", "sdir/inner.txt": "inner secret\n"}, "S")
    s = git.out("rev-parse", "HEAD", cwd=work).strip()
    c.commit({"secret2.txt": "second secret\n"}, "S2")
    s2 = git.out("rev-parse", "HEAD", cwd=work).strip()
    gitdir = root / "leak.git"
    git.run("clone", "-q", "--bare", str(work), str(gitdir))
    git.run("update-ref", "refs/hidden/secret", s, cwd=gitdir)
    git.run("update-ref", "refs/hidden/secret2", s2, cwd=gitdir)
    git.run("update-ref", "-d", "refs/heads/secret", cwd=gitdir)
    git.run("config", "uploadpack.hideRefs", "refs/hidden", cwd=gitdir)
    tip = git.out("rev-parse", "refs/heads/main", cwd=gitdir).strip()
    hidden = hidden_only_objects(git, gitdir, ["refs/heads/main"], ["refs/hidden/secret2"])
    assert s in hidden and s2 in hidden
    visible = objects_reachable(git, gitdir, "refs/heads/main")
    return Leak(root, gitdir, tip, s, s2, hidden, visible)


