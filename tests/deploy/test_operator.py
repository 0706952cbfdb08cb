"""Operator rough edges (issue #14): a server that cannot listen says why in one line, bad
settings are refused rather than bent, ``--version`` and ``--help`` are useful."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from gitspout.server.app.cli import main
from gitspout.server.app.config import load_config
from gitutil import REPO_ROOT


def _run(*args: str, cwd: Path = REPO_ROOT, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    return subprocess.run([sys.executable, "-m", "gitspout.server.app.cli", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """``main()`` in this process: settings are refused before it changes anything global."""
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse: --version, --help
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, out.out, out.err)


@pytest.fixture
def never_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """A setting that should be refused and is not would start the server in this
    process and never return: make that a failure instead of a hang."""
    import gitspout.server.app.cli as cli

    async def refuse(*_args: object, **_kw: object) -> None:
        raise AssertionError("the server started: the setting was accepted")

    monkeypatch.setattr(cli, "serve", refuse)


def _one_line_error(res: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert res.returncode != 0
    assert "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_port_in_use_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        res = _run("serve", "--root", str(tmp_path), "--host", "127.0.0.1", "--port", str(port))
    _one_line_error(res, f"cannot listen on 127.0.0.1:{port}", "in use")


@pytest.mark.parametrize(("host", "why"), [("no-such-host.invalid", "unknown host"),
                                            ("192.0.2.1", "assign")])  # TEST-NET-1: not ours
def test_unknown_host_or_missing_address_is_one_line(tmp_path: Path, host: str, why: str) -> None:
    res = _run("serve", "--root", str(tmp_path), "--host", host, "--port", "0")
    _one_line_error(res, f"cannot listen on {host}:0", why)


@pytest.mark.parametrize(("toml", "needle"), [
    ('port = 8081\n[gitspout]\nthreads = 4\n', "both at the top level (port)"),
    ("port = 18305.9\n", "'port'"),
    ("[gitspout]\nport = true\n", "'port'"),
    ("port = [1]\n", "'port' (config file"),                  # TypeError, not a traceback
    ("keepalive = {a = 1}\n", "'keepalive'"),
    ("port = 1979-05-27\n", "'port'"),
    ('host = 5\n', "'host'"),                                   # not str()'ed into 0.0.0.5
    ('metrics_repos = ["app.git"]\n', "'metrics_repos'"),
    ("gitspout = 1\n", "must be a table"),
    ("cache_memory = true\n", "'cache_memory'"),
])
def test_bad_toml_is_refused(tmp_path: Path, toml: str, needle: str,
                             capsys: pytest.CaptureFixture[str], never_serve: None) -> None:
    conf = tmp_path / "gitspout.toml"
    conf.write_text(toml)
    res = _main(capsys, "serve", "--root", str(tmp_path), "--config", str(conf))
    _one_line_error(res, needle)
    assert res.returncode == 2


@pytest.mark.parametrize(("flag", "value", "needle"), [
    ("--metrics-port", "99999", "metrics_port 99999 is out of range"),
    ("--keepalive", "-1", "keepalive"),
    ("--keepalive", "0", "keepalive"),
    ("--keepalive", "nan", "keepalive"),
    ("--port", "8080.5", "'port' (--port)"),
    ("--cache-memory", "inf", "'cache_memory'"),                # OverflowError, not a traceback
    ("--pack-cache-size", "1e400", "'pack_cache_size'"),
    ("--max-body", "0", "max_body must be at least 4096"),
    ("--max-inflated-body", "-5", "max_inflated_body must be at least 4096"),
    ("--agent", "my agent", "agent must be printable ASCII"),
    ("--pack-cache-dir", "/proc/gitspout-cannot-be-here", "pack_cache_dir"),
    ("--body-memory", "1MiB", "body_memory must be 0 (no cap) or at least max_inflated_body"),
    # past 1e9 seconds timers overflow: every request failed with an OverflowError
    ("--send-timeout", "1e19", "more than 1e+09 seconds"),
    ("--idle-timeout", "1e300", "'idle_timeout'"),
    ("--bundle-size", "-1", "bundle_size must be 0 or more"),
])
def test_bad_flags_are_refused(tmp_path: Path, flag: str, value: str, needle: str,
                               capsys: pytest.CaptureFixture[str], never_serve: None) -> None:
    res = _main(capsys, "serve", "--root", str(tmp_path), flag, value)
    _one_line_error(res, needle)
    assert res.returncode == 2


def test_env_error_names_the_variable(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch,
                                      never_serve: None) -> None:
    monkeypatch.setenv("GITSPOUT_PORT", "abc")
    res = _main(capsys, "serve", "--root", str(tmp_path))
    _one_line_error(res, "'port' (GITSPOUT_PORT)")


def test_sizes_take_suffixes(tmp_path: Path) -> None:
    cfg = load_config({"root": str(tmp_path), "max_body": "32MiB", "max_inflated_body": "128M"},
                      env={})
    assert (cfg.max_body, cfg.max_inflated_body) == (32 << 20, 128 << 20)


def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    res = _main(capsys, "--version")
    assert res.returncode == 0
    assert res.stdout.startswith("gitspout ") and res.stdout.split()[1][0].isdigit()
    res = _main(capsys, "serve", "--help")
    assert res.returncode == 0
    assert "``" not in res.stdout
    flat = " ".join(res.stdout.split())
    assert "(default: 8080; env GITSPOUT_PORT)" in flat
    assert "(default: 127.0.0.1; env GITSPOUT_HOST)" in flat
    top = _main(capsys, "--help")
    assert "``" not in top.stdout and "--version" in top.stdout
