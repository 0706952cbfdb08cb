"""Access control (server/app/auth.py, docs/operations.md "Access control"), with the real git client
and a credential helper: 401 + WWW-Authenticate makes git ask its helper, 403 refuses a
user not allowed, a wrong password fails; rules follow the repository's real path (no
URL spelling or link inside the root escapes them); no secret in logs or metrics;
``--metrics-port`` with ``--no-public-metrics`` moves /metrics off the serving port.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
from gitspout.server.app.auth import load_access
from gitspout.server.app.config import ConfigError
from gitutil import REPO_ROOT, Git, LiveServer, copy_repo, fsck, poll, repo_state, start_server
from rawhttp import metric
from rawhttp import request as raw_request

PASSWORDS = {"alice": "al1ce-s3cret", "bob": "b0b-t0ken-xyz"}


@pytest.fixture(scope="module")
def auth_root(tmp_path_factory: pytest.TempPathFactory, fixture_root: Path) -> Path:
    root = tmp_path_factory.mktemp("auth")
    copy_repo(fixture_root / "basic.git", root / "public.git")
    (root / "team").mkdir()
    copy_repo(fixture_root / "basic.git", root / "team" / "app.git")
    copy_repo(fixture_root / "plain.git", root / "secret.git")
    (root / "public" ).mkdir()
    os.symlink(root / "team" / "app.git", root / "public" / "link.git")  # inside the root
    return root


@pytest.fixture(scope="module")
def auth_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # cost 4: the tests stay fast; the server takes whatever cost a hash says
    hashes = {u: bcrypt.hashpw(p.encode(), bcrypt.gensalt(4)).decode() for u, p in PASSWORDS.items()}
    path = tmp_path_factory.mktemp("authcfg") / "auth.toml"
    path.write_text(
        'realm = "test realm"\n[users]\n'
        + "".join(f'{u} = "{h}"\n' for u, h in hashes.items())
        + '[[access]]\nrepos = ["public.git", "public/*"]\nanonymous = true\n'
        + '[[access]]\nrepos = ["team/*"]\nusers = ["alice"]\n'
        + '[[access]]\nrepos = ["secret.git"]\nusers = ["bob"]\n')
    return path


@pytest.fixture(scope="module")
def auth_server(auth_root: Path, auth_file: Path) -> Iterator[LiveServer]:
    srv = start_server(auth_root, ["--auth-file", str(auth_file)])
    yield srv
    srv.stop()


def _helper(user: str, password: str) -> tuple[str, ...]:
    script = f"!f() {{ echo username={user}; echo password={password}; }}; f"
    return ("-c", "credential.helper=", "-c", f"credential.helper={script}")


def _clone(git: Git, url: str, dest: Path, *extra: str) -> subprocess.CompletedProcess[bytes]:
    return git.run(*extra, "clone", "-q", "--mirror", url, str(dest), check=False)


def _basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def test_anonymous_reads_what_is_public(git: Git, auth_server: LiveServer, tmp_path: Path) -> None:
    assert _clone(git, f"{auth_server.url}/public.git", tmp_path / "p").returncode == 0
    fsck(git, tmp_path / "p")
    for repo in ("team/app.git", "team/app", "public/link.git", "secret.git", "nothere.git",
                 "team/nothere.git"):
        proc = _clone(git, f"{auth_server.url}/{repo}", tmp_path / repo.replace("/", "_"))
        assert proc.returncode != 0, repo
        # git asked for credentials (GIT_TERMINAL_PROMPT=0: none to be had)
        assert b"could not read Username" in proc.stderr, (repo, proc.stderr)
    resp = raw_request(auth_server.port, "GET", "/team/app.git/info/refs?service=git-upload-pack")
    assert resp.status == 401
    assert resp.headers.get("www-authenticate") == 'Basic realm="test realm", charset="UTF-8"'
    resp = raw_request(auth_server.port, "GET", "/public/nothere.git/info/refs?service=git-upload-pack")
    assert resp.status == 404  # an anonymous rule: nothing to hide


@pytest.mark.parametrize("version", [0, 2])
def test_allowed_user_clones_with_a_credential_helper(git: Git, auth_server: LiveServer,
                                                      auth_root: Path, tmp_path: Path,
                                                      version: int) -> None:
    dest = tmp_path / "c"
    proc = _clone(git, f"{auth_server.url}/team/app.git", dest, "-c",
                  f"protocol.version={version}", *_helper("alice", PASSWORDS["alice"]))
    assert proc.returncode == 0, proc.stderr
    fsck(git, dest)
    plain = tmp_path / "file"
    git.run("clone", "-q", "--mirror", f"file://{auth_root / 'team' / 'app.git'}", str(plain))
    assert repo_state(git, dest) == repo_state(git, plain)
    proc = _clone(git, f"{auth_server.url}/secret.git", tmp_path / "s",
                  *_helper("bob", PASSWORDS["bob"]))
    assert proc.returncode == 0, proc.stderr


def test_wrong_password_fails(git: Git, auth_server: LiveServer, tmp_path: Path) -> None:
    for user, password in (("alice", "wrong"), ("alice", PASSWORDS["bob"]), ("mallory", "x")):
        proc = _clone(git, f"{auth_server.url}/team/app.git", tmp_path / user / password,
                      *_helper(user, password))
        assert proc.returncode != 0
        assert b"Authentication failed" in proc.stderr, proc.stderr
    # a wrong password is a 401 even for a public repository: credentials sent are checked
    resp = raw_request(auth_server.port, "GET", "/public.git/info/refs?service=git-upload-pack",
                       headers=_basic("alice", "wrong"))
    assert resp.status == 401


def test_malformed_credentials_get_401(auth_server: LiveServer) -> None:
    """Basic credentials that are not base64 of ``user:password``, a non-ASCII byte among
    them included, are refused with 401 (git asks its helper again), never a 500: a byte
    like \xc3 made the decoder raise what was not caught, with a traceback logged."""
    from rawhttp import exchange

    route = b"/team/app.git/info/refs?service=git-upload-pack"
    for blob in (b"\xc3\xa9", b"YWxp\xffY2U=", b"!!!", b"YWxpY2U=", b"OmFsaWNl"):
        resp = exchange(auth_server.port, b"GET " + route + b" HTTP/1.1\r\nHost: x\r\n"
                        b"Authorization: Basic " + blob + b"\r\nConnection: close\r\n\r\n")
        assert resp.status == 401, (blob, resp.status)
    assert not [line for line in auth_server.lines if "Traceback" in line]


def test_a_token_longer_than_72_bytes_counts_whole(git: Git, auth_root: Path,
                                                   tmp_path: Path) -> None:
    """A token longer than bcrypt's 72 bytes (a JWT), hashed by ``gitspout hash-password``,
    lets its user clone, and one differing only past byte 72 does not. Before, hashing it
    failed with a traceback (bcrypt 5), and a login with it was refused."""
    token = "eyJhbGciOiJIUzI1NiJ9." + "x" * 80 + ".tail-1"
    proc = subprocess.run([sys.executable, "-m", "gitspout.server.app.cli", "hash-password"],
                          cwd=REPO_ROOT, input=token.encode() + b"\n", capture_output=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / "auth.toml"
    path.write_text(f'[users]\nci = "{proc.stdout.decode().strip()}"\n[[access]]\n'
                    'repos = ["team/*"]\nusers = ["ci"]\n')
    srv = start_server(auth_root, ["--auth-file", str(path)])
    try:
        ok = _clone(git, f"{srv.url}/team/app.git", tmp_path / "ok", *_helper("ci", token))
        assert ok.returncode == 0, ok.stderr
        fsck(git, tmp_path / "ok")
        bad = _clone(git, f"{srv.url}/team/app.git", tmp_path / "bad",
                     *_helper("ci", token.replace("tail-1", "tail-2")))
        assert bad.returncode != 0 and b"Authentication failed" in bad.stderr, bad.stderr
    finally:
        srv.stop()


def test_no_100_continue_before_the_access_check(auth_server: LiveServer) -> None:
    """``Expect: 100-continue`` without credentials gets its 401 before any ``100
    Continue``, and the connection ends there (the body is neither invited nor read);
    with credentials the 100 comes, the body follows and the fetch is answered. Before,
    the 100 came first: an anonymous client was invited to upload --max-body bytes, read
    and thrown away."""
    from rawhttp import connect, pkt_lines

    body = pkt_lines("command=ls-refs", "object-format=sha1") + b"0000"
    for creds, first in (({}, b"HTTP/1.1 401"), (_basic("alice", PASSWORDS["alice"]),
                                                   b"HTTP/1.1 100 Continue")):
        head = ("POST /team/app.git/git-upload-pack HTTP/1.1\r\nHost: x\r\n"
                "Content-Type: application/x-git-upload-pack-request\r\nGit-Protocol: "
                f"version=2\r\nContent-Length: {len(body)}\r\nExpect: 100-continue\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in creds.items()) + "\r\n").encode()
        with connect(auth_server.port, 10) as sock:
            sock.sendall(head)
            data = b""
            while len(data) < len(first) and (chunk := sock.recv(4096)):
                data += chunk
            assert data.startswith(first), data[:200]
            if not creds:
                while b"authentication required" not in data:  # the 401's whole body
                    data += sock.recv(65536)
                assert b"100 Continue" not in data and b"Connection: close" in data, data
                # A client that sends its body anyway (curl does after a second) has it
                # drained: the connection then ends with a FIN, not a reset.
                sock.sendall(body)
                sock.shutdown(socket.SHUT_WR)
                while sock.recv(65536):
                    pass
                continue
            sock.sendall(body)
            while b"refs/heads/main" not in data and (chunk := sock.recv(65536)):
                data += chunk
            assert b"HTTP/1.1 200" in data and b"refs/heads/main" in data, data[:300]


def test_user_not_allowed_gets_403(git: Git, auth_server: LiveServer, tmp_path: Path) -> None:
    for repo in ("team/app.git", "public/link.git"):  # the link leads into team/
        proc = _clone(git, f"{auth_server.url}/{repo}", tmp_path / repo.replace("/", "_"),
                      *_helper("bob", PASSWORDS["bob"]))
        assert proc.returncode != 0
        assert b"403" in proc.stderr, proc.stderr
    resp = raw_request(auth_server.port, "GET", "/secret.git/info/refs?service=git-upload-pack",
                       headers=_basic("alice", PASSWORDS["alice"]))
    assert resp.status == 403
    resp = raw_request(auth_server.port, "GET", "/nothere.git/info/refs?service=git-upload-pack",
                       headers=_basic("alice", PASSWORDS["alice"]))
    assert resp.status == 404  # a user with valid credentials learns it does not exist


def test_no_secret_in_logs_or_metrics(git: Git, auth_server: LiveServer, tmp_path: Path,
                                      auth_file: Path) -> None:
    _clone(git, f"{auth_server.url}/team/app.git", tmp_path / "c",
           *_helper("alice", PASSWORDS["alice"]))
    _clone(git, f"{auth_server.url}/team/app.git", tmp_path / "d", *_helper("alice", "nope-42"))
    with urllib.request.urlopen(f"{auth_server.url}/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    everything = "\n".join(auth_server.lines) + metrics
    hashes = [line.split('"')[1] for line in auth_file.read_text().splitlines() if "$2b$" in line]
    for secret in (*PASSWORDS.values(), "nope-42", *hashes, "Authorization", "Basic "):
        assert secret not in everything, secret
    # verified credentials are remembered: a clone is several requests, one bcrypt check
    hits = [line for line in metrics.splitlines()
            if line.startswith('gitspout_cache_lookups_total{cache="credentials",result="hit"}')]
    assert hits and float(hits[0].split()[-1]) >= 1, hits


def test_metrics_only_on_the_metrics_port(fixture_root: Path, git: Git) -> None:
    port = _free_port()
    srv = start_server(fixture_root, ["--metrics-port", str(port), "--no-public-metrics"])
    try:
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(f"{srv.url}/metrics", timeout=5)
        assert exc.value.code == 404
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            assert b"gitspout_requests_total" in resp.read()
        git.run("ls-remote", f"{srv.url}/basic.git")  # serving goes on
    finally:
        srv.stop()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_bad_auth_files_stop_the_start(tmp_path: Path, fixture_root: Path) -> None:
    cases = {
        "plain.toml": '[users]\nalice = "hunter2"\n',  # not a hash
        "rule.toml": '[[access]]\nusers = ["alice"]\n',  # no repos
        "who.toml": '[[access]]\nrepos = ["*"]\nusers = ["nobody"]\n',
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(ConfigError):
            load_access(str(path))
        proc = subprocess.run([sys.executable, "-m", "gitspout.server.app.cli", "serve",
                               "--root", str(fixture_root), "--port", "0",
                               "--auth-file", str(path)],
                              cwd=REPO_ROOT, capture_output=True, timeout=30)
        assert proc.returncode == 2 and b"auth file" in proc.stderr, proc.stderr


def test_hash_password_command(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "gitspout.server.app.cli", "hash-password"],
                          cwd=REPO_ROOT, input=b"s3cret\n", capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    hashed = proc.stdout.strip()
    assert bcrypt.checkpw(b"s3cret", hashed) and not bcrypt.checkpw(b"other", hashed)


def test_wrong_password_flood_does_not_hold_up_known_users(auth_root: Path, tmp_path: Path) -> None:
    """16 clients with wrong passwords, each a bcrypt check at cost 12 (0.25 s) queued in
    the pool: a user checked a moment ago is answered from the credentials cache, on the
    loop, not behind them (it waited 4 s: for every one of the 16 checks). Counted, not
    timed: when the known user has its answer, most wrong passwords are still unchecked."""
    import threading

    path = tmp_path / "auth.toml"
    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(12)).decode()
    path.write_text(f'[users]\nalice = "{hashed}"\n[[access]]\nrepos = ["team/*"]\n'
                    'users = ["alice"]\n')
    srv = start_server(auth_root, ["--auth-file", str(path)])
    route = "/team/app.git/info/refs?service=git-upload-pack"

    def failed() -> float:
        return metric(srv.port, 'gitspout_auth_checks_total{result="failed"}', 0.0)

    try:
        assert raw_request(srv.port, "GET", route, _basic("alice", "right")).status == 200

        def attack(k: int) -> None:
            raw_request(srv.port, "GET", route, _basic("alice", f"wrong{k}"), timeout=60)

        flood = [threading.Thread(target=attack, args=(k,)) for k in range(16)]
        for t in flood:
            t.start()
        # Every wrong password is at the gate (one of them may be being checked).
        poll(lambda: metric(srv.port, "gitspout_auth_queued", 0.0) + failed() >= 15, 60,
             "the 16 wrong passwords at the gate")
        assert raw_request(srv.port, "GET", route, _basic("alice", "right")).status == 200
        checked = failed()
        for t in flood:
            t.join(timeout=60)
        assert failed() == 16
        print(f"wrong passwords checked when the known user had its answer: {checked:.0f} of 16")
        assert checked <= 8, f"a known user waited for {checked:.0f} of 16 wrong passwords"
    finally:
        srv.stop()
