"""Media gaps: long pauses between consecutive received RTP packets of one logical call.

The probe feeds every arrival (``time.monotonic()``) to one ``GapTracker`` per session, across
reconnections, so a gap that spans a reconnection runs from the old connection's last packet to
the new one's first. Gap lengths are monotonic; their start is converted to the wall clock with
one offset taken when the tracker is built (a clock step during the call cannot bend a gap).
"""
from __future__ import annotations

import time

from voiceedge.results import GAP_MIN_MS  # the analysis reads it too

MAX_GAPS = 500      # kept per session; the others are only counted


class GapTracker:
    """Arrival gaps >= ``min_ms``: ``gaps`` is ``[start_unix, ms, attempt]`` per gap, where
    ``attempt`` is the attempt whose packet ended it (set ``attempt`` before its packets)."""

    def __init__(self, min_ms: float = GAP_MIN_MS, max_gaps: int = MAX_GAPS,
                 unix_offset: float | None = None) -> None:
        if min_ms <= 0 or max_gaps < 0:
            raise ValueError("min_ms must be positive and max_gaps at least 0")
        self.min_s = min_ms / 1000.0
        self.max_gaps = max_gaps
        self.unix_offset = (time.time() - time.monotonic()) if unix_offset is None else unix_offset
        self.attempt = 0
        self.first: float | None = None     # monotonic arrival of the first packet
        self.last: float | None = None      # ... and of the latest one
        self.gaps: list[list] = []
        self.unlisted = 0                   # gaps beyond max_gaps

    def add(self, at: float) -> None:
        """One packet arrived at ``at`` (monotonic, not before the previous one). Per packet:
        keep it to an assignment and a compare or two."""
        last = self.last
        self.last = at
        if last is None:
            self.first = at
        elif at - last >= self.min_s:
            if len(self.gaps) < self.max_gaps:
                self.gaps.append([round(last + self.unix_offset, 6),
                                  round((at - last) * 1000.0, 3), self.attempt])
            else:
                self.unlisted += 1

    def unix(self, at: float | None) -> float | None:
        """A monotonic moment on the wall clock (None stays None)."""
        return None if at is None else round(at + self.unix_offset, 6)

    @property
    def count(self) -> int:
        return len(self.gaps) + self.unlisted
