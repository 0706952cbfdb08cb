"""Clients that are other programs: isomorphic-git (node) and JGit (the jgit CLI)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from clientbase import TIMEOUT, Client, ClientFailed, Creds, Unsupported, _parse_ls_remote, _run
from gitutil import git_env

ISOGIT_DIR = Path(__file__).resolve().parent / "isogit"
# Debian's jgit-cli 4.11 starts only with these on its class path: its launcher names the
# pgm jar alone, whose manifest leaves out the LFS and Apache HTTP jars Main needs.
JGIT_JARS = ("org.eclipse.jgit.lfs", "org.eclipse.jgit.http.apache", "httpclient", "httpcore",
             "commons-logging", "slf4j-api", "slf4j-nop")


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
        if not shutil.which("jgit") or not shutil.which("java"):
            return "jgit or java not installed (apt-get install jgit-cli; .ci/run does)"
        missing = [j for j in JGIT_JARS if not Path(f"/usr/share/java/{j}.jar").exists()]
        if missing:
            return f"jars jgit needs are missing from /usr/share/java: {missing}"
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
