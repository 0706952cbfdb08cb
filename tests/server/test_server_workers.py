"""``--workers N`` (issue 28; server/app/workers.py, workerstats.py, README "Scaling").

A live master with two workers on 127.0.0.1: connections spread over both (SO_REUSEPORT),
real clones fsck-clean and equal to ``file://``, /metrics counting every request once over
the workers, a worker killed with SIGKILL restarted while the other serves, SIGTERM
draining every worker, SIGHUP reaching every worker, workers leaving with their master.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from gitutil import Committer, Git, LiveServer, fsck, git_env, poll, repo_state, start_server
from netnskit import SlowProxy
from rawhttp import FLUSH, metric_samples, parse_pkts, pkt_lines, post_upload_pack, request

BLOB = 6 << 20  # a clone through SlowProxy at 4 MiB/s is in flight for about a second
INFO_REFS = "/app.git/info/refs?service=git-upload-pack"


@pytest.fixture(scope="module")
def workers_root(tmp_path_factory: pytest.TempPathFactory, git: Git) -> Path:
    root = tmp_path_factory.mktemp("workersroot")
    work = root.parent / f"{root.name}-work"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    c.commit({"big.bin": random.Random(28).randbytes(BLOB)}, "big")
    for i in range(5):
        c.commit({f"f{i}.txt": f"line {i}\n" * (i + 1)}, f"commit {i}")
    git.run("tag", "v1", cwd=work)
    git.run("clone", "-q", "--bare", "--no-local", str(work), str(root / "app.git"))
    git.run("config", "uploadpack.allowFilter", "true", cwd=root / "app.git")
    return root


def _children(pid: int) -> set[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return {int(p) for p in fh.read().split()}
    except OSError:
        return set()


def _info_refs_total(port: int) -> float:
    return sum(v for k, v in metric_samples(port, "gitspout_requests_total").items()
               if 'command="info-refs"' in k)


def _ready(port: int) -> float:
    return metric_samples(port, "gitspout_workers").get('{state="ready"}', 0)


def _start(root: Path, extra: tuple[str, ...] = ()) -> LiveServer:
    srv = start_server(root, ["--workers", "2", *extra])
    assert len(_children(srv.proc.pid)) == 2
    return srv


def _clone_equal(git: Git, srv: LiveServer, tmp: Path, name: str) -> None:
    """A real clone over HTTP, fsck-clean and equal to a ``file://`` clone."""
    dest, ref = tmp / name, tmp / f"{name}-file"
    git.run("clone", "-q", "--bare", f"http://127.0.0.1:{srv.port}/app.git", str(dest))
    git.run("clone", "-q", "--bare", "--no-local", f"file://{srv.root / 'app.git'}", str(ref))
    fsck(git, dest)
    assert repo_state(git, dest) == repo_state(git, ref)


def test_requests_spread_over_workers_and_counted_once(
        workers_root: Path, git: Git, tmp_path: Path) -> None:
    srv = _start(workers_root)
    try:
        before = _info_refs_total(srv.port)
        n = 60
        for _ in range(n):  # a new connection each: the kernel hashes each to a worker
            assert request(srv.port, "GET", INFO_REFS).status == 200
        assert _info_refs_total(srv.port) == before + n  # neither lost nor double-counted
        per = metric_samples(srv.port, "gitspout_worker_requests_total")
        assert len(per) == 2 and all(v > 0 for v in per.values()), per
        assert {f'{{pid="{p}"}}' for p in _children(srv.proc.pid)} == set(per)
        _clone_equal(git, srv, tmp_path, "c1")
        resp = request(srv.port, "GET", "/readyz")
        assert resp.status == 200
    finally:
        srv.stop()


def test_killed_worker_is_restarted_and_its_counts_kept(
        workers_root: Path, git: Git, tmp_path: Path) -> None:
    srv = _start(workers_root)
    try:
        for _ in range(20):
            assert request(srv.port, "GET", INFO_REFS).status == 200
        seen = _info_refs_total(srv.port)  # a scrape: what Prometheus has seen
        assert seen == 20
        old = _children(srv.proc.pid)
        victim = min(old)
        os.kill(victim, signal.SIGKILL)
        srv.wait_for_line(f"(pid {victim}) killed by SIGKILL", 10)
        new = poll(lambda: _children(srv.proc.pid) - old if len(_children(srv.proc.pid)) == 2
                   else set(), 20, "a new worker")
        assert len(new) == 1 and victim not in _children(srv.proc.pid)
        assert poll(lambda: _ready(srv.port) == 2, 20, "two ready workers")
        assert metric_samples(srv.port, "gitspout_worker_restarts_total") == {"": 1}
        assert _info_refs_total(srv.port) == seen  # the dead worker's scraped counts stay
        for _ in range(10):
            assert request(srv.port, "GET", INFO_REFS).status == 200
        assert _info_refs_total(srv.port) == seen + 10
        _clone_equal(git, srv, tmp_path, "after-kill")
    finally:
        srv.stop()


def test_sigterm_drains_every_worker(workers_root: Path, git: Git, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    srv = _start(workers_root, ("--pack-cache-dir", str(cache), "--drain-timeout", "60"))
    pids = _children(srv.proc.pid)
    proxies, clones = [], []
    try:
        for i in range(6):  # six connections, hashed over the two workers
            proxy = SlowProxy("127.0.0.1", srv.port, 4 << 20)
            proxies.append(proxy)
            clones.append(subprocess.Popen(
                ["git", "clone", "-q", "--bare", f"http://127.0.0.1:{proxy.port}/app.git",
                 str(tmp_path / f"slow{i}")], env=git_env(git.home), stderr=subprocess.PIPE))
        poll(lambda: all(p.relayed >= 256 << 10 for p in proxies), 60, "packs in flight")
        srv.proc.send_signal(signal.SIGTERM)
        for clone in clones:
            _out, err = clone.communicate(timeout=120)
            assert clone.returncode == 0, err.decode(errors="replace")
        assert srv.proc.wait(timeout=60) == 0
        lines = srv.wait_for_lines("requests in flight, up to", 2)
        in_flight = [int(re.search(r"draining: (\d+) requests", x).group(1)) for x in lines]
        # Every clone was in flight in one of the two drains (the kernel's hash may put
        # all six on one worker: about 1 run in 32).
        assert len(in_flight) == 2 and sum(in_flight) == 6, in_flight
        srv.wait_for_lines(") drained", 2)
        srv.wait_for_line("all 2 workers stopped")
        assert not any(os.path.exists(f"/proc/{p}") for p in pids)
        assert not list(cache.glob("gitspout-packcache-*"))
    finally:
        for clone in clones:
            clone.kill()
        for proxy in proxies:
            proxy.close()
        srv.stop()
    for i in range(6):
        fsck(git, tmp_path / f"slow{i}")


def test_sighup_reaches_every_worker(workers_root: Path, tmp_path: Path) -> None:
    auth = tmp_path / "auth.toml"
    auth.write_text('[[access]]\nrepos = ["*"]\nanonymous = true\n')
    srv = _start(workers_root, ("--auth-file", str(auth)))
    try:
        srv.proc.send_signal(signal.SIGHUP)
        srv.wait_for_lines("SIGHUP: reloaded the auth file", 2, 10)
        assert srv.alive() and request(srv.port, "GET", INFO_REFS).status == 200
    finally:
        srv.stop()


def test_every_worker_reads_the_auth_file_the_master_last_found_good(
        workers_root: Path, tmp_path: Path) -> None:
    """A worker restarted after the auth file was edited without SIGHUP, or broken, reads
    the master's copy of the last good one: every answer is the same whichever worker
    gives it, and a broken file costs no worker. The next SIGHUP with a good file reaches
    every worker; one with a broken file none. Before, a restarted worker read the file
    as it was on disk: alice's answers went 401 or 200 by worker, and a broken file made
    the restarted worker fail its start over and over."""
    import base64

    import bcrypt

    def rules(*users: str) -> str:
        hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()
        return ("[users]\n" + "".join(f'{u} = "{hashed}"\n' for u in users)
                + "[[access]]\nrepos = [\"*\"]\nusers = [" + ", ".join(f'"{u}"' for u in users)
                + "]\n")

    def statuses(user: str) -> set[int]:
        auth = {"Authorization": "Basic " + base64.b64encode(f"{user}:pw".encode()).decode()}
        return {request(srv.port, "GET", INFO_REFS, auth).status for _ in range(16)}

    def kill_one() -> None:
        old = _children(srv.proc.pid)
        victim = min(old)
        os.kill(victim, signal.SIGKILL)
        srv.wait_for_line(f"(pid {victim}) killed by SIGKILL", 10)
        poll(lambda: len(_children(srv.proc.pid) - old) == 1 and _ready(srv.port) == 2, 30,
             "the worker restarted and ready")

    auth = tmp_path / "auth.toml"
    auth.write_text(rules("alice", "bob"))
    srv = _start(workers_root, ("--auth-file", str(auth)))
    try:
        assert statuses("alice") == {200}
        auth.write_text(rules("bob"))  # edited, no SIGHUP yet
        kill_one()
        assert statuses("alice") == {200} and statuses("bob") == {200}
        auth.write_text("[users\nbroken")
        kill_one()
        assert statuses("alice") == {200}
        assert not [line for line in srv.lines if "Traceback" in line]
        srv.proc.send_signal(signal.SIGHUP)
        srv.wait_for_line("SIGHUP: auth file not reloaded, every worker keeps", 10)
        assert statuses("alice") == {200}
        auth.write_text(rules("bob"))
        srv.proc.send_signal(signal.SIGHUP)
        srv.wait_for_lines("SIGHUP: reloaded the auth file", 2, 10)
        assert statuses("alice") == {401} and statuses("bob") == {200}
    finally:
        srv.stop()


def test_workers_leave_with_their_master(workers_root: Path) -> None:
    srv = _start(workers_root)
    pids = _children(srv.proc.pid)
    srv.proc.kill()
    srv.proc.wait(timeout=10)
    poll(lambda: all(_gone(p) for p in pids), 60, "workers gone with their master")


def _gone(pid: int) -> bool:
    """Exited (a zombie left to whoever reaps orphans counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("value", ["0", "many", "257"])
def test_bad_workers_setting_is_refused(workers_root: Path, value: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "gitspout.server.app.cli", "serve",
                           "--root", str(workers_root), "--port", "0", "--workers", value],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "workers must be" in proc.stderr, proc.stderr


def test_bundles_shared_by_workers(workers_root: Path, git: Git, tmp_path: Path) -> None:
    """--bundles with two workers: clones counted over both write one bundle, in one
    directory; every worker offers it and serves it whole (fresh connections, hashed over
    both workers), and a clone with it is fsck-clean and equal to file://."""
    where = tmp_path / "bundles"
    srv = _start(workers_root, ("--bundles", "--bundle-after", "2", "--bundle-dir", str(where)))
    try:
        body = pkt_lines("command=bundle-uri", "object-format=sha1") + FLUSH

        def listed() -> dict[str, str] | None:
            resp = post_upload_pack(srv.port, body, "app.git", version=2)
            assert resp.status == 200
            out = dict(p.decode().partition("=")[::2] for p in parse_pkts(resp.body) if p)
            return out or None

        assert listed() is None
        for i in range(2):  # two clones: on one worker or on both, they count together
            git.run("clone", "-q", "--bare", f"{srv.url}/app.git", str(tmp_path / f"w{i}"))
        offered = poll(listed, 30, "a bundle offered")
        uri = next(v for k, v in offered.items() if k.endswith(".uri"))
        path = "/" + uri.split("/", 3)[3]
        assert poll(lambda: metric_samples(srv.port, "gitspout_bundles_written_total").get("") == 1,
                    10, "one bundle written")
        before = metric_samples(srv.port, "gitspout_worker_requests_total")
        bodies = set()
        for _ in range(30):  # a new connection each: both workers serve it
            resp = request(srv.port, "GET", path)
            assert resp.status == 200
            bodies.add(resp.body)
            assert listed() == offered
        after = metric_samples(srv.port, "gitspout_worker_requests_total")
        assert len(after) == 2 and all(after[k] > before.get(k, 0) for k in after), after
        assert len(bodies) == 1 and next(iter(bodies)).startswith(b"# v2 git bundle\n")
        assert metric_samples(srv.port, "gitspout_bundle_requests_total")[
            '{result="served"}'] == 30
        dest = tmp_path / "with-bundle"
        git.run("-c", "protocol.version=2", "clone", "-q", "--bare", f"--bundle-uri={srv.url}{path}",
                f"{srv.url}/app.git", str(dest))
        ref = tmp_path / "ref"
        git.run("clone", "-q", "--bare", "--no-local", f"file://{srv.root / 'app.git'}", str(ref))
        fsck(git, dest)
        got = repo_state(git, dest)
        refs = "".join(f"{line}\n" for line in got.refs.splitlines() if " refs/bundles/" not in line)
        assert replace(got, refs=refs) == repo_state(git, ref)
        (shared,) = (where / "gitspout-bundles").iterdir()
        assert len(list(shared.glob("*.bundle"))) == 1
    finally:
        srv.stop()
    assert list((where / "gitspout-bundles").iterdir()) == []  # the master removed it


def test_blob_packs_shared_by_workers(workers_root: Path, git: Git, tmp_path: Path) -> None:
    """--blob-uri-threshold with two workers: the large blob's pack, written by one, is
    served by both (fresh connections), and clones taking it are fsck-clean."""
    where = tmp_path / "blobs"
    srv = _start(workers_root, ("--blob-uri-threshold", "1M", "--bundle-dir", str(where)))
    try:
        for i in range(3):
            dest = tmp_path / f"c{i}"
            git.run("-c", "protocol.version=2", "-c", "fetch.uriprotocols=http", "clone", "-q",
                    "--bare", f"{srv.url}/app.git", str(dest))
            fsck(git, dest)
            assert len(list((dest / "objects" / "pack").glob("*.pack"))) == 2
        assert metric_samples(srv.port, "gitspout_blob_packs_written_total") == {"": 1}
        (shared,) = (where / "gitspout-blobpacks").iterdir()
        (name,) = [p.name for p in shared.glob("*.pack")]
        before = metric_samples(srv.port, "gitspout_worker_requests_total")
        for _ in range(20):
            resp = request(srv.port, "GET", f"/app.git/gitspout-blobpack/{name}")
            assert resp.status == 200 and len(resp.body) > BLOB
        after = metric_samples(srv.port, "gitspout_worker_requests_total")
        assert len(after) == 2 and all(after[k] > before.get(k, 0) for k in after), after
    finally:
        srv.stop()
    assert list((where / "gitspout-blobpacks").iterdir()) == []


def test_auto_counts_affinity_and_cgroup_quota(tmp_path: Path) -> None:
    from gitspout.server.app.workers import usable_cpus

    cpus = len(os.sched_getaffinity(0))
    v2 = tmp_path / "v2"
    (v2 / "pod").mkdir(parents=True)
    (tmp_path / "self2").write_text("0::/pod\n")
    (v2 / "cpu.max").write_text("max 100000\n")
    (v2 / "pod" / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(str(v2), str(tmp_path / "self2")) == cpus
    (v2 / "cpu.max").write_text("50000 100000\n")  # an ancestor's quota counts too
    assert usable_cpus(str(v2), str(tmp_path / "self2")) == 1
    v1 = tmp_path / "v1" / "cpu,cpuacct" / "kube"
    v1.mkdir(parents=True)
    (tmp_path / "self1").write_text("5:memory:/kube\n4:cpu,cpuacct:/kube\n")
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert usable_cpus(str(tmp_path / "v1"), str(tmp_path / "self1")) == cpus
    (v1 / "cpu.cfs_quota_us").write_text("80000\n")
    assert usable_cpus(str(tmp_path / "v1"), str(tmp_path / "self1")) == 1


def test_budgets_are_split_between_workers(workers_root: Path) -> None:
    from gitspout.server.app.config import load_config
    from gitspout.server.app.workers import worker_config

    cfg = load_config({"root": str(workers_root), "cache_memory": "300MiB",
                       "pack_cache_size": "1GiB", "max_connections": "1000", "max_packs": "3",
                       "body_memory": "0"}, env={})
    one = worker_config(cfg, 4, 1234, 0)
    assert one.port == 1234
    assert one.cache_memory * 4 == cfg.cache_memory and one.pack_cache_size * 4 == 1 << 30
    assert one.max_connections == 250 and one.max_packs == 1 and one.body_memory == 0
    assert one.max_open_packs == cfg.max_open_packs and one.threads == cfg.threads


def test_merge_sums_counters_keeps_dead_counters_drops_dead_gauges() -> None:
    from gitspout.server.app.workerstats import merge_expositions

    def text(requests: int, conns: int, start: float) -> str:
        return (f'# TYPE r_total counter\nr_total{{c="x"}} {requests}\n# TYPE g gauge\n'
                f'g {conns}\n# TYPE process_start_time_seconds gauge\n'
                f'process_start_time_seconds {start}\n# TYPE h histogram\n'
                f'h_bucket{{le="1.0"}} {requests}\nh_bucket{{le="+Inf"}} {requests}\n'
                f'h_count {requests}\nh_sum 1.5\n')
    merged = {m.name: {(s.name, tuple(sorted(s.labels.items()))): s.value for s in m.samples}
              for m in merge_expositions([text(3, 2, 100), text(4, 5, 90)], [text(7, 9, 50)])}
    assert merged["r"] == {("r_total", (("c", "x"),)): 14}
    assert merged["g"] == {("g", ()): 7}
    assert merged["process_start_time_seconds"] == {("process_start_time_seconds", ()): 90}
    assert merged["h"][("h_count", ())] == 14 and merged["h"][("h_sum", ())] == 4.5
    assert merged["h"][("h_bucket", (("le", "+Inf"),))] == 14


def _lookups(port: int) -> dict[str, float]:
    return {re.search(r'result="(\w+)"', k).group(1): v
            for k, v in metric_samples(port, "gitspout_pack_cache_lookups_total").items()}


def test_pack_cache_is_shared_one_producer_per_key(
        workers_root: Path, git: Git, tmp_path: Path) -> None:
    """Blobless clones, one then twelve after it, then eight at once with another filter:
    each pack generated once over both workers, read by every clone wherever it landed."""
    srv = _start(workers_root, ("--pack-cache-dir", str(tmp_path / "cache")))
    url = f"http://127.0.0.1:{srv.port}/app.git"
    try:
        def clone(name: str, spec: str) -> subprocess.Popen[bytes]:
            return subprocess.Popen(["git", "clone", "-q", "--bare", f"--filter={spec}", url,
                                     str(tmp_path / name)], env=git_env(git.home),
                                    stderr=subprocess.PIPE)

        def finish(procs: list[subprocess.Popen[bytes]]) -> None:
            for p in procs:
                _out, err = p.communicate(timeout=120)
                assert p.returncode == 0, err.decode(errors="replace")

        finish([clone("first", "blob:none")])
        generated = metric_samples(srv.port, "gitspout_pack_cache_generated_bytes_total")[""]
        for i in range(12):
            finish([clone(f"seq{i}", "blob:none")])
        assert _lookups(srv.port) == {"hit": 12, "miss": 1, "joined": 0, "bypass": 0}
        finish([clone(f"storm{i}", "tree:0") for i in range(8)])
        got = _lookups(srv.port)
        assert got["miss"] == 2 and got["hit"] + got["joined"] == 19 and got["bypass"] == 0
        assert metric_samples(srv.port, "gitspout_pack_cache_generated_bytes_total")[""] > generated
        ref = tmp_path / "file-blobless"
        git.run("clone", "-q", "--bare", "--no-local", "--filter=blob:none",
                f"file://{workers_root / 'app.git'}", str(ref))
        for name in ("first", "seq11", "storm0", "storm7"):
            fsck(git, tmp_path / name)
        assert repo_state(git, tmp_path / "seq11") == repo_state(git, ref)
        # A producer killed: the master removes what it published (nobody else evicts it).
        [shared] = (tmp_path / "cache").glob("gitspout-packcache-*")
        owners = _owners(shared)
        assert len(owners) == 2 and set(owners.values()) <= _children(srv.proc.pid)
        victim = owners[next(iter(owners))]
        os.kill(victim, signal.SIGKILL)
        poll(lambda: victim not in _owners(shared).values(), 20, "the dead worker's packs gone")
        assert len(list(shared.glob("*.pack"))) == len(_owners(shared)) < 2
        finish([clone("after", "blob:none"), clone("after2", "tree:0")])
        fsck(git, tmp_path / "after")
    finally:
        srv.stop()


def test_killed_workers_unfinished_files_are_removed(workers_root: Path, tmp_path: Path) -> None:
    """A worker killed while it produced a pack (an OOM kill) leaves ``KEY.part``, maybe
    ``KEY.meta.PID``, in the shared directory, in nobody's share of --pack-cache-size: the
    master removes them when it reaps the worker; another producer's files stay."""
    import fcntl

    srv = _start(workers_root, ("--pack-cache-dir", str(tmp_path / "cache")))
    try:
        [shared] = (tmp_path / "cache").glob("gitspout-packcache-*")
        victim, other = sorted(_children(srv.proc.pid))

        def plant(key: str, owner: int) -> Path:
            (shared / f"{key * 40}.lock").write_text(f"{owner}\n")
            part = shared / f"{key * 40}.part"
            part.write_bytes(b"\0" * (256 << 10))
            return part

        dead = plant("a", victim)  # the victim's, its lock free: left behind
        claimed = plant("b", victim)  # a producer claimed it since (holds the lock)
        held = os.open(shared / f"{'b' * 40}.lock", os.O_RDWR)
        fcntl.flock(held, fcntl.LOCK_EX)
        others = plant("c", other)  # a live worker's (a whole pack, not published)
        half_meta = shared / f"{'d' * 40}.meta.{victim}"
        half_meta.write_text('{"size": ')
        others_meta = shared / f"{'e' * 40}.meta.{other}"
        others_meta.write_text('{"size": ')
        try:
            os.kill(victim, signal.SIGKILL)
            srv.wait_for_line(f"(pid {victim}) killed by SIGKILL", 10)
            poll(lambda: not dead.exists() and not half_meta.exists(), 10,
                 "the killed worker's unfinished files gone")
            assert claimed.exists() and others.exists() and others_meta.exists()
        finally:
            os.close(held)
    finally:
        srv.stop()


def _disk_bytes(directory: Path) -> int:
    """Bytes of every file under ``directory`` (the pack cache and the closure store)."""
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def test_shared_cache_directory_stays_within_the_size_in_all(git: Git, tmp_path: Path) -> None:
    """Two workers, one --pack-cache-dir of 1.5 MB, clones of six branches of 600 KiB each
    (3.6 MB of packs): each worker keeps half of the size, so the directory (packs,
    metadata, closures) never holds more than the setting, not twice it."""
    root, work = tmp_path / "root", tmp_path / "work"
    git.run("init", "-q", "-b", "b0", str(work))
    c = Committer(git, work)
    rng = random.Random(2)
    for b in range(6):
        if b:
            git.run("switch", "-q", "--orphan", f"b{b}", cwd=work)
        c.commit({f"b{b}.bin": rng.randbytes(600 << 10)}, f"branch {b}")
    git.run("clone", "-q", "--bare", "--no-local", str(work), str(root / "app.git"))
    git.run("--git-dir", str(root / "app.git"), "repack", "-adq", "--write-bitmap-index")
    cap, cache = 1_500_000, tmp_path / "cache"
    srv = _start(root, ("--pack-cache-dir", str(cache), "--pack-cache-size", str(cap)))
    try:
        [shared] = cache.glob("gitspout-packcache-*")
        for b in range(6):
            dest = tmp_path / f"b{b}.git"
            git.run("clone", "--bare", "-q", "--single-branch", "-b", f"b{b}",
                    f"http://127.0.0.1:{srv.port}/app.git", str(dest))
            fsck(git, dest)
            # Its producer has published its pack or was evicted: the disk is settled.
            poll(lambda: not list(shared.glob("*.part")), 20, "no pack being written")
            assert _disk_bytes(cache) <= cap, sorted(
                (f.name, f.stat().st_size) for f in cache.rglob("*") if f.is_file())
        generated = metric_samples(srv.port, "gitspout_pack_cache_generated_bytes_total")[""]
        assert generated > 2 * cap  # the cache was asked to hold more than twice its size
        evicted = metric_samples(srv.port, "gitspout_pack_cache_evictions_total")
        assert evicted['{reason="size"}'] >= 3
        # An evicted pack's lock file goes with it: one was kept per key ever fetched.
        locks, packs = list(shared.glob("*.lock")), list(shared.glob("*.pack"))
        assert {f.stem for f in locks} <= {f.stem for f in packs}, (locks, packs)
        assert metric_samples(srv.port, "gitspout_pack_cache_limit_bytes")[""] <= cap
    finally:
        srv.stop()


def _owners(directory: Path) -> dict[str, int]:
    """The published packs of a shared cache directory and the pid of their producer."""
    import json

    out = {}
    for meta in directory.glob("*.meta"):
        try:
            out[meta.stem] = json.loads(meta.read_text())["pid"]
        except (OSError, ValueError):
            continue
    return out


def _claim_in_child(directory: str, key: bytes, publish: bool) -> tuple[int, int, int]:
    """A forked process claims ``key`` and produces; returns (pid, read end told 'claimed',
    write end that lets it finish): it publishes or dies without publishing."""
    from gitspout.server.app import cacheshare

    told_r, told_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            found = cacheshare.claim(directory, key)
            os.write(told_w, found.kind.encode()[:1])
            os.read(go_r, 1)
            if publish:
                with open(found.part, "wb") as fh:
                    fh.write(b"PACK" + bytes(20))
                cacheshare.publish(directory, key, found.part,
                                   {"size": 24, "objects": 0, "progress": [[0, b"x".hex()]]})
                cacheshare.release(found.lock)
                code = 0
        finally:
            os._exit(code)  # without publish: dies holding the lock, as a killed worker
    os.close(told_w)
    os.close(go_r)
    return pid, told_r, go_w


@pytest.mark.parametrize("publish", [True, False])
def test_one_producer_per_key_across_processes(tmp_path: Path, publish: bool) -> None:
    """The claim protocol between two processes: the second waits while the first holds
    the key; it then adopts what the first published, or learns it died (None)."""
    import asyncio

    from gitspout.server.app import cacheshare

    key = bytes(range(32))
    pid, told, go = _claim_in_child(str(tmp_path), key, publish)
    assert os.read(told, 1) == b"p"  # the child is the producer
    assert cacheshare.claim(str(tmp_path), key).kind == "wait"
    keepalives: list[int] = []

    async def wait() -> dict[str, object] | None:
        async def keepalive() -> None:
            keepalives.append(1)
            if len(keepalives) == 2:
                os.write(go, b"x")  # let the producer finish only once we have waited
        return await cacheshare.wait_for_producer(str(tmp_path), key, 0.05, keepalive)

    meta = asyncio.run(wait())
    os.waitpid(pid, 0)
    assert len(keepalives) >= 2
    if publish:
        assert meta == {"size": 24, "objects": 0, "progress": [[0, "78"]]}
        assert cacheshare.claim(str(tmp_path), key).kind == "adopt"
    else:
        assert meta is None
        part = Path(cacheshare.pack_path(str(tmp_path), key)).with_suffix(".part")
        assert part.exists()  # what the dead producer left, outside every worker's share
        assert cacheshare.forget_producer(str(tmp_path), pid + 1) == 0  # not that one's
        assert cacheshare.forget_producer(str(tmp_path), pid) == 1 and not part.exists()
        assert not part.with_suffix(".lock").exists()  # with its lock file
        again = cacheshare.claim(str(tmp_path), key)  # the dead producer's lock is free
        assert again.kind == "produce" and os.path.getsize(again.part) == 0
        cacheshare.release(again.lock)


def test_metrics_port_answers_for_every_worker(workers_root: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        mport = s.getsockname()[1]
    srv = _start(workers_root, ("--metrics-port", str(mport), "--no-public-metrics"))
    try:
        for _ in range(30):
            assert request(srv.port, "GET", INFO_REFS).status == 200
        assert request(srv.port, "GET", "/metrics").status == 404
        assert _info_refs_total(mport) == 30
        assert metric_samples(mport, "gitspout_workers")['{state="answered"}'] == 2
    finally:
        srv.stop()


def test_port_in_use_stops_the_master(workers_root: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "gitspout.server.app.cli", "serve",
                               "--root", str(workers_root), "--port", str(port),
                               "--workers", "2"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in proc.stderr


def test_a_lock_file_removed_under_its_holder_is_not_shared(tmp_path: Path) -> None:
    """A lock file goes with its key's pack, removed by the process holding it; one that
    opened the old file before the removal must not lock it and produce too."""
    import fcntl

    from gitspout.server.app import cacheshare

    key = bytes(range(32))
    first = cacheshare.claim(str(tmp_path), key)
    assert first.kind == "produce"
    lock = Path(cacheshare.pack_path(str(tmp_path), key)).with_suffix(".lock")
    stale = os.open(lock, os.O_RDWR)  # opened before the removal, locked after it
    try:
        cacheshare.unpublish(first.part, first.lock)  # failed: its files go, lock file too
        assert not lock.exists() and not Path(first.part).exists()
        cacheshare.release(first.lock)
        second = cacheshare.claim(str(tmp_path), key)
        assert second.kind == "produce" and lock.exists()
        fcntl.flock(stale, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the old inode: free, and no lock
        assert cacheshare.claim(str(tmp_path), key).kind == "wait"
        cacheshare.publish(str(tmp_path), key, second.part, {"size": 0})
        cacheshare.release(second.lock)
        assert cacheshare.claim(str(tmp_path), key).kind == "adopt"
        cacheshare.unpublish(cacheshare.pack_path(str(tmp_path), key))  # evicted, lock free
        assert list(tmp_path.iterdir()) == []
    finally:
        os.close(stale)


def _worker_of(port: int, sock: socket.socket) -> int | None:
    """The pid of the worker that accepted ``sock``'s connection (``ss``)."""
    local = sock.getsockname()[1]
    out = subprocess.run(["ss", "-tnpH", "state", "established",
                          f"( sport = :{port} and dport = :{local} )"],
                         capture_output=True, text=True, timeout=10).stdout
    found = re.search(r"pid=(\d+)", out)
    return int(found.group(1)) if found else None


def _fetch_on(sock: socket.socket, repo: str, tip: str) -> bytes:
    """A v2 full fetch of ``tip`` on a kept-alive connection; the response body."""
    body = pkt_lines("command=fetch", "object-format=sha1") + b"0001" + pkt_lines(
        f"want {tip}", "no-progress", "done") + FLUSH
    sock.sendall((f"POST /{repo}/git-upload-pack HTTP/1.1\r\nHost: x\r\n"
                  "Content-Type: application/x-git-upload-pack-request\r\n"
                  f"Git-Protocol: version=2\r\nContent-Length: {len(body)}\r\n\r\n").encode()
                 + body)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    length = re.search(rb"(?i)content-length: (\d+)", head)
    if length:
        while len(rest) < int(length.group(1)):
            rest += sock.recv(1 << 20)
        return rest
    while not rest.endswith(b"\r\n0\r\n\r\n"):  # chunked
        rest += sock.recv(1 << 20)
    return rest


def test_another_workers_evicted_pack_is_produced_again_not_bypassed(
        git: Git, tmp_path: Path) -> None:
    """Worker A reads a pack worker B produced (adopted in A's index); B evicts it for
    size; A's next request for it claims the key again and produces it into the cache.
    Before, A opened the gone file: a warning ("cannot open"), a bypass (the whole pack
    generated again for this request alone) and an entry listed until its TTL; the
    entries gauge counted such entries in every worker that read them."""
    root = tmp_path / "root"
    root.mkdir()
    tips = {}
    for name in ("x.git", "y.git"):
        work = tmp_path / f"w-{name}"
        git.run("init", "-q", "-b", "main", str(work))
        Committer(git, work).commit({"big.bin": random.Random(name).randbytes(1 << 20)}, name)
        git.run("clone", "-q", "--bare", str(work), str(root / name))
        tips[name] = git.out("rev-parse", "main", cwd=work).strip()
    # 3 MiB in all: 1.5 MiB a worker, room for one 1 MiB pack each.
    srv = _start(root, ("--pack-cache-dir", str(tmp_path / "cache"), "--pack-cache-size",
                        str(3 << 20)))
    socks: dict[int, socket.socket] = {}
    try:
        workers = _children(srv.proc.pid)
        for _ in range(200):  # a kept-alive connection to each worker
            if len(socks) == 2:
                break
            sock = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
            pid = poll(lambda s=sock: _worker_of(srv.port, s), 10, "the connection's worker")
            if pid in workers and pid not in socks:
                socks[pid] = sock
            else:
                sock.close()
        assert len(socks) == 2, socks
        b, a = socks.values()
        [shared] = (tmp_path / "cache").glob("gitspout-packcache-*")

        def settled(packs: int) -> None:
            poll(lambda: len(list(shared.glob("*.pack"))) == packs
                 and not list(shared.glob("*.part")), 20, f"{packs} packs in the cache")

        assert b"PACK" in _fetch_on(b, "x.git", tips["x.git"])  # B produces x
        settled(1)
        assert b"PACK" in _fetch_on(a, "x.git", tips["x.git"])  # A reads it
        assert _lookups(srv.port)["hit"] == 1
        assert b"PACK" in _fetch_on(b, "y.git", tips["y.git"])  # B produces y, evicts x
        settled(1)
        assert b"PACK" in _fetch_on(a, "x.git", tips["x.git"])  # A: x again
        settled(2)
        got = _lookups(srv.port)
        assert got["bypass"] == 0 and got["miss"] == 3, got
        assert not [line for line in srv.lines if "cannot open" in line]
        entries = metric_samples(srv.port, "gitspout_pack_cache_entries")[""]
        assert entries == len(list(shared.glob("*.pack"))) == 2
    finally:
        for sock in socks.values():
            sock.close()
        srv.stop()
