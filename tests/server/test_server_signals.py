"""Signals (issue 24, item 7; server/app/signals.py, docs/operations.md signals table).

SIGHUP (logrotate's signal) killed the server with no drain: a clone in flight was cut and
the pack-cache directory left behind. Now it never stops the server and reloads the auth
file. A second SIGINT (or SIGTERM) during a drain, or SIGQUIT, stops at once and still
removes the pack-cache directory.
"""

from __future__ import annotations

import base64
import random
import signal
import socket
import subprocess
from pathlib import Path

import bcrypt
import pytest
from gitutil import Committer, Git, LiveServer, fsck, git_env, start_server, wait_until
from netnskit import SlowProxy
from rawhttp import FLUSH, UPLOAD_CT, build_request, metric, pkt_lines
from rawhttp import request as raw_request

BLOB = 8 << 20  # incompressible: more than a stalled client's socket buffers absorb


@pytest.fixture(scope="module")
def sig_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    root = tmp_path_factory.mktemp("sigroot")
    work = root.parent / f"{root.name}-work"
    git.run("init", "-q", "-b", "main", str(work))
    Committer(git, work).commit({"blob.bin": random.Random(7).randbytes(BLOB)}, "big")
    (root / "public").mkdir()
    (root / "team").mkdir()
    git.run("clone", "-q", "--bare", "--no-local", str(work), str(root / "public" / "big.git"))
    git.run("clone", "-q", "--bare", "--no-local", str(work), str(root / "team" / "app.git"))
    return root


def _auth_text(password: str) -> str:
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()
    return (f'[users]\nalice = "{hashed}"\n[[access]]\nrepos = ["public/*"]\n'
            'anonymous = true\n[[access]]\nrepos = ["team/*"]\nusers = ["alice"]\n')


def _status(srv: LiveServer, password: str) -> int:
    token = base64.b64encode(f"alice:{password}".encode()).decode()
    return raw_request(srv.port, "GET", "/team/app.git/info/refs?service=git-upload-pack",
                       {"Authorization": f"Basic {token}"}).status


def test_sighup_reloads_the_auth_file_and_never_stops(
        sig_root: Path, git: Git, tmp_path: Path) -> None:
    """Before: the first SIGHUP ended the process, and the clone in flight with it."""
    auth = tmp_path / "auth.toml"
    auth.write_text(_auth_text("first"))
    srv = start_server(sig_root, ["--auth-file", str(auth)])
    proxy = SlowProxy("127.0.0.1", srv.port, 4 << 20)
    dest = tmp_path / "clone"
    clone = subprocess.Popen(["git", "clone", "-q", "--bare",
                              f"http://127.0.0.1:{proxy.port}/public/big.git", str(dest)],
                             env=git_env(git.home), stderr=subprocess.PIPE)
    try:
        assert wait_until(lambda: proxy.relayed >= 512 << 10, 30), "no pack in flight"
        srv.proc.send_signal(signal.SIGHUP)
        srv.wait_for_line("SIGHUP: reloaded the auth file")
        assert srv.alive() and _status(srv, "first") == 200
        auth.write_text(_auth_text("second"))
        srv.proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: _status(srv, "second") == 200, 10)
        assert _status(srv, "first") == 401
        auth.write_text("[users]\nalice = 'not a hash'\n")
        srv.proc.send_signal(signal.SIGHUP)
        srv.wait_for_line("SIGHUP: auth file not reloaded")
        assert _status(srv, "second") == 200  # the previous file stays
        _out, err = clone.communicate(timeout=120)
        assert clone.returncode == 0, err.decode(errors="replace")
        assert srv.alive()
    finally:
        clone.kill()
        proxy.close()
        srv.stop()
    fsck(git, dest)


def _never_reading_fetch(port: int, want: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    body = pkt_lines(f"want {want} side-band-64k ofs-delta") + FLUSH + pkt_lines("done")
    sock.sendall(build_request("POST", "/public/big.git/git-upload-pack",
                               {"Content-Type": UPLOAD_CT}, body))
    return sock


@pytest.mark.parametrize("how", ["second SIGINT", "SIGQUIT"])
def test_stop_now_cuts_the_drain_and_removes_the_pack_cache(
        sig_root: Path, git: Git, tmp_path: Path, how: str) -> None:
    """A client that never reads holds a drain for all of --drain-timeout (60 s here).
    Before: a second SIGINT was ignored, and SIGQUIT dumped core leaving the pack-cache
    directory behind."""
    cache = tmp_path / "cache"
    srv = start_server(sig_root, ["--drain-timeout", "60", "--pack-cache-dir", str(cache)])
    want = git.out("rev-parse", "main", cwd=sig_root / "public" / "big.git").strip()
    sock = _never_reading_fetch(srv.port, want)
    try:
        assert list(cache.glob("gitspout-packcache-*"))
        assert wait_until(lambda: metric(srv.port, "gitspout_admission_in_progress") == 1, 30)
        if how == "second SIGINT":
            srv.proc.send_signal(signal.SIGINT)
            srv.wait_for_line("draining: 1 requests in flight")
            assert srv.alive()  # draining: waits for the client
            srv.proc.send_signal(signal.SIGINT)
        else:
            srv.proc.send_signal(signal.SIGQUIT)
        assert srv.proc.wait(timeout=15) == 0
    finally:
        sock.close()
        srv.stop()
    assert not list(cache.glob("gitspout-packcache-*"))
