"""Fixtures of the interoperability suite: one served root, built once per session, and the
two servers that serve it side by side, each behind a recording proxy.

The root holds
* ``hist.git``: a few hundred commits, aggressively repacked with a bitmap (history.py);
* ``nobitmap.git``: the same, repacked without a bitmap (gitspout walks);
* ``pushed.git``: the same history as a repository that only ever received pushes (packs
  completed by ``--fix-thin``, loose objects, no bitmap);
* ``gcpushed.git``: ``hist.git`` after a push (three commits, a tag, a branch moved:
  loose objects beside the bitmapped pack);
* ``sha256.git``: a smaller sha256 history;
* ``private/hist.git``: needs Basic credentials on both servers;
* per fetch test, a fresh copy of ``hist.git`` or ``nobitmap.git`` that the test pushes
  new commits into.

gitspout serves it with ``--auth-file``; git-http-backend behind nginx (``auth_basic`` on
``/private/``) and fcgiwrap (bench/peer.py).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
for _extra in (Path(__file__).resolve().parents[2], Path(__file__).resolve().parents[1] / "server"):
    if str(_extra) not in sys.path:
        sys.path.append(str(_extra))  # bench.peer; rawhttp (tests/server)

from gitutil import Git, copy_repo, start_server  # noqa: E402
from history import Spec, build_source, make_shape, push_new_commits  # noqa: E402
from proxy import RecordingProxy  # noqa: E402
from scenario import BACKEND, GITSPOUT, USERS, InteropRoot, Side, matrix_lines  # noqa: E402


def _allow_filter(git: Git, repo: Path) -> None:
    # git-http-backend filters only when told; gitspout reads the same setting.
    git.run("config", "uploadpack.allowFilter", "true", cwd=repo)


@pytest.fixture(scope="session")
def interop_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> InteropRoot:
    base = tmp_path_factory.mktemp("interop")
    root = base / "root"
    root.mkdir()
    src = build_source(git, base / "src.git", Spec())
    hist = make_shape(git, src, root / "hist.git", "gc")
    _allow_filter(git, hist)
    _allow_filter(git, make_shape(git, src, root / "nobitmap.git", "nobitmap"))
    _allow_filter(git, make_shape(git, src, root / "pushed.git", "pushed"))
    copy_repo(hist, root / "gcpushed.git")
    push_new_commits(git, root / "gcpushed.git", base / "gcpushed-work")
    sha_src = build_source(git, base / "src256.git", Spec(commits=60, object_format="sha256"))
    _allow_filter(git, make_shape(git, sha_src, root / "sha256.git", "gc"))
    (root / "private").mkdir()
    copy_repo(hist, root / "private" / "hist.git")
    return InteropRoot(root, src)


def _auth_file(path: Path) -> Path:
    import bcrypt

    hashes = {u: bcrypt.hashpw(p.encode(), bcrypt.gensalt(4)).decode() for u, p in USERS.items()}
    path.write_text('realm = "interop"\n[users]\n'
                    + "".join(f'{u} = "{h}"\n' for u, h in hashes.items())
                    + '[[access]]\nrepos = ["private/*"]\nusers = ["alice"]\n'
                    + '[[access]]\nrepos = ["*"]\nanonymous = true\n')
    return path


def _need_backend() -> None:
    path = "/usr/sbin:/usr/bin:/sbin:/bin"
    missing = [t for t in ("nginx", "fcgiwrap") if shutil.which(t, path=path) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (apt-get install -y nginx fcgiwrap; "
                    ".ci/run does)")


@pytest.fixture(scope="session")
def sides(interop_root: InteropRoot, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[dict[str, Side]]:
    _need_backend()
    from bench.peer import GitHttpBackend

    auth = _auth_file(tmp_path_factory.mktemp("interop-auth") / "auth.toml")
    ours = start_server(interop_root.root, ["--auth-file", str(auth)])
    backend = GitHttpBackend(interop_root.root, basic_auth=("/private/", USERS),
                             probe_repo="hist.git", fcgi_workers=4, nginx_workers=1)
    proxies: list[RecordingProxy] = []
    try:
        backend.start()
        proxies = [RecordingProxy(ours.url).start(), RecordingProxy(backend.url).start()]
        yield {GITSPOUT: Side(GITSPOUT, proxies[0], interop_root.root),
               BACKEND: Side(BACKEND, proxies[1], interop_root.root)}
    finally:
        for p in proxies:
            p.stop()
        backend.stop()
        ours.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in matrix_lines():
        terminalreporter.write_line(line)
