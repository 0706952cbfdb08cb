"""A coverage-guided fuzz target (atheris) for the request-handling path, run by hand and
never by pytest (its name does not start with ``test_``; docs/development.md "Tests").

Each input is one POST body, handled in-process the way ``server/app/http.py`` handles it
(the same functions, without aiohttp and the thread pool) against small fixture
repositories built at start with the git CLI (one with a bitmap and a commit-graph, one
without, both with tags and a second branch):

- mode 0: a v0 upload-request body as sent (pkt-lines), parsed, planned, its pack produced;
- mode 1: a v2 body as sent (``command=...``, capabilities, delim, arguments, flush);
- mode 2: v2 ``fetch`` arguments, one per input line, framed as git frames them;
- mode 3: v2 ``ls-refs`` arguments, likewise; mode 4: ``object-info``.

In modes 2-4, ``$0``..``$9`` in a line stand for ids of the fixture's objects (commits,
trees, blobs, a tag), so that the fuzzer reaches wants, haves, shallow lines and deepen
without guessing 40 hex digits.

The invariant (docs/ARCHITECTURE.md "The fuzz invariant", extended to the handler): a
request either gets its answer, or a ``ClientError`` (a ``Refusal`` included); anything else
(a storage fault on a healthy repository, an AssertionError, a bare ValueError, a hang)
is a finding.

    pip install -e '.[fuzz]'
    mkdir -p /tmp/corpus            # an empty directory gets the seeds; the corpus grows there
    python tests/fuzz/fuzz_request.py -max_total_time=600 -rss_limit_mb=3072 \\
        -dict=tests/fuzz/request.dict /tmp/corpus
    python tests/fuzz/fuzz_request.py --coverage /tmp/corpus   # line coverage it reached
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import atheris

with atheris.instrument_imports(include=["gitspout"]):
    from gitspout.protocol.advertise import v0_request_capabilities
    from gitspout.protocol.errors import ClientError
    from gitspout.protocol.fetch_request import FetchRequest, parse_v0_request
    from gitspout.server.core import commands as C
    from gitspout.server.core.context import RequestContext
    from gitspout.server.core.fetch import plan_fetch
    from gitspout.server.core.framing import frame_fetch
    from gitspout.server.packgen import PackStream
    from gitspout.server.store.confine import LinkGuard
    from gitspout.server.store.fscache import DirCache
    from gitspout.server.store.registry import PackRegistry
    from gitspout.server.store.repos import Repo, RepoResolver

ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
       "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
       "GIT_AUTHOR_NAME": "f", "GIT_AUTHOR_EMAIL": "f@x", "GIT_COMMITTER_NAME": "f",
       "GIT_COMMITTER_EMAIL": "f@x", "GIT_AUTHOR_DATE": "1600000000 +0000",
       "GIT_COMMITTER_DATE": "1600000000 +0000"}


def _git(*args: str, cwd: str | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=ENV, check=True, capture_output=True,
                          text=True, timeout=60).stdout


def build_root(root: str) -> list[str]:
    """small.git (bitmap, commit-graph) and plain.git (neither); the ids ``$N`` stand for."""
    work = os.path.join(root, "work")
    _git("init", "-q", "-b", "main", work)
    for i in range(12):
        os.makedirs(os.path.join(work, f"d{i % 3}"), exist_ok=True)
        with open(os.path.join(work, f"d{i % 3}", f"f{i}"), "w") as fh:
            fh.write(f"content {i}\n" * (i + 1))
        _git("add", "-A", cwd=work)
        _git("commit", "-q", "-m", f"c{i}", cwd=work)
        if i == 4:
            _git("tag", "-a", "v1", "-m", "v1", cwd=work)
            _git("branch", "side", cwd=work)
    for name, bitmaps in (("small.git", True), ("plain.git", False)):
        dest = os.path.join(root, name)
        _git("clone", "-q", "--bare", "--no-local", work, dest)
        _git("repack", "-adq" + ("b" if bitmaps else ""), cwd=dest)
        if bitmaps:
            _git("commit-graph", "write", "--reachable", cwd=dest)
    objs = _git("cat-file", "--batch-all-objects", "--batch-check=%(objectname) %(objecttype)",
                cwd=os.path.join(root, "small.git")).split("\n")
    by_type: dict[str, list[str]] = {}
    for line in filter(None, objs):
        oid, kind = line.split()
        by_type.setdefault(kind, []).append(oid)
    head = _git("rev-parse", "main", "main~3", "side", "v1", cwd=work).split()
    return (head + by_type["tree"][:2] + by_type["blob"][:3] + ["0" * 40])[:10]


ROOT = tempfile.mkdtemp(prefix="gitspout-fuzz-")
OIDS = build_root(ROOT)
RESOLVER = RepoResolver(ROOT)
REPOS: list[Repo] = [RESOLVER.resolve("small.git"), RESOLVER.resolve("plain.git")]
REGISTRY = PackRegistry()
DIRS = DirCache(enabled=True, guard=LinkGuard(os.path.realpath(ROOT), False))


def _pkt(payload: bytes) -> bytes:
    return b"%04x" % (len(payload) + 4) + payload


def _lines(body: bytes) -> list[bytes]:
    text = body.decode("latin-1")
    for n, oid in enumerate(OIDS):
        text = text.replace(f"${n}", oid)
    return [line.encode("latin-1") + b"\n" for line in text.split("\n") if line][:200]


def _v2(command: bytes, body: bytes) -> bytes:
    return (_pkt(b"command=" + command + b"\n") + _pkt(b"object-format=sha1\n") + b"0001"
            + b"".join(_pkt(line) for line in _lines(body) if len(line) <= 65516) + b"0000")


def _consume(ctx: RequestContext, req: FetchRequest) -> None:
    plan = plan_fetch(ctx, req)
    head = frame_fetch(plan)
    for _ in head.before:
        pass
    if head.pack and plan.order is not None:
        for _chunk in PackStream(plan.order, ctx.objects()):
            pass
        for _item in head.after:
            pass


def handle(mode: int, repo: Repo, body: bytes) -> None:
    ctx = RequestContext(repo, REGISTRY, b"gitspout/fuzz", DIRS)
    try:
        if mode == 0:
            caps = v0_request_capabilities(ctx.config.allow_filter)
            req = parse_v0_request(body, caps, ctx.object_format.encode(), ctx.hash_len * 2)
            if req.wants:
                _consume(ctx, req)
            return
        if mode > 1:
            body = _v2((b"fetch", b"ls-refs", b"object-info")[mode - 2], body)
        command = C.read_command(ctx, body)
        if isinstance(command, C.FetchCommand):
            _consume(ctx, command.req)
    except ClientError:
        pass  # the client's fault: a 4xx or an ERR line, as it should be
    finally:
        ctx.close()


def one_input(data: bytes) -> None:
    if len(data) < 2:
        return
    handle(data[0] % 5, REPOS[(data[0] >> 4) & 1], data[1:])


def seeds() -> list[bytes]:
    """A few requests as git sends them, to start from (written to an empty corpus)."""
    want = f"want {OIDS[0]} multi_ack_detailed side-band-64k thin-pack ofs-delta include-tag"
    v0 = [_pkt(want.encode() + b"\n") + b"0000" + _pkt(b"done\n"),
          _pkt(want.encode() + b" shallow\n") + _pkt(b"deepen 2\n") + b"0000",
          _pkt(want.encode() + b" filter\n") + _pkt(b"filter blob:none\n") + b"0000"
          + _pkt(f"have {OIDS[1]}\n".encode()) + _pkt(b"done\n")]
    fetch = ["want $0\nofs-delta\ndone", "want $0\nhave $1\nthin-pack\nno-progress",
             "want $2\nwant $3\ninclude-tag\ndeepen 1\ndone",
             "want $0\nshallow $1\ndeepen-relative\ndeepen 1\ndone",
             "want-ref refs/heads/main\ndone", "want $0\nfilter blob:limit=10\ndone",
             "want $0\ndeepen-since 1600000000\ndeepen-not refs/tags/v1\ndone",
             "want $7\nsideband-all\nwait-for-done\nhave $4\ndone"]
    out = [b"\x00" + body for body in v0]
    out += [b"\x02" + f.encode() for f in fetch] + [b"\x12" + f.encode() for f in fetch]
    out += [b"\x03peel\nsymrefs\nunborn\nref-prefix refs/heads/", b"\x04size\noid $4\noid $7"]
    out.append(b"\x01" + _v2(b"fetch", b"want $0\ndone"))
    return out


def _code_lines(path: str) -> set[int]:
    """Line numbers of ``path`` inside functions (module and class bodies ran at import,
    before the replay was traced), from its compiled code objects."""
    import inspect

    with open(path, "rb") as fh:
        stack = [compile(fh.read(), path, "exec")]
    lines: set[int] = set()
    while stack:
        code = stack.pop()
        if code.co_flags & inspect.CO_OPTIMIZED:
            lines.update(line for _, _, line in code.co_lines() if line is not None)
            lines.discard(code.co_firstlineno)  # the def line (and decorators) ran at import
        stack.extend(c for c in code.co_consts if isinstance(c, type(code)))
    return lines


def report_coverage(dirs: list[str]) -> None:
    """Replay a corpus and print the line coverage of each module of gitspout it reached
    (``--coverage DIR...``; stdlib tracing, no coverage.py needed)."""
    import threading

    top = os.path.dirname(os.path.dirname(os.path.dirname(C.__file__)))  # .../gitspout
    hit: dict[str, set[int]] = {}

    def tracer(frame, event, _arg):  # type: ignore[no-untyped-def]
        path = frame.f_code.co_filename
        if not path.startswith(top):
            return None
        lines = hit.setdefault(path, set())

        def local(frame, event, _arg):  # type: ignore[no-untyped-def]
            if event == "line":
                lines.add(frame.f_lineno)
            return local
        return local

    threading.settrace(tracer)
    sys.settrace(tracer)
    n = 0
    for d in dirs:
        for name in sorted(os.listdir(d)):
            with open(os.path.join(d, name), "rb") as fh:
                one_input(fh.read())
            n += 1
    sys.settrace(None)
    total_hit = total = 0
    print(f"{n} inputs replayed")
    for path in sorted(hit):
        code = _code_lines(path)
        got = len(hit[path] & code)
        total_hit, total = total_hit + got, total + len(code)
        print(f"{os.path.relpath(path, top):45s} {got:5d}/{len(code):5d} {100 * got / len(code):5.1f}%")
    print(f"{'modules reached, together':45s} {total_hit:5d}/{total:5d} {100 * total_hit / total:5.1f}%")


def main() -> None:
    if sys.argv[1:2] == ["--coverage"]:
        report_coverage(sys.argv[2:])
        return
    dirs = [a for a in sys.argv[1:] if not a.startswith("-")]
    if dirs and os.path.isdir(dirs[0]) and not os.listdir(dirs[0]):
        for i, seed in enumerate(seeds()):
            with open(os.path.join(dirs[0], f"seed-{i:02d}"), "wb") as fh:
                fh.write(seed)
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
