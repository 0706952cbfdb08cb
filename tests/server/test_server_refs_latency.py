"""Latency isolation (issue 11): a small ls-refs on one repository completes while large
ls-refs of another one (200,000 packed refs, the first one parsing packed-refs from
scratch, the next ones after a ref moved) run. The p50/p99 go in the benchmark
(``python -m bench.loopstall --settings large-ls-refs``); here it must complete, correctly,
many times over while the large answers are under way."""

from __future__ import annotations

import shutil
import statistics
import threading
import time
from pathlib import Path

from gitutil import Git, copy_repo, start_server
from rawhttp import parse_pkts, post_upload_pack, v2_command

REFS = 200_000
ARGS = ("peel", "symrefs")


def _big_repo(git: Git, src: Path, dst: Path) -> None:
    copy_repo(src, dst)
    gd = ["--git-dir", str(dst)]
    git.run(*gd, "pack-refs", "--all")
    commits = git.out(*gd, "rev-list", "--all").split()
    lines = (dst / "packed-refs").read_text().splitlines(keepends=True)
    head, rest = lines[0], lines[1:]
    many = [f"{commits[i % len(commits)]} refs/heads/many/b{i:06d}\n" for i in range(REFS)]
    entries: list[list[str]] = []
    for line in rest:
        if line.startswith("^"):
            entries[-1].append(line)
        else:
            entries.append([line])
    entries += [[x] for x in many]
    entries.sort(key=lambda e: e[0].split(" ", 1)[1])
    (dst / "packed-refs").write_text(head + "".join(x for e in entries for x in e))


def test_small_ls_refs_completes_beside_large_ones(git: Git, fixture_root: Path,
                                                  tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    _big_repo(git, fixture_root / "basic.git", root / "big.git")
    copy_repo(fixture_root / "basic.git", root / "small.git")
    expected_small = git.run("upload-pack", "--stateless-rpc", str(root / "small.git"),
                             input=v2_command("ls-refs", args=ARGS),
                             env={"GIT_PROTOCOL": "version=2"}).stdout
    srv = start_server(root, extra_args=["--log-level", "warning"])
    try:
        large_done = threading.Event()
        large_results: list[tuple[int, int, float]] = []

        def large() -> None:
            try:
                commits = git.out("--git-dir", str(root / "big.git"), "rev-list", "-2",
                                  "main").split()
                for i in range(4):
                    if i:  # a push moved a ref: not the answer cached for the last state
                        git.run("--git-dir", str(root / "big.git"), "update-ref",
                                "refs/heads/bump", commits[i % 2])
                    t0 = time.monotonic()
                    resp = post_upload_pack(srv.port, v2_command("ls-refs", args=ARGS),
                                            repo="big.git", version=2, timeout=120)
                    large_results.append((resp.status, len(resp.body), time.monotonic() - t0))
            finally:
                large_done.set()

        worker = threading.Thread(target=large)
        worker.start()
        small: list[float] = []
        while not large_done.is_set():
            t0 = time.monotonic()
            resp = post_upload_pack(srv.port, v2_command("ls-refs", args=ARGS),
                                    repo="small.git", version=2, timeout=30)
            small.append(time.monotonic() - t0)
            assert resp.status == 200
            assert resp.body == expected_small
            time.sleep(0.005)  # the small client's pace (it is counted, below, not timed)
        worker.join(timeout=120)
    finally:
        srv.stop()
    assert [s for s, _, _ in large_results] == [200] * 4
    assert all(n > REFS * 40 for _, n, _ in large_results), large_results
    assert len(parse_pkts(expected_small)) > 2
    assert len(small) >= 5, (small, large_results)
    ms = sorted(x * 1000 for x in small)
    print(f"small ls-refs beside large ones: {len(ms)} samples, p50 "
          f"{statistics.median(ms):.1f} ms, max {ms[-1]:.1f} ms; large: "
          f"{[round(t * 1000) for _, _, t in large_results]} ms")
    shutil.rmtree(root, ignore_errors=True)
