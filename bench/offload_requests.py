"""Where a bundled clone's server CPU goes (issue 29): each request a clone with
``transfer.bundleURI`` makes of gitspout (info/refs, ls-refs, bundle-uri, the bundle),
repeated on fresh connections, CPU from the server's cgroup (bench/peer.py).

    python -m bench.offload_requests --root bench/work/real --repo dulwich-gc.git [--n 200]
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from .client import client_env
from .peer import Gitspout


def _pkt(line: str) -> bytes:
    data = line.encode() + b"\n"
    return b"%04x" % (len(data) + 4) + data


V2 = {"Git-Protocol": "version=2"}
POST = {**V2, "Content-Type": "application/x-git-upload-pack-request"}


def _req(port: int, method: str, path: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path("bench/work/real"))
    ap.add_argument("--repo", default="dulwich-gc.git")
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()
    repo = args.repo
    with tempfile.TemporaryDirectory(prefix="offload-req-") as tmp, Gitspout(
            args.root, probe_repo=repo, name="gitspout-bundles", extra_args=[
                "--bundles", "--bundle-after", "1", "--bundle-dir", tmp]) as srv:
        subprocess.run(["git", "clone", "-q", "--bare", srv.repo_url(repo),
                        os.path.join(tmp, "warm.git")], env=client_env(), check=True,
                       capture_output=True, timeout=600)
        cmd = _pkt("command=bundle-uri") + _pkt("object-format=sha1") + b"0000"
        deadline = time.monotonic() + 600
        while b".uri=" not in (body := _req(srv.port, "POST", f"/{repo}/git-upload-pack",
                                            cmd, POST)[1]):
            if time.monotonic() > deadline:
                raise RuntimeError("no bundle written")
            time.sleep(0.2)
        found = re.search(rb"\.uri=http://[^/]+(/\S+?\.bundle)", body)
        assert found is not None
        ls_refs = (_pkt("command=ls-refs") + _pkt("object-format=sha1") + b"0001"
                   + _pkt("peel") + _pkt("symrefs") + _pkt("unborn") + _pkt("ref-prefix HEAD")
                   + _pkt("ref-prefix refs/heads/") + _pkt("ref-prefix refs/tags/") + b"0000")
        cases = [
            ("info/refs", "GET", f"/{repo}/info/refs?service=git-upload-pack", None, V2),
            ("ls-refs", "POST", f"/{repo}/git-upload-pack", ls_refs, POST),
            ("bundle-uri", "POST", f"/{repo}/git-upload-pack", cmd, POST),
            ("bundle GET", "GET", found.group(1).decode(), None, {}),
        ]
        print(f"repository {repo}; load average (1 min): {os.getloadavg()[0]:.2f}")
        print("| request | server CPU ms | wall ms |\n|---|---:|---:|")
        for name, method, path, data, headers in cases:
            n = max(1, args.n // 10) if name == "bundle GET" else args.n
            for _ in range(3):
                _req(srv.port, method, path, data, headers)
            srv.reset_counters()
            t0 = time.monotonic()
            for _ in range(n):
                status, _ = _req(srv.port, method, path, data, headers)
                assert status == 200, (name, status)
            wall = (time.monotonic() - t0) / n
            print(f"| {name} | {srv.cpu_ns() / n / 1e6:.2f} | {wall * 1e3:.2f} |")


if __name__ == "__main__":
    main()
