"""One request, independent of HTTP: its view of the repository (``context``), the answers
built from ref state (``answers``), the fetch plan and want policy (``fetch``), pack totals
(``stats``).
"""

__all__: list[str] = []
