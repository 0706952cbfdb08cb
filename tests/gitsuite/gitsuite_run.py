"""Run C git's own HTTP fetch tests against stock git-http-backend and against gitspout.

``make test-git-suite GIT_SRC=DIR`` (docs/git-test-suite.md). Given a git source tree, this
builds it, then runs each chosen test script twice, one after the other: once as git ships
it (Apache and git-http-backend), once with the upload-pack requests proxied by the same
Apache to a gitspout of this checkout (gitsuite_apache.py). It prints, per script, the
tests run and the failures of each run, and the tests that fail only with gitspout.

git's HTTP tests refuse to run as root: as root, this creates a system user (``gitsuite``),
gives it the source tree, and runs the build and the tests as that user; gitspout runs as
the caller (it reads the tests' repositories, it writes nothing there).
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gitsuite_apache import proxy_conf, wrapper_script  # noqa: E402
from gitsuite_spout import SpoutKeeper  # noqa: E402
from gitsuite_tap import (  # noqa: E402
    ScriptResult,
    compare,
    format_report,
    parse_tap,
    verbose_section,
)

# The scripts of issue 26: git's HTTP fetch tests that reach upload-pack through Apache.
# (t5555, t5562 and t5704 call git-http-backend directly, with no web server to proxy.)
DEFAULT_SCRIPTS = ("t5551 t5559 t5702 t5616 t5537 t5539 t5558 t5703 t5700 t0410 t0611 "
                   "t5500 t5510 t5601 t5620 t5812 t5549 t5561 t5581 t5564").split()
MODES = ("stock", "gitspout")
# Debian packages to build git with HTTP support and to run its HTTP tests.
PACKAGES = ("make", "gcc", "libcurl4-openssl-dev", "libexpat1-dev", "zlib1g-dev",
            "libssl-dev", "gettext", "apache2", "curl")
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Setup:
    """Where things are and who runs them, for one invocation."""

    src: Path
    out: Path
    user: pwd.struct_passwd | None  # None: run the tests as the caller (not root)
    httpd: str
    protocol: str | None
    timeout: float
    gitspout_args: tuple[str, ...]

    def as_user(self, cmd: Sequence[str]) -> list[str]:
        """``cmd`` run as the test user (``setpriv`` keeps the environment we pass)."""
        if self.user is None:
            return list(cmd)
        return ["setpriv", f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}",
                "--init-groups", "--", *cmd]

    def give(self, path: Path) -> None:
        """Make ``path`` (a directory we created) the test user's."""
        if self.user is not None:
            os.chown(path, self.user.pw_uid, self.user.pw_gid)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--git-src", required=True, help="git source tree (a release tag)")
    p.add_argument("--out", help="runs, logs and the report (default: GIT_SRC/gitspout-suite, "
                                 "-v0 added with --protocol-version 0)")
    p.add_argument("--scripts", default=" ".join(DEFAULT_SCRIPTS),
                   help="test scripts by number or name, space or comma separated; "
                        "'all-http': every script that starts Apache")
    p.add_argument("--modes", default=",".join(MODES), help="stock, gitspout or both")
    p.add_argument("--protocol-version", default=os.environ.get("GIT_TEST_PROTOCOL_VERSION"),
                   help="GIT_TEST_PROTOCOL_VERSION for the tests (0, 1 or 2; default: "
                        "the environment's, else git's default, v2)")
    p.add_argument("--user", default="gitsuite", help="test user when run as root")
    p.add_argument("--jobs", type=int, default=2, help="make -j for git's build")
    p.add_argument("--make-args", default="NO_RUST=YesPlease",
                   help="extra make arguments for git's build")
    p.add_argument("--no-build", action="store_true", help="use the tree as built")
    p.add_argument("--no-apt", action="store_true", help="never apt-get install")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per script run")
    p.add_argument("--gitspout-arg", action="append", default=[],
                   help="extra argument to gitspout serve (repeatable)")
    p.add_argument("--report-only", action="store_true",
                   help="print the report of the results already in --out")
    p.add_argument("--show", metavar="tNNNN.N",
                   help="print one test's verbose log from each run in --out, and the "
                        "gitspout log's warnings and errors for its script")
    return p.parse_args(argv)


def ensure_packages() -> None:
    """apt-get install what git's build and HTTP tests need and is missing (as root)."""
    def have(pkg: str) -> bool:
        return subprocess.run(["dpkg", "-s", pkg], capture_output=True).returncode == 0

    missing = [p for p in PACKAGES if not have(p)]
    if "libcurl4-openssl-dev" in missing and have("libcurl4-gnutls-dev"):
        missing.remove("libcurl4-openssl-dev")
    if not missing:
        return
    print(f"apt-get install {' '.join(missing)}", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
                   check=True, env=env, stdout=subprocess.DEVNULL)


def ensure_user(name: str) -> pwd.struct_passwd:
    """The test user, created (a system user with no login and no home) if missing."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--user-group", "--home-dir", "/nonexistent",
                        "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
        return pwd.getpwnam(name)


def find_httpd() -> str:
    """Apache, where t/lib-httpd.sh looks for it first."""
    for path in ("/usr/sbin/httpd", "/usr/sbin/apache2", shutil.which("httpd"),
                 shutil.which("apache2")):
        if path and os.access(path, os.X_OK):
            return path
    sys.exit("no Apache found (Debian: apt-get install apache2)")


def build(setup: Setup, jobs: int, make_args: str) -> float:
    """``make`` git's tree as the test user; returns the seconds it took."""
    if setup.user is not None:
        subprocess.run(["chown", "-R", f"{setup.user.pw_uid}:{setup.user.pw_gid}",
                        str(setup.src)], check=True)
    log = setup.out / "build.log"
    start = time.monotonic()
    with log.open("wb") as f:
        rc = subprocess.run(setup.as_user(["make", f"-j{jobs}", *make_args.split()]),
                            cwd=setup.src, stdout=f, stderr=subprocess.STDOUT,
                            env=clean_env(setup)).returncode
    if rc != 0:
        sys.stdout.write(log.read_text(errors="replace")[-4000:])
        sys.exit(f"git's build failed (make exited {rc}); log: {log}")
    return time.monotonic() - start


def resolve_scripts(tdir: Path, spec: str) -> list[Path]:
    """Test script paths from numbers ("t5551"), names, or "all-http"."""
    if spec.strip() == "all-http":
        return http_scripts(tdir)
    scripts = []
    for word in spec.replace(",", " ").split():
        matches = sorted(tdir.glob(f"{word.removesuffix('.sh')}*.sh"))
        if len(matches) != 1:
            sys.exit(f"test script {word!r}: {len(matches)} matches in {tdir}")
        scripts.append(matches[0])
    return scripts


def http_scripts(tdir: Path) -> list[Path]:
    """Every script that starts Apache: those that source lib-httpd.sh, and those that
    source such a script (t5559 is t5551 over HTTP/2: ". ./t5551-http-fetch-smart.sh")."""
    texts = {p: p.read_text(errors="replace") for p in tdir.glob("t[0-9]*.sh")}
    found = {p for p, text in texts.items() if "lib-httpd.sh" in text}
    for p, text in texts.items():
        if any(f". ./{q.name}" in text for q in found):
            found.add(p)
    return sorted(found)


def clean_env(setup: Setup) -> dict[str, str]:
    """A clean environment for git's build and tests (the caller's may hold anything)."""
    env = {"PATH": BASE_PATH, "LANG": "C.UTF-8", "TERM": "dumb", "HOME": str(setup.out)}
    if setup.user is not None:
        env |= {"USER": setup.user.pw_name, "LOGNAME": setup.user.pw_name}
    return env


def run_script(setup: Setup, script: Path, mode: str) -> ScriptResult:
    """Run one test script in one mode; its TAP is kept in OUT/MODE/tap/NAME.tap."""
    name = script.name.removesuffix(".sh")
    mode_dir = setup.out / mode
    env = clean_env(setup) | {"TEST_OUTPUT_DIRECTORY": str(mode_dir), "GIT_TEST_HTTPD": "true"}
    if setup.protocol:
        env["GIT_TEST_PROTOCOL_VERSION"] = setup.protocol
    tap = mode_dir / "tap" / f"{name}.tap"
    start = time.monotonic()
    if mode == "gitspout":
        rendezvous = setup.out / "rendezvous" / name
        shutil.rmtree(rendezvous, ignore_errors=True)
        rendezvous.mkdir(parents=True)
        setup.give(rendezvous)
        env |= {"LIB_HTTPD_PATH": str(setup.out / "bin" / "httpd"),
                "GITSPOUT_SUITE_DIR": str(rendezvous)}
        log = setup.out / "gitspout-logs" / f"{name}.log"
        log.unlink(missing_ok=True)
        with SpoutKeeper(rendezvous, log, setup.out / "gitspout-cache",
                         setup.gitspout_args):
            rc = _run_tap(setup, script, env, tap)
    else:
        rc = _run_tap(setup, script, env, tap)
    _stop_stray_apache(mode_dir / f"trash directory.{name}" / "httpd" / "httpd.pid")
    with tap.open(errors="replace") as f:
        result = parse_tap(name, f)
    result.exit_code, result.seconds = rc, time.monotonic() - start
    return result


def _run_tap(setup: Setup, script: Path, env: dict[str, str], tap: Path) -> int:
    """The script's exit code (-9 on timeout); its stdout and stderr go to ``tap``."""
    with tap.open("wb") as f:
        proc = subprocess.Popen(setup.as_user(["/bin/sh", script.name, "--verbose-log"]),
                                cwd=script.parent, env=env, stdout=f,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            return proc.wait(timeout=setup.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            f.write(f"\n# gitsuite: killed after {setup.timeout:.0f}s\n".encode())
            return -9


def _stop_stray_apache(pidfile: Path) -> None:
    """A script killed mid-way leaves its Apache (a daemon in its own session) running."""
    try:
        pid = int(pidfile.read_text().strip())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        pass


def check_access(setup: Setup) -> None:
    """The test user must reach the source tree and the output directory (a tree under
    /root, for one, it cannot)."""
    if setup.user is None:
        return
    for test, path in (("-x", setup.src), ("-w", setup.out)):
        probe = subprocess.run(setup.as_user(["test", test, str(path)]), env=clean_env(setup))
        if probe.returncode != 0:
            sys.exit(f"user {setup.user.pw_name} cannot reach {path}: choose a GIT_SRC (and "
                     "--out) outside directories only root can enter")


def prepare_out(setup: Setup, modes: Sequence[str]) -> None:
    """Fresh run directories, owned by the test user where the tests write."""
    setup.out.mkdir(parents=True, exist_ok=True)
    setup.give(setup.out)
    for mode in modes:
        shutil.rmtree(setup.out / mode, ignore_errors=True)
        (setup.out / mode / "tap").mkdir(parents=True)
        setup.give(setup.out / mode)
    for sub in ("bin", "rendezvous", "gitspout-logs"):
        (setup.out / sub).mkdir(exist_ok=True)
        setup.give(setup.out / sub)
    bridge = setup.out / "bin" / "one-time-bridge.sh"
    shutil.copyfile(Path(__file__).with_name("one-time-bridge.sh"), bridge)
    bridge.chmod(0o755)
    conf = setup.out / "bin" / "gitspout-proxy.conf"
    conf.write_text(proxy_conf(str(bridge)))
    wrapper = setup.out / "bin" / "httpd"
    wrapper.write_text(wrapper_script(setup.httpd, str(conf)))
    wrapper.chmod(0o755)


def save(out: Path, results: dict[str, dict[str, ScriptResult]], meta: dict[str, object]) -> None:
    data = {"meta": meta, "results": {mode: {name: r.to_json() for name, r in runs.items()}
                                      for mode, runs in results.items()}}
    tmp = out / ".results.json.tmp"
    tmp.write_text(json.dumps(data, indent=1))
    tmp.rename(out / "results.json")


def load(out: Path) -> tuple[dict[str, dict[str, ScriptResult]], dict[str, object]]:
    if not (out / "results.json").is_file():
        sys.exit(f"no results in {out} (run without --report-only first)")
    data = json.loads((out / "results.json").read_text())
    results = {mode: {name: ScriptResult.from_json(r) for name, r in runs.items()}
               for mode, runs in data["results"].items()}
    return results, data["meta"]


def report(results: dict[str, dict[str, ScriptResult]], meta: dict[str, object]) -> str:
    modes = [m for m in MODES if m in results]
    names = list(dict.fromkeys(n for m in modes for n in results[m]))
    rows = [compare(results.get("stock", {}).get(n), results.get("gitspout", {}).get(n))
            for n in names]
    head = [f"git {meta.get('git')}, protocol {meta.get('protocol') or 'default (v2)'}, "
            f"modes {', '.join(modes)}"]
    for key in ("build_seconds", "run_seconds"):
        if key in meta:
            head.append(f"{key.replace('_', ' ')}: {float(str(meta[key])):.0f}")
    return "\n".join(head) + "\n\n" + format_report(rows, modes)


def show(tdir: Path, out: Path, which: str) -> int:
    """Print test ``tNNNN.N``'s section of each mode's verbose log, then what the gitspout
    log of that script says at warning level and above (its JSON request lines excepted)."""
    number, _, test = which.partition(".")
    name = resolve_scripts(tdir, number)[0].name.removesuffix(".sh")
    for mode in MODES:
        path = out / mode / "test-results" / f"{name}.out"
        if path.is_file():
            with path.open(errors="replace") as f:
                print(f"==== {mode}: {path}", *verbose_section(f, int(test)), sep="\n")
    log = out / "gitspout-logs" / f"{name}.log"
    if log.is_file():
        print(f"==== gitspout log: {log}")
        with log.open(errors="replace") as f:
            print(*(line.rstrip() for line in f if not line.startswith("{")), sep="\n")
    return 0


def progress(i: int, n: int, result: ScriptResult, mode: str) -> None:
    fails = ",".join(str(t.number) for t in result.failures) or "none"
    state = " ABORTED" if result.aborted and result.skip_all is None else ""
    print(f"[{i}/{n}] {result.script:<36} {mode:<8} {result.ran:>4} ran, failed: {fails} "
          f"({result.seconds:.0f}s){state}", flush=True)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    src = Path(args.git_src).resolve()
    suffix = f"-v{args.protocol_version}" if args.protocol_version not in (None, "") else ""
    out = Path(args.out).resolve() if args.out else src / f"gitspout-suite{suffix}"
    if args.report_only:
        print(report(*load(out)), end="")
        return 0
    if args.show:
        return show(src / "t", out, args.show)
    if not (src / "t" / "lib-httpd.sh").is_file():
        sys.exit(f"{src} is not a git source tree (no t/lib-httpd.sh)")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        sys.exit(f"--modes: {args.modes!r} (stock, gitspout)")
    root = os.geteuid() == 0
    if root and not args.no_apt:
        ensure_packages()
    setup = Setup(src, out, ensure_user(args.user) if root else None, find_httpd(),
                  args.protocol_version or None, args.timeout, tuple(args.gitspout_arg))
    prepare_out(setup, modes)
    check_access(setup)
    meta: dict[str, object] = {"git": src.name, "protocol": setup.protocol}
    if not args.no_build:
        meta["build_seconds"] = round(build(setup, args.jobs, args.make_args), 1)
        print(f"built git in {meta['build_seconds']}s", flush=True)
    scripts = resolve_scripts(src / "t", args.scripts)
    results: dict[str, dict[str, ScriptResult]] = {m: {} for m in modes}
    start = time.monotonic()
    for i, script in enumerate(scripts, 1):
        for mode in modes:
            result = run_script(setup, script, mode)
            results[mode][result.script] = result
            progress(i, len(scripts), result, mode)
            meta["run_seconds"] = round(time.monotonic() - start, 1)
            save(out, results, meta)
    text = report(results, meta)
    (out / "report.md").write_text(text)
    print("\n" + text, end="")
    print(f"\nreport: {out / 'report.md'}; TAP: {out}/<mode>/tap; verbose logs and the trash "
          f"of failed scripts: {out}/<mode>/; gitspout logs: {out / 'gitspout-logs'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
