"""HTTP Git servers under test, each measured by its own cgroup.

* :class:`GitHttpBackend` -- the reference peer: C git's ``git-http-backend``
  behind nginx + fcgiwrap (nginx master/workers, fcgiwrap and every CGI child
  share one cgroup).
* :class:`Gitspout` -- ``<venv>/bin/gitspout serve --root DIR --host 127.0.0.1
  --port PORT``; :class:`CommandServer` runs any such command line.

Both are context managers exposing the same API::

    with GitHttpBackend(root) as peer:          # port picked automatically
        peer.url, peer.repo_url("x.git")
        peer.reset_counters(); ...; peer.cpu_ns(), peer.memory_max_bytes()
        peer.pids(), peer.peak_rss_by_pid()

Everything listens on 127.0.0.1 only; on exit (also on errors) process groups
are killed, the cgroup is emptied and removed, and the temporary work dir
(configs, sockets, logs) is deleted unless ``keep_workdir`` is set or startup
failed (then its path is in the error message).

CLI: ``python -m bench.peer ROOT [--server c-git|gitspout] [--serve SECONDS]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cgroup import Cgroup
from bench.process import (
    LOOPBACK,
    ServerError,
    ServerProcess,
    ensure_port_free,
    exit_on_sigterm,
    free_port,
    wait_for_http,
    wait_for_port,
)

GIT_HTTP_BACKEND = "/usr/lib/git-core/git-http-backend"
ADVERT_CTYPE = "application/x-git-upload-pack-advertisement"
REPO_TOP = Path(__file__).resolve().parent.parent


def find_probe_repo(root: Path) -> str | None:
    """First (sorted) bare repository directly under *root*, e.g. ``"foo.git"``."""
    for entry in sorted(root.iterdir()):
        if (entry / "HEAD").is_file() and (entry / "objects").is_dir():
            return entry.name
    return None


def server_env(workdir: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Small reproducible environment: HOME is the (empty) work dir, so no
    ``~/.gitconfig`` influences either server."""
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "HOME": str(workdir),
        "LANG": "C.UTF-8",
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    env.update(extra or {})
    return env


class BenchServer:
    """Common lifecycle and measurement API; subclasses implement ``_launch``."""

    def __init__(
        self, root: Path | str, port: int | None = None, *, name: str,
        workdir: Path | None = None, probe_repo: str | None = None,
        ready_timeout: float = 30.0, keep_workdir: bool = False,
    ) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise ServerError(f"root {self.root} is not a directory")
        self.port = port or free_port()
        self.name = name
        self.cgroup = Cgroup(name)
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(
            tempfile.mkdtemp(prefix=f"gitspout-bench-{name}-"))
        self.probe_repo = probe_repo or find_probe_repo(self.root)
        self.ready_timeout = ready_timeout
        self.keep_workdir = keep_workdir
        self.procs: list[ServerProcess] = []
        self.startup_s: float | None = None

    # -- addresses -------------------------------------------------------
    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8080``."""
        return f"http://{LOOPBACK}:{self.port}"

    def repo_url(self, repo: str) -> str:
        """Clone URL of the repository *repo* (path relative to root)."""
        return f"{self.url}/{repo.strip('/')}"

    # -- lifecycle ----------------------------------------------------------
    def _launch(self) -> list[ServerProcess]:
        raise NotImplementedError

    def start(self) -> BenchServer:
        """Create the cgroup, launch the processes and wait until ready."""
        t0 = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            ensure_port_free(self.port)
            self.cgroup.create()
            self.procs = self._launch()
            self._wait_ready(t0)
        except BaseException as e:
            self.keep_workdir = True
            self.stop()
            if isinstance(e, ServerError):
                raise ServerError(f"{self.name}: {e} (logs kept in {self.workdir})") from e
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def _wait_ready(self, t0: float) -> None:
        left = lambda: max(0.5, self.ready_timeout - (time.monotonic() - t0))  # noqa: E731
        wait_for_port(self.port, timeout=left(), procs=self.procs)
        if self.probe_repo:
            path = f"/{self.probe_repo}/info/refs?service=git-upload-pack"
            wait_for_http(self.port, path, timeout=left(), procs=self.procs,
                          expect_content_type=ADVERT_CTYPE)

    def stop(self) -> None:
        """Stop all processes, remove the cgroup and (normally) the work dir."""
        errors: list[str] = []
        for proc in reversed(self.procs):
            try:
                proc.stop()
            except ServerError as e:
                errors.append(str(e))
        try:
            if self.cgroup.created:
                self.cgroup.remove()
        except Exception as e:  # noqa: BLE001 - report, but finish cleanup
            errors.append(str(e))
        if self._own_workdir and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if errors:
            raise ServerError(f"{self.name}: cleanup problems: {'; '.join(errors)}")

    def __enter__(self) -> BenchServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- measurements ---------------------------------------------------------
    def cpu_ns(self) -> int:
        """CPU ns used by all server processes (incl. exited children) since reset."""
        return self.cgroup.usage_ns()

    def memory_max_bytes(self) -> int:
        """cgroup memory high-water mark (RSS + page cache) since reset."""
        return self.cgroup.memory_max_bytes()

    def reset_counters(self) -> None:
        """Zero the CPU counter and the memory high-water mark."""
        self.cgroup.reset()

    def pids(self) -> list[int]:
        """Every live process of this server."""
        return self.cgroup.pids()

    def peak_rss_by_pid(self) -> dict[int, int]:
        """VmHWM (bytes) of every live process of this server."""
        return self.cgroup.peak_rss_by_pid()

    def log_tails(self, lines: int = 20) -> str:
        """Concatenated tails of all process logs (for error reports)."""
        return "\n".join(f"--- {p.name} ---\n{p.log_tail(lines)}" for p in self.procs)


class GitHttpBackend(BenchServer):
    """C git's git-http-backend behind nginx + fcgiwrap (all in one cgroup).

    *backend* is the CGI program (default: the system git's); *backend_env* is passed to
    it as FastCGI parameters, e.g. ``{"GIT_EXEC_PATH": DIR}`` for a git built elsewhere
    (fcgiwrap gives the CGI only the request's parameters as its environment)."""

    def __init__(self, root: Path | str, port: int | None = None, *, name: str = "c-git",
                 fcgi_workers: int = 16, nginx_workers: int = 2,
                 basic_auth: tuple[str, Mapping[str, str]] | None = None,
                 backend: str = GIT_HTTP_BACKEND, backend_env: Mapping[str, str] | None = None,
                 **kw: object) -> None:
        """``basic_auth`` = (path prefix, {user: password}): repositories under that prefix
        (e.g. ``/private/``) need HTTP Basic credentials (nginx ``auth_basic``). ``backend``
        is the git-http-backend to run (``backend_env``: FastCGI parameters it gets as its
        environment, e.g. GIT_EXEC_PATH for a git build tree)."""
        super().__init__(root, port, name=name, **kw)  # type: ignore[arg-type]
        self.fcgi_workers = fcgi_workers
        self.nginx_workers = nginx_workers
        self.backend = backend
        self.backend_env = dict(backend_env or {})
        self.socket_path = self.workdir / "fcgiwrap.sock"
        self.basic_auth = basic_auth

    def _launch(self) -> list[ServerProcess]:
        for tool in ("nginx", "fcgiwrap"):
            if not shutil.which(tool, path=server_env(self.workdir)["PATH"]):
                raise ServerError(f"{tool} not found: apt-get install -y nginx fcgiwrap")
        if not os.access(self.backend, os.X_OK):
            raise ServerError(f"{self.backend} missing (install git)")
        conf = self.workdir / "nginx.conf"
        conf.write_text(nginx_config(self.workdir, self.port, self.root, self.socket_path,
                                     self.nginx_workers, self.basic_auth, self.backend,
                                     self.backend_env))
        env = server_env(self.workdir)
        fcgi = ServerProcess(
            "fcgiwrap", ["fcgiwrap", "-c", str(self.fcgi_workers), "-s",
                         f"unix:{self.socket_path}"],
            log_path=self.workdir / "fcgiwrap.log", cgroup=self.cgroup, env=env,
            cwd=self.workdir).start()
        procs = [fcgi]
        _wait_for_path(self.socket_path, 10.0, fcgi)
        nginx_argv = ["nginx", "-p", str(self.workdir), "-c", str(conf),
                      "-e", str(self.workdir / "error.log")]
        _nginx_test(nginx_argv, self.workdir, env)
        procs.append(ServerProcess("nginx", nginx_argv, log_path=self.workdir / "nginx.log",
                                   cgroup=self.cgroup, env=env, cwd=self.workdir).start())
        return procs


def _wait_for_path(path: Path, timeout: float, proc: ServerProcess) -> None:
    """Wait until *path* exists (e.g. a unix socket), failing if *proc* dies."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        proc.check_alive()
        if time.monotonic() > deadline:
            raise ServerError(f"{path} not created within {timeout}s")
        time.sleep(0.02)


def _nginx_test(argv: list[str], workdir: Path, env: dict[str, str]) -> None:
    """``nginx -t`` the generated config so errors are reported clearly."""
    import subprocess

    res = subprocess.run([*argv, "-t", "-q"], env=env, cwd=workdir, capture_output=True,
                         text=True, timeout=30)
    if res.returncode != 0:
        raise ServerError(f"nginx config test failed:\n{res.stderr}{res.stdout}")


def nginx_config(workdir: Path, port: int, root: Path, socket_path: Path,
                 workers: int = 2, basic_auth: tuple[str, Mapping[str, str]] | None = None,
                 backend: str = GIT_HTTP_BACKEND,
                 backend_env: Mapping[str, str] | None = None) -> str:
    """nginx.conf for git-http-backend; every path nginx writes is in *workdir*."""
    w = workdir
    (w / "empty").mkdir(exist_ok=True)
    params = _backend_params(root, socket_path, backend, backend_env)
    private = ""
    if basic_auth is not None:
        prefix, users = basic_auth
        (w / "htpasswd").write_text("".join(f"{u}:{{PLAIN}}{p}\n" for u, p in users.items()))
        private = f"""location ~ ^({prefix.rstrip('/')}/.*/(info/refs|git-upload-pack))$ {{
            auth_basic "git";
            auth_basic_user_file {w}/htpasswd;{params}
        }}
        """
    return f"""# generated by bench/peer.py
user root;
daemon off;
master_process on;
worker_processes {workers};
pid {w}/nginx.pid;
error_log {w}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log {w}/access.log;
    client_body_temp_path {w}/client_body;
    proxy_temp_path {w}/proxy;
    fastcgi_temp_path {w}/fastcgi;
    uwsgi_temp_path {w}/uwsgi;
    scgi_temp_path {w}/scgi;
    client_max_body_size 0;
    keepalive_timeout 65;
    server {{
        listen {LOOPBACK}:{port};
        server_name localhost;
        root {w}/empty;
        {private}location ~ (/.*/(info/refs|git-upload-pack))$ {{{params}
        }}
        location / {{ return 404; }}
    }}
}}
"""


def _backend_params(root: Path, socket_path: Path, backend: str = GIT_HTTP_BACKEND,
                    backend_env: Mapping[str, str] | None = None) -> str:
    """The fastcgi lines of a location served by git-http-backend."""
    extra = "".join(f"\n            fastcgi_param {k} {v};"
                    for k, v in (backend_env or {}).items())
    return f"""
            fastcgi_pass unix:{socket_path};
            fastcgi_buffering off;
            fastcgi_read_timeout 600s;
            fastcgi_send_timeout 600s;
            send_timeout 600s;
            fastcgi_param SCRIPT_FILENAME {backend};{extra}
            fastcgi_param GIT_PROJECT_ROOT {root};
            fastcgi_param GIT_HTTP_EXPORT_ALL 1;
            fastcgi_param PATH_INFO $uri;
            fastcgi_param QUERY_STRING $args;
            fastcgi_param REQUEST_METHOD $request_method;
            fastcgi_param CONTENT_TYPE $content_type;
            fastcgi_param CONTENT_LENGTH $content_length;
            fastcgi_param GIT_PROTOCOL $http_git_protocol;
            fastcgi_param HTTP_CONTENT_ENCODING $http_content_encoding;
            fastcgi_param REMOTE_ADDR $remote_addr;
            fastcgi_param SERVER_PROTOCOL $server_protocol;"""


class CommandServer(BenchServer):
    """Any server started as one command; ``{root}``/``{port}``/``{host}`` are
    substituted in *argv*."""

    def __init__(self, root: Path | str, argv: Sequence[str], port: int | None = None, *,
                 name: str, env: Mapping[str, str] | None = None, **kw: object) -> None:
        super().__init__(root, port, name=name, **kw)  # type: ignore[arg-type]
        self.argv_template = list(argv)
        self.extra_env = dict(env or {})

    def argv(self) -> list[str]:
        """The command line with placeholders filled in."""
        subst = {"root": str(self.root), "port": str(self.port), "host": LOOPBACK}
        return [a.format(**subst) for a in self.argv_template]

    def _launch(self) -> list[ServerProcess]:
        return [ServerProcess(self.name, self.argv(), log_path=self.workdir / "server.log",
                              cgroup=self.cgroup, cwd=self.workdir,
                              env=server_env(self.workdir, self.extra_env)).start()]


def find_gitspout_bin() -> Path:
    """Locate the ``gitspout`` console script (current venv, ./.venv, or PATH)."""
    candidates = [Path(sys.executable).parent / "gitspout", REPO_TOP / ".venv/bin/gitspout"]
    found = shutil.which("gitspout")
    if found:
        candidates.append(Path(found))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise ServerError("gitspout executable not found (pip install -e . into the venv); "
                      f"looked at {[str(c) for c in candidates]}")


class Gitspout(CommandServer):
    """``gitspout serve --root DIR --host 127.0.0.1 --port PORT`` in its own cgroup."""

    def __init__(self, root: Path | str, port: int | None = None, *, name: str = "gitspout",
                 gitspout_bin: Path | str | None = None, extra_args: Sequence[str] = (),
                 **kw: object) -> None:
        exe = str(gitspout_bin or find_gitspout_bin())
        argv = [exe, "serve", "--root", "{root}", "--host", "{host}", "--port", "{port}",
                *extra_args]
        super().__init__(root, argv, port, name=name, **kw)  # type: ignore[arg-type]


def make_server(kind: str, root: Path | str, port: int | None = None, *,
                name: str | None = None, **kw: object) -> BenchServer:
    """Factory: *kind* is ``"c-git"`` (git-http-backend) or ``"gitspout"``."""
    if kind == "c-git":
        return GitHttpBackend(root, port, name=name or "c-git", **kw)  # type: ignore[arg-type]
    if kind == "gitspout":
        return Gitspout(root, port, name=name or "gitspout", **kw)  # type: ignore[arg-type]
    raise ValueError(f"unknown server kind {kind!r}")


def main(argv: list[str] | None = None) -> int:
    """CLI: start a server on ROOT, print its URL, serve for a bounded time."""
    ap = argparse.ArgumentParser(description="Run a benchmark git HTTP server on 127.0.0.1")
    ap.add_argument("root", type=Path)
    ap.add_argument("--server", choices=["c-git", "gitspout"], default="c-git")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--serve", type=float, default=600.0, metavar="SECONDS",
                    help="how long to serve before stopping (Ctrl-C stops earlier)")
    args = ap.parse_args(argv)
    exit_on_sigterm()
    with make_server(args.server, args.root, args.port or None) as srv:
        print(f"{srv.name} serving {srv.root} at {srv.url} (pids {srv.pids()}, "
              f"ready in {srv.startup_s:.2f}s)", flush=True)
        try:
            time.sleep(args.serve)
        except KeyboardInterrupt:
            pass
        print(f"cpu_ns={srv.cpu_ns()} memory_max_bytes={srv.memory_max_bytes()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
