"""bench/make_repo.py --many-refs: packed-refs written directly is what git reads."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench.make_repo import add_many_refs


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def test_many_refs_are_sorted_packed_and_valid(tmp_path: Path) -> None:
    src = tmp_path / "src.git"
    work = tmp_path / "work"
    _git("init", "-q", "-b", "main", str(work))
    for i in range(3):
        _git("-C", str(work), "-c", "user.name=b", "-c", "user.email=b@e", "commit", "-q",
             "--allow-empty", "-m", f"c{i}")
    _git("-C", str(work), "-c", "user.name=b", "-c", "user.email=b@e", "tag", "-a", "-m", "t",
         "v1")
    _git("clone", "-q", "--bare", str(work), str(src))
    dest = add_many_refs(src, tmp_path / "many.git", 2000)
    refs = _git("--git-dir", str(dest), "for-each-ref", "--format=%(refname)").split()
    assert len(refs) == 2000 + 2 and "refs/tags/v1" in refs
    assert refs == sorted(refs)
    assert not (dest / "refs" / "heads" / "main").exists()
    lines = (dest / "packed-refs").read_text().splitlines()
    assert lines[0] == "# pack-refs with: peeled fully-peeled sorted "
    assert any(line.startswith("^") for line in lines)  # v1's peeled line kept
    _git("--git-dir", str(dest), "fsck", "--no-progress")
    assert add_many_refs(src, tmp_path / "many.git", 5) == dest  # reused
