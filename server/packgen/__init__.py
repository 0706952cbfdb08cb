"""Pack generation, below the core: a :class:`~.order.PackOrder` (what to send, how)
produced from an :class:`~.access.ObjectAccess` (what to read) as one
:class:`~.stream.PackStream` (``stream``): the source chosen (``choose``), entries sent
verbatim, copied (``reuse``, ``layout``) or written anew (``writer``, ``delta``).
"""

from .access import ObjectAccess
from .caches import PackCaches
from .order import PackOrder
from .stats import PackStats, Progress
from .stream import PackStream

__all__ = ["ObjectAccess", "PackCaches", "PackOrder", "PackStats", "PackStream", "Progress"]
