"""The gitspout server: the shell around the sans-IO protocol package.

Layers, each importing only from the ones below it (docs/ARCHITECTURE.md "Layers"):
``app`` (the HTTP adapter, the conversation, the process) → ``core`` (one request: its
view, answers, fetch plan and pack order) → ``packgen`` (a pack order into pack bytes) →
``graph`` (commit and object walks) → ``store`` (repositories, refs, objects, packs, caches).
"""

__all__: list[str] = []
