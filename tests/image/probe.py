"""HTTP probes for tests/image/run.sh: poll to a deadline, print what was found.

Standard library only (plus PyYAML, which podman-compose depends on), so that the script
runs with the system Python and needs no project venv. Every command exits 0 on success
and 1 with a message on stderr when the deadline passes first.

    probe.py free-port
    probe.py wait-http URL SECONDS
    probe.py prom-target PROMETHEUS_URL JOB SECONDS
    probe.py prom-rules PROMETHEUS_URL RULES_FILE SECONDS
"""

from __future__ import annotations

import json
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

POLL = 0.5  # seconds between attempts; each attempt has its own timeout below


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (OSError, urllib.error.URLError) as exc:
        return 0, str(exc).encode()


def _poll(what: str, seconds: float, attempt: Callable[[], tuple[bool, str]]) -> int:
    """Calls attempt() until it returns (True, text) or the deadline passes."""
    deadline = time.monotonic() + seconds
    last = ""
    while True:
        done, last = attempt()
        if done:
            print(last)
            return 0
        if time.monotonic() >= deadline:
            print(f"{what}: not done after {seconds:g} s; last: {last}", file=sys.stderr)
            return 1
        time.sleep(POLL)


def free_port() -> int:
    """A port free on 127.0.0.1 now (the caller binds it soon after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, seconds: float) -> int:
    def attempt() -> tuple[bool, str]:
        status, body = _get(url)
        return status == 200, f"{url} -> {status} {body[:200]!r}"
    return _poll("wait-http", seconds, attempt)


def _api(base: str, path: str) -> Any:
    status, body = _get(base.rstrip("/") + path)
    if status != 200:
        return None
    doc = json.loads(body)
    return doc.get("data") if doc.get("status") == "success" else None


def prom_target(base: str, job: str, seconds: float) -> int:
    """Prometheus has scraped job's every target successfully (health "up")."""
    def attempt() -> tuple[bool, str]:
        data = _api(base, "/api/v1/targets")
        if data is None:
            return False, "no answer from /api/v1/targets"
        mine = [t for t in data["activeTargets"] if t["labels"].get("job") == job]
        summary = [(t["scrapeUrl"], t["health"], t.get("lastError", "")) for t in mine]
        return bool(mine) and all(t["health"] == "up" for t in mine), f"{job}: {summary}"
    return _poll("prom-target", seconds, attempt)


def _rule_names(rules_file: str) -> list[str]:
    import yaml

    with open(rules_file) as f:
        doc = yaml.safe_load(f)
    return [r.get("record") or r["alert"] for g in doc["groups"] for r in g["rules"]]


def prom_rules(base: str, rules_file: str, seconds: float) -> int:
    """Every rule of rules_file is loaded and has been evaluated without error."""
    expected = sorted(_rule_names(rules_file))

    def attempt() -> tuple[bool, str]:
        data = _api(base, "/api/v1/rules")
        if data is None:
            return False, "no answer from /api/v1/rules"
        rules = [r for g in data["groups"] for r in g["rules"]]
        loaded = sorted(r["name"] for r in rules)
        bad = [(r["name"], r["health"], r.get("lastError", "")) for r in rules
               if r["health"] != "ok"]
        text = (f"{len(loaded)} of {len(expected)} rules loaded in {len(data['groups'])} "
                f"groups; not ok yet: {bad}")
        return loaded == expected and not bad, text
    return _poll("prom-rules", seconds, attempt)


def main(argv: list[str]) -> int:
    cmd, args = argv[0], argv[1:]
    if cmd == "free-port":
        print(free_port())
        return 0
    if cmd == "wait-http":
        return wait_http(args[0], float(args[1]))
    if cmd == "prom-target":
        return prom_target(args[0], args[1], float(args[2]))
    if cmd == "prom-rules":
        return prom_rules(args[0], args[1], float(args[2]))
    print(f"unknown command {cmd!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
