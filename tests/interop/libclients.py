"""Clients that are Python libraries, run in process: libgit2 (pygit2) and dulwich."""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

from clientbase import Client, ClientFailed, Creds, _run
from gitutil import git_env


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
