"""The public surface of protocol/ and its layering rule (docs/ARCHITECTURE.md "Layers")."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import gitspout.protocol as protocol
import pytest

MODULES = sorted(m.name for m in pkgutil.iter_modules(protocol.__path__))
FORBIDDEN = {"asyncio", "aiohttp", "os", "dulwich", "prometheus_client", "socket", "subprocess",
             "threading", "server"}


def test_package_all_resolves() -> None:
    for name in protocol.__all__:
        assert getattr(protocol, name) is not None, name


@pytest.mark.parametrize("module", MODULES)
def test_module_all_resolves(module: str) -> None:
    mod = importlib.import_module(f"gitspout.protocol.{module}")
    assert hasattr(mod, "__all__"), module
    for name in mod.__all__:
        assert hasattr(mod, name), f"protocol.{module}.{name}"


@pytest.mark.parametrize("module", MODULES)
def test_module_is_sans_io(module: str) -> None:
    path = Path(protocol.__file__).parent / f"{module}.py"
    tree = ast.parse(path.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.split(".")[0])
            if node.module.startswith("gitspout.server"):
                imported.add("server")
    assert not imported & FORBIDDEN, f"protocol/{module}.py imports {imported & FORBIDDEN}"


@pytest.mark.parametrize("module", MODULES)
def test_module_size(module: str) -> None:
    """ARCHITECTURE.md style: small modules, about 400 lines at most."""
    path = Path(protocol.__file__).parent / f"{module}.py"
    assert len(path.read_text().splitlines()) <= 450
