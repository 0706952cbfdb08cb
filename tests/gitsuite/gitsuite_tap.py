"""The pure half of the git test-suite runner: git's TAP output parsed, two runs compared.

git's test scripts (t/test-lib.sh) print TAP on stdout when run with ``--verbose-log``:
``ok 3 - title``, ``not ok 4 - title``, ``ok 5 # skip title (missing PREREQ)``,
``not ok 6 - title # TODO known breakage``, ``ok 7 - title # TODO known breakage vanished``,
and a plan, ``1..N`` (``1..0 # SKIP why`` when the whole script is skipped). Only a
``not ok`` without a ``# TODO`` directive is a failure, as ``prove`` counts it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["TestResult", "ScriptResult", "Row", "parse_tap", "compare", "format_report",
           "verbose_section"]

_LINE = re.compile(r"^(not ok|ok) (\d+)(?: - (.*?))?(?: # (skip|SKIP|TODO)\b ?(.*))?$")
_PLAN = re.compile(r"^1\.\.(\d+)(?: # SKIP ?(.*))?$")


@dataclass(frozen=True, slots=True)
class TestResult:
    """One test of a script: its number, title and outcome."""

    number: int
    title: str
    status: str  # "pass", "fail", "skip", "todo" (known breakage), "fixed" (breakage vanished)


@dataclass(slots=True)
class ScriptResult:
    """What one run of one test script printed, and how it ended."""

    script: str
    tests: dict[int, TestResult] = field(default_factory=dict)
    plan: int | None = None
    skip_all: str | None = None
    exit_code: int | None = None
    seconds: float = 0.0

    @property
    def failures(self) -> list[TestResult]:
        """Tests that failed (known breakages excluded), in number order."""
        return [t for _, t in sorted(self.tests.items()) if t.status == "fail"]

    @property
    def ran(self) -> int:
        """Tests that ran (not skipped)."""
        return sum(1 for t in self.tests.values() if t.status != "skip")

    @property
    def aborted(self) -> bool:
        """The script died before its plan, or exited non-zero with no failure to show
        for it (a broken setup, a killed Apache, a timeout)."""
        if self.plan is None:
            return True
        return bool(self.exit_code) and not self.failures

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (``from_json`` reads it back)."""
        return {
            "script": self.script, "plan": self.plan, "skip_all": self.skip_all,
            "exit_code": self.exit_code, "seconds": round(self.seconds, 1),
            "tests": [[t.number, t.status, t.title] for _, t in sorted(self.tests.items())],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> ScriptResult:
        """The inverse of ``to_json``."""
        tests = data["tests"]
        assert isinstance(tests, list)
        result = cls(str(data["script"]), plan=_opt_int(data.get("plan")),
                     skip_all=_opt_str(data.get("skip_all")),
                     exit_code=_opt_int(data.get("exit_code")),
                     seconds=float(str(data.get("seconds", 0.0))))
        for number, status, title in tests:
            result.tests[int(number)] = TestResult(int(number), str(title), str(status))
        return result


def _opt_int(value: object) -> int | None:
    return None if value is None else int(str(value))


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


def parse_tap(script: str, lines: Iterable[str]) -> ScriptResult:
    """Parse the TAP a git test script printed; lines that are not TAP are ignored."""
    result = ScriptResult(script)
    for raw in lines:
        line = raw.rstrip("\r\n")
        m = _LINE.match(line)
        if m:
            result.tests[int(m[2])] = _test_result(m)
            continue
        m = _PLAN.match(line)
        if m:
            result.plan = int(m[1])
            if m[2] is not None:
                result.skip_all = m[2]
    return result


def _test_result(m: re.Match[str]) -> TestResult:
    ok, number, title, directive, rest = m[1] == "ok", int(m[2]), m[3], m[4], m[5] or ""
    if directive in ("skip", "SKIP"):
        # git writes "ok 5 # skip <title> (missing PREREQ)": the title is in the directive.
        return TestResult(number, title or rest, "skip")
    if directive == "TODO":
        return TestResult(number, title or "", "fixed" if ok else "todo")
    return TestResult(number, title or "", "pass" if ok else "fail")


@dataclass(frozen=True, slots=True)
class Row:
    """One script's line of the report: the same script run with stock git-http-backend
    and with gitspout behind the same Apache."""

    script: str
    tests: int
    skipped: int
    stock_failures: tuple[int, ...]
    gitspout_failures: tuple[int, ...]
    gitspout_only: tuple[TestResult, ...]
    stock_only: tuple[TestResult, ...]
    notes: tuple[str, ...]


def compare(stock: ScriptResult | None, gitspout: ScriptResult | None) -> Row:
    """The report row of one script. A test fails "only with gitspout" when it failed
    with gitspout and passed with stock (a test stock did not run is not counted)."""
    some = gitspout or stock
    assert some is not None, "compare() needs at least one run"
    s_tests = stock.tests if stock else {}
    g_tests = gitspout.tests if gitspout else {}
    g_only = tuple(t for n, t in sorted(g_tests.items())
                   if t.status == "fail" and n in s_tests and s_tests[n].status == "pass")
    s_only = tuple(t for n, t in sorted(s_tests.items())
                   if t.status == "fail" and n in g_tests and g_tests[n].status == "pass")
    notes = tuple(note for name, run in (("stock", stock), ("gitspout", gitspout))
                  if run is not None for note in _notes(name, run))
    return Row(
        script=some.script,
        tests=max(len(s_tests), len(g_tests)),
        skipped=sum(1 for t in some.tests.values() if t.status == "skip"),
        stock_failures=tuple(t.number for t in stock.failures) if stock else (),
        gitspout_failures=tuple(t.number for t in gitspout.failures) if gitspout else (),
        gitspout_only=g_only, stock_only=s_only, notes=notes,
    )


def _notes(mode: str, run: ScriptResult) -> list[str]:
    notes = []
    if run.skip_all is not None:
        notes.append(f"{mode}: whole script skipped: {run.skip_all}")
    elif run.aborted:
        notes.append(f"{mode}: aborted (exit {run.exit_code}, "
                     f"{len(run.tests)} of {run.plan if run.plan is not None else '?'} tests)")
    if run.plan is not None and run.skip_all is None and len(run.tests) != run.plan:
        notes.append(f"{mode}: plan {run.plan}, {len(run.tests)} results")
    return notes


def format_report(rows: Sequence[Row], modes: Sequence[str] = ("stock", "gitspout")) -> str:
    """The report as Markdown: the per-script table, then each test that failed only
    with gitspout (and each that failed only with stock), then the notes."""
    out = ["| script | tests | skipped | stock failures | gitspout failures | gitspout only |",
           "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        only = ", ".join(str(t.number) for t in r.gitspout_only) or "-"
        out.append(f"| {r.script} | {r.tests} | {r.skipped} | {_count(r, 'stock', modes)} "
                   f"| {_count(r, 'gitspout', modes)} | {only} |")
    total_tests = sum(r.tests for r in rows)
    total_only = sum(len(r.gitspout_only) for r in rows)
    out.append(f"| **total** | {total_tests} | {sum(r.skipped for r in rows)} "
               f"| {sum(len(r.stock_failures) for r in rows)} "
               f"| {sum(len(r.gitspout_failures) for r in rows)} | {total_only} |")
    out += _listing("Failed only with gitspout", [(r.script, r.gitspout_only) for r in rows])
    out += _listing("Failed only with stock git-http-backend",
                    [(r.script, r.stock_only) for r in rows])
    notes = [f"- {r.script}: {n}" for r in rows for n in r.notes]
    if notes:
        out += ["", "Notes:", *notes]
    return "\n".join(out) + "\n"


def _count(row: Row, mode: str, modes: Sequence[str]) -> str:
    if mode not in modes:
        return "-"
    return str(len(row.stock_failures if mode == "stock" else row.gitspout_failures))


def _listing(heading: str, groups: Sequence[tuple[str, Sequence[TestResult]]]) -> list[str]:
    lines = [f"- {_short(script)}.{t.number} {t.title}" for script, tests in groups
             for t in tests]
    return ["", f"{heading}: {len(lines) or 'none'}", *lines]


def _short(script: str) -> str:
    """``t5551-http-fetch-smart`` -> ``t5551``."""
    return script.split("-", 1)[0]


def verbose_section(lines: Iterable[str], number: int) -> list[str]:
    """The ``--verbose-log`` lines of test ``number``: from its "expecting success of
    NNNN.N" (or "checking known breakage of") to its "ok"/"not ok" line, both included."""
    start = re.compile(rf"^(expecting success|checking known breakage|checking to-be-fixed "
                       rf"breakage) of \d+\.{number} ")
    end = re.compile(rf"^(not )?ok {number}( |$)")
    out: list[str] = []
    for raw in lines:
        line = raw.rstrip("\n")
        if out or start.match(line):
            out.append(line)
            if end.match(line):
                break
    return out
