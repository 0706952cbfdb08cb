"""The eight survival scenarios of issue 24, one figure each, for one or more source trees.

1. descriptors: a repository of ``--packs`` packs cloned under ``ulimit -n 1024``;
2. drain: SIGTERM during a clone read at 2 MB/s, the server in a network namespace of
   its own deleted the moment the process exits (needs root and ``ip``);
3. stalled readers: 32 clients that ask for an 8 MiB pack and never read, then a small
   clone of another repository;
4. stalled bodies: 8 bodies fill --body-memory (256 MiB), then a byte every 25 s; a v2
   ls-refs meanwhile, and how long the budget stays held;
5. password flood: 30 clients (127.0.0.2-31) of wrong passwords at bcrypt cost 12; a
   valid user's ``git ls-remote`` and an anonymous one of a repository not resolved yet;
6. alternates: a repository whose ``objects/info/alternates`` names its own objects
   directory 8 and 12 times, cloned;
7. SIGHUP during a clone read at 2 MB/s;
8. a URL holding ESC, CR and OSC, refused as a link outside the root: raw control
   characters in the server's output.

::

    git worktree add /tmp/base bcd416c
    .venv/bin/python -m bench.survival --tree /tmp/base --tree .
    .venv/bin/python -m bench.survival --tree . --only 1 --packs 5000

Flags a tree does not know (``--send-timeout``) are not passed to it. Clients and servers
share this machine: say its load with the figures. Standard library, plus bcrypt for 5.
"""

from __future__ import annotations

import argparse
import base64
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.process import gitspout_command  # noqa: E402

GIT_ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C",
           "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.com",
           "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@example.com"}


def git(*args: str, cwd: Path | None = None, input: bytes | None = None,
        timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run(["git", *args], cwd=cwd, input=input, env=GIT_ENV,
                          capture_output=True, timeout=timeout)
    if check and proc.returncode:
        raise RuntimeError(f"git {' '.join(args)}: {proc.stderr.decode(errors='replace')}")
    return proc


def last_error(proc: subprocess.CompletedProcess[bytes] | subprocess.Popen[bytes],
               err: bytes) -> str:
    lines = [x for x in err.decode(errors="replace").splitlines() if x.strip()]
    return lines[0][:90] if lines else f"exit {proc.returncode}"


# -- a server of one tree ------------------------------------------------------------


class Server:
    """``gitspout serve`` of ``tree``: flags the tree does not know are left out."""

    def __init__(self, tree: Path, scratch: Path, root: Path, args: Sequence[str] = (),
                 prefix: Sequence[str] = (), host: str = "127.0.0.1",
                 nofile: int | None = None) -> None:
        argv, env = gitspout_command(tree, _import_root(tree, scratch))
        known = _known_flags(tree, scratch)
        kept: list[str] = []
        for i, a in enumerate(args):
            if a.startswith("--") and a not in known:
                continue
            if i and args[i - 1].startswith("--") and args[i - 1] not in known:
                continue
            kept.append(a)
        self.log = scratch / f"server-{time.monotonic_ns()}.log"
        cmd = [*prefix, *argv, "--root", str(root), "--host", host, "--port", "0", *kept]

        def limit() -> None:
            import resource
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(cmd, cwd=tree, env={**os.environ, **env},
                                         stdout=out, stderr=subprocess.STDOUT,
                                         preexec_fn=limit)
        self.port = self._port()
        self.host = host
        self.url = f"http://{host}:{self.port}"

    def _port(self) -> int:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = re.search(r"serving .* at http://[^ ]*:(\d+)/", self.text())
            if m:
                return int(m.group(1))
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError("server did not start:\n" + self.text()[-2000:])

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fds(self) -> int:
        try:
            return len(os.listdir(f"/proc/{self.proc.pid}/fd"))
        except OSError:
            return -1

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


_FLAGS: dict[Path, set[str]] = {}


def _import_root(tree: Path, scratch: Path) -> Path:
    """A PYTHONPATH of this tree's own (bench.process.link_import_root)."""
    return scratch / ("importroot-" + re.sub(r"[^A-Za-z0-9]+", "_", str(tree)))


def _known_flags(tree: Path, scratch: Path) -> set[str]:
    if tree not in _FLAGS:
        argv, env = gitspout_command(tree, _import_root(tree, scratch))
        out = subprocess.run([*argv, "--help"], cwd=tree, env={**os.environ, **env},
                             capture_output=True, timeout=60).stdout.decode()
        _FLAGS[tree] = set(re.findall(r"(--[a-z][a-z-]+)", out))
    return _FLAGS[tree]


# -- fixtures -----------------------------------------------------------------------


def many_packs(dest: Path, packs: int) -> Path:
    """One commit, tree and blob per pack (fast-import checkpoints)."""
    out = []
    for i in range(packs):
        data = f"file {i}\n" * 3
        out.append(f"commit refs/heads/main\nmark :{i + 1}\ncommitter b <b@e> "
                   f"{1_600_000_000 + i} +0000\ndata {len(f'c{i}')}\nc{i}\n")
        if i:
            out.append(f"from :{i}\n")
        out.append(f"M 644 inline f{i % 50}.txt\ndata {len(data)}\n{data}\ncheckpoint\n\n")
    git("init", "-q", "--bare", str(dest))
    git("symbolic-ref", "HEAD", "refs/heads/main", cwd=dest)
    git("-c", "fastimport.unpackLimit=0", "fast-import", "--quiet", cwd=dest,
        input="".join(out).encode(), timeout=1800)
    return dest


def blob_repo(dest: Path, size: int, seed: int) -> Path:
    work = dest.parent / (dest.name + "-work")
    git("init", "-q", "-b", "main", str(work))
    (work / "blob.bin").write_bytes(random.Random(seed).randbytes(size))
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "blob", cwd=work)
    git("clone", "-q", "--bare", "--no-local", str(work), str(dest))
    shutil.rmtree(work)
    return dest


def clone(url: str, dest: Path, *extra: str, timeout: float = 600
          ) -> subprocess.CompletedProcess[bytes]:
    shutil.rmtree(dest, ignore_errors=True)
    return git(*extra, "clone", "-q", "--bare", url, str(dest), timeout=timeout, check=False)


def fsck_and_equal(dest: Path, repo: Path) -> str:
    if git("fsck", "--no-progress", cwd=dest, check=False).returncode:
        return "fsck FAILED"
    refs = [git("for-each-ref", cwd=d).stdout for d in (dest, repo)]
    return "fsck-clean, refs = file://" if refs[0] == refs[1] else "fsck-clean, refs DIFFER"


def wait_until(check: Callable[[], bool], timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(step)
    return check()


class SlowProxy:
    """127.0.0.1 to (host, port): the server's bytes at ``rate`` bytes/s."""

    def __init__(self, host: str, port: int, rate: int) -> None:
        self.upstream, self.rate, self.relayed = (host, port), rate, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.socket()
            server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
            server.settimeout(30)
            server.connect(self.upstream)
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, slow: bool) -> None:
        src.settimeout(5 if slow else None)
        try:
            while data := src.recv(16 << 10):
                dst.sendall(data)
                if slow:
                    self.relayed += len(data)
                    time.sleep(len(data) / self.rate)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()


def metric(srv: Server, name: str) -> float | None:
    import urllib.request
    try:
        with urllib.request.urlopen(f"{srv.url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


# -- the scenarios ----------------------------------------------------------------------


def s1_descriptors(tree: Path, work: Path, packs: int) -> str:
    root = work / f"packs{packs}"
    if not (root / "many.git").exists():
        root.mkdir(parents=True, exist_ok=True)
        many_packs(root / "many.git", packs)
    srv = Server(tree, work, root, nofile=1024)
    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.02):
            peak[0] = max(peak[0], srv.fds())

    threading.Thread(target=watch, daemon=True).start()
    try:
        start = time.monotonic()
        done = clone(f"{srv.url}/many.git", work / "c1")
        took = time.monotonic() - start
        result = fsck_and_equal(work / "c1", root / "many.git") if done.returncode == 0 \
            else f"FAILED: {last_error(done, done.stderr)}"
        time.sleep(1)
        after = srv.fds()
        again = clone(f"{srv.url}/many.git", work / "c2")
    finally:
        stop.set()
        srv.stop()
    return (f"{packs} packs, ulimit -n 1024: clone {result} in {took:.1f} s; descriptors "
            f"peak {peak[0]}, after {after}; next clone "
            f"{'ok' if again.returncode == 0 else 'FAILED'}")


def s2_drain(tree: Path, work: Path) -> str:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return "skipped: needs root and ip"
    root = work / "drainroot"
    if not root.exists():
        root.mkdir()
        blob_repo(root / "big.git", 8 << 20, 2)
    pid = os.getpid() % 16384
    ns, host_if, ns_if = f"gsb{pid}", f"gsbh{pid}", f"gsbn{pid}"
    net = f"10.214.{pid >> 6}"
    outer, inner = f"{net}.{((pid & 63) << 2) + 1}", f"{net}.{((pid & 63) << 2) + 2}"

    def ip(*a: str) -> None:
        subprocess.run(["ip", *a], capture_output=True, timeout=30)

    for a in (("netns", "add", ns), ("link", "add", host_if, "type", "veth", "peer", "name",
                                      ns_if), ("link", "set", ns_if, "netns", ns),
              ("addr", "add", f"{outer}/30", "dev", host_if), ("link", "set", host_if, "up"),
              ("-n", ns, "addr", "add", f"{inner}/30", "dev", ns_if),
              ("-n", ns, "link", "set", ns_if, "up")):
        ip(*a)
    try:
        srv = Server(tree, work, root, ["--drain-timeout", "60"],
                     prefix=["ip", "netns", "exec", ns], host=inner)
        proxy = SlowProxy(inner, srv.port, 2 << 20)
        dest = work / "drainclone"
        shutil.rmtree(dest, ignore_errors=True)
        cl = subprocess.Popen(["git", "clone", "-q", "--bare", f"http://127.0.0.1:{proxy.port}/big.git",
                               str(dest)], env=GIT_ENV, stderr=subprocess.PIPE)
        wait_until(lambda: proxy.relayed >= 1 << 20, 30)
        srv.proc.send_signal(signal.SIGTERM)
        srv.proc.wait(timeout=90)
        ip("link", "del", host_if)
        ip("netns", "del", ns)
        _out, err = cl.communicate(timeout=120)
        proxy.close()
    finally:
        ip("link", "del", host_if)
        ip("netns", "del", ns)
    drained = re.findall(r"(drained in [0-9.]+ s)", srv.text())
    result = fsck_and_equal(dest, root / "big.git") if cl.returncode == 0 \
        else f"FAILED: {last_error(cl, err)}"
    return f"SIGTERM at 1 of 8 MiB, read at 2 MB/s: clone {result}; server {', '.join(drained)}"


def _never_reading(port: int, repo: str, want: str) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    body = (_pkt(f"want {want} side-band-64k ofs-delta\n") + b"0000" + _pkt("done\n"))
    sock.sendall((f"POST /{repo}/git-upload-pack HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  f"application/x-git-upload-pack-request\r\nContent-Length: {len(body)}\r\n\r\n"
                  ).encode() + body)
    return sock


def _pkt(line: str) -> bytes:
    return b"%04x" % (len(line) + 4) + line.encode()


def s3_stalled_readers(tree: Path, work: Path) -> str:
    root = work / "stallroot"
    if not root.exists():
        root.mkdir()
        blob_repo(root / "big.git", 8 << 20, 3)
        git("clone", "-q", "--bare", "--no-local", str(root / "big.git"), str(root / "big2.git"))
        blob_repo(root / "small.git", 100, 4)
    want = git("rev-parse", "main", cwd=root / "big.git").stdout.decode().strip()
    srv = Server(tree, work, root, ["--send-timeout", "5", "--pack-queue-wait", "20",
                                    "--pack-cache-size", "0"])
    socks = [_never_reading(srv.port, ("big.git", "big2.git")[i % 2], want) for i in range(32)]
    try:
        wait_until(lambda: metric(srv, "gitspout_admission_in_progress") == 32, 30)
        start = time.monotonic()
        done = clone(f"{srv.url}/small.git", work / "smallclone", timeout=120)
        took = time.monotonic() - start
        def cuts() -> float:  # no progress, or under the minimum rate: both cut
            return sum(metric(srv, f'gitspout_connection_timeouts_total{{kind="{k}"}}') or 0
                       for k in ("send", "send_rate"))

        wait_until(lambda: cuts() >= 32, 10)
        cut = cuts()
    finally:
        for s in socks:
            s.close()
        srv.stop()
    result = "ok" if done.returncode == 0 else f"FAILED: {last_error(done, done.stderr)}"
    return (f"32 never-reading clients (--send-timeout 5 where known, --pack-queue-wait 20): "
            f"small clone {result} after {took:.1f} s; responses cut: {cut or 0:.0f}")


def s4_stalled_bodies(tree: Path, work: Path) -> str:
    root = work / "bodyroot"
    if not root.exists():
        root.mkdir()
        blob_repo(root / "tiny.git", 100, 5)
    srv = Server(tree, work, root)  # defaults: 32 MiB bodies, 256 MiB in all, 30 s
    cap = 32 << 20
    stop = threading.Event()
    socks = []
    try:
        for _ in range(8):
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.sendall((f"POST /tiny.git/git-upload-pack HTTP/1.1\r\nHost: x\r\nContent-Type: "
                       f"application/x-git-upload-pack-request\r\nContent-Length: {cap}\r\n\r\n"
                       ).encode() + b"0" * (cap - 4))  # 32 bytes of the budget left
            socks.append(s)

        def trickle() -> None:
            while not stop.wait(25):
                for s in socks:
                    try:
                        s.send(b"0")
                    except OSError:
                        pass

        threading.Thread(target=trickle, daemon=True).start()
        time.sleep(2)  # the server reads the 256 MiB
        start = time.monotonic()
        ls = git("-c", "protocol.version=2", "ls-remote", f"{srv.url}/tiny.git", check=False)
        ls_took = time.monotonic() - start
        released = wait_until(lambda: _post_status(srv.port, 1 << 20) == 200, 70, step=1)
        freed = time.monotonic() - start
    finally:
        stop.set()
        for s in socks:
            s.close()
        srv.stop()
    ls_result = "200" if ls.returncode == 0 else last_error(ls, ls.stderr)
    return (f"8 bodies of 32 MiB, then a byte every 25 s: v2 ls-refs {ls_result} in "
            f"{ls_took:.2f} s; a 1 MiB body served again "
            + (f"after {freed:.0f} s" if released else "never within 70 s (budget held)"))


def _post_status(port: int, size: int) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall((f"POST /tiny.git/git-upload-pack HTTP/1.1\r\nHost: x\r\nConnection: close"
                   f"\r\nContent-Type: application/x-git-upload-pack-request\r\n"
                   f"Content-Length: {size}\r\n\r\n").encode() + b"0" * size)
        head = s.recv(64)
    m = re.match(rb"HTTP/1.1 (\d+)", head)
    return int(m.group(1)) if m else 0


def s5_password_flood(tree: Path, work: Path) -> str:
    import bcrypt

    root = work / "authroot"
    if not root.exists():
        (root / "team").mkdir(parents=True)
        (root / "public").mkdir()
        blob_repo(root / "team" / "app.git", 100, 6)
        blob_repo(root / "public" / "fresh.git", 100, 7)
    auth = work / "auth.toml"
    auth.write_text(f'[users]\nalice = "{bcrypt.hashpw(b"right", bcrypt.gensalt(12)).decode()}"\n'
                    '[[access]]\nrepos = ["public/*"]\nanonymous = true\n'
                    '[[access]]\nrepos = ["team/*"]\nusers = ["alice"]\n')
    srv = Server(tree, work, root, ["--auth-file", str(auth)])
    stop = threading.Event()

    def flood(i: int) -> None:
        path = "/team/app.git/info/refs?service=git-upload-pack"
        while not stop.is_set():
            token = base64.b64encode(f"alice:{secrets.token_hex(6)}".encode()).decode()
            try:
                with socket.create_connection(("127.0.0.1", srv.port), timeout=120,
                                              source_address=(f"127.0.0.{2 + i}", 0)) as s:
                    s.sendall((f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                               f"Authorization: Basic {token}\r\n\r\n").encode())
                    if s.recv(64).startswith(b"HTTP/1.1 429"):
                        stop.wait(1)
            except OSError:
                stop.wait(0.1)

    threads = [threading.Thread(target=flood, args=(i,), daemon=True) for i in range(30)]
    for t in threads:
        t.start()
    try:
        time.sleep(10)  # the flood under way
        helper = "!f() { echo username=alice; echo password=right; }; f"
        start = time.monotonic()
        valid = git("-c", "credential.helper=", "-c", f"credential.helper={helper}", "ls-remote",
                    f"{srv.url}/team/app.git", check=False, timeout=120)
        valid_took = time.monotonic() - start
        start = time.monotonic()
        anon = git("ls-remote", f"{srv.url}/public/fresh.git", check=False, timeout=120)
        anon_took = time.monotonic() - start
    finally:
        stop.set()
        srv.stop()
    return (f"30 clients of wrong passwords, cost 12: valid user "
            f"{'ok' if valid.returncode == 0 else 'FAILED'} in {valid_took:.2f} s, anonymous "
            f"(repository not resolved yet) {'ok' if anon.returncode == 0 else 'FAILED'} in "
            f"{anon_took:.2f} s")


def s6_alternates(tree: Path, work: Path) -> str:
    out = []
    for lines in (1, 8, 12):
        root = work / f"altroot{lines}"
        if not root.exists():
            root.mkdir()
            repo = blob_repo(root / "r.git", 1000, 8)
            (repo / "objects" / "info" / "alternates").write_text("../objects\n" * lines)
        srv = Server(tree, work, root)
        try:
            clone(f"{srv.url}/r.git", work / "altwarm", timeout=300)
            rss0 = _rss(srv.proc.pid)
            start = time.monotonic()
            done = clone(f"{srv.url}/r.git", work / "altclone", timeout=300)
            took = time.monotonic() - start
            rss = _rss(srv.proc.pid) - rss0
        finally:
            srv.stop()
        ok = "ok" if done.returncode == 0 else "FAILED"
        out.append(f"{lines} line{'s' if lines > 1 else ''}: {ok} {took:.2f} s, RSS {rss:+.0f} MB")
    return "own objects dir N times, warm clone: " + "; ".join(out)


def _rss(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def s7_sighup(tree: Path, work: Path) -> str:
    root = work / "drainroot"
    if not root.exists():
        root.mkdir()
        blob_repo(root / "big.git", 8 << 20, 2)
    cache = work / "sighup-cache"
    shutil.rmtree(cache, ignore_errors=True)
    srv = Server(tree, work, root, ["--pack-cache-dir", str(cache)])
    proxy = SlowProxy("127.0.0.1", srv.port, 2 << 20)
    dest = work / "hupclone"
    shutil.rmtree(dest, ignore_errors=True)
    cl = subprocess.Popen(["git", "clone", "-q", "--bare", f"http://127.0.0.1:{proxy.port}/big.git",
                           str(dest)], env=GIT_ENV, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: proxy.relayed >= 1 << 20, 30)
        srv.proc.send_signal(signal.SIGHUP)
        time.sleep(1)
        alive = srv.alive()
        _out, err = cl.communicate(timeout=120)
    finally:
        proxy.close()
        srv.stop()
    left = [p.name for p in cache.glob("gitspout-packcache-*")]
    result = "ok" if cl.returncode == 0 else f"FAILED: {last_error(cl, err)}"
    return (f"SIGHUP at 1 of 8 MiB: server {'alive' if alive else 'DEAD'}, clone {result}, "
            f"pack-cache directory {'left behind' if left else 'removed at exit'}")


def s8_logs(tree: Path, work: Path) -> str:
    root = work / "logroot"
    nasty = "evil\x1b[31m\x1b]0;pwned\x07\r\u009dx.git"
    if not root.exists():
        root.mkdir()
        blob_repo(work / "outside.git", 100, 9)
        os.symlink(work / "outside.git", root / nasty)
    srv = Server(tree, work, root)
    try:
        path = "/" + urllib.parse.quote(nasty) + "/info/refs?service=git-upload-pack"
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            s.recv(1024)
        time.sleep(0.5)
        text = srv.text()
    finally:
        srv.stop()
    raw = sum(1 for c in text if ord(c) < 0x20 and c != "\n" or 0x7F <= ord(c) < 0xA0)
    return f"URL with ESC, OSC, BEL, CR, C1: {raw} raw control characters in the log"


SCENARIOS = {
    "1": ("descriptors", s1_descriptors), "2": ("drain", s2_drain),
    "3": ("stalled readers", s3_stalled_readers), "4": ("stalled bodies", s4_stalled_bodies),
    "5": ("password flood", s5_password_flood), "6": ("alternates", s6_alternates),
    "7": ("SIGHUP", s7_sighup), "8": ("logs", s8_logs),
}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", type=Path,
                    help="gitspout source tree to run (repeatable; default: this checkout)")
    ap.add_argument("--only", default="12345678", help="scenarios to run, e.g. 135")
    ap.add_argument("--packs", type=int, default=600, help="packs of scenario 1")
    ap.add_argument("--work", type=Path, default=None, help="scratch directory (kept)")
    args = ap.parse_args(argv)
    trees = args.tree or [Path(__file__).resolve().parent.parent]
    work = args.work or Path(tempfile.mkdtemp(prefix="gitspout-survival-"))
    print(f"load average {os.getloadavg()[0]:.2f}; work {work}", flush=True)
    for tree in trees:
        scratch = work / tree.resolve().name
        scratch.mkdir(parents=True, exist_ok=True)
        for key in args.only:
            name, fn = SCENARIOS[key]
            shared = work / "shared"
            shared.mkdir(exist_ok=True)
            try:
                figure = fn(tree.resolve(), shared, args.packs) if key == "1" \
                    else fn(tree.resolve(), shared)  # type: ignore[call-arg]
            except Exception as exc:  # noqa: BLE001 - a scenario that breaks is a figure too
                figure = f"ERROR {type(exc).__name__}: {str(exc)[:120]}"
            print(f"{tree} | {key}. {name} | {figure}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
