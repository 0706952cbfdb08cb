"""Helpers of the offload tests (bundle URIs, packfile URIs): a static file server on
127.0.0.1 that records what it was asked, C git's own stateless upload-pack as ground
truth, and a newer git for what the CI git (2.39) lacks."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from gitutil import Git, git_env

# A git of at least 2.41 (bundle-uri command and transfer.bundleURI), e.g. the
# bin-wrappers/git of a built source tree (docs/git-test-suite.md); tests that need one
# are skipped without it.
NEW_GIT = os.environ.get("GITSPOUT_TEST_NEW_GIT", "")


def new_git() -> str | None:
    """The newer git named by GITSPOUT_TEST_NEW_GIT, if it runs."""
    if not NEW_GIT or not shutil.which(NEW_GIT):
        return None
    out = subprocess.run([NEW_GIT, "version"], capture_output=True, timeout=30).stdout.split()
    if len(out) < 3:
        return None
    major, minor = (int(x) for x in out[2].decode().split(".")[:2])
    return NEW_GIT if (major, minor) >= (2, 41) else None


@dataclass
class StaticServer:
    """Files under ``root`` over HTTP on 127.0.0.1; ``paths``: every GET, in order."""

    root: Path
    port: int = 0
    paths: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def static_server(root: Path) -> Iterator[StaticServer]:
    info = StaticServer(root)

    class Handler(SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            info.paths.append(self.path)
            super().do_GET()

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(root)))
    info.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield info
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def c_upload_pack(git: Git, gitdir: Path, body: bytes, binary: str = "git") -> bytes:
    """C git's answer to one v2 request body: ``upload-pack --stateless-rpc``, as
    git-http-backend runs it."""
    env = git_env(git.home, {"GIT_PROTOCOL": "version=2"})
    proc = subprocess.run([binary, "upload-pack", "--stateless-rpc", str(gitdir)], input=body,
                          env=env, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return proc.stdout


def sections(payloads: list[bytes | None]) -> tuple[list[bytes | None], bytes]:
    """A v2 fetch response under sideband-all: its lines up to and including ``packfile``
    (band byte dropped), and the pack data of band 1 after it."""
    head: list[bytes | None] = []
    pack = bytearray()
    in_pack = False
    for p in payloads:
        if in_pack:
            if p is not None and p[:1] == b"\x01":
                pack += p[1:]
            continue
        head.append(p if p is None else p[1:] if p[:1] == b"\x01" else p)
        in_pack = p == b"\x01packfile\n"
    return head, bytes(pack)


def pack_count(pack: bytes) -> int:
    assert pack[:4] == b"PACK", pack[:16]
    return int.from_bytes(pack[8:12], "big")
