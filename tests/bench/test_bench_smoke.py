"""Smoke test of the benchmark harness: ``python -m bench.run --quick --json OUT``.

Runs the CI mode of the benchmark (a small synthetic repository, both on-disk
variants, clone-v2 and fetch-1, one round) against git-http-backend behind
nginx + fcgiwrap (A) and gitspout (B), and checks the raw samples it writes.
The figures themselves are not asserted: the machine is shared and noisy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_TOP = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 240  # the quick mode is meant to take well under 2 minutes on 2 cores


def _missing_tools() -> list[str]:
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [tool for tool in ("nginx", "fcgiwrap") if shutil.which(tool, path=path) is None]


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_quick_benchmark_measures_both_servers(tmp_path: Path) -> None:
    missing = _missing_tools()
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (apt-get install -y nginx "
                    "fcgiwrap); the benchmark's reference server needs them")
    out = tmp_path / "bench.json"
    res = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--json", str(out),
         "--tmp-dir", str(tmp_path)],
        cwd=REPO_TOP, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    log = f"stdout:\n{res.stdout[-6000:]}\nstderr:\n{res.stderr[-3000:]}"
    assert res.returncode == 0, log
    assert "repo variant case" in res.stdout, log   # the final table was printed
    data = json.loads(out.read_text())
    samples = data["samples"]

    combos = {(v, c) for v in ("gc", "unmaintained") for c in ("clone-v2", "fetch-1")}
    for server, impl in (("A", "git-http-backend"), ("B", "gitspout")):
        mine = [s for s in samples if s["server"] == server]
        assert {(s["variant"], s["case"]) for s in mine} == combos, log
        for s in mine:
            what = f"{impl} {s['variant']} {s['case']} run {s['run']}"
            assert s["impl"] == impl
            assert s["error"] is None, f"{what}: {s['error']}"
            assert s["cpu_ns"] > 0, f"{what}: no server CPU measured"
            assert s["bytes_down"] > 0, f"{what}: no bytes counted by the proxy"
            assert s["wall_s"] > 0
        assert any(s["peak_rss_bytes"] for s in mine), f"{impl}: no peak RSS"

    # gitspout's cold run (first request after a restart) is recorded separately
    cold = [s for s in samples if s["cold"]]
    assert {(s["variant"], s["case"]) for s in cold} == combos
    assert all(s["server"] == "B" for s in cold)

    # the first run of each server per case was fsck'd, and every fsck was clean
    checked = [s for s in samples if s["fsck"] != "skipped"]
    assert {(s["server"], s["variant"], s["case"]) for s in checked} == {
        (srv, v, c) for srv in ("A", "B") for v, c in combos}
    for s in checked:
        assert s["fsck"].startswith("clean"), f"{s['server']} {s['variant']} {s['case']}: " \
                                              f"fsck {s['fsck']}"

    # one pushed commit per variant, fetched by both servers' clients
    assert len(data["pushes"]) == 2
    assert len({p["commit"] for p in data["pushes"].values()}) == 1  # deterministic commit

    rows = {(m["variant"], m["case"]): m for m in data["medians"]}
    assert set(rows) == combos
    for m in rows.values():
        for key in ("a_cpu_ms", "b_cpu_ms", "a_bytes", "b_bytes", "b_cold_cpu_ms"):
            assert m[key], f"{m['variant']} {m['case']}: {key} missing"
