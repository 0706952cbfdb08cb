"""bench/loadgen.c, the saturation benchmark's load generator that drops bodies in the
kernel: built with the machine's C compiler and run for a second against a live gitspout
with request bodies recorded from real git, it counts exactly the requests gitspout
answered and exactly the body bytes gitspout wrote (ls-refs and the first answer of a
fetch are chunked, an identical fetch answered from the cache has a Content-Length: each
is read to its end, or the counts would part).
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

REPO_TOP = Path(__file__).resolve().parents[2]
for _extra in (REPO_TOP, REPO_TOP / "tests" / "server"):
    if str(_extra) not in sys.path:
        sys.path.append(str(_extra))  # bench; rawhttp

from gitutil import Committer, Git, poll, start_server  # noqa: E402
from rawhttp import request  # noqa: E402

from bench.saturation import build_loadgen, record, run_trunc  # noqa: E402


def _sums(port: int) -> dict[str, float]:
    text = request(port, "GET", "/metrics").text
    out = {}
    for name in ("gitspout_requests_total", "gitspout_response_bytes_total"):
        out[name] = sum(float(m.group(1)) for m in
                        re.finditer(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M))
    return out


@pytest.mark.timeout(120)
def test_loadgen_counts_what_the_server_answered(git: Git, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("cc") is None or shutil.which("taskset") is None:
        pytest.skip("no C compiler, or no taskset (util-linux)")
    exe = build_loadgen(tmp_path)
    work = tmp_path / "work"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    for i in range(8):
        c.commit({f"f{i % 3}.txt": f"line {i}\n" * (50 + i)}, f"commit {i}")
    root = tmp_path / "root"
    root.mkdir()
    git.run("clone", "-q", "--bare", str(work), str(root / "d0.git"))
    monkeypatch.setenv("HOME", str(git.home))  # record() runs git: the tests' config, not ours
    srv = start_server(root)
    try:
        bodies = record(srv.url, root / "d0.git", tmp_path / "rec")
        files = (tmp_path / "ls", tmp_path / "fetch")
        for path, body in zip(files, bodies["clone"], strict=True):
            path.write_bytes(body)
        before = _sums(srv.port)
        got = run_trunc(exe, srv.port, files, 2, 1.0, "0-1", 1)
        # The server counts a streamed answer once its last write returned: the client may
        # have read it a moment before. Nothing else asks meanwhile: its count only grows.
        after = poll(lambda: (a := _sums(srv.port))["gitspout_requests_total"]
                     - before["gitspout_requests_total"] >= got["requests"] and a,
                     10, "the server's count of the requests loadgen counted")
    finally:
        srv.stop()
    assert got["non2xx"] == 0 and got["socket_errors"] == 0, got
    assert got["requests"] >= 3, got
    # /metrics is not a git request: counted in neither
    assert got["requests"] == after["gitspout_requests_total"] - before["gitspout_requests_total"]
    assert got["bytes"] == (after["gitspout_response_bytes_total"]
                            - before["gitspout_response_bytes_total"])
