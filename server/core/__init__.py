"""One request, independent of HTTP: its view of the repository (``context``), the answers
built from ref state (``answers``), a v2 command (``commands``), the fetch plan, want policy
and pack order (``fetch``), and the response framed up to its pack (``framing``).
"""

__all__: list[str] = []
