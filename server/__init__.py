"""The gitspout server: the shell around the sans-IO protocol package.

Layers, each importing only from the ones below it (docs/ARCHITECTURE.md "Layers"):
``app`` (HTTP adapter, CLI, metrics) → ``packgen`` (pack plans and sources) → ``core``
(one request's context, fetch plan, answers) → ``graph`` (commit and object walks) →
``store`` (repositories, refs, objects, packs, caches).
"""

__all__: list[str] = []
