"""Pack generation: choosing a pack source for a fetch plan (``packplan``) and producing its
bytes verbatim, from reused entries or generated (``packsource``; ARCHITECTURE.md I5).
"""

__all__: list[str] = []
