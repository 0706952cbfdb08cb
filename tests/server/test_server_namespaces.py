"""A namespace of a repository served at a URL: C git's GIT_NAMESPACE under a web server.

gitspout served the whole ref space at such URLs (git's t5551.25, t5559.25, t5702.69).
Each answer is compared with C git's upload-pack run with ``GIT_NAMESPACE`` on the same
repository: the refs (stripped of ``refs/namespaces/<ns>/``), HEAD and its symref, hidden
refs; the real client's clone equals the clone over file:// through the same namespace;
an object reachable only from outside the namespace is refused, in v0 and v2.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitspout.server.app.config import ConfigError, load_config
from gitutil import Committer, Git, LiveServer, fsck, start_server
from packutil import InBandError, pack_bytes
from rawhttp import DELIM, FLUSH, get_info_refs, parse_pkts, pkt_lines, post_upload_pack

MAP = "ns-repo.git=repo.git#ns,deep/=#a/b"


@pytest.fixture(scope="module")
def ns_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    root = tmp_path_factory.mktemp("nsroot")
    work = tmp_path_factory.mktemp("nswork") / "w"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work, start=1_690_000_000)
    c.commit({"a.txt": "one\n"}, "one")
    c.commit({"a.txt": "namespaced\n"}, "namespaced")
    git.run("tag", "-a", "-m", "ns tag", "v1", cwd=work)
    c.commit({"a.txt": "outside\n"}, "outside")
    c.commit({"b.txt": "secret\n"}, "secret")
    repo = root / "repo.git"
    git.run("clone", "-q", "--bare", str(work), str(repo))
    ns = "refs/namespaces/ns/"
    for ref, rev in ((f"{ns}refs/heads/main", "main~2"), (f"{ns}refs/tags/v1", "v1"),
                     (f"{ns}refs/heads/hidden", "main"), ("refs/heads/main", "main~1")):
        git.run("update-ref", ref, rev, cwd=repo)
    git.run("update-ref", "-d", "refs/tags/v1", cwd=repo)
    git.run("symbolic-ref", f"{ns}HEAD", f"{ns}refs/heads/main", cwd=repo)
    git.run("config", "uploadpack.hideRefs", "refs/heads/hidden", cwd=repo)
    # A tag outside the namespace, of a commit the namespace shows.
    git.run("tag", "-a", "-m", "secret tag message", "secret", f"{ns}refs/heads/main", cwd=repo)
    # A nested namespace a/b under a prefix URL.
    git.run("clone", "-q", "--bare", str(work), str(root / "other.git"))
    git.run("update-ref", "refs/namespaces/a/refs/namespaces/b/refs/heads/main", "main~3",
            cwd=root / "other.git")
    return root


@pytest.fixture(scope="module")
def ns_server(ns_root: Path) -> Iterator[LiveServer]:
    srv = start_server(ns_root, ["--namespaces", MAP])
    yield srv
    srv.stop()


def _c_git(git: Git, repo: Path, ns: str, body: bytes | None, version: int) -> bytes:
    args = ["upload-pack", "--stateless-rpc"] + (["--advertise-refs"] if body is None else [])
    env = {"GIT_NAMESPACE": ns}
    if version == 2:
        env["GIT_PROTOCOL"] = "version=2"
    return git.run(*args, str(repo), input=body, env=env, check=False).stdout


def _refs_and_symrefs(body: bytes) -> tuple[list[bytes], list[bytes]]:
    lines = [p for p in parse_pkts(body) if p is not None and not p.startswith(b"# service")]
    refs, symrefs = [], []
    for line in lines:
        line, _, caps = line.partition(b"\0")
        symrefs += [c for c in caps.split() if c.startswith(b"symref=")]
        refs.append(line.rstrip(b"\n"))
    return refs, symrefs


@pytest.mark.parametrize(("url", "repo", "ns"), [("ns-repo.git", "repo.git", "ns"),
                                                 ("deep/other.git", "other.git", "a/b")])
def test_advertisement_and_ls_refs_equal_c_git(git: Git, ns_server: LiveServer, ns_root: Path,
                                               url: str, repo: str, ns: str) -> None:
    resp = get_info_refs(ns_server.port, repo=url, version=0)
    assert resp.status == 200
    assert _refs_and_symrefs(resp.body) == _refs_and_symrefs(_c_git(git, ns_root / repo, ns, None, 0))
    for args in ([], ["symrefs", "peel"], ["symrefs", "ref-prefix refs/heads/"]):
        body = pkt_lines("command=ls-refs", "object-format=sha1") + DELIM + pkt_lines(*args) + FLUSH
        ours = post_upload_pack(ns_server.port, body, repo=url, version=2)
        assert ours.status == 200
        assert ours.body == _c_git(git, ns_root / repo, ns, body, 2), args


def test_clone_through_a_namespace_equals_file(git: Git, ns_server: LiveServer, ns_root: Path,
                                               tmp_path: Path) -> None:
    states = []
    for name, url, extra in (
            ("http", f"{ns_server.url}/ns-repo.git", []),
            ("file", f"file://{ns_root / 'repo.git'}", ["--upload-pack",
                                                         "GIT_NAMESPACE=ns git-upload-pack"])):
        dest = tmp_path / name
        git.run("clone", "-q", "--mirror", *extra, url, str(dest))
        fsck(git, dest)
        states.append((git.out("for-each-ref", cwd=dest), git.out("symbolic-ref", "HEAD", cwd=dest),
                       git.out("log", "-1", "--format=%s", "main", cwd=dest)))
    assert states[0] == states[1]
    assert states[0][2].strip() == "namespaced"


def _two_wants(first: str, second: str, version: int) -> bytes:
    """A fetch body wanting ``first`` and ``second``, in v0 or v2."""
    if version == 2:
        return (pkt_lines("command=fetch", "object-format=sha1") + DELIM
                + pkt_lines(f"want {first}", f"want {second}", "done") + FLUSH)
    return pkt_lines(f"want {first} side-band-64k", f"want {second}") + FLUSH + pkt_lines("done")


@pytest.mark.parametrize("version", [0, 2])
def test_objects_outside_the_namespace_are_refused(git: Git, ns_server: LiveServer,
                                                   ns_root: Path, version: int) -> None:
    repo = ns_root / "repo.git"
    inside = git.out("rev-parse", "refs/namespaces/ns/refs/heads/main", cwd=repo).strip()
    for outside in ("main", "refs/namespaces/ns/refs/heads/hidden"):
        oid = git.out("rev-parse", outside, cwd=repo).strip()
        body = _two_wants(inside, oid, version)
        resp = post_upload_pack(ns_server.port, body, repo="ns-repo.git", version=version)
        with pytest.raises(InBandError, match="not our ref"):
            pack_bytes(resp.body)
        if version == 0:  # C git's v0 refuses it too (its v2 checks nothing)
            assert b"not our ref" in _c_git(git, repo, "ns", body, 0)


@pytest.mark.parametrize("version", [0, 2])
def test_a_tag_outside_the_namespace_is_refused(git: Git, ns_server: LiveServer,
                                                ns_root: Path, version: int) -> None:
    """A tag object that only a ref outside the namespace holds is not an orphan tag (one
    no ref holds any more, served when its commit is visible): the namespace's URL
    refuses it, although the commit it points to is the namespace's own."""
    repo = ns_root / "repo.git"
    inside = git.out("rev-parse", "refs/namespaces/ns/refs/heads/main", cwd=repo).strip()
    tag = git.out("rev-parse", "refs/tags/secret", cwd=repo).strip()
    assert git.out("rev-parse", "refs/tags/secret^{commit}", cwd=repo).strip() == inside
    body = _two_wants(inside, tag, version)
    resp = post_upload_pack(ns_server.port, body, repo="ns-repo.git", version=version)
    with pytest.raises(InBandError, match="not our ref"):
        pack_bytes(resp.body)


def test_the_setting_in_each_form(tmp_path: Path) -> None:
    toml = tmp_path / "g.toml"
    toml.write_text(f'root = "{tmp_path}"\n[namespaces]\n'
                    '"ns-repo.git" = { repo = "repo.git", namespace = "ns" }\n'
                    '"deep/" = { repo = "", namespace = "a/b" }\n')
    assert load_config({"config": str(toml)}, env={}).namespaces == MAP
    assert load_config({"root": str(tmp_path)}, env={"GITSPOUT_NAMESPACES": MAP}).namespaces == MAP
    for bad in ("x.git=repo.git", "x.git=repo.git#..", "x.git=../up.git#ns", "=repo.git#ns"):
        with pytest.raises(ConfigError, match="namespaces"):
            load_config({"root": str(tmp_path), "namespaces": bad}, env={})


def test_a_namespace_url_answers_to_its_own_access_rule(git: Git, ns_root: Path,
                                                        tmp_path: Path) -> None:
    """With an auth file, a namespace's URL is matched by that URL, not by its
    repository's path: a tenant allowed its namespace reads it and neither the whole
    repository nor another namespace; the repository's own URL keeps its own rule."""
    import bcrypt

    def hashed(password: str) -> str:
        return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()

    auth = tmp_path / "auth.toml"
    auth.write_text(f'[users]\ntenant = "{hashed("t-pass")}"\nowner = "{hashed("o-pass")}"\n'
                    '[[access]]\nrepos = ["ns-repo.git"]\nusers = ["tenant"]\n'
                    '[[access]]\nrepos = ["repo.git", "other.git"]\nusers = ["owner"]\n')
    srv = start_server(ns_root, ["--namespaces", MAP, "--auth-file", str(auth)])
    host = srv.url.split("://", 1)[1]
    try:
        def ls_remote(user: str, password: str, path: str) -> subprocess.CompletedProcess[bytes]:
            return git.run("ls-remote", f"http://{user}:{password}@{host}/{path}", check=False,
                           env={"GIT_TERMINAL_PROMPT": "0"})

        ok = ls_remote("tenant", "t-pass", "ns-repo.git")
        assert ok.returncode == 0, ok.stderr
        assert b"refs/heads/main" in ok.stdout and b"refs/namespaces/" not in ok.stdout
        for path in ("repo.git", "deep/other.git"):
            refused = ls_remote("tenant", "t-pass", path)
            assert refused.returncode != 0 and b"403" in refused.stderr, (path, refused.stderr)
        whole = ls_remote("owner", "o-pass", "repo.git")
        assert whole.returncode == 0 and b"refs/namespaces/ns/" in whole.stdout
        assert b"403" in ls_remote("owner", "o-pass", "ns-repo.git").stderr
        dest = tmp_path / "tenant"
        git.run("clone", "-q", "--bare", f"http://tenant:t-pass@{host}/ns-repo.git", str(dest))
        fsck(git, dest)
    finally:
        srv.stop()


def test_a_repository_mapped_at_its_own_path_is_served_only_as_the_namespace(
        git: Git, ns_root: Path, tmp_path: Path) -> None:
    """``repo.git=repo.git#ns`` (and a prefix ``deep/=deep#a/b`` over a directory of the
    same name): every other URL of those repositories (``repo`` without ``.git``, a link
    to it inside the root) is refused as missing, in v0 and v2, with or without
    credentials; the mapped URL serves the namespace alone. Before, ``/repo`` served every
    namespace of it, under the same access rule as the tenant's URL."""
    import bcrypt

    root = tmp_path / "root"
    root.mkdir()
    subprocess.run(["cp", "-a", str(ns_root / "repo.git"), str(root / "repo.git")], check=True)
    (root / "deep").mkdir()
    subprocess.run(["cp", "-a", str(ns_root / "other.git"), str(root / "deep" / "other.git")],
                   check=True)
    (root / "alias.git").symlink_to(root / "repo.git")
    (root / "alias-deep").symlink_to(root / "deep")
    # Mapped through a link: the repository it leads to is the one confined.
    (root / "store").mkdir()
    subprocess.run(["cp", "-a", str(ns_root / "repo.git"), str(root / "store" / "real.git")],
                   check=True)
    (root / "linked.git").symlink_to(root / "store" / "real.git")
    # Another repository named alike (a work tree's "work/.git" against "work.git"):
    # not confined.
    subprocess.run(["cp", "-a", str(ns_root / "repo.git"), str(root / "work.git")], check=True)
    git.run("clone", "-q", str(ns_root / "repo.git"), str(root / "work"))
    auth = tmp_path / "auth.toml"
    hashed = bcrypt.hashpw(b"t-pass", bcrypt.gensalt(4)).decode()
    auth.write_text(f'[users]\ntenant = "{hashed}"\n'
                    '[[access]]\nrepos = ["repo.git", "deep/*", "alias*", "linked.git", '
                    '"store/*", "work", "work.git"]\nusers = ["tenant"]\n')
    ns_map = "repo.git=repo.git#ns,deep/=deep#a/b,linked.git=linked.git#ns,work.git=work.git#ns"
    for extra in ([], ["--auth-file", str(auth)]):
        srv = start_server(root, ["--namespaces", ns_map, *extra])
        host = srv.url.split("://", 1)[1]
        base = f"http://tenant:t-pass@{host}" if extra else srv.url
        try:
            for version in ("0", "2"):
                def ls_remote(path: str, version: str = version,
                              base: str = base) -> subprocess.CompletedProcess[bytes]:
                    return git.run("-c", f"protocol.version={version}", "ls-remote",
                                   f"{base}/{path}", check=False,
                                   env={"GIT_TERMINAL_PROMPT": "0"})

                ok = ls_remote("repo.git")
                assert ok.returncode == 0, ok.stderr
                assert b"refs/heads/main" in ok.stdout
                assert b"refs/namespaces/" not in ok.stdout and b"secret" not in ok.stdout
                ok = ls_remote("deep/other.git")
                assert ok.returncode == 0 and b"refs/heads/main" in ok.stdout, ok.stderr
                assert b"refs/namespaces/" not in ok.stdout
                for path in ("repo", "alias.git", "alias", "alias-deep/other.git", "linked",
                             "store/real.git", "store/real"):
                    refused = ls_remote(path)
                    assert refused.returncode != 0, (path, refused.stdout)
                    assert b"not found" in refused.stderr or b"404" in refused.stderr, \
                        (path, refused.stderr)
                ok = ls_remote("linked.git")
                assert ok.returncode == 0 and b"refs/namespaces/" not in ok.stdout, ok.stderr
                whole = ls_remote("work/.git")  # the work tree's repository: its own refs
                assert whole.returncode == 0 and b"refs/heads/main" in whole.stdout, \
                    whole.stderr
        finally:
            srv.stop()


def test_a_symref_into_another_namespace_names_nothing(git: Git, ns_root: Path,
                                                        tmp_path: Path) -> None:
    """A namespace whose HEAD is a symref into another namespace: it is left out, as if
    the namespace had no HEAD; its advertisement (v0 ``symref=`` capability, v2
    ``symref-target``) names nothing of the other namespace, nor is the other namespace's
    tip one of its own: a want of it is refused. Before, ``symref-target:refs/namespaces/
    ns/...`` told a tenant another tenant's namespace, and its tip was served. (C git
    2.39's upload-pack crashes on such a HEAD: no answer to compare with.)"""
    root = tmp_path / "root"
    root.mkdir()
    subprocess.run(["cp", "-a", str(ns_root / "repo.git"), str(root / "repo.git")], check=True)
    repo = root / "repo.git"
    git.run("update-ref", "refs/namespaces/x/refs/heads/own", "main", cwd=repo)
    side = git.out("commit-tree", "main^{tree}", "-m", "ns only", cwd=repo).strip()
    git.run("update-ref", "refs/namespaces/ns/refs/heads/side", side, cwd=repo)
    git.run("symbolic-ref", "refs/namespaces/x/HEAD", "refs/namespaces/ns/refs/heads/side",
            cwd=repo)
    # And through a symref of the namespace's own: HEAD -> x's link -> ns's side.
    git.run("symbolic-ref", "refs/namespaces/y/HEAD", "refs/namespaces/y/refs/heads/link",
            cwd=repo)
    git.run("symbolic-ref", "refs/namespaces/y/refs/heads/link",
            "refs/namespaces/ns/refs/heads/side", cwd=repo)
    git.run("update-ref", "refs/namespaces/y/refs/heads/own", "main", cwd=repo)
    srv = start_server(root, ["--namespaces", "x.git=repo.git#x,y.git=repo.git#y"])
    try:
        own = git.out("rev-parse", "main", cwd=repo).strip()
        other = side
        for url in ("x.git", "y.git"):
            v0 = get_info_refs(srv.port, url, version=0)
            refs, symrefs = _refs_and_symrefs(v0.body)
            assert symrefs == [] and b"namespaces" not in v0.body, v0.body
            assert [r.split(b"\0")[0] for r in refs] == [f"{own} refs/heads/own".encode()]
            want = pkt_lines("command=fetch", "object-format=sha1") + DELIM + pkt_lines(
                f"want {other}", "done") + FLUSH
            refused = post_upload_pack(srv.port, want, url, version=2)
            assert b"not our ref" in refused.body, refused.body
        body = pkt_lines("command=ls-refs", "object-format=sha1") + DELIM + pkt_lines(
            "symrefs", "peel") + FLUSH
        v2 = post_upload_pack(srv.port, body, "x.git", version=2)
        assert v2.status == 200 and b"namespaces" not in v2.body, v2.body
        assert b"refs/heads/own" in v2.body
    finally:
        srv.stop()
