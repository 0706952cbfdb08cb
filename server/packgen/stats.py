"""What producing a pack reports while it runs and once it is done.

Shared by the pack sources (``packgen``), which fill them in, and the adapter (``app``),
which writes progress to side-band 2 and puts the totals in logs and metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Progress", "PackStats"]


@dataclass(frozen=True, slots=True)
class Progress:
    """A progress line for side-band channel 2 (already formatted, with \\r or \\n)."""

    text: bytes


@dataclass
class PackStats:
    """What a source sent, by kind (for the Total line, logs and metrics)."""

    objects: int = 0
    deltas: int = 0
    reused: int = 0
    reused_deltas: int = 0
    generated: int = 0
    verbatim: int = 0
    size: int = 0  # the pack's bytes on the wire
    pack_reused: int = 0
    kind: str = ""
    reused_bytes: int = 0  # entries copied from packs (verbatim sources count as reused)
    generated_bytes: int = 0  # entries compressed here
    # objects the order excluded that the pack would have held: sent as packfile URIs
    offloaded: tuple[bytes, ...] = ()

    def total_line(self) -> bytes:
        return (
            b"Total %d (delta %d), reused %d (delta %d), pack-reused %d\n"
            % (self.objects, self.deltas, self.reused, self.reused_deltas, self.pack_reused)
        )
