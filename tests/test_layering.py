"""The layering rule of gitspout.server (docs/ARCHITECTURE.md "Layers"), enforced.

Each sub-package of ``server/`` is a layer. A module may import from its own layer and from
the layers below it, never from one above; the modules of ``server/`` form no import cycle;
and only the HTTP adapter (``app``) touches aiohttp, asyncio or prometheus_client.
``protocol/`` imports nothing from ``server/`` (tests/protocol/test_proto_api.py).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SERVER = Path(__file__).resolve().parent.parent / "server"
# Top to bottom: a layer may import only itself and what follows it.
LAYERS = ("app", "core", "packgen", "graph", "store")
ADAPTER_ONLY = {"aiohttp", "asyncio", "prometheus_client", "uvloop"}


def _module_name(path: Path, root: Path = SERVER) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["gitspout", "server", *parts])


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    """Absolute names an ``from X import Y`` statement brings in (Y may be a module)."""
    if node.level == 0:
        base = node.module or ""
    else:
        parts = module.split(".")
        keep = len(parts) - node.level + (1 if is_package else 0)
        base = ".".join(parts[:keep] + ([node.module] if node.module else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def iter_imports(path: Path, root: Path = SERVER) -> Iterator[str]:
    """Every module name imported by the file at ``path`` (function-level imports too)."""
    module = _module_name(path, root)
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield from _resolve(module, is_package, node)


def _layer(name: str) -> str | None:
    parts = name.split(".")
    if parts[:2] != ["gitspout", "server"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in LAYERS else None


def layering_violations(root: Path = SERVER) -> list[str]:
    """Upward imports, adapter-only libraries below the adapter, and files outside a layer."""
    found = []
    for path in sorted(root.rglob("*.py")):
        here = _layer(_module_name(path, root))
        if here is None:
            if path.parent != root:
                found.append(f"{path.relative_to(root)} is in no layer")
            continue
        rank = LAYERS.index(here)
        for name in iter_imports(path, root):
            there = _layer(name)
            if there is not None and LAYERS.index(there) < rank:
                found.append(f"{path.relative_to(root)} ({here}) imports {name} ({there})")
            if here != "app" and name.split(".")[0] in ADAPTER_ONLY:
                found.append(f"{path.relative_to(root)} ({here}) imports {name}")
    return found


def import_cycles(root: Path = SERVER) -> list[list[str]]:
    """Cycles among the modules of ``server/`` (package ``__init__`` files left out)."""
    modules = {_module_name(p, root): p for p in root.rglob("*.py") if p.name != "__init__.py"}
    graph = {m: sorted({n for n in iter_imports(p, root) if n in modules and n != m})
             for m, p in modules.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in graph[m]:
            if state.get(n) == 1:
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return cycles


def test_imports_go_only_downward() -> None:
    assert layering_violations() == []


def test_no_import_cycles() -> None:
    assert import_cycles() == []


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    root = tmp_path / "server"
    for path in SERVER.rglob("*.py"):
        dest = root / path.relative_to(SERVER)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(path.read_text())
    return root


def test_an_upward_import_is_caught(tree_copy: Path) -> None:
    """The rule has teeth: a store module importing from the adapter fails the check."""
    victim = tree_copy / "store" / "packs.py"
    victim.write_text(victim.read_text() + "\nfrom ..app.metrics import REGISTRY  # noqa\n")
    assert any("store/packs.py (store) imports gitspout.server.app.metrics" in v
               for v in layering_violations(tree_copy))


def test_a_cycle_is_caught(tree_copy: Path) -> None:
    victim = tree_copy / "store" / "fsops.py"
    victim.write_text(victim.read_text() + "\nfrom . import fscache  # noqa\n")
    assert import_cycles(tree_copy), "fscache -> fsops -> fscache not found"


def test_an_adapter_library_below_the_adapter_is_caught(tree_copy: Path) -> None:
    victim = tree_copy / "graph" / "commits.py"
    victim.write_text(victim.read_text() + "\nimport asyncio  # noqa\n")
    assert any("graph/commits.py (graph) imports asyncio" in v
               for v in layering_violations(tree_copy))
