"""gitspout serving repositories that live on a latencyfs mount (simulated NFS).

The fixture repositories (tests/repos_fixture.py) are built on local disk and
mounted through latencyfs with a small delay per metadata request; gitspout's
``--root`` is the mount point, so every file it touches goes through FUSE.
Results are compared with C git reading the same repositories over
``file://`` from the local directory underneath the mount.

The last test pins FUSE request budgets: how many requests a repeated,
unchanged request costs once the server is warm.  They are the measured values
of the current server, so any change that adds filesystem round trips on
these paths fails here (and a change that removes some should lower them).
"""

from __future__ import annotations

import http.client
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from gitspout.server.store.fscache import RACY_NS
from gitutil import Committer, Git, LiveServer, RepoState, backdate, fsck, poll, repo_state, start_server
from latencyfs import op_total
from mount import LatencyMount
from repos_fixture import build_fixture_root

DELAY_MS = 0.2
VERSIONS = ("0", "2")

#: FUSE requests per request of a warm server on an unchanged repository
#: (attr/entry timeouts 0, i.e. NFS ``noac``): (metadata requests, all requests).
#: Measured on the current server; see the module docstring.
# Each includes a stat of config (5 FUSE requests under noac: an edit in place, of
# hideRefs say, is seen at once, as C git, which reads the file every time); the v0 and
# ls-refs ones a stat of packed-refs too (5 more: a rewrite in place, as C git's
# stat_validity_check). Without them: 25, 3 and 25 (the fetch has both: 39).
BUDGETS = {
    "info/refs v0": (35, 35),
    "info/refs v2": (8, 8),
    "ls-refs v2": (35, 35),
    # A clone asked again (an identical fetch, answered as it was): 58 while each fetch
    # took the real path of objects/ (an lstat of every component) for its alternates.
    "fetch v2": (49, 49),
}
REPEATS = 10


@dataclass
class NfsServed:
    src: Path              # the mounted directory (local disk): file:// ground truth
    mount: LatencyMount
    server: LiveServer     # gitspout with --root = mount.path

    def http(self, repo: str) -> str:
        return f"{self.server.url}/{repo}"

    def file(self, repo: str) -> str:
        return f"file://{self.src / repo}"


@pytest.fixture(scope="module")
def nfs(fuse_reason: str | None, tmp_path_factory: pytest.TempPathFactory,
        git: Git) -> Iterator[NfsServed]:
    if fuse_reason is not None:
        pytest.skip(f"latencyfs unavailable: {fuse_reason}")
    src = tmp_path_factory.mktemp("nfs-served")
    build_fixture_root(git, src, tmp_path_factory.mktemp("nfs-build"))
    mount = LatencyMount(src, delay_ms=DELAY_MS).start()
    try:
        # No periodic sweep (one lstat per idle open file, every 10 s by default): the
        # budgets below count what a request costs, and a sweep landing inside a measured
        # window added its stats to them (--sweep-interval 0.3 fails them every time).
        # The sweep has its own tests (test_release.py).
        server = start_server(mount.path, ["--sweep-interval", "0"])
        try:
            yield NfsServed(src, mount, server)
        finally:
            server.stop()
    finally:
        mount.stop()


# --------------------------------------------------------------------------
# helpers


def assert_same(git: Git, ours: Path, theirs: Path) -> RepoState:
    """Same refs, HEAD, shallow boundary and object set; ours is fsck-clean."""
    a, b = repo_state(git, ours), repo_state(git, theirs)
    assert a.refs == b.refs
    assert a.head == b.head
    assert a.shallow == b.shallow
    assert a.objects == b.objects, (f"{len(b.objects - a.objects)} missing, "
                                    f"{len(a.objects - b.objects)} extra over http")
    fsck(git, ours)
    return a


def clone_both(git: Git, nfs: NfsServed, repo: str, dest: Path, version: str,
               *args: str) -> tuple[Path, Path]:
    ours, theirs = dest / f"http-v{version}", dest / f"file-v{version}"
    base = ["-c", f"protocol.version={version}", "clone", "-q", *args]
    git.run(*base, nfs.http(repo), str(ours))
    git.run(*base, nfs.file(repo), str(theirs))
    return ours, theirs


def get(port: int, method: str, path: str, headers: dict[str, str],
        body: bytes | None = None) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        assert resp.status == 200, (resp.status, data[:200])
        return data
    finally:
        conn.close()


def pkt(line: str) -> bytes:
    return b"%04x" % (len(line) + 4) + line.encode()


LS_REFS = (pkt("command=ls-refs\n") + pkt("object-format=sha1\n") + b"0001" + pkt("peel\n")
           + pkt("symrefs\n") + pkt("ref-prefix HEAD\n") + pkt("ref-prefix refs/heads/\n")
           + pkt("ref-prefix refs/tags/\n") + b"0000")


def fetch_body(nfs: NfsServed, repo: str) -> bytes:
    """A v2 clone of ``repo``'s HEAD, no progress (its answer is the same bytes each time)."""
    tip = subprocess.run(["git", "--git-dir", str(nfs.src / repo), "rev-parse", "HEAD"],
                         check=True, capture_output=True, text=True).stdout.strip()
    return (pkt("command=fetch\n") + pkt("object-format=sha1\n") + b"0001"
            + pkt("ofs-delta\n") + pkt("no-progress\n") + pkt(f"want {tip}\n")
            + pkt("done\n") + b"0000")


def request(nfs: NfsServed, kind: str, repo: str) -> bytes:
    info = f"/{repo}/info/refs?service=git-upload-pack"
    if kind == "info/refs v0":
        return get(nfs.server.port, "GET", info, {})
    if kind == "info/refs v2":
        return get(nfs.server.port, "GET", info, {"Git-Protocol": "version=2"})
    return get(nfs.server.port, "POST", f"/{repo}/git-upload-pack",
               {"Git-Protocol": "version=2",
                "Content-Type": "application/x-git-upload-pack-request"},
               fetch_body(nfs, repo) if kind == "fetch v2" else LS_REFS)


# --------------------------------------------------------------------------
# correctness through the mount


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("repo", ["basic.git", "plain.git", "multipack.git", "team/app"])
def test_clone_matches_file(git: Git, nfs: NfsServed, tmp_path: Path, repo: str,
                            version: str) -> None:
    ours, theirs = clone_both(git, nfs, repo, tmp_path, version)
    assert_same(git, ours, theirs)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("args", [("--depth", "1"), ("--filter=blob:none", "--no-checkout")],
                         ids=["shallow", "blobless"])
def test_shallow_and_partial_clone(git: Git, nfs: NfsServed, tmp_path: Path, version: str,
                                   args: tuple[str, ...]) -> None:
    ours, theirs = clone_both(git, nfs, "basic.git", tmp_path, version, *args)
    a, b = repo_state(git, ours), repo_state(git, theirs)
    assert (a.refs, a.head, a.shallow, a.objects) == (b.refs, b.head, b.shallow, b.objects)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("repo", ["basic.git", "hidden.git", "multipack.git", "manyrefs.git"])
def test_ls_remote_matches_file(git: Git, nfs: NfsServed, repo: str, version: str) -> None:
    args = ["-c", f"protocol.version={version}", "ls-remote"]
    ours = git.out(*args, nfs.http(repo))
    assert ours == git.out(*args, nfs.file(repo))
    assert ours.count("\n") > (100_000 if repo == "manyrefs.git" else 3)


@pytest.fixture
def mutable_repo(nfs: NfsServed) -> Iterator[str]:
    """A private copy of basic.git on the mount."""
    name = f"mut-{uuid.uuid4().hex[:8]}.git"
    shutil.copytree(nfs.src / "basic.git", nfs.src / name)
    yield name
    shutil.rmtree(nfs.src / name, ignore_errors=True)


def _push(git: Git, repo: Path, work: Path, n: int, start: int, ref: str = "main") -> None:
    """Commit *n* times in *work* (cloned from *repo* on first use) and push to *repo*."""
    if not work.exists():
        git.run("clone", "-q", str(repo), str(work))
    c = Committer(git, work, start=start)
    for i in range(n):
        c.commit({f"new/file{i}.txt": f"new {start} {i}\n" * 40,
                  "README.md": f"# fixture\n\nupdated {start} {i}\n"}, f"new {i}")
    git.run("push", "-q", "origin", f"HEAD:refs/heads/{ref}", cwd=work)


@pytest.mark.parametrize("version", VERSIONS)
def test_fetch_after_push_gc_and_pack_refs_on_the_mount(
        git: Git, nfs: NfsServed, tmp_path: Path, mutable_repo: str, version: str) -> None:
    """Writers work through the mount too (as another NFS client would): pushes,
    ``gc --prune=now`` (packs replaced) and ``pack-refs --all`` between fetches."""
    on_mount = nfs.mount.path / mutable_repo
    ours, theirs = clone_both(git, nfs, mutable_repo, tmp_path, version)
    fetch = ["-c", f"protocol.version={version}", "fetch", "-q", "--prune", "origin"]
    work = tmp_path / "work"
    steps = [
        lambda: _push(git, on_mount, work, 3, 1_700_000_000),
        lambda: git.run("gc", "-q", "--prune=now", cwd=on_mount),
        lambda: _push(git, on_mount, work, 2, 1_710_000_000, ref="topic"),
        lambda: git.run("pack-refs", "--all", cwd=on_mount),
        lambda: _push(git, on_mount, work, 1, 1_720_000_000),
        lambda: git.run("repack", "-adq", cwd=on_mount),
    ]
    for step in steps:
        step()
        for clone in (ours, theirs):
            git.run(*fetch, cwd=clone)
        assert_same(git, ours, theirs)
    head = git.out("rev-parse", "origin/main", cwd=ours).strip()
    assert head == git.out("rev-parse", "main", cwd=nfs.src / mutable_repo).strip()


# --------------------------------------------------------------------------
# budgets


def test_repeated_unchanged_requests_fuse_budget(nfs: NfsServed,
                                                 record_property: Callable[[str, object], None],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A warm server answering the same request for an unchanged small repository
    stays within a fixed number of FUSE requests (metadata and all kinds)."""
    # An unchanged repository: nothing modified within the last hour.  (Listings
    # of directories changed within the last seconds are not trusted by the
    # server's caches, as git does for racily clean index entries.)
    backdate(nfs.src, time.time() - 3600)
    # Setting an mtime back makes the ctime now: the config stays racy (read by every
    # request, store/repos.py) until its ctime is RACY_NS old, as an untouched one is.
    changed = (nfs.src / "basic.git" / "config").stat().st_ctime_ns
    poll(lambda: time.time_ns() - changed > RACY_NS + 100_000_000, timeout=30,
         what="the backdated config's ctime older than RACY_NS")
    measured: dict[str, tuple[float, float]] = {}
    kinds: dict[str, str] = {}
    for kind in BUDGETS:
        first = request(nfs, kind, "basic.git")
        request(nfs, kind, "basic.git")                      # warm
        nfs.mount.reset()
        for _ in range(REPEATS):
            assert request(nfs, kind, "basic.git") == first
        stats = nfs.mount.stats()
        measured[kind] = (stats["_delayed"] / REPEATS, op_total(stats) / REPEATS)
        kinds[kind] = " ".join(f"{k}:{v / REPEATS:g}" for k, v in sorted(stats.items())
                               if v and not k.startswith("_"))
    with capsys.disabled():
        print("\nFUSE requests per repeated request of basic.git (noac, warm): "
              + ", ".join(f"{k}: {m:g} metadata / {a:g} all (budget {BUDGETS[k][0]}/"
                          f"{BUDGETS[k][1]}; {kinds[k]})" for k, (m, a) in measured.items()))
    for kind, (meta, total) in measured.items():
        record_property(f"fuse_{kind}", f"{meta} {total}")
        assert meta <= BUDGETS[kind][0], f"{kind}: {meta} metadata requests per request"
        assert total <= BUDGETS[kind][1], f"{kind}: {total} FUSE requests per request"
