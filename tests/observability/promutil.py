"""A real Prometheus for tests (Debian's ``prometheus``), promtool, and the rules file read
without a YAML library (the venv has none; test_prometheus checks this reader against the
rules Prometheus itself loaded)."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gitutil import REPO_ROOT, stop_process
from obsutil import free_port

DEPLOY = REPO_ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "rules.yml"
PROM_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "gitspout.json"


def tool(name: str) -> str:
    path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if path is None:
        import pytest

        pytest.skip(f"{name} is not installed (.ci/run installs Debian's prometheus)")
    return path


def promtool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([tool("promtool"), *args], input=stdin, capture_output=True,
                          timeout=60, cwd=REPO_ROOT)


@dataclass
class Rule:
    kind: str  # "record" or "alert"
    name: str
    expr: str
    for_: str = ""


def read_rules(path: Path = RULES) -> list[Rule]:
    """The rules of a rules file written in the style of deploy/prometheus/rules.yml: each
    rule starts with ``- record:`` or ``- alert:``; ``expr:`` is inline or a ``|`` block."""
    rules: list[Rule] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^\s*-\s+(record|alert):\s*(\S+)\s*$", line)
        if m:
            rules.append(Rule(m.group(1), m.group(2), ""))
        m = re.match(r"^(\s*)expr:\s*(.*)$", line)
        if m and rules:
            indent, rest = len(m.group(1)), m.group(2).strip()
            if rest in ("|", ">", "|-", ">-"):
                block = []
                i += 1
                while i < len(lines) and (not lines[i].strip() or
                                          len(lines[i]) - len(lines[i].lstrip()) > indent):
                    block.append(lines[i].strip())
                    i += 1
                rules[-1].expr = " ".join(b for b in block if b)
                continue
            rules[-1].expr = rest
        m = re.match(r"^\s*for:\s*(\S+)\s*$", line)
        if m and rules:
            rules[-1].for_ = m.group(1)
        i += 1
    return rules


class Prometheus:
    """``prometheus`` on 127.0.0.1 with a temporary TSDB, scraping ``targets`` every
    ``interval`` under job ``gitspout`` and evaluating ``rules`` as often."""

    def __init__(self, workdir: Path, targets: list[str], rules: Path = RULES,
                 interval: str = "1s") -> None:
        self.workdir = workdir
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n"
            f"  scrape_interval: {interval}\n"
            f"  scrape_timeout: {interval}\n"
            f"  evaluation_interval: {interval}\n"
            "rule_files:\n"
            f"  - {json.dumps(str(rules))}\n"
            "scrape_configs:\n"
            "  - job_name: gitspout\n"
            "    static_configs:\n"
            f"      - targets: {json.dumps(targets)}\n"
        )
        self.log = open(workdir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [tool("prometheus"), f"--config.file={config}",
             f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=workdir)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        self.log.flush()
        return (self.workdir / "prometheus.log").read_text(errors="replace")[-4000:]

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited:\n{self.logs()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"prometheus not ready after {timeout}s:\n{self.logs()}")

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}"
        data = urllib.parse.urlencode(params).encode() if params else None
        try:
            with urllib.request.urlopen(url, data=data, timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
            raise AssertionError(f"{path} {params}: HTTP {exc.code}: {body}") from None
        assert body.get("status") == "success", body
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", **params)
        assert data["resultType"] == "vector", data
        return list(data["result"])

    def scalar(self, expr: str, at: float | None = None) -> float:
        """The single value of ``expr``; 0 when it selects nothing (a series not yet born)."""
        result = self.query(expr, at)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else 0.0

    def wait(self, what: str, predicate: Any, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"prometheus: timed out waiting for {what}\n{self.logs()}")
            time.sleep(0.1)

    def wait_scrape_after(self, t: float, timeout: float = 20.0) -> float:
        """Wait until a scrape of the gitspout target started after wall-clock ``t``;
        returns that scrape's timestamp."""
        seen = [0.0]

        def newer() -> bool:
            r = self.query('timestamp(gitspout_requests_in_flight{job="gitspout"})')
            seen[0] = float(r[0]["value"][1]) if r else 0.0
            return seen[0] > t

        self.wait(f"a scrape after {t}", newer, timeout)
        return seen[0]

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


def finite(values: list[dict[str, Any]]) -> list[float]:
    out = []
    for r in values:
        v = float(r["value"][1])
        if not math.isnan(v):
            out.append(v)
    return out
