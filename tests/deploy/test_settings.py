"""Settings as operators meet them (issue 27, "Settings"; server/app/config.py, configview.py),
through the installed console script in a subprocess:

* ``serve --help`` is grouped by topic, sizes shown as ``32 MiB``;
* ``gitspout config`` and ``serve --print-config`` print the effective settings, each with
  its source, flag over env over file over default; what they print reads back as a file;
* ``--check-config`` exits 0 on a good configuration and nonzero with one clear line (no
  traceback) on a bad TOML file, auth file, namespace or setting.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from gitutil import Git, copy_repo

GITSPOUT = Path(sys.executable).parent / "gitspout"  # the console script of this install
TOPICS = ["listening", "repositories", "limits", "caches", "offload", "timeouts", "auth", "metrics",
          "logging"]


def _run(*args: str, env: dict[str, str] | None = None,
         cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": ":".join(sys.path), **(env or {})}  # this process's gitspout
    return subprocess.run([str(GITSPOUT), *args], env=full, cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def _settings(text: str) -> dict[str, tuple[str, str]]:
    """``name -> (value, source)`` from what ``gitspout config`` printed."""
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(r"(#\s)?(\w+) =( .*?)?\s+# (.+)", line)
        if m:
            out[m.group(2)] = ((m.group(3) or "").strip(), m.group(4))
    return out


def test_help_is_grouped_by_topic_with_sizes_in_units() -> None:
    res = _run("serve", "--help")
    assert res.returncode == 0, res.stderr
    headings = re.findall(r"^(\w+):$", res.stdout, re.M)
    # A setting without a "group" in its metadata shows under "other": give it a topic.
    assert headings == ["options", *TOPICS], headings
    sections = dict(zip(headings, re.split(r"^\w+:$", res.stdout, flags=re.M)[1:], strict=True))
    where = {"--port": "listening", "--trusted-proxies": "listening", "--root": "repositories",
             "--max-body": "limits", "--pack-cache-size": "caches",
             "--idle-timeout": "timeouts", "--auth-file": "auth", "--metrics-port": "metrics",
             "--log-format": "logging", "--check-config": "options",
             "--print-config": "options"}
    for flag, topic in where.items():
        assert re.search(rf"^\s+{flag}\b", sections[topic], re.M), (flag, topic)
    flat = " ".join(res.stdout.split())
    for shown in ("default: 32 MiB;", "default: 64 MiB;", "default: 1 GiB;",
                  "default: 256 KiB;", "--max-body SIZE"):
        assert shown in flat, shown
    assert "33554432" not in flat and "1073741824" not in flat
    assert res.stdout.count("\n") < 400


def test_config_shows_each_source_flag_over_env_over_file(tmp_path: Path) -> None:
    conf = tmp_path / "gitspout.toml"
    conf.write_text('port = 1111\nthreads = 3\nidle_timeout = 9.5\nmax_body = "16 MiB"\n'
                    'log_format = "json"\n')
    env = {"GITSPOUT_PORT": "2222", "GITSPOUT_THREADS": "5", "GITSPOUT_CONFIG": str(conf)}
    res = _run("config", "--root", str(tmp_path), "--port", "3333", env=env)
    assert res.returncode == 0, res.stderr
    got = _settings(res.stdout)
    assert got["port"] == ("3333", "flag --port")
    assert got["threads"] == ("5", "env GITSPOUT_THREADS")
    assert got["idle_timeout"] == ("9.5", f"file {conf}")
    assert got["max_body"] == ('"16 MiB"', f"file {conf}")
    assert got["log_format"] == ('"json"', f"file {conf}")
    assert got["root"] == (f'"{tmp_path}"', "flag --root")
    assert got["keepalive"] == ("5.0", "default")
    assert got["max_inflated_body"] == ('"64 MiB"', "default")
    assert got["auth_file"] == ("", "default")  # unset: commented out
    assert got["config"] == (f'"{conf}"', "env GITSPOUT_CONFIG")
    # serve --print-config prints the same and does not serve
    same = _run("serve", "--print-config", "--root", str(tmp_path), "--port", "3333", env=env)
    assert same.returncode == 0 and same.stdout == res.stdout


def test_printed_config_reads_back_to_the_same_settings(tmp_path: Path) -> None:
    first = _run("config", "--root", str(tmp_path), "--max-body", "32MiB", "--threads", "6",
                 "--trusted-proxies", "10.0.0.0/8,192.0.2.1",
                 "--namespaces", "a.git=b.git#ns")
    assert first.returncode == 0, first.stderr
    printed = tmp_path / "printed.toml"
    printed.write_text(first.stdout)
    again = _run("config", "--config", str(printed))
    assert again.returncode == 0, again.stderr
    a, b = _settings(first.stdout), _settings(again.stdout)
    assert {k: v[0] for k, v in a.items() if k != "config"} == \
        {k: v[0] for k, v in b.items() if k != "config"}
    assert {v[1] for k, v in b.items() if a[k][0] and k != "config"} == {f"file {printed}"}


@pytest.mark.parametrize("size", ["32MiB", "32 MiB", "32m", str(32 << 20)])
def test_size_flags_take_units_or_bytes(tmp_path: Path, size: str) -> None:
    res = _run("config", "--root", str(tmp_path), "--max-body", size)
    assert res.returncode == 0, res.stderr
    assert _settings(res.stdout)["max_body"] == ('"32 MiB"', "flag --max-body")


@pytest.fixture
def good_root(tmp_path: Path, fixture_root: Path) -> Path:
    root = tmp_path / "root"
    copy_repo(fixture_root / "basic.git", root / "team" / "app.git")
    return root


def _check(root: Path, toml: str | bytes, *extra: str) -> subprocess.CompletedProcess[str]:
    conf = root.parent / "check.toml"
    if isinstance(toml, bytes):
        conf.write_bytes(toml)
    else:
        conf.write_text(toml)
    return _run("serve", "--check-config", "--root", str(root), "--config", str(conf), *extra)


def _one_clear_line(res: subprocess.CompletedProcess[str], needle: str) -> None:
    assert res.returncode != 0, res.stdout
    assert "Traceback" not in res.stderr + res.stdout, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gitspout: "), res.stderr
    assert needle in lines[0], lines[0]


def test_check_config_passes_a_good_configuration(good_root: Path, git: Git) -> None:
    auth = good_root.parent / "auth.toml"
    auth.write_text('[users]\nalice = "$2b$04$abcdefghijklmnopqrstuu5Mj9Kx3oMqqFTw3ZDqbSTx7ugx0N.0a"\n'
                    '[[access]]\nrepos = ["team/*"]\nusers = ["alice"]\n')
    res = _check(good_root, f'auth_file = "{auth}"\nlog_format = "json"\n'
                 '[namespaces]\n"ns.git" = { repo = "team/app.git", namespace = "n" }\n'
                 '"t/" = { repo = "team", namespace = "t" }\n')
    assert res.returncode == 0, res.stderr
    assert res.stderr == "" and res.stdout.startswith("gitspout: configuration OK"), res.stdout
    assert "2 namespace entries" in res.stdout and "1 rules" in res.stdout
    assert _run("config", "--check-config", "--root", str(good_root)).returncode == 0


@pytest.mark.parametrize(("toml", "needle"), [
    ("port = \n", "check.toml"),                                         # not TOML
    ("prot = 8080\n", "unknown key 'prot'"),
    ('log_format = "yaml"\n', "log_format must be 'text' or 'json'"),
    ('trusted_proxies = "10.0.0.0/33"\n', "bad address or network '10.0.0.0/33'"),
    ('trusted_proxies = ["10.0.0.0/8", "proxy.example"]\n', "'proxy.example'"),
    ('max_body = "lots"\n', "'max_body'"),
    ('auth_file = "/nonexistent/auth.toml"\n', "cannot read auth file"),
    ('[namespaces]\n"ns.git" = { repo = "team/gone.git", namespace = "n" }\n',
     "'ns.git' names repository 'team/gone.git'"),
    ('[namespaces]\n"t/" = { repo = "nowhere", namespace = "t" }\n', "'t/' names directory"),
    ('namespaces = "bad-entry"\n', "bad namespace entry"),
    ("max-open-packs = 3\nmax_open_packs = 400\n", "are one setting"),
    ('bundles = true\nbundle_dir = "/etc/passwd"\n', "bundle_dir '/etc/passwd'"),
])
def test_check_config_refuses_a_bad_one_in_one_line(good_root: Path, toml: str,
                                                    needle: str) -> None:
    _one_clear_line(_check(good_root, toml), needle)


def test_check_config_refuses_a_bad_auth_file(good_root: Path) -> None:
    auth = good_root.parent / "auth.toml"
    auth.write_text('[users]\nalice = "not a bcrypt hash"\n')
    _one_clear_line(_check(good_root, f'auth_file = "{auth}"\n'), "auth file")


def test_files_that_are_not_utf8_are_refused_in_one_line(good_root: Path) -> None:
    """A config or auth file with a byte that is not UTF-8: one line naming the file,
    not a traceback of tomllib's UnicodeDecodeError."""
    auth = good_root.parent / "latin1-auth.toml"
    auth.write_bytes(b'realm = "caf\xe9"\n')
    _one_clear_line(_check(good_root, f'auth_file = "{auth}"\n'), "not UTF-8")
    _one_clear_line(_check(good_root, 'agent = "\xff"\n'.encode("latin-1")), "not UTF-8")
