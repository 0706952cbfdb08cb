"""Raw HTTP/1.1 over a socket, for requests an HTTP client library will not send.

Everything here is bounded: each socket has a timeout, each read loop a deadline and a byte
cap. Requests carry ``Connection: close`` (unless told otherwise) so that the end of a
response is the server closing the connection. Only 127.0.0.1 is ever contacted.
"""

from __future__ import annotations

import re
import socket
import struct
import time
from dataclasses import dataclass, field

HOST = "127.0.0.1"
TIMEOUT = 15.0
MAX_RESPONSE = 64 << 20

UPLOAD_CT = "application/x-git-upload-pack-request"
ADVERT_CT = "application/x-git-upload-pack-advertisement"
RESULT_CT = "application/x-git-upload-pack-result"
INFO_REFS = "/info/refs?service=git-upload-pack"
SERVICE_PREAMBLE = b"001e# service=git-upload-pack\n0000"

FLUSH = b"0000"

# Caps of the ``small_server`` fixture (conftest.py).
SMALL_MAX_BODY = 8192
SMALL_MAX_INFLATED = 65536
DELIM = b"0001"


def pkt(data: bytes | str) -> bytes:
    """One data pkt-line."""
    raw = data.encode() if isinstance(data, str) else data
    return b"%04x" % (len(raw) + 4) + raw


def pkt_lines(*lines: str) -> bytes:
    """Text pkt-lines, each with its LF."""
    return b"".join(pkt(line + "\n") for line in lines)


def parse_pkts(body: bytes) -> list[bytes | None]:
    """Decode a response body into payloads; flush/delim/response-end become None.

    Stops at the first malformed length (a response is ours to trust only this far).
    """
    out: list[bytes | None] = []
    pos = 0
    while pos + 4 <= len(body):
        head = body[pos : pos + 4]
        try:
            n = int(head, 16)
        except ValueError:
            break
        if n < 4:
            out.append(None)
            pos += 4
            continue
        out.append(body[pos + 4 : pos + n])
        pos += n
    return out


def v2_command(command: str, caps: tuple[str, ...] = ("object-format=sha1",),
               args: tuple[str, ...] = ()) -> bytes:
    """A protocol v2 command request body."""
    return pkt_lines(f"command={command}", *caps) + DELIM + pkt_lines(*args) + FLUSH


@dataclass
class Response:
    status: int
    reason: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    raw: bytes = b""
    complete: bool = True

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def build_request(method: str, path: str | bytes, headers: dict[str, str] | None = None,
                  body: bytes | None = None, chunked: bool = False,
                  close: bool = True) -> bytes:
    """Bytes of one request. ``path`` is sent exactly as given (bytes allowed)."""
    target = path if isinstance(path, bytes) else path.encode("latin-1")
    lines = [method.encode() + b" " + target + b" HTTP/1.1", b"Host: 127.0.0.1"]
    if close:
        lines.append(b"Connection: close")
    for key, value in (headers or {}).items():
        lines.append(f"{key}: {value}".encode("latin-1"))
    payload = b""
    if body is not None:
        if chunked:
            lines.append(b"Transfer-Encoding: chunked")
            payload = encode_chunked(body)
        else:
            lines.append(b"Content-Length: %d" % len(body))
            payload = body
    return b"\r\n".join(lines) + b"\r\n\r\n" + payload


def encode_chunked(body: bytes, size: int = 7) -> bytes:
    """``body`` as small chunks, so that the server really has to reassemble it."""
    parts = [b"%x\r\n" % len(body[i : i + size]) + body[i : i + size] + b"\r\n"
             for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n\r\n"


def connect(port: int, timeout: float = TIMEOUT) -> socket.socket:
    sock = socket.create_connection((HOST, port), timeout=timeout)
    sock.settimeout(timeout)
    return sock


def read_until_close(sock: socket.socket, timeout: float = TIMEOUT,
                     limit: int = MAX_RESPONSE) -> tuple[bytes, bool]:
    """Everything the server sends until it closes; ``(data, closed)``."""
    deadline = time.monotonic() + timeout
    parts: list[bytes] = []
    size = 0
    while time.monotonic() < deadline and size < limit:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            data = sock.recv(1 << 16)
        except TimeoutError:
            return b"".join(parts), False
        except ConnectionResetError:
            return b"".join(parts), True
        if not data:
            return b"".join(parts), True
        parts.append(data)
        size += len(data)
    return b"".join(parts), False


def read_head(sock: socket.socket, timeout: float = TIMEOUT) -> bytes:
    """Bytes up to the end of the response head (or whatever came before the deadline)."""
    deadline = time.monotonic() + timeout
    data = b""
    while b"\r\n\r\n" not in data and time.monotonic() < deadline and len(data) < 1 << 20:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            more = sock.recv(1 << 16)
        except (TimeoutError, ConnectionResetError):
            break
        if not more:
            break
        data += more
    return data


def exchange(port: int, request: bytes, timeout: float = TIMEOUT) -> Response:
    """Send ``request`` and read the response until the server closes the connection."""
    sock = connect(port, timeout)
    try:
        try:
            sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer (413...) and close before reading everything
        data, _closed = read_until_close(sock, timeout)
    finally:
        sock.close()
    return parse_response(data)


def parse_response(data: bytes) -> Response:
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        raise AssertionError(f"no complete response head in {data[:200]!r}")
    lines = head.split(b"\r\n")
    version, status, *reason = lines[0].split(b" ", 2)
    assert version.startswith(b"HTTP/1."), lines[0]
    headers: dict[str, str] = {}
    for line in lines[1:]:
        key, _, value = line.partition(b":")
        headers[key.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    body, complete = rest, True
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body, complete = decode_chunked(rest)
    elif "content-length" in headers:
        n = int(headers["content-length"])
        complete = len(rest) >= n
        body = rest[:n]
    return Response(int(status), (reason[0] if reason else b"").decode("latin-1"),
                    headers, body, data, complete)


def decode_chunked(data: bytes) -> tuple[bytes, bool]:
    """Decode a chunked body; ``(body, saw_last_chunk)``."""
    out: list[bytes] = []
    pos = 0
    while True:
        end = data.find(b"\r\n", pos)
        if end < 0:
            return b"".join(out), False
        size = int(data[pos:end].split(b";")[0], 16)
        if size == 0:
            return b"".join(out), True
        out.append(data[end + 2 : end + 2 + size])
        if end + 2 + size > len(data):
            return b"".join(out), False
        pos = end + 2 + size + 2


def request(port: int, method: str, path: str | bytes, headers: dict[str, str] | None = None,
            body: bytes | None = None, chunked: bool = False,
            timeout: float = TIMEOUT) -> Response:
    return exchange(port, build_request(method, path, headers, body, chunked), timeout)


def get_info_refs(port: int, repo: str = "basic.git", version: int = 0) -> Response:
    headers = {"Git-Protocol": f"version={version}"} if version else {}
    return request(port, "GET", f"/{repo}{INFO_REFS}", headers)


def post_upload_pack(port: int, body: bytes, repo: str = "basic.git", version: int = 0,
                     headers: dict[str, str] | None = None, chunked: bool = False,
                     timeout: float = TIMEOUT) -> Response:
    hdrs = {"Content-Type": UPLOAD_CT}
    if version:
        hdrs["Git-Protocol"] = f"version={version}"
    hdrs.update(headers or {})
    return request(port, "POST", f"/{repo}/git-upload-pack", hdrs, body, chunked, timeout)


def assert_not_5xx(resp: Response) -> None:
    assert resp.status < 500, f"server error {resp.status}: {resp.body[:300]!r}"


def assert_serving(port: int, repo: str = "basic.git") -> None:
    """The server still answers a valid info/refs with a well-formed advertisement."""
    resp = get_info_refs(port, repo)
    assert resp.status == 200, (resp.status, resp.body[:200])
    assert resp.complete
    assert resp.header("content-type") == ADVERT_CT
    assert resp.body.startswith(SERVICE_PREAMBLE)
    assert resp.body.endswith(FLUSH)


def abort(sock: socket.socket) -> None:
    """Close with an RST instead of a FIN (SO_LINGER 0), as a killed client would."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def thread_count(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads: line")


def metric_samples(port: int, name: str) -> dict[str, float]:
    """Every sample of ``name`` in the server's /metrics, by its label text (``""`` for
    none, else e.g. ``{result="hit"}``)."""
    resp = request(port, "GET", "/metrics")
    assert resp.status == 200
    out = {}
    for line in resp.text.splitlines():
        m = re.match(rf"{re.escape(name)}(\{{.*\}})? (\S+)$", line)
        if m:
            out[m.group(1) or ""] = float(m.group(2))
    return out


def metric(port: int, sample: str, default: float | None = None) -> float:
    """One sample of the server's /metrics, e.g. ``gitspout_open_files`` or
    ``gitspout_send_cuts_total{reason="stalled"}``; ``default`` when it is absent."""
    resp = request(port, "GET", "/metrics")
    assert resp.status == 200
    for line in resp.text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    if default is not None:
        return default
    raise LookupError(f"{sample} not in /metrics")


@dataclass(frozen=True)
class TcpSocket:
    """One IPv4 TCP socket of this network namespace, as /proc/net/tcp shows it."""

    local_port: int
    remote_port: int
    state: str  # "ESTABLISHED", "LISTEN", ...
    tx_queue: int  # bytes sent and not yet acknowledged by the peer
    rx_queue: int  # bytes received and not yet read; for LISTEN: connections not accepted


_TCP_STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1",
               5: "FIN_WAIT2", 6: "TIME_WAIT", 7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK",
               10: "LISTEN", 11: "CLOSING"}


def tcp_sockets(local_port: int) -> list[TcpSocket]:
    """The sockets whose local port is ``local_port``: for a server's port, its listening
    socket and its side of every connection (``remote_port`` names the client's socket).
    A test waits on these (a full send queue: the client stopped reading; an empty accept
    queue: every connection was accepted) instead of sleeping."""
    out = []
    with open("/proc/net/tcp") as fh:
        next(fh)  # the header line
        for line in fh:
            fields = line.split()
            local, remote, state = fields[1], fields[2], int(fields[3], 16)
            if int(local.split(":")[1], 16) != local_port:
                continue
            tx, rx = (int(x, 16) for x in fields[4].split(":"))
            out.append(TcpSocket(local_port, int(remote.split(":")[1], 16),
                                 _TCP_STATES.get(state, str(state)), tx, rx))
    return out


def server_side(port: int, client: socket.socket) -> TcpSocket | None:
    """The server's end of ``client``'s connection to ``port`` (None once it is gone)."""
    mine = client.getsockname()[1]
    return next((s for s in tcp_sockets(port)
                 if s.remote_port == mine and s.state != "LISTEN"), None)


def accept_queue(port: int) -> int:
    """Connections to the listening socket on ``port`` that the server has not accepted yet."""
    return sum(s.rx_queue for s in tcp_sockets(port) if s.state == "LISTEN")
