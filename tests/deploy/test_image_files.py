"""The image's inputs, checked offline (docs/container.md): the lock files satisfy
pyproject.toml; the image has one name and tag, the package's version, wherever it is
named; docker-compose.yml publishes on 127.0.0.1 by default, wants a Grafana password
from the environment, rotates every service's log and pins every image.

Building and running the image is `make test-image` (tests/image/run.sh), not here.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from gitutil import REPO_ROOT
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
IMAGE = f"gitspout:{VERSION}"
LOCK = REPO_ROOT / "requirements.lock"
BUILD_LOCK = REPO_ROOT / "requirements-build.lock"
COMPOSE = REPO_ROOT / "docker-compose.yml"
KUSTOMIZE_DIR = REPO_ROOT / "deploy" / "kubernetes"
# The documents that show commands with the image's name.
DOCS = [REPO_ROOT / "README.md", REPO_ROOT / "docs" / "container.md", REPO_ROOT / "Dockerfile"]
# The image's Python, on Linux: the markers of the requirements are evaluated for it.
IMAGE_ENV = {**default_environment(), "python_version": "3.11", "python_full_version": "3.11.2",
             "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
             "implementation_name": "cpython", "platform_python_implementation": "CPython"}


# -- lock files -------------------------------------------------------------------------------

class Pin:
    """One entry of a lock file: name==version, its hashes, and the "# via" lines."""

    def __init__(self, req: Requirement, hashes: list[str], via: list[str]) -> None:
        self.req, self.hashes, self.via = req, hashes, via
        self.name = canonicalize_name(req.name)
        (spec,) = req.specifier  # exactly one, and it must be ==
        self.exact = spec.operator == "=="
        self.version = Version(spec.version)


def parse_lock(text: str) -> dict[str, Pin]:
    """The pins of a `pip-compile`/`uv pip compile` lock with hashes and annotations."""
    pins: dict[str, Pin] = {}
    current: Pin | None = None
    for logical in re.sub(r"\\\n", " ", text).splitlines():
        line = logical.strip()
        if not line:
            continue
        if line.startswith("#"):
            note = line.lstrip("#").strip()
            if current is not None and note and note != "via":
                current.via.append(note.removeprefix("via").strip())
            continue
        spec, *hashes = re.split(r"\s+--hash=", line)
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate(IMAGE_ENV):
            current = None
            continue
        current = Pin(req, hashes, [])
        assert current.name not in pins, f"{current.name} pinned twice"
        pins[current.name] = current
    return pins


def lock_problems(requirements: list[str], pins: dict[str, Pin]) -> list[str]:
    """Why `pins` does not satisfy `requirements` (an empty list when it does)."""
    problems = []
    for pin in pins.values():
        if not pin.exact:
            problems.append(f"{pin.name} is not pinned with ==")
        if not pin.hashes or not all(h.startswith("sha256:") for h in pin.hashes):
            problems.append(f"{pin.name} has no sha256 hash")
    for text in requirements:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(IMAGE_ENV):
            continue
        pin = pins.get(canonicalize_name(req.name))
        if pin is None:
            problems.append(f"{req.name} is not in the lock")
        elif not req.specifier.contains(pin.version, prereleases=True):
            problems.append(f"{req.name}: the lock's {pin.version} is outside {req.specifier}")
    return problems


def _runtime_requirements() -> list[str]:
    """What the image installs: the dependencies and the auth extra (--auth-file)."""
    project = PYPROJECT["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["auth"]]


def test_lock_satisfies_pyproject() -> None:
    pins = parse_lock(LOCK.read_text())
    assert lock_problems(_runtime_requirements(), pins) == []


def test_lock_holds_the_runtime_dependencies_only() -> None:
    """Each pin is there for a runtime requirement or for another pin, per its "via"
    annotation: nothing of the test, fuzz or nfs extras unless a runtime package needs it."""
    pins = parse_lock(LOCK.read_text())
    direct = {canonicalize_name(Requirement(r).name) for r in _runtime_requirements()}
    for pin in pins.values():
        assert pin.via, f"{pin.name} has no 'via' annotation (make lock writes them)"
        for source in pin.via:
            if source.startswith("gitspout"):
                assert pin.name in direct, f"{pin.name} is not a runtime requirement"
            else:
                assert canonicalize_name(source) in pins, f"{pin.name} via {source}: not locked"
    assert "pytest" not in pins and "bcrypt" in pins


def test_build_lock_satisfies_the_build_system() -> None:
    pins = parse_lock(BUILD_LOCK.read_text())
    assert lock_problems(["pip", *PYPROJECT["build-system"]["requires"]], pins) == []


def test_a_lock_that_does_not_satisfy_is_refused() -> None:
    """The check above can fail: a pin outside the specifier, a missing requirement, a
    requirement pinned with >= and one without hashes are all reported."""
    lock = ("numpy==1.22.0 \\\n    --hash=sha256:aa\n    # via gitspout (pyproject.toml)\n"
            "aiohttp>=3.9 \\\n    --hash=sha256:bb\n"
            "uvloop==0.19.0\n")
    problems = lock_problems(["numpy>=1.23", "aiohttp>=3.9", "uvloop>=0.19", "dulwich>=0.25.0"],
                             parse_lock(lock))
    assert problems == ["aiohttp is not pinned with ==", "uvloop has no sha256 hash",
                        "numpy: the lock's 1.22.0 is outside >=1.23",
                        "dulwich is not in the lock"]


# -- one image name and tag -------------------------------------------------------------------

def test_compose_and_kustomization_use_the_package_version() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    assert compose["services"]["gitspout"]["image"] == IMAGE
    kustomization = yaml.safe_load((KUSTOMIZE_DIR / "kustomization.yaml").read_text())
    (entry,) = kustomization["images"]
    assert (entry["name"], entry["newName"], entry["newTag"]) == ("gitspout", "gitspout", VERSION)
    # The Deployment names the image that the kustomization retags.
    deployment = yaml.safe_load((KUSTOMIZE_DIR / "deployment.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == entry["name"]


def _commands(text: str) -> list[str]:
    """The docker/podman commands of a document, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [m.group(0) for m in re.finditer(r"(?:docker|podman)(?: compose| build| run)[^\n]*",
                                            joined)]


def _image_references(text: str) -> list[str]:
    """Image references to gitspout: `gitspout:TAG` with a version-like or named tag (not
    host:port such as gitspout:8080), and the image argument of build -t and run."""
    refs = re.findall(r"\bgitspout:(?:\d+\.\d+\.\d+\S*|latest|local|dev)\b", text)
    for cmd in _commands(text):
        if m := re.search(r"build .*-t (\S+)", cmd):
            refs.append(m.group(1))
        if re.match(r"(?:docker|podman) run", cmd):
            words = re.split(r"\s+", cmd)
            refs += [w for w in words if w == "gitspout" or re.fullmatch(r"gitspout:[^/\s]+", w)]
    return refs


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_documents_name_the_same_image(doc: Path) -> None:
    refs = _image_references(doc.read_text())
    assert refs, f"{doc.name} names no gitspout image"
    assert set(refs) == {IMAGE}, f"{doc.name}: {sorted(set(refs))} (want {IMAGE})"


def test_a_stray_image_name_is_found() -> None:
    text = ("    docker build -t gitspout .\n    podman run --rm -p 8080:8080 \\\n"
            "        -v x:/srv/git:ro gitspout:latest --threads 4\n"
            "targets: [gitspout:8080]\n")
    assert sorted(_image_references(text)) == ["gitspout", "gitspout:latest", "gitspout:latest"]


# -- compose ----------------------------------------------------------------------------------

_VAR = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} (the forms the file uses)."""
    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2) or "", m.group(3) or ""
        val = env.get(name)
        unset = val is None or (op.startswith(":") and val == "")
        if op.endswith("?") and unset:
            raise KeyError(f"{name}: {arg}")
        if op.endswith("-") and unset:
            return arg
        return val or ""
    return _VAR.sub(one, value)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc


def test_compose_publishes_on_loopback_unless_told(compose: dict[str, Any]) -> None:
    ports = [p for svc in compose["services"].values() for p in svc.get("ports", [])]
    assert len(ports) == 3
    for port in ports:
        assert interpolate(port, {}).startswith("127.0.0.1:"), port
        # The documented way to expose them.
        assert interpolate(port, {"PUBLISH_ADDRESS": "0.0.0.0"}).startswith("0.0.0.0:"), port
    assert "PUBLISH_ADDRESS" in (REPO_ROOT / "docs" / "container.md").read_text()
    gitspout = compose["services"]["gitspout"]["ports"]
    assert interpolate(gitspout[0], {}) == "127.0.0.1:8080:8080"
    assert interpolate(gitspout[0], {"PUBLISH_GITSPOUT_PORT": "18080"}) == "127.0.0.1:18080:8080"


def test_grafana_password_comes_from_the_environment(compose: dict[str, Any]) -> None:
    env = compose["services"]["grafana"]["environment"]
    value = env["GF_SECURITY_ADMIN_PASSWORD"]
    assert re.fullmatch(r"\$\{GRAFANA_ADMIN_PASSWORD:\?[^}]+\}", value), value
    with pytest.raises(KeyError, match="GRAFANA_ADMIN_PASSWORD"):
        interpolate(value, {})
    with pytest.raises(KeyError):
        interpolate(value, {"GRAFANA_ADMIN_PASSWORD": ""})
    assert interpolate(value, {"GRAFANA_ADMIN_PASSWORD": "s3cret"}) == "s3cret"
    assert "admin/admin" not in COMPOSE.read_text()


def test_every_service_rotates_its_log(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        log = svc.get("logging")
        assert log is not None, f"{name} has no logging"
        assert log["driver"] == "json-file", name
        assert re.fullmatch(r"\d+[km]", log["options"]["max-size"]), name
        assert int(log["options"]["max-file"]) >= 2, name


def test_every_image_is_pinned(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        image = svc["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and "/" not in tag, f"{name}: {image} has no tag"
        assert tag != "latest", f"{name}: {image}"
        assert re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{name}: {image} is not a version tag"


def test_image_inputs_are_in_the_build_context() -> None:
    """Both lock files are copied by the Dockerfile and let through by .dockerignore."""
    ignore = (REPO_ROOT / ".dockerignore").read_text().split()
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    for lock in (LOCK, BUILD_LOCK):
        assert f"!{lock.name}" in ignore
        assert re.search(rf"^COPY .*\b{re.escape(lock.name)}\b", dockerfile, re.M)
