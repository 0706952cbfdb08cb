"""Fixtures for tests that run against repositories on a simulated NFS mount.

``latency_mount`` is a factory::

    def test_x(latency_mount, tmp_path):
        m = latency_mount(tmp_path / "src", delay_ms=1.0)   # or latency_mount() for a fresh dir
        (m.path / "file").write_text("...")
        assert m.stats()["create"] == 1

Every mount it made is stopped (unmounted, daemon ended) at teardown, even
when the test failed.  The whole module is skipped where FUSE or pyfuse3 is
missing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # make the sibling modules importable in any import mode
    sys.path.insert(0, _HERE)

from mount import LatencyMount, MountError, MountFactory, fuse_available  # noqa: E402


@pytest.fixture(scope="session")
def fuse_reason() -> str | None:
    """Why latencyfs cannot run here (None when it can)."""
    return fuse_available()


@pytest.fixture
def latency_mount(
    fuse_reason: str | None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MountFactory]:
    """Factory ``(source=None, **LatencyMount kwargs) -> started LatencyMount``."""
    if fuse_reason is not None:
        pytest.skip(f"latencyfs unavailable: {fuse_reason}")
    mounts: list[LatencyMount] = []

    def make(source: str | os.PathLike[str] | None = None, **kwargs: Any) -> LatencyMount:
        src = Path(source) if source is not None else tmp_path_factory.mktemp("nfs-src")
        src.mkdir(parents=True, exist_ok=True)
        mount = LatencyMount(src, **kwargs)
        mounts.append(mount)
        return mount.start()

    yield make
    errors: list[str] = []
    for mount in reversed(mounts):
        try:
            mount.stop()
        except MountError as exc:
            errors.append(str(exc))
    if errors:
        pytest.fail("latencyfs teardown: " + "; ".join(errors))
