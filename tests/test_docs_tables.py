"""The README's tables of settings and metrics are generated, and this checks they are current.

* The settings table comes from the settings definition (``server/app/config.py``: each
  field's flag, default and help).
* The metrics table comes from a live gitspout's ``/metrics`` after one clone: every
  ``gitspout_*`` family, its type, its labels and its help.

A change to either that the README does not show fails here. To write the tables again:

    GITSPOUT_UPDATE_DOCS=1 .venv/bin/python -m pytest -q tests/test_docs_tables.py
"""

from __future__ import annotations

import dataclasses
import os
import re
import urllib.request
from pathlib import Path

import pytest
from gitspout.server.app.config import GROUPS, Config, group_of
from gitutil import Git, start_server
from prometheus_client.parser import text_string_to_metric_families

README = Path(__file__).resolve().parent.parent / "README.md"
UPDATE = os.environ.get("GITSPOUT_UPDATE_DOCS") == "1"


def _block(name: str) -> tuple[str, str, str]:
    """The README before, inside and after the generated block ``name``."""
    text = README.read_text()
    start = f"<!-- {name}: generated, see tests/test_docs_tables.py -->\n"
    end = f"<!-- end of {name} -->\n"
    i, j = text.index(start) + len(start), text.index(end)
    return text[:i], text[i:j], text[j:]


def _check(name: str, table: str) -> None:
    before, current, after = _block(name)
    if UPDATE and current != table:
        README.write_text(before + table + after)
        return
    assert current == table, (f"README.md's {name} is not current: run "
                              "GITSPOUT_UPDATE_DOCS=1 pytest tests/test_docs_tables.py")


def _default(f: dataclasses.Field[object]) -> str:
    value = f.default
    if value in (None, ""):
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if f.metadata.get("size") and isinstance(value, int) and value:
        for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
            if value % (1 << shift) == 0:
                return f"{value >> shift} {unit}"
    return str(value)


def settings_table() -> str:
    """By topic, in the order of ``serve --help`` (config.py GROUPS)."""
    lines = ["| topic | flag | env | default | meaning |", "| --- | --- | --- | --- | --- |"]
    order = list(GROUPS)
    for f in sorted(dataclasses.fields(Config),
                    key=lambda f: -1 if f.name == "config" else order.index(group_of(f))):
        topic = "" if f.name == "config" else group_of(f)
        flag = "--" + f.name.replace("_", "-")
        env = "GITSPOUT_" + f.name.upper()
        doc = str(f.metadata.get("help", "")).replace("|", "/")
        lines.append(f"| {topic} | `{flag}` | `{env}` | `{_default(f)}` | {doc} |")
    return "\n".join(lines) + "\n"


def test_settings_table_is_current() -> None:
    _check("settings table", settings_table())


def _metrics_table(text: str) -> str:
    labels: dict[str, set[str]] = {}
    rows: dict[str, tuple[str, str]] = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith("gitspout_"):
            continue
        rows[fam.name] = (fam.type, fam.documentation)
        for sample in fam.samples:
            labels.setdefault(fam.name, set()).update(
                k for k in sample.labels if k not in ("le", "quantile"))
    lines = ["| metric | type | what |", "| --- | --- | --- |"]
    for name in sorted(rows):
        kind, doc = rows[name]
        shown = name + ("_total" if kind == "counter" else "")
        keys = sorted(labels.get(name, ()))
        label = "{" + ",".join(keys) + "}" if keys else ""
        lines.append(f"| `{shown}{label}` | {kind} | {doc.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def test_metrics_table_is_current(tmp_path: Path, git: Git) -> None:
    root = tmp_path / "root"
    git.run("init", "-q", "--bare", str(root / "r.git"))
    work = tmp_path / "w"
    git.run("init", "-q", "-b", "main", str(work))
    (work / "a").write_text("a\n")
    git.run("add", "a", cwd=work)
    git.run("commit", "-qm", "a", cwd=work)
    git.run("push", "-q", str(root / "r.git"), "main", cwd=work)
    srv = start_server(root)
    try:
        git.run("clone", "-q", f"{srv.url}/r.git", str(tmp_path / "c"))
        with urllib.request.urlopen(f"{srv.url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    finally:
        srv.stop()
    table = _metrics_table(text)
    assert re.search(r"gitspout_requests_total\{[a-z_,]+\}", table)  # labels were seen
    _check("metrics table", table)


@pytest.mark.parametrize("name", ["settings table", "metrics table"])
def test_blocks_are_present(name: str) -> None:
    assert _block(name)[1].startswith("| ")
