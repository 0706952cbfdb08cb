"""Walks over the object graph: commits and trees of a request (``commits``, ``treewalk``),
reachability and enumeration (``reachability``), bitmap walks (``bitmapwalk``), the
negotiation oracle (``negotiation``) and shallow boundaries (``shallow``).
"""

__all__: list[str] = []
