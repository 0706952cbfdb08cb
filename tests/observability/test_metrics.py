"""/metrics and the JSON access log of a live gitspout, after real git traffic; the
deploy/ artefacts (rules, example config, Grafana dashboard) against a live scrape.

Every server here is dedicated to one test, so counter deltas are exact."""

from __future__ import annotations

import json
import random
import re
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from gitutil import Git
from obsutil import (
    REPO,
    CountingProxy,
    check_name,
    dashboard_exprs,
    delta,
    free_port,
    label_values_metric,
    make_root,
    metric_names,
    object_count,
    push_commit,
    samples,
    scrape,
    start_captured,
    total,
    value,
    wait_idle,
)
from promutil import DASHBOARD, PROM_CONFIG, RULES, promtool, read_rules

UP = "git-upload-pack"
# Series Prometheus makes itself for every target (not in any scrape).
SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
# What the issue asks the dashboard to show.
DASHBOARD_MUST_USE = {
    "gitspout_requests_total", "gitspout_request_duration_seconds_bucket",
    "gitspout_response_bytes_total", "gitspout_response_write_calls_sum",
    "gitspout_response_write_calls_count", "gitspout_fs_operations_total",
    "gitspout_pack_dir_rescans_total", "gitspout_pack_objects_total", "gitspout_pack_bytes_total",
    "gitspout_requests_in_flight", "gitspout_thread_pool_queue_length",
    "gitspout_cache_lookups_total",
}


def _requests(d: dict) -> dict[tuple[str, str, str], float]:
    """gitspout_requests_total deltas as {(protocol, command, status): n}."""
    out = {}
    for (name, labels), n in d.items():
        if name == "gitspout_requests_total":
            lab = dict(labels)
            assert lab["service"] == UP
            out[(lab["protocol"], lab["command"], lab["status"])] = n
    return out


@pytest.fixture(scope="module")
def traffic_scrape(tmp_path_factory: pytest.TempPathFactory, obs_template: Path, git: Git) -> str:
    """A scrape after a v2 clone, a v2 and a v0 ls-remote, a v0 clone and an incremental
    fetch (haves, a second pack), so that every labelled series exists."""
    tmp = tmp_path_factory.mktemp("traffic")
    root = make_root(tmp / "served", obs_template)
    srv = start_captured(root, ["--metrics-repos", REPO])
    try:
        url = f"{srv.url}/{REPO}"
        git.run("clone", "-q", url, str(tmp / "c2"))
        git.run("ls-remote", url)
        git.run("-c", "protocol.version=0", "ls-remote", url)
        git.run("-c", "protocol.version=0", "clone", "-q", url, str(tmp / "c0"))
        push_commit(git, root / REPO, tmp / "pusher", "one")
        git.run("fetch", "-q", "origin", cwd=tmp / "c2")
        wait_idle(srv.url)
        return scrape(srv.url)
    finally:
        srv.stop()


def test_promtool_check_metrics_on_live_scrape(traffic_scrape: str) -> None:
    assert 'command="fetch"' in traffic_scrape and 'command="ls-refs"' in traffic_scrape
    proc = promtool("check", "metrics", stdin=traffic_scrape.encode())
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), (
        proc.stdout.decode() + proc.stderr.decode())


def test_every_labelled_series_exists_after_traffic(traffic_scrape: str) -> None:
    names = {line.split("{")[0].split(" ")[0] for line in traffic_scrape.splitlines()
             if line and not line.startswith("#")}
    for name in ("gitspout_requests_total", "gitspout_request_duration_seconds_bucket",
                 "gitspout_phase_duration_seconds_bucket", "gitspout_requests_in_flight",
                 "gitspout_response_bytes_total", "gitspout_response_write_calls_bucket",
                 "gitspout_fs_operations_total", "gitspout_pack_dir_rescans_total",
                 "gitspout_pack_objects_total", "gitspout_pack_bytes_total",
                 "gitspout_negotiation_haves_bucket", "gitspout_cache_lookups_total",
                 "gitspout_thread_pool_queue_length", "gitspout_thread_pool_threads",
                 "gitspout_process_read_syscalls_total", "gitspout_process_write_syscalls_total",
                 "gitspout_repo_requests_total"):
        assert name in names, name
    for needle in ('command="info-refs",protocol="2"', 'command="info-refs",protocol="0"',
                   'command="fetch",protocol="0"', 'source="generated"', 'source="verbatim"',
                   'cache="listings"', 'cache="objects"', 'cache="object_sets"',
                   'cache="advertisements"', 'kind="stat"', f'repo="{REPO}"'):
        assert needle in traffic_scrape, needle
    assert 'repo="other.git"' not in traffic_scrape


def _used_names() -> dict[str, set[str]]:
    """Metric name -> where it is used, over the dashboard (every expr and every variable
    query) and the rules; recording-rule names are left out (the rules define them)."""
    used: dict[str, set[str]] = {}
    dash = json.loads(DASHBOARD.read_text())
    for title, ref, expr in dashboard_exprs(dash):
        for n in metric_names(expr):
            used.setdefault(n, set()).add(f"dashboard {title!r} {ref}")
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            for n in label_values_metric(q):
                used.setdefault(n, set()).add(f"dashboard variable {var['name']}")
    rules = read_rules()
    recorded = {r.name for r in rules if r.kind == "record"}
    for r in rules:
        for n in metric_names(r.expr):
            if n not in recorded:
                used.setdefault(n, set()).add(f"rule {r.name}")
    return used


def test_metric_name_extraction() -> None:
    assert metric_names(
        'histogram_quantile(0.99, sum by (le, command) (rate(a_bucket{job=~"$job", '
        'x="y{z}"}[$__rate_interval]))) / ignoring(kind) group_left sum(b_total offset 5m) '
        'or vector(0) > bool 1 and on (job) c:rec:rate5m unless up == 0') == {
            "a_bucket", "b_total", "c:rec:rate5m", "up"}
    assert label_values_metric('label_values(gitspout_requests_total{job=~"$job"}, instance)') \
        == {"gitspout_requests_total"}
    assert check_name("x_total", "# TYPE x counter\nx_total 1\n") is None
    assert check_name("x_bucket", "# TYPE x counter\nx_total 1\n") is not None
    assert check_name("x_count", "# TYPE x_count counter\nx_count_total 1\n") is not None
    histogram = '# TYPE h histogram\nh_bucket{le="+Inf"} 1\nh_count 1\nh_sum 1\n'
    assert check_name("h_count", histogram) is None


def test_dashboard_and_rules_use_only_live_metric_names(traffic_scrape: str) -> None:
    used = _used_names()
    assert DASHBOARD_MUST_USE <= set(used), DASHBOARD_MUST_USE - set(used)
    problems = [f"{why} (used in {sorted(used[n])})" for n in sorted(used)
                if n not in SYNTHETIC and (why := check_name(n, traffic_scrape))]
    assert not problems, "\n".join(problems)


def test_dashboard_is_importable_json() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 30 and dash.get("id") is None
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = []

    def walk(panels: list) -> None:
        for p in panels:
            ids.append(p["id"])
            pos = p["gridPos"]
            assert set(pos) == {"h", "w", "x", "y"} and pos["x"] + pos["w"] <= 24
            if p["type"] != "row":
                assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
                assert p["targets"], p["title"]
            for t in p.get("targets", []):
                assert t["datasource"]["uid"] == "${datasource}" and t["refId"]
                assert '=~"$job"' in t["expr"] and '=~"$instance"' in t["expr"], t["expr"]
            walk(p.get("panels", []))

    walk(dash["panels"])
    assert len(ids) == len(set(ids))
    exprs = [e for _, _, e in dashboard_exprs(dash)]
    for q in ("0.5", "0.95", "0.99"):
        assert any(e.startswith(f"histogram_quantile({q}, sum by (le, command) (rate("
                                "gitspout_request_duration_seconds_bucket") for e in exprs), q


def test_promtool_check_rules() -> None:
    proc = promtool("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    rules = read_rules()
    assert len(rules) == int(re.search(rb"SUCCESS: (\d+) rules", proc.stdout).group(1))
    alerts = {r.name: r for r in rules if r.kind == "alert"}
    assert all(r.expr for r in rules)
    assert all(r.for_ for r in alerts.values())
    text = RULES.read_text()
    assert text.count("severity:") == len(alerts) and text.count("summary:") == len(alerts)


def test_promtool_rule_unit_tests() -> None:
    """The alerts fire on the series they are about, after their for: (rules_test.yml)."""
    proc = promtool("test", "rules", str(Path(__file__).parent / "rules_test.yml"))
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def test_promtool_check_example_config() -> None:
    proc = promtool("check", "config", str(PROM_CONFIG))
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


@pytest.mark.parametrize("version", ["2", "1", "0"])
def test_one_clone_counts_exactly(version: str, obs_root: Path, start_server, git: Git,
                                  tmp_path: Path) -> None:
    srv = start_server(obs_root, "--metrics-repos", REPO)
    proxy = CountingProxy(srv.port)
    try:
        before = wait_idle(srv.url)
        clone = tmp_path / "clone"
        git.run("-c", f"protocol.version={version}", "clone", "-q", f"{proxy.url}/{REPO}",
                str(clone))
        proxy.wait_closed()
        after = wait_idle(srv.url)
    finally:
        proxy.stop()
    d = delta(before, after)
    commands = ["info-refs", "ls-refs", "fetch"] if version == "2" else ["info-refs", "fetch"]
    assert _requests(d) == {(version, c, "200"): 1 for c in commands}
    assert [ex.command for ex in proxy.exchanges] == commands
    assert all(ex.status == 200 for ex in proxy.exchanges)
    for c in commands:
        key = {"service": UP, "protocol": version, "command": c}
        # the body bytes the client received, per command, as counted by the proxy
        assert d[("gitspout_response_bytes_total", frozenset(key.items()))] == \
            proxy.bytes_by_command()[c], c
        assert d[("gitspout_request_duration_seconds_count",
                  frozenset({"service": UP, "command": c}.items()))] == 1
        assert d[("gitspout_response_write_calls_count", frozenset({"command": c}.items()))] == 1
    objects = "gitspout_pack_objects_total"
    sent = total(after, objects) - total(before, objects)
    assert sent == object_count(git, clone)
    assert value(after, "gitspout_repo_requests_total", repo=REPO, command="fetch") == 1
    syscalls = value(after, "gitspout_process_write_syscalls_total") - \
        value(before, "gitspout_process_write_syscalls_total")
    assert syscalls >= total(after, "gitspout_response_write_calls_sum") - \
        total(before, "gitspout_response_write_calls_sum") > 0
    assert value(after, "gitspout_requests_in_flight") == 0


def test_ls_remote_counts_no_fetch(obs_root: Path, start_server, git: Git) -> None:
    srv = start_server(obs_root)
    before = wait_idle(srv.url)
    git.run("ls-remote", f"{srv.url}/{REPO}")
    git.run("-c", "protocol.version=0", "ls-remote", f"{srv.url}/other.git")
    d = delta(before, wait_idle(srv.url))
    assert _requests(d) == {("2", "info-refs", "200"): 1, ("2", "ls-refs", "200"): 1,
                            ("0", "info-refs", "200"): 1}
    assert not any(n == "gitspout_repo_requests_total" for n, _ in d)  # no --metrics-repos


def test_access_log_line_per_request(obs_root: Path, start_server, git: Git,
                                     tmp_path: Path) -> None:
    secret = "s3cr3t-Bearer-token-b7e1"
    cookie = "session=c00kie-9f2a"
    srv = start_server(obs_root)
    proxy = CountingProxy(srv.port)
    try:
        wait_idle(srv.url)
        clone = tmp_path / "clone"
        git.run("-c", f"http.extraHeader=Authorization: Bearer {secret}",
                "-c", f"http.extraHeader=Cookie: {cookie}",
                "clone", "-q", f"http://user:pa55word@127.0.0.1:{proxy.port}/{REPO}", str(clone))
        git.run("-c", "protocol.version=0", "-c", f"http.extraHeader=Authorization: Basic {secret}",
                "ls-remote", f"{proxy.url}/{REPO}")
        proxy.wait_closed()
        scrape_text = scrape(srv.url)
        wait_idle(srv.url)
    finally:
        proxy.stop()
    lines = srv.access_log()
    assert [(x["command"], x["protocol"]) for x in lines] == \
        [("info-refs", "2"), ("ls-refs", "2"), ("fetch", "2"), ("info-refs", "0")]
    version = git.out("version").split()[-1]
    for line, ex in zip(lines, proxy.exchanges, strict=True):
        assert set(line) >= {"ts", "request_id", "repo", "service", "protocol", "command",
                             "status", "bytes", "writes", "objects", "haves", "pack_source",
                             "duration_ms", "phases_ms", "fs_ops", "agent"}, line
        assert re.fullmatch(r"[0-9a-f]{16}", line["request_id"])
        assert line["repo"] == REPO and line["service"] == UP
        assert line["status"] == ex.status == 200
        assert line["bytes"] == ex.body_bytes > 0  # what the client received
        assert isinstance(line["duration_ms"], float) and line["duration_ms"] > 0
        assert all(isinstance(v, float) and 0 <= v <= line["duration_ms"]
                   for v in line["phases_ms"].values()), line
        if line["command"] != "info-refs":
            assert line["agent"] == f"git/{version}", line
    assert len({x["request_id"] for x in lines}) == len(lines)
    fetch = lines[2]
    assert fetch["objects"] == object_count(git, clone) > 0
    assert {"negotiate", "enumerate", "pack", "send"} <= set(fetch["phases_ms"])
    assert lines[0]["objects"] == lines[1]["objects"] == 0
    assert "advertise" in lines[0]["phases_ms"]
    everything = "\n".join(srv.lines) + scrape_text
    for leaked in (secret, "c00kie", "pa55word", "Authorization", "Bearer"):
        assert leaked not in everything, leaked
    # /metrics scrapes are not requests: no log line, no counter
    assert len(lines) == 4


def test_metrics_port_serves_metrics_only(obs_root: Path, start_server, git: Git) -> None:
    port = free_port()
    srv = start_server(obs_root, "--metrics-port", str(port))
    git.run("ls-remote", f"{srv.url}/{REPO}")
    wait_idle(srv.url)
    text = scrape(f"http://127.0.0.1:{port}")
    assert 'gitspout_requests_total{command="ls-refs",protocol="2"' in text
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/{REPO}/info/refs?service={UP}", timeout=5)
    assert exc.value.code == 404


def test_internal_error_is_counted_as_5xx(obs_root: Path, start_server, git: Git,
                                          tmp_path: Path) -> None:
    repo = obs_root / REPO
    for idx in (repo / "objects" / "pack").glob("*.idx"):
        idx.write_bytes(idx.read_bytes()[:100])  # a truncated pack index
    srv = start_server(obs_root)
    proxy = CountingProxy(srv.port)
    try:
        proc = git.run("clone", "-q", f"{proxy.url}/{REPO}", str(tmp_path / "c"), check=False)
        proxy.wait_closed()
        after = wait_idle(srv.url)
    finally:
        proxy.stop()
    assert proc.returncode != 0
    # A truncated index is a storage fault: the fetch is answered 500 (before the 200),
    # counted as such, and as a storage fault of kind idx.
    failed = [ex.command for ex in proxy.exchanges if ex.status == 500]
    assert failed == ["fetch"], proxy.exchanges
    assert value(after, "gitspout_requests_total", service=UP, protocol="2", command="fetch",
                 status="500") == 1
    assert value(after, "gitspout_storage_faults_total", kind="idx", outcome="failed") == 1
    assert value(after, "gitspout_storage_faults_total", kind="idx", outcome="fallback") == 1


def _pkt(payload: bytes) -> bytes:
    return b"%04x" % (len(payload) + 4) + payload


def test_pool_busy_gauge_counts_pack_streaming(tmp_path: Path, start_server, git: Git) -> None:
    """The pack is produced in the server's thread pool, step by step while it streams: the
    pool gauges must see that work (it once went to the executor past them). Loose random
    blobs make each step slow (inflated, then deflated again for the pack), so a scrape
    taken while the body arrives finds a pool thread busy."""
    repo = tmp_path / "served" / "big.git"
    git.run("init", "-q", "--bare", "-b", "main", str(repo))
    rng = random.Random(20240917)
    entries = []
    for i in range(6):
        blob = tmp_path / f"blob{i}"
        blob.write_bytes(rng.randbytes(4 << 20))
        oid = git.out("--git-dir", str(repo), "hash-object", "-w", str(blob)).strip()
        entries.append(f"100644 blob {oid}\tb{i}.bin\n")
    tree = git.out("--git-dir", str(repo), "mktree", input="".join(entries).encode()).strip()
    env = {"GIT_AUTHOR_DATE": "1600000000 +0000", "GIT_COMMITTER_DATE": "1600000000 +0000"}
    commit = git.out("--git-dir", str(repo), "commit-tree", tree, "-m", "big", env=env).strip()
    git.run("--git-dir", str(repo), "update-ref", "refs/heads/main", commit)
    srv = start_server(tmp_path / "served", "--threads", "2")
    body = (_pkt(b"command=fetch\n") + b"0001" + _pkt(f"want {commit}\n".encode())
            + _pkt(b"ofs-delta\n") + _pkt(b"no-progress\n") + _pkt(b"done\n") + b"0000")
    request = urllib.request.Request(f"{srv.url}/big.git/{UP}", data=body, headers={
        "Content-Type": f"application/x-{UP}-request", "Git-Protocol": "version=2"})
    with urllib.request.urlopen(request, timeout=120) as resp:
        # The headers are here: the fetch was planned; what the pool does from now on is
        # producing the pack.
        received: list[int] = []
        reader = threading.Thread(target=lambda: received.append(len(resp.read())))
        reader.start()
        busy = []
        while reader.is_alive():
            busy.append(value(samples(scrape(srv.url)), "gitspout_thread_pool_busy"))
            time.sleep(0.01)  # the sampler's pace, while the pack is read
        reader.join()
    assert received and received[0] > 6 * (4 << 20)
    assert max(busy) >= 1, f"no scrape of {len(busy)} saw a busy pool thread"
    after = wait_idle(srv.url)
    assert value(after, "gitspout_thread_pool_busy") == 0
    assert value(after, "gitspout_thread_pool_queue_length") == 0


def test_a_repository_has_one_name_whatever_its_url(obs_root: Path, start_server,
                                                    git: Git) -> None:
    """``obs`` and ``obs.git`` (and a link to it inside the root) are one repository,
    named ``obs.git`` (its path under the root) in the per-repository metrics, the access
    log and the pool's per-repository queue, whichever URL came first. Before, the first
    URL that found it named it until a restart: a request to ``/obs`` first left
    ``--metrics-repos obs.git`` without a series, and the workers could differ."""
    (obs_root / "link.git").symlink_to(obs_root / REPO)
    # Listed as "obs" (as a URL may name it): the same repository, labelled obs.git.
    srv = start_server(obs_root, "--metrics-repos", "obs")
    before = wait_idle(srv.url)
    for path in ("obs", REPO, "link.git", "obs/"):
        git.run("ls-remote", f"{srv.url}/{path}")
    after = wait_idle(srv.url)
    assert value(after, "gitspout_repo_requests_total", repo=REPO, command="ls-refs") \
        - value(before, "gitspout_repo_requests_total", repo=REPO, command="ls-refs") == 4
    logged = [json.loads(line) for line in srv.stdout if line.startswith("{")]
    repos = {r.get("repo") for r in logged if r.get("command") in ("ls-refs", "info-refs")}
    assert repos == {REPO}, repos
