"""The git client implementations of the interoperability suite, behind one small API.

Each client does what it can: ``ls_remote``, ``clone`` (``depth``), ``fetch`` (``depth``:
deepen a shallow clone) and ``blobless`` (a ``blob:none`` clone, then what its checkout
fetches lazily, then one old blob by id). An operation the implementation has no means for
raises :class:`Unsupported` with the reason; one that it tried and that failed raises
:class:`ClientFailed` with the client's own message.

* ``git``: C git (the machine's, 2.39), protocol v2.
* ``pygit2``: libgit2 through pygit2 (its wheel bundles libgit2), in process.
* ``dulwich``: dulwich's own HTTP client (porcelain, and ``HttpGitClient`` for lazy fetches),
  in process.
* ``isogit``: isomorphic-git 1.x with its node http client (``isogit/client.mjs``; the
  ``node_modules`` that ``.ci/run`` installs with ``npm ci``).
* ``jgit``: Debian's ``jgit`` CLI (JGit 4.11, protocol v0 only, no shallow, no filter).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from gitutil import Git, git_env

HERE = Path(__file__).resolve().parent
ISOGIT_DIR = HERE / "isogit"
TIMEOUT = 120
# Debian's jgit-cli 4.11 starts only with these on its class path: its launcher names the
# pgm jar alone, whose manifest leaves out the LFS and Apache HTTP jars Main needs.
JGIT_JARS = ("org.eclipse.jgit.lfs", "org.eclipse.jgit.http.apache", "httpclient", "httpcore",
             "commons-logging", "slf4j-api", "slf4j-nop")


class Unsupported(Exception):
    """The client has no means to do this operation (the reason says which)."""


class ClientFailed(Exception):
    """The client tried and failed; the message is its own."""


@dataclass(frozen=True)
class Creds:
    username: str
    password: str


def with_creds(url: str, creds: Creds | None) -> str:
    if creds is None:
        return url
    parts = urlsplit(url)
    netloc = f"{creds.username}:{creds.password}@{parts.hostname}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


class Client:
    """One client implementation; subclasses override what they support."""

    name = ""
    protocol = ""  # the protocol version it speaks for fetches, for the report

    def __init__(self, git: Git) -> None:
        self.git = git

    def available(self) -> str | None:
        """None when usable here, else why not."""
        return None

    def ls_remote(self, url: str, creds: Creds | None = None) -> dict[str, str]:
        raise Unsupported(f"{self.name} has no ls-remote")

    def clone(self, url: str, dest: Path, depth: int | None = None,
              creds: Creds | None = None) -> None:
        raise Unsupported(f"{self.name} cannot clone")

    def fetch(self, dest: Path, depth: int | None = None) -> None:
        raise Unsupported(f"{self.name} cannot fetch")

    def blobless(self, url: str, dest: Path, old_blob: str) -> None:
        raise Unsupported(f"{self.name} has no partial clone (no filter option)")


def _run(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> str:
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, timeout=TIMEOUT)
    if proc.returncode != 0:
        raise ClientFailed(f"{' '.join(argv[:3])}... exit {proc.returncode}: "
                           + (proc.stderr or proc.stdout).decode(errors="replace").strip()[-800:])
    return proc.stdout.decode(errors="replace")


class CGit(Client):
    name, protocol = "git", "v2"

    def _git(self, *args: str, cwd: Path | None = None) -> str:
        return _run(["git", "-c", "protocol.version=2", *args], git_env(self.git.home), cwd)

    def ls_remote(self, url: str, creds: Creds | None = None) -> dict[str, str]:
        out = self._git("ls-remote", "--symref", with_creds(url, creds))
        return _parse_ls_remote(out)

    def clone(self, url: str, dest: Path, depth: int | None = None,
              creds: Creds | None = None) -> None:
        extra = [f"--depth={depth}", "--no-single-branch"] if depth else []
        self._git("clone", "-q", *extra, with_creds(url, creds), str(dest))

    def fetch(self, dest: Path, depth: int | None = None) -> None:
        extra = [f"--depth={depth}"] if depth else []
        self._git("fetch", "-q", *extra, "origin", cwd=dest)

    def blobless(self, url: str, dest: Path, old_blob: str) -> None:
        self._git("clone", "-q", "--filter=blob:none", "--no-checkout", url, str(dest))
        self._git("checkout", "-q", "main", cwd=dest)  # the checkout's lazy fetch
        self._git("cat-file", "-e", old_blob, cwd=dest)  # one old blob, by id


def _parse_ls_remote(out: str) -> dict[str, str]:
    refs: dict[str, str] = {}
    for line in out.splitlines():
        left, tab, name = line.partition("\t")
        if not tab:
            continue  # a prompt, a progress line
        if left.startswith("ref: "):
            refs[f"{name} ->"] = left[5:]
        else:
            refs[name] = left
    return refs


class Pygit2(Client):
    name, protocol = "pygit2", "v0"

    def available(self) -> str | None:
        try:
            import pygit2  # noqa: F401
        except ImportError as exc:
            return f"pygit2 not installed: {exc}"
        return None

    @staticmethod
    def _callbacks(creds: Creds | None) -> object:
        import pygit2

        class Callbacks(pygit2.RemoteCallbacks):  # type: ignore[misc]
            asked = 0

            def credentials(self, url: str, username: str | None, allowed: object) -> object:
                # libgit2 asks again after each 401: answer once, then give up.
                self.asked += 1
                if creds is None or self.asked > 1:
                    raise ClientFailed("401: credentials refused")
                return pygit2.UserPass(creds.username, creds.password)

        return Callbacks()

    def ls_remote(self, url: str, creds: Creds | None = None) -> dict[str, str]:
        import pygit2

        tmp = _tempdir(Path(os.environ.get("TMPDIR", "/tmp")), "pygit2-ls-")
        try:
            repo = pygit2.init_repository(str(tmp), bare=True)
            remote = repo.remotes.create_anonymous(url)
            try:
                heads = remote.list_heads(callbacks=self._callbacks(creds))
            except (pygit2.GitError, ClientFailed, KeyError) as exc:
                raise ClientFailed(str(exc)) from exc
            refs: dict[str, str] = {}
            for h in heads:
                refs[h.name] = str(h.oid)
                if h.symref_target:
                    refs[f"{h.name} ->"] = h.symref_target
            return refs
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def clone(self, url: str, dest: Path, depth: int | None = None,
              creds: Creds | None = None) -> None:
        import pygit2

        try:
            pygit2.clone_repository(url, str(dest), depth=depth or 0,
                                    callbacks=self._callbacks(creds))
        except (pygit2.GitError, ClientFailed, KeyError, ValueError) as exc:
            raise ClientFailed(f"{type(exc).__name__}: {exc}") from exc

    def fetch(self, dest: Path, depth: int | None = None) -> None:
        import pygit2

        try:
            repo = pygit2.Repository(str(dest))
            repo.remotes["origin"].fetch(depth=depth or 0, callbacks=self._callbacks(None))
        except (pygit2.GitError, ClientFailed, KeyError, ValueError) as exc:
            raise ClientFailed(f"{type(exc).__name__}: {exc}") from exc


def _tempdir(parent: Path, prefix: str) -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


class Dulwich(Client):
    name, protocol = "dulwich", "v2"

    def ls_remote(self, url: str, creds: Creds | None = None) -> dict[str, str]:
        from dulwich import porcelain

        kw = {"username": creds.username, "password": creds.password} if creds else {}
        try:
            res = porcelain.ls_remote(url, **kw)  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - whatever dulwich raises is the finding
            raise ClientFailed(f"{type(exc).__name__}: {exc}") from exc
        refs = {k.decode(): v.decode() for k, v in res.refs.items() if v is not None}
        for name, target in (res.symrefs or {}).items():
            refs[f"{name.decode()} ->"] = target.decode()
        return refs

    def clone(self, url: str, dest: Path, depth: int | None = None,
              creds: Creds | None = None, **extra: object) -> None:
        from dulwich import porcelain

        kw: dict[str, object] = {"username": creds.username, "password": creds.password} \
            if creds else {}
        kw.update(extra)
        err = io.BytesIO()
        try:
            porcelain.clone(url, str(dest), depth=depth, errstream=err, **kw)  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001
            raise ClientFailed(f"{type(exc).__name__}: {exc}") from exc

    def fetch(self, dest: Path, depth: int | None = None) -> None:
        from dulwich import porcelain

        err = io.BytesIO()
        try:
            if depth:
                self._deepen(dest, depth)
            else:
                porcelain.fetch(str(dest), "origin", errstream=err, outstream=io.StringIO())
        except Exception as exc:  # noqa: BLE001
            raise ClientFailed(f"{type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _deepen(dest: Path, depth: int) -> None:
        """porcelain's fetch with a depth wants every ref and then stumbles on annotated
        tags (dulwich 1.2: ``'Tag' object has no attribute 'parents'`` in ``get_depth``, on
        any server): its client, asked for the branches only, deepens fine."""
        from dulwich.client import get_transport_and_path
        from dulwich.repo import Repo

        repo = Repo(str(dest))
        url = repo.get_config().get((b"remote", b"origin"), b"url").decode()
        client, path = get_transport_and_path(url)
        heads: dict[bytes, bytes] = {}

        def wants(refs: dict[bytes, bytes], depth: int | None = None) -> list[bytes]:
            heads.update({k: v for k, v in refs.items() if k.startswith(b"refs/heads/")})
            return sorted(set(heads.values()))

        client.fetch(path, repo, determine_wants=wants, depth=depth)
        for name, sha in heads.items():
            repo.refs[b"refs/remotes/origin/" + name.removeprefix(b"refs/heads/")] = sha

    def blobless(self, url: str, dest: Path, old_blob: str) -> None:
        """dulwich clones with a filter but fetches no missing object on its own: its
        client fetches them by id (as git's promisor fetch asks: wants, ``blob:none``),
        the tree's blobs first (what a checkout needs), then one old blob."""
        from dulwich.client import get_transport_and_path
        from dulwich.object_store import ObjectStoreGraphWalker
        from dulwich.repo import Repo

        self.clone(url, dest, checkout=False, filter_spec="blob:none")
        try:
            repo = Repo(str(dest))
            missing = [e.sha for e in _tree_entries(repo, repo[repo.head()].tree)
                       if e.sha not in repo.object_store]
            client, path = get_transport_and_path(url)
            # No haves, as git's promisor fetch (fetch.negotiationAlgorithm=noop): a server
            # takes a blob reachable from a have for one the client holds, and sends nothing.
            repo.get_graph_walker = lambda heads=None: ObjectStoreGraphWalker(  # type: ignore[method-assign]
                [], lambda sha: [])
            for wants in (missing, [old_blob.encode()]):
                client.fetch(path, repo, determine_wants=lambda refs, depth=None, w=wants: w,
                             filter_spec=b"blob:none")
            repo.get_worktree().reset_index()
        except Exception as exc:  # noqa: BLE001
            raise ClientFailed(f"{type(exc).__name__}: {exc}") from exc
        self._mark_partial(dest)

    def _mark_partial(self, dest: Path) -> None:
        """Tell git what dulwich's partial clone is (dulwich marks nothing): a promisor
        remote, and every pack from it a promisor pack, as git's own partial clone has;
        else git fsck takes each filtered-out blob for a broken link."""
        for key, value in (("core.repositoryformatversion", "1"),
                           ("extensions.partialClone", "origin"),
                           ("remote.origin.promisor", "true"),
                           ("remote.origin.partialCloneFilter", "blob:none")):
            _run(["git", "config", key, value], git_env(self.git.home), dest)
        for pack in (dest / ".git" / "objects" / "pack").glob("pack-*.pack"):
            pack.with_suffix(".promisor").write_text("")


def _tree_entries(repo: object, tree_id: bytes) -> list[object]:
    from dulwich.object_store import iter_tree_contents

    return [e for e in iter_tree_contents(repo.object_store, tree_id)  # type: ignore[attr-defined]
            if e.mode is not None and not (e.mode & 0o40000)]


class IsoGit(Client):
    name, protocol = "isogit", "v1"

    def available(self) -> str | None:
        if not shutil.which("node"):
            return "node is not installed"
        if not (ISOGIT_DIR / "node_modules" / "isomorphic-git").is_dir():
            return f"isomorphic-git not installed: run npm ci in {ISOGIT_DIR} (.ci/run does)"
        return None

    def _node(self, args: dict[str, object]) -> dict[str, object]:
        out = _run(["node", str(ISOGIT_DIR / "client.mjs"), json.dumps(args)],
                   git_env(self.git.home), ISOGIT_DIR)
        res = json.loads(out.strip().splitlines()[-1])
        if not res.get("ok"):
            raise ClientFailed(f"{res.get('code')}: {res.get('message')}")
        return dict(res)

    def _auth(self, creds: Creds | None) -> dict[str, str]:
        return {"username": creds.username, "password": creds.password} if creds else {}

    def ls_remote(self, url: str, creds: Creds | None = None) -> dict[str, str]:
        res = self._node({"op": "ls-remote", "url": url, **self._auth(creds)})
        refs: dict[str, str] = {}
        for r in res["refs"]:  # type: ignore[attr-defined]
            refs[r["ref"]] = r["oid"]
            if r.get("target"):
                refs[f"{r['ref']} ->"] = r["target"]
            if r.get("peeled"):
                refs[r["ref"] + "^{}"] = r["peeled"]
        return refs

    def clone(self, url: str, dest: Path, depth: int | None = None,
              creds: Creds | None = None) -> None:
        self._node({"op": "clone", "url": url, "dir": str(dest), "depth": depth,
                    **self._auth(creds)})

    def fetch(self, dest: Path, depth: int | None = None) -> None:
        self._node({"op": "fetch", "dir": str(dest), "depth": depth})


class JGit(Client):
    name, protocol = "jgit", "v0"

    def available(self) -> str | None:
        if not shutil.which("jgit"):
            return "jgit not installed (apt-get install jgit-cli)"
        return None

    def _env(self) -> dict[str, str]:
        env = git_env(self.git.home)
        env["JGIT_CLASSPATH"] = ":".join(f"/usr/share/java/{j}.jar" for j in JGIT_JARS)
        return env

    def _jgit(self, *args: str, cwd: Path | None = None, creds: Creds | None = None) -> str:
        if creds is not None:
            return _answer_prompts(["jgit", *args], self._env(), cwd,
                                   [(b"Username:", creds.username), (b"Password:", creds.password)])
        return _run(["jgit", *args], self._env(), cwd)

    def ls_remote(self, url: str, creds: Creds | None = None) -> dict[str, str]:
        return _parse_ls_remote(self._jgit("ls-remote", url, creds=creds))

    def clone(self, url: str, dest: Path, depth: int | None = None,
              creds: Creds | None = None) -> None:
        if depth:
            raise Unsupported("jgit 4.11 has no shallow clone (--depth came in JGit 6.3)")
        self._jgit("clone", url, str(dest), creds=creds)

    def fetch(self, dest: Path, depth: int | None = None) -> None:
        if depth:
            raise Unsupported("jgit 4.11 has no shallow fetch (--depth came in JGit 6.3)")
        self._jgit("fetch", "origin", cwd=dest)


def _answer_prompts(argv: list[str], env: dict[str, str], cwd: Path | None,
                    answers: list[tuple[bytes, str]]) -> str:
    """Run ``argv`` on a pseudo-terminal, typing each answer once its prompt appears.

    The jgit CLI takes credentials from a console only: without one it opens an AWT dialog
    (HeadlessException here), and it ignores a password in the URL.
    """
    import os
    import pty
    import select
    import time

    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    seen = b""
    pending = list(answers)
    deadline = time.monotonic() + TIMEOUT
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # the other end closed: the process is done
                    break
                if not chunk:
                    break
                seen += chunk
                last = seen.split(b"\n")[-1]
                while pending and pending[0][0] in last:
                    os.write(master, pending.pop(0)[1].encode() + b"\n")
                    seen += b"\n"
                    last = b""
                if not pending and any(prompt in last for prompt, _ in answers):
                    # Asked again: the credentials were refused (jgit asks until told).
                    raise ClientFailed(f"{' '.join(argv[:2])}: credentials refused, asked again: "
                                       + seen.decode(errors="replace").strip()[-400:])
            elif proc.poll() is not None:
                break
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = seen.decode(errors="replace")
    if rc != 0:
        raise ClientFailed(f"{' '.join(argv[:3])}... exit {rc}: {text.strip()[-800:]}")
    return text


CLIENTS: dict[str, type[Client]] = {c.name: c for c in (CGit, Pygit2, Dulwich, IsoGit, JGit)}
