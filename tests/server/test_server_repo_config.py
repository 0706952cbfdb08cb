"""The repository's config as C git reads it: hideRefs must hold however the file is
written (store/gitconfig.py, docs/ARCHITECTURE.md "Repository config").

Each case writes a config, then compares what gitspout advertises with what C git's own
upload-pack advertises over file:// for the same repository, and checks that the hidden
commit cannot be fetched by id. The parser itself is compared with ``git config --list``
on valid and broken files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitspout.server.app.config import load_config
from gitspout.server.app.metrics import RequestRecord
from gitspout.server.app.state import ServerState
from gitspout.server.core.answers import advertisement_chunks
from gitspout.server.core.context import RequestContext
from gitspout.server.store.fscache import RACY_NS
from gitutil import Git, LiveServer, backdate, git_env, poll, start_server
from rawhttp import FLUSH, pkt_lines, post_upload_pack

BASE = "[core]\n\trepositoryformatversion = 0\n\tbare = true\n"


@pytest.fixture(scope="module")
def cfg_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    root = tmp_path_factory.mktemp("cfgroot")
    work = tmp_path_factory.mktemp("cfgwork") / "w"
    git.run("init", "-q", "-b", "main", str(work))
    (work / "f.txt").write_text("visible\n")
    git.run("add", "f.txt", cwd=work)
    git.run("commit", "-qm", "visible", cwd=work)
    git.run("checkout", "-qb", "secret", cwd=work)
    (work / "f.txt").write_text("TOP SECRET\n")
    git.run("commit", "-qam", "secret", cwd=work)
    repo = root / "r.git"
    git.run("clone", "-q", "--bare", str(work), str(repo))
    git.run("update-ref", "refs/hidden/secret", "refs/heads/secret", cwd=repo)
    git.run("update-ref", "-d", "refs/heads/secret", cwd=repo)
    git.run("symbolic-ref", "HEAD", "refs/heads/main", cwd=repo)
    return root


@pytest.fixture(scope="module")
def cfg_server(cfg_root: Path) -> Iterator[LiveServer]:
    srv = start_server(cfg_root)
    yield srv
    srv.stop()


def _ours(git: Git, server: LiveServer) -> list[str]:
    out = git.out("-c", "protocol.version=2", "ls-remote", f"{server.url}/r.git")
    return sorted(line.split("\t")[1] for line in out.splitlines())


def _theirs(git: Git, repo: Path) -> list[str]:
    out = git.out("-c", "protocol.version=2", "ls-remote", f"file://{repo}")
    return sorted(line.split("\t")[1] for line in out.splitlines())


def _secret_served(git: Git, server: LiveServer, repo: Path) -> bool:
    secret = git.out("rev-parse", "refs/hidden/secret", cwd=repo).strip()
    body = pkt_lines(f"want {secret} side-band-64k ofs-delta no-progress") + FLUSH \
        + pkt_lines("done")
    resp = post_upload_pack(server.port, body, repo="r.git")
    return resp.status == 200 and b"not our ref" not in resp.body and b"PACK" in resp.body


@pytest.mark.parametrize("config", [
    "[uploadPack]\n\thideRefs = refs/hidden\n",                      # git config's own case
    "[Transfer]\n\tHIDEREFS = refs/hidden\n",
    # last match wins in file order, across reopened sections
    "[transfer]\n\thideRefs = refs/hidden\n[uploadpack]\n\thideRefs = !refs/hidden\n"
    "[transfer]\n\thideRefs = refs/hidden/secret\n",
    "[include]\n\tpath = hide.inc\n",                                  # relative to config
    '[includeIf "gitdir:r.git"]\n\tpath = hide.inc\n',
])
def test_hidden_as_c_git_hides(git: Git, cfg_server: LiveServer, cfg_root: Path,
                               config: str) -> None:
    repo = cfg_root / "r.git"
    (repo / "hide.inc").write_text("[uploadpack]\n\thideRefs = refs/hidden\n")
    (repo / "config").write_text(BASE + config)
    assert "refs/hidden/secret" not in _theirs(git, repo)  # the case is one that hides
    assert _ours(git, cfg_server) == _theirs(git, repo)
    assert not _secret_served(git, cfg_server, repo)


def test_an_edit_in_place_is_seen_at_once(git: Git, cfg_server: LiveServer,
                                           cfg_root: Path) -> None:
    """Appended with ``>>`` (same inode, same directory listing): the next request
    hides the ref, as C git does."""
    repo = cfg_root / "r.git"
    (repo / "config").write_text(BASE)
    assert "refs/hidden/secret" in _ours(git, cfg_server)
    with open(repo / "config", "a") as fh:
        fh.write("[uploadpack]\n\thideRefs = refs/hidden\n")
    assert _ours(git, cfg_server) == _theirs(git, repo) == ["HEAD", "refs/heads/main"]
    assert not _secret_served(git, cfg_server, repo)


def test_a_malformed_config_is_refused_not_served(git: Git, cfg_server: LiveServer,
                                                  cfg_root: Path) -> None:
    """C git dies on a bad line (``fatal: bad config line``); serving the repository
    without the file's settings would drop its hideRefs."""
    repo = cfg_root / "r.git"
    (repo / "config").write_text(BASE + "[uploadpack]\n\thideRefs = refs/hidden\n[broken\n")
    c_git = subprocess.run(["git", "ls-remote", f"file://{repo}"], capture_output=True,
                           env=git_env(git.home), timeout=60)
    assert c_git.returncode != 0 and b"bad config line" in c_git.stderr
    resp = post_upload_pack(cfg_server.port, pkt_lines("command=ls-refs") + FLUSH,
                            repo="r.git", version=2)
    assert resp.status == 500 and b"hidden" not in resp.body
    (repo / "config").write_text(BASE)  # and it is served again once fixed
    assert "refs/hidden/secret" in _ours(git, cfg_server)


VALUES = [
    # (config lines, whether C git reads them): numbers as C git reads them
    ("[uploadpack]\n\tallowFilter = 2k\n", True),
    ("[uploadpack]\n\tallowFilter = 0k\n", True),
    ("[uploadpack]\n\tallowFilter = 0x10\n", True),
    ("[uploadpack]\n\tallowFilter = -3\n", True),
    ("[uploadpack]\n\tallowFilter = 10000000000000000000000\n", False),
    ("[uploadpack]\n\tallowFilter = 3000000000\n", False),
    ("[uploadpack]\n\tallowFilter = 2t\n", False),
    ('[uploadpackfilter "tree"]\n\tmaxDepth = 5k\n', True),
    ('[uploadpackfilter "tree"]\n\tmaxDepth = abc\n', False),
    ('[uploadpackfilter "tree"]\n\tmaxDepth = -1\n', False),
    ("[lsrefs]\n\tunborn = ignore\n", True),
    ("[lsrefs]\n\tunborn = bogus\n", False),
    ("[lsrefs]\n\tunborn = Advertise\n", False),  # compared case and all
    ("[lsrefs]\n\tunborn = bogus\n\tunborn = ignore\n", True),  # the last one counts
    ("[lsrefs]\n\tunborn\n", False),
]


@pytest.mark.parametrize(("lines", "good"), VALUES)
def test_values_read_as_c_git_reads_them(git: Git, cfg_server: LiveServer, cfg_root: Path,
                                         lines: str, good: bool) -> None:
    """A value C git reads is served; one it dies on answers 500 (a bad config). Before,
    ``allowFilter = 2k`` (true to C git) answered 500, while a boolean out of range, a
    bad ``maxDepth`` and a bad ``lsrefs.unborn`` were served as if they were not there."""
    repo = cfg_root / "r.git"
    (repo / "config").write_text(BASE + lines)
    # C git reads uploadpackfilter.* for a fetch only (ls-refs does not): a clone then.
    tmp = cfg_root.parent / "values-clone"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        c_git = subprocess.run(["git", "-c", "protocol.version=2", "clone", "-q", "--bare",
                                "--no-local", f"file://{repo}", str(tmp)], capture_output=True,
                               env=git_env(git.home), timeout=60)
        assert (c_git.returncode == 0) == good, c_git.stderr
        resp = post_upload_pack(cfg_server.port, pkt_lines("command=ls-refs") + FLUSH,
                                repo="r.git", version=2)
        assert resp.status == (200 if good else 500), resp.body[:200]
    finally:
        (repo / "config").write_text(BASE)
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_packed_refs_rewritten_in_place_is_seen(git: Git, cfg_server: LiveServer,
                                                  cfg_root: Path) -> None:
    """A writer other than git may rewrite packed-refs in place (same inode, same size):
    a ref moved back, so that its old commit is reachable only from a hidden ref, no
    longer offers that commit."""
    repo = cfg_root / "r.git"
    (repo / "config").write_text(BASE + "[uploadpack]\n\thideRefs = refs/hidden\n")
    secret = git.out("rev-parse", "refs/hidden/secret", cwd=repo).strip()
    main = git.out("rev-parse", "main", cwd=repo).strip()
    git.run("update-ref", "refs/heads/main", secret, cwd=repo)
    git.run("pack-refs", "--all", cwd=repo)
    assert _secret_served(git, cfg_server, repo)  # main reaches it now
    old = time.time() - 3600  # listings of directories changed just now are not trusted
    for path in (repo, repo / "packed-refs", repo / "refs", repo / "refs" / "heads"):
        os.utime(path, (old, old))
    assert _ours(git, cfg_server) == _theirs(git, repo)  # kept by the server
    (repo / "packed-refs").write_text((repo / "packed-refs").read_text()
                                      .replace(f"{secret} refs/heads/main", f"{main} refs/heads/main"))
    assert _ours(git, cfg_server) == _theirs(git, repo)
    assert not _secret_served(git, cfg_server, repo)
    git.run("update-ref", "refs/heads/main", main, cwd=repo)


# ---------------------------------------------------------------- the parser against git

VALID = [
    BASE,
    "[Section]\n  Key = value with  two  spaces   \n",
    '[a "Sub Section"]\n\tk = "quoted  # not a comment" ; a comment\n',
    "[a]\nk = one \\\n  continued\nbare\n[a.Deprecated]\nk = x\n",
    '[a]\n\tk = tab\\there \\"q\\" back\\\\slash\n',
    "[a] k = on the header line\n# comment\n; comment\n",
    "[a]\r\n\tk = crlf\r\n",
    '[a "x\\"y"]\nk = v\n',
    "k = before any section\n",
]
BROKEN = [
    "[broken\nk = v\n",
    "[a]\nmy_key = 1\n",
    '[a]\nk = "unterminated\n',
    "[core ]\nk = v\n",
    "[a]\nk = bad \\q escape\n",
    "[a]\nbare # comment\n",
]


def _git_list(git: Git, path: Path) -> list[tuple[str, str | None]] | None:
    done = subprocess.run(["git", "config", "--file", str(path), "--list", "-z"],
                          capture_output=True, env=git_env(git.home), timeout=60)
    if done.returncode != 0:
        return None
    out: list[tuple[str, str | None]] = []
    for item in done.stdout.decode().split("\0")[:-1]:
        key, nl, value = item.partition("\n")
        out.append((key, value if nl else None))
    return out


def _ours_list(text: str) -> list[tuple[str, str | None]] | None:
    from gitspout.server.store.gitconfig import ConfigFileError, parse_config

    try:
        entries = parse_config(text)
    except ConfigFileError:
        return None
    return [(".".join(p for p in (e.section, e.subsection, e.key) if p), e.value)
            for e in entries]


@pytest.mark.parametrize("text", VALID + BROKEN)
def test_parser_reads_what_git_config_reads(git: Git, tmp_path: Path, text: str) -> None:
    path = tmp_path / "config"
    path.write_text(text)
    expected = _git_list(git, path)
    assert (expected is None) == (text in BROKEN)
    assert _ours_list(text) == expected


def test_include_outside_the_root_is_refused(git: Git, cfg_root: Path,
                                             tmp_path: Path) -> None:
    """An include is read like a symlink: leading outside the root, the repository is
    refused (404), unless --allow-symlinks-outside-root."""
    root = tmp_path / "root"
    shutil.copytree(cfg_root / "r.git", root / "r.git", symlinks=True)
    outside = tmp_path / "outside.inc"
    outside.write_text("[uploadpack]\n\thideRefs = refs/hidden\n")
    (root / "r.git" / "config").write_text(BASE + f"[include]\n\tpath = {outside}\n")
    srv = start_server(root)
    try:
        resp = post_upload_pack(srv.port, pkt_lines("command=ls-refs") + FLUSH,
                                repo="r.git", version=2)
        assert resp.status == 404
    finally:
        srv.stop()
    srv = start_server(root, ["--allow-symlinks-outside-root"])
    try:
        assert _ours(git, srv) == _theirs(git, root / "r.git") == ["HEAD", "refs/heads/main"]
    finally:
        srv.stop()


def _view(state: ServerState) -> RequestContext:
    return state.view(state.scope(RequestRecord()), state.resolver.resolve("r.git"))


def test_a_kept_advertisement_names_the_config_it_was_made_with(
        cfg_root: Path, tmp_path: Path) -> None:
    """A request that read the config before an edit in place, and made its answer after
    another request read the new one, keeps it under its own config: the next request
    does not get refs/hidden/secret from it (v0's advertisement, and ls-refs, are kept
    across requests, core/answers.py). The config of the answer used to be whichever the
    repository read last (a race with --threads-per-repo 0 or above 1)."""
    root = tmp_path / "root"
    shutil.copytree(cfg_root / "r.git", root / "r.git", symlinks=True)
    repo = root / "r.git"
    (repo / "config").write_text(BASE)
    backdate(root, time.time() - 3600)
    state = ServerState.create(load_config({"root": str(root)}, env={}))
    first = _view(state)
    assert not first.config.hide_refs  # this request reads the config before the edit
    with open(repo / "config", "a") as fh:
        fh.write("[uploadpack]\n\thideRefs = refs/hidden\n")
    backdate(repo / "config", time.time() - 3600)
    second = _view(state)
    assert second.config.hide_refs  # another reads it after
    try:
        made = b"".join(advertisement_chunks(first, 0))
        assert b"refs/hidden/secret" in made  # the first request's own answer, as C git's
        for version in (0, 1):  # (the one read before the edit would send)
            third = _view(state)
            try:
                assert b"refs/hidden/secret" not in b"".join(advertisement_chunks(third, version))
                assert third.config.identity == second.config.identity != first.config.identity
            finally:
                third.close()
    finally:
        first.close()
        second.close()


def test_a_config_changed_lately_is_read_again_whatever_its_stat(
        cfg_root: Path, tmp_path: Path) -> None:
    """A config changed less than RACY_NS ago (mtime or ctime) may change again within the
    same tick of the file system's clock (on NFS a second), the same size: a stat would
    not show it, so the next request reads it again. One older than that is not read
    again."""
    root = tmp_path / "root"
    shutil.copytree(cfg_root / "r.git", root / "r.git", symlinks=True)
    backdate(root, time.time() - 3600)
    config = root / "r.git" / "config"
    state = ServerState.create(load_config({"root": str(root)}, env={}))

    def reads() -> int:
        ctx = _view(state)
        try:
            before = ctx.fs.counts["open"]
            _ = ctx.config
            return ctx.fs.counts["open"] - before
        finally:
            ctx.close()

    config.write_text(BASE)
    when = time.time() + 3600  # racy for an hour (a clock ahead, as an NFS server's may be)
    os.utime(config, (when, when))
    assert [reads() for _ in range(3)] == [1, 1, 1]
    # An mtime set back an hour: its ctime is now, and racy for RACY_NS (2 s). Read by
    # every request until then, and by none after.
    backdate(config, time.time() - 3600)
    changed = config.stat().st_ctime_ns
    assert reads() == 1  # its stat changed
    again = reads()  # its stat unchanged, its ctime recent: read again while it is
    assert again == 1 or time.time_ns() - changed > RACY_NS - 500_000_000, again
    poll(lambda: reads() == 0, timeout=30, what="the config trusted once its ctime is old")
    assert [reads() for _ in range(3)] == [0, 0, 0]
