"""A real Prometheus (Debian's ``prometheus``) scraping a dedicated gitspout every second
with deploy/prometheus/rules.yml loaded: one clone moves the counters by exactly what the
client saw, the rules evaluate cleanly, and every dashboard query answers."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from gitutil import Git
from obsutil import (
    REPO,
    CapturedServer,
    CountingProxy,
    Exchange,
    dashboard_exprs,
    free_port,
    make_root,
    metric_names,
    start_captured,
    wait_idle,
)
from promutil import DASHBOARD, Prometheus, finite, read_rules

JOB = 'job="gitspout"'
# Grafana's variables, as Grafana would expand them for this one-target setup.
VARIABLES = {"$__rate_interval": "1m", "$job": "gitspout", "$instance": ".+"}


@dataclass
class Scenario:
    prom: Prometheus
    server: CapturedServer
    exchanges: list[Exchange]
    log: list[dict[str, Any]]
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)


# PromQL whose values are compared before and after the measured clone.
SERIES = {
    "fetch_requests": f'sum(gitspout_requests_total{{{JOB}, command="fetch"}})',
    "fetch_requests_v2_200": f'gitspout_requests_total{{{JOB}, service="git-upload-pack", '
                             'protocol="2", command="fetch", status="200"}',
    "requests": f"sum(gitspout_requests_total{{{JOB}}})",
    "bytes": f"sum(gitspout_response_bytes_total{{{JOB}}})",
    "bytes_info-refs": f'sum(gitspout_response_bytes_total{{{JOB}, command="info-refs"}})',
    "bytes_ls-refs": f'sum(gitspout_response_bytes_total{{{JOB}, command="ls-refs"}})',
    "bytes_fetch": f'sum(gitspout_response_bytes_total{{{JOB}, command="fetch"}})',
    "write_calls": f"sum(gitspout_response_write_calls_sum{{{JOB}}})",
    "write_syscalls": f"sum(gitspout_process_write_syscalls_total{{{JOB}}})",
    "fetch_durations": f'sum(gitspout_request_duration_seconds_count{{{JOB}, command="fetch"}})',
}


def _values(prom: Prometheus, at: float) -> dict[str, float]:
    return {k: prom.scalar(q, at) for k, q in SERIES.items()}


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory, obs_template: Path,
             git: Git) -> Iterator[Scenario]:
    tmp = tmp_path_factory.mktemp("prom")
    root = make_root(tmp / "served", obs_template)
    # Prometheus first: its service discovery hands out targets only after ~5 s, so gitspout
    # starts (on a port picked beforehand) and is warmed up meanwhile.
    port = free_port()
    prom = Prometheus(tmp / "prometheus", [f"127.0.0.1:{port}"])
    server = proxy = None
    try:
        server = start_captured(root, ["--port", str(port)])
        proxy = CountingProxy(server.port)
        prom.wait_ready()
        # Warm up (every series exists and Prometheus has seen it), then settle.
        git.run("clone", "-q", f"{server.url}/{REPO}", str(tmp / "warm"))
        prom.wait("the gitspout target to be up",
                  lambda: [r["value"][1] for r in prom.query(f"up{{{JOB}}}")] == ["1"])
        wait_idle(server.url)
        before_ts = prom.wait_scrape_after(time.time() + 0.01)
        logged = len(server.access_log())
        s = Scenario(prom, server, proxy.exchanges, [])
        s.before = _values(prom, before_ts)

        git.run("clone", "-q", f"{proxy.url}/{REPO}", str(tmp / "measured"))
        proxy.wait_closed()
        wait_idle(server.url)
        after_ts = prom.wait_scrape_after(time.time() + 0.01)
        s.after = _values(prom, after_ts)
        s.log = server.access_log()[logged:]
        yield s
    finally:
        if proxy is not None:
            proxy.stop()
        prom.stop()
        if server is not None:
            server.stop()


def test_one_clone_adds_exactly_one_fetch(scenario: Scenario) -> None:
    b, a = scenario.before, scenario.after
    assert b["fetch_requests"] == 1  # the warm-up clone
    assert a["fetch_requests"] - b["fetch_requests"] == 1
    assert a["fetch_requests_v2_200"] - b["fetch_requests_v2_200"] == 1
    assert [ex.command for ex in scenario.exchanges] == ["info-refs", "ls-refs", "fetch"]
    assert a["requests"] - b["requests"] == len(scenario.exchanges) == 3
    assert a["fetch_durations"] - b["fetch_durations"] == 1


def test_response_bytes_match_what_the_client_received(scenario: Scenario) -> None:
    b, a = scenario.before, scenario.after
    received = sum(ex.body_bytes for ex in scenario.exchanges)
    assert received > 0
    assert a["bytes"] - b["bytes"] == received
    for ex in scenario.exchanges:
        key = f"bytes_{ex.command}"
        assert a[key] - b[key] == ex.body_bytes, ex.command
    # the server's own access log says the same, request by request
    assert [(x["command"], x["bytes"]) for x in scenario.log] == \
        [(ex.command, ex.body_bytes) for ex in scenario.exchanges]


def test_write_syscalls_cover_the_write_calls(scenario: Scenario) -> None:
    b, a = scenario.before, scenario.after
    writes = a["write_calls"] - b["write_calls"]
    assert writes == sum(x["writes"] for x in scenario.log) > 0
    assert a["write_syscalls"] - b["write_syscalls"] >= writes


def test_rules_loaded_and_evaluated(scenario: Scenario) -> None:
    prom = scenario.prom
    groups = prom.api("rules")["groups"]
    loaded = {r["name"]: r for g in groups for r in g["rules"]}
    mine = read_rules()
    assert sorted(loaded) == sorted(r.name for r in mine)
    for r in mine:
        got = loaded[r.name]
        assert got["type"] == ("recording" if r.kind == "record" else "alerting")
        assert metric_names(got["query"]) == metric_names(r.expr), r.name  # the YAML reader
        assert got["health"] == "ok" and not got.get("lastError"), got
    prom.wait("a rule evaluation with the measured clone",
              lambda: prom.scalar(f"job_command:gitspout_requests:rate5m{{{JOB}, "
                                  'command="fetch"}') > 0)
    assert prom.scalar(f"job:gitspout_requests:rate5m{{{JOB}}}") > 0
    assert prom.scalar(f"job:gitspout_requests_errors:ratio_rate5m{{{JOB}}}") == 0
    assert prom.scalar(f"job:gitspout_response_bytes:rate5m{{{JOB}}}") > 0
    p99 = prom.scalar(f'job_command:gitspout_request_duration_seconds:p99_5m{{{JOB}, '
                      'command="fetch"}')
    assert 0 < p99 < 600
    assert prom.scalar(f"job:gitspout_fs_operations_per_request:ratio_rate5m{{{JOB}}}") > 0
    assert prom.scalar(f"job:gitspout_pack_dir_rescans:rate5m{{{JOB}}}") == 0
    assert prom.api("alerts")["alerts"] == []  # healthy traffic: nothing pending or firing


def _expand(expr: str) -> str:
    for var, val in VARIABLES.items():
        expr = expr.replace(var, val)
    assert "$" not in expr, expr
    return expr


# Panels whose every query must give a finite positive number after one clone.
POSITIVE = {"Requests/s", "Response bytes/s", "Request rate by command",
            "Requests by status and protocol", "Request latency per command (p50 / p95 / p99)",
            "Phase latency p95", "Response bytes/s by command", "Write calls per response",
            "Syscalls/s", "Pack objects/s by source", "Pack-source mix (share of objects)",
            "Pack bytes/s by source", "FS operations per request", "Cache hit ratio",
            "CPU", "Resident memory", "p99 fetch latency"}


def test_every_dashboard_query_answers(scenario: Scenario, tmp_path: Path) -> None:
    prom = scenario.prom
    dash = json.loads(DASHBOARD.read_text())
    report = []
    for title, ref, expr in dashboard_exprs(dash):
        result = prom.query(_expand(expr))  # raises on a PromQL error
        assert result, f"{title} {ref}: no data for {expr}"
        values = {json.dumps(r["metric"], sort_keys=True): float(r["value"][1]) for r in result}
        report.append({"panel": title, "ref": ref, "expr": expr, "values": values})
        if title in POSITIVE:
            assert any(v > 0 for v in finite(result)), f"{title} {ref}: {values}"
        else:  # ratios, queues, in-flight: defined, and not negative
            assert all(v >= 0 for v in finite(result)), f"{title} {ref}: {values}"
    out = tmp_path / "dashboard-values.json"
    out.write_text(json.dumps(report, indent=1))
    for r in report:
        shown = ", ".join(f"{k if k != '{}' else ''}={v:.6g}" if not math.isnan(v) else f"{k}=NaN"
                          for k, v in r["values"].items())
        print(f"{r['panel']} [{r['ref']}]: {shown}")
