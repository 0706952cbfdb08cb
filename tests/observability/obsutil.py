"""Helpers for the observability tests: a gitspout whose output is kept, /metrics scrapes,
a byte-counting HTTP proxy, and metric names out of PromQL.

(The module names in this directory must not repeat those of other test directories.)
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gitutil import REPO_ROOT, Committer, Git, stop_process
from prometheus_client.parser import text_string_to_metric_families

HTTP_TIMEOUT = 10.0
REPO = "obs.git"  # the served repository the tests use (conftest.obs_template)


# -- served roots --------------------------------------------------------------------------

def make_root(root: Path, template: Path) -> Path:
    """A served root: obs.git and other.git (a copy, which --metrics-repos leaves out)."""
    shutil.copytree(template, root / REPO, symlinks=True)
    shutil.copytree(template, root / "other.git", symlinks=True)
    return root


def push_commit(git: Git, served_repo: Path, work: Path, name: str) -> str:
    """Add one commit to the served repository's main (through a scratch clone)."""
    if not work.exists():
        git.run("clone", "-q", "--no-local", str(served_repo), str(work))
    c = Committer(git, work, start=1_695_000_000 + len(name))
    oid = c.commit({f"new/{name}.txt": f"{name}\n" * 20}, f"add {name}")
    git.run("push", "-q", "origin", "main", cwd=work)
    return oid


# -- a live gitspout whose stdout and stderr are kept ------------------------------------------

@dataclass
class CapturedServer:
    """``gitspout serve`` on 127.0.0.1 with every output line kept, per stream."""

    proc: subprocess.Popen[bytes]
    port: int
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def lines(self) -> list[str]:
        return self.stdout + self.stderr

    def access_log(self) -> list[dict[str, object]]:
        """The access-log lines (the server runs with --log-format json), in the order they
        were written, from both streams."""
        out = []
        for line in list(self.stdout) + list(self.stderr):
            if line.startswith("{"):
                record = json.loads(line)
                if record["logger"] == "gitspout.access":
                    out.append(record)
        return out

    def stop(self) -> None:
        stop_process(self.proc)


def start_captured(root: Path, extra_args: Sequence[str] = (),
                   timeout: float = 20.0) -> CapturedServer:
    cmd = [sys.executable, "-m", "gitspout.server.app.cli", "serve", "--root", str(root),
           "--host", "127.0.0.1", "--port", "0", "--log-format", "json", *extra_args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITSPOUT_")}
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    out: list[str] = []
    err: list[str] = []
    started = threading.Event()

    def pump(stream: object, sink: list[str]) -> None:
        for raw in stream:  # type: ignore[attr-defined]
            line = raw.decode(errors="replace").rstrip("\n")
            sink.append(line)
            if "serving" in line and " at http://" in line:
                started.set()

    for stream, sink in ((proc.stdout, out), (proc.stderr, err)):
        threading.Thread(target=pump, args=(stream, sink), daemon=True).start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if started.wait(0.05):
            for line in out + err:
                m = re.search(r"serving .* at http://127\.0\.0\.1:(\d+)/", line)
                if m:
                    return CapturedServer(proc, int(m.group(1)), out, err)
    proc.kill()
    raise RuntimeError("gitspout did not start:\n" + "\n".join(out + err))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- /metrics ----------------------------------------------------------------------------------

def scrape(url: str) -> str:
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=HTTP_TIMEOUT) as resp:
        assert resp.status == 200
        return resp.read().decode()


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Samples:
    """Every sample of an exposition, keyed by (sample name, labels)."""
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(smp: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0 for a series that does not exist (yet)."""
    return smp.get((name, frozenset(labels.items())), 0.0)


def total(smp: Samples, name: str, **match: str) -> float:
    """Sum over the series of ``name`` whose labels include ``match``."""
    want = set(match.items())
    return sum(v for (n, lab), v in smp.items() if n == name and want <= lab)


def wait_idle(url: str, timeout: float = 10.0) -> Samples:
    """Scrape until no request is in flight. /metrics runs on the event loop that also
    decrements the gauge and accounts the request in one synchronous step, so a scrape
    showing 0 in flight includes every finished request."""
    deadline = time.monotonic() + timeout
    while True:
        smp = samples(scrape(url))
        if value(smp, "gitspout_requests_in_flight") == 0:
            return smp
        if time.monotonic() > deadline:
            raise AssertionError("requests still in flight after the client finished")
        time.sleep(0.02)


def delta(before: Samples, after: Samples, prefix: str = "gitspout_") -> Samples:
    """Samples that changed (created series count from 0)."""
    keys = set(before) | set(after)
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in keys
            if k[0].startswith(prefix) and not k[0].endswith("_created")
            and after.get(k, 0.0) != before.get(k, 0.0)}


def families(text: str) -> dict[str, str]:
    """Family name -> type, with the exposition's own family names (counters keep
    ``_total`` stripped, as the parser reports them)."""
    return {fam.name: fam.type for fam in text_string_to_metric_families(text)}


SUFFIXES = {"_bucket": {"histogram"}, "_sum": {"histogram", "summary"},
            "_count": {"histogram", "summary"}, "_total": {"counter"},
            "_created": {"counter", "histogram", "summary"}}


def check_name(name: str, text: str) -> str | None:
    """Why ``name`` (as used in a query) is not in the exposition ``text``; None if it is.

    A name is fine when it is a sample name of the scrape and, once its suffix
    (_bucket/_sum/_count/_total/_created) is stripped, names a family of a type that has
    that suffix (so ``x_count`` of a counter named ``x_count_total`` does not pass)."""
    fams = families(text)
    sample_names = {n for n, _ in samples(text)}
    if name not in sample_names:
        return f"{name}: no such series in the scrape"
    for suffix, types in SUFFIXES.items():
        base = name[: -len(suffix)]
        if name.endswith(suffix) and fams.get(base) in types:
            return None
    if fams.get(name) in ("gauge", "untyped", "unknown"):
        return None
    return f"{name}: suffix does not match the family type ({fams.get(name)})"


# -- metric names in PromQL --------------------------------------------------------------------

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
            "and", "or", "unless", "atan2", "inf", "nan", "start", "end",
            # aggregations, which may take their by/without clause before the parentheses
            "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
            "bottomk", "topk", "quantile"}
_LABEL_LIST_AFTER = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_TOKEN = re.compile(r"""
    (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<var>\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*)
  | (?P<range>\[[^\]]*\])
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<num>[0-9]+(?:\.[0-9]*)?(?:e[+-]?[0-9]+)?[smhdwy]?)
  | (?P<punct>.)
""", re.VERBOSE | re.DOTALL)


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers that are not functions, keywords,
    label names inside {...} or in by/without/on/ignoring/group_x lists."""
    tokens = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(expr)
              if not (m.lastgroup == "punct" and m.group().isspace())]
    names: set[str] = set()
    brace = 0
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        nxt = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if text == "{":
            brace += 1
        elif text == "}":
            brace -= 1
        elif kind == "ident" and brace == 0:
            low = text.lower()
            if low in _LABEL_LIST_AFTER and nxt == "(":
                depth, i = 0, i + 1
                while i < len(tokens):  # skip the label list
                    if tokens[i][1] == "(":
                        depth += 1
                    elif tokens[i][1] == ")":
                        depth -= 1
                        if depth == 0:
                            break
                    i += 1
            elif low in KEYWORDS or nxt == "(":
                pass  # a keyword, a function or an aggregation
            else:
                names.add(text)
        i += 1
    return names


def label_values_metric(query: str) -> set[str]:
    """The metric of a Grafana ``label_values(metric{...}, label)`` variable query."""
    m = re.match(r"\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$", query)
    return metric_names(m.group(1)) if m else metric_names(query)


# -- a byte-counting HTTP/1.1 proxy ------------------------------------------------------------

@dataclass
class Exchange:
    method: str = ""
    path: str = ""
    request_body: bytes = b""
    status: int = 0
    body_bytes: int = 0  # response body bytes after de-chunking

    @property
    def command(self) -> str:
        """info-refs, or the command of an upload-pack POST (v0/v1 POSTs are fetches)."""
        if self.method == "GET" and self.path.split("?")[0].endswith("/info/refs"):
            return "info-refs"
        m = re.search(rb"command=([a-z-]+)", self.request_body)
        return m.group(1).decode() if m else "fetch"


class _Message:
    """An incremental HTTP/1.1 message parser (one direction of one connection)."""

    def __init__(self, on_message: object, keep_body: bool) -> None:
        self.on_message = on_message
        self.keep_body = keep_body
        self.buf = b""
        self.state = "head"
        self.remaining = 0
        self.head = b""
        self.body_len = 0
        self.body = bytearray()

    def _body(self, data: bytes) -> None:
        self.body_len += len(data)
        if self.keep_body and len(self.body) < 1 << 20:
            self.body += data

    def _done(self) -> None:
        self.on_message(self.head, self.body_len, bytes(self.body))  # type: ignore[operator]
        self.state, self.head, self.body_len, self.body = "head", b"", 0, bytearray()

    def feed(self, data: bytes) -> None:
        self.buf += data
        while True:
            if self.state == "head":
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                self.head, self.buf = self.buf[:end], self.buf[end + 4:]
                headers = {}
                for line in self.head.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    headers[k.strip().lower()] = v.strip().lower()
                first = self.head.split(b"\r\n", 1)[0].split()
                no_body = first[1][:1] == b"1" or first[1] in (b"204", b"304")
                if first[0].startswith(b"HTTP/") and no_body:
                    self._done()  # 1xx, 204 and 304 have no body
                elif b"chunked" in headers.get(b"transfer-encoding", b""):
                    self.state = "size"
                elif b"content-length" in headers:
                    self.remaining = int(headers[b"content-length"])
                    self.state = "fixed"
                    if not self.remaining:
                        self._done()
                elif first[0].startswith(b"HTTP/"):
                    self.state = "close"  # delimited by the end of the connection
                else:
                    self._done()  # a request without a body
            elif self.state == "fixed":
                take = self.buf[: self.remaining]
                self.buf = self.buf[len(take):]
                self._body(take)
                self.remaining -= len(take)
                if self.remaining:
                    return
                self._done()
            elif self.state == "size":
                end = self.buf.find(b"\r\n")
                if end < 0:
                    return
                size = int(self.buf[:end].split(b";")[0], 16)
                self.buf = self.buf[end + 2:]
                self.remaining, self.state = size, ("data" if size else "trailer")
            elif self.state == "data":
                take = self.buf[: self.remaining]
                self.buf = self.buf[len(take):]
                self._body(take)
                self.remaining -= len(take)
                if self.remaining:
                    return
                self.state = "crlf"
            elif self.state == "crlf":
                if len(self.buf) < 2:
                    return
                assert self.buf[:2] == b"\r\n", "bad chunk framing"
                self.buf, self.state = self.buf[2:], "size"
            elif self.state == "trailer":
                end = self.buf.find(b"\r\n")
                if end < 0:
                    return
                line, self.buf = self.buf[:end], self.buf[end + 2:]
                if not line:
                    self._done()
            elif self.state == "close":
                self._body(self.buf)
                self.buf = b""
                return

    def eof(self) -> None:
        if self.state == "close":
            self._done()


class CountingProxy:
    """A reverse proxy on 127.0.0.1 that relays bytes unchanged to ``target_port`` and
    records every exchange: request line and body, response status and body size."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self.port = int(self._sock.getsockname()[1])
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._connection, args=(client,), daemon=True)
            t.start()
            self._threads.append(t)

    def _connection(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=60)
        client.settimeout(60)
        pending: list[Exchange] = []

        def on_request(head: bytes, _n: int, body: bytes) -> None:
            method, path = head.split(b"\r\n", 1)[0].split()[:2]
            headers = head.lower()
            if b"content-encoding: gzip" in headers:
                body = gzip.decompress(body)
            pending.append(Exchange(method.decode(), path.decode(), body))

        def on_response(head: bytes, n: int, _body: bytes) -> None:
            status = int(head.split(b"\r\n", 1)[0].split()[1])
            if 100 <= status < 200:
                return
            ex = pending.pop(0)
            ex.status, ex.body_bytes = status, n
            with self._lock:
                self.exchanges.append(ex)

        requests = _Message(on_request, keep_body=True)
        responses = _Message(on_response, keep_body=False)

        def pipe(src: socket.socket, dst: socket.socket, parser: _Message) -> None:
            try:
                while True:
                    data = src.recv(1 << 16)
                    if not data:
                        break
                    dst.sendall(data)
                    parser.feed(data)
            except OSError:
                pass
            finally:
                parser.eof()
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

        up = threading.Thread(target=pipe, args=(client, upstream, requests), daemon=True)
        up.start()
        pipe(upstream, client, responses)
        up.join(timeout=60)
        client.close()
        upstream.close()

    def wait_closed(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        for t in list(self._threads):
            t.join(max(0.0, deadline - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        self._sock.close()
        self._accept.join(timeout=5)
        self.wait_closed(timeout=5)

    def bytes_by_command(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for ex in self.exchanges:
            out[ex.command] = out.get(ex.command, 0) + ex.body_bytes
        return out


# -- git, quickly ------------------------------------------------------------------------------

def object_count(git: object, repo: Path) -> int:
    """Objects in a clone's packs (what one fetch sent)."""
    out = git.out("count-objects", "-v", cwd=repo)  # type: ignore[attr-defined]
    fields_ = dict(line.split(": ") for line in out.splitlines())
    return int(fields_["in-pack"]) + int(fields_["count"])


def dashboard_exprs(dashboard: Mapping[str, object]) -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) for every target of every panel, rows included."""
    out = []

    def walk(panels: Iterable[Mapping[str, object]]) -> None:
        for p in panels:
            for t in p.get("targets", []) or []:  # type: ignore[union-attr]
                if "expr" in t:
                    out.append((str(p.get("title")), str(t.get("refId")), str(t["expr"])))
            walk(p.get("panels", []) or [])  # type: ignore[arg-type]

    walk(dashboard.get("panels", []))  # type: ignore[arg-type]
    return out
