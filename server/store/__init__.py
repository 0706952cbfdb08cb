"""Storage: repositories under the root, refs, object snapshots, pack/index/bitmap/commit-graph
files, the process-wide registry and caches, counted file-system calls, and the confinement
of paths to the root (ARCHITECTURE.md I1, I2, I8).
"""

__all__: list[str] = []
