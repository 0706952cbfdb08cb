"""Walks over the object graph: commits and trees of a request (``commits``, ``treewalk``),
closures of tips kept across requests (``closures``), the want checks (``reachability``),
what a fetch must get (``enumeration``), bitmap walks (``bitmapwalk``), the negotiation
oracle (``negotiation``) and shallow boundaries (``shallow``).
"""

__all__: list[str] = []
