"""The distribution installs one import root, ``gitspout``, and no generic top-level names.

Builds the wheel as ``pip install .`` would (no network: the venv's own setuptools) and looks
at what it would put in site-packages.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(REPO)], check=True, timeout=300, capture_output=True)
    (found,) = out.glob("gitspout-*.whl")
    return found


def test_only_gitspout_is_installed(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"gitspout"}
    assert "gitspout/server/app/cli.py" in names and "gitspout/protocol/pktline.py" in names
    # Every layer and the typing markers ship.
    for layer in ("app", "packgen", "core", "graph", "store"):
        assert f"gitspout/server/{layer}/__init__.py" in names, layer
    assert "gitspout/server/py.typed" in names and "gitspout/protocol/py.typed" in names


def test_console_script_points_into_the_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        (ep,) = [n for n in zf.namelist() if n.endswith("entry_points.txt")]
        text = zf.read(ep).decode()
    assert "gitspout = gitspout.server.app.cli:main" in text
