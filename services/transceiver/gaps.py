"""When a session's caller RTP arrived: the first and last packet, and the gaps between them.

A fault between client and transceiver (a relay restart, a cut link) shows up here as a gap in
the client -> server direction. ``ArrivalGaps.arrived`` is on every caller packet's path
(inbound.py), so it costs a subtraction and a compare; the rest happens once per gap.
"""
from __future__ import annotations

import math
from typing import Any

GAP_S = 0.060     # shorter silences are jitter, not a gap
MAX_GAPS = 500    # per session; the rest are only counted


class ArrivalGaps:
    """Arrival times (``time.time()``) of one session's RTP packets, in arrival order."""

    __slots__ = ("first", "last", "gaps", "dropped", "_cap", "_on_gap")

    def __init__(self, cap: int = MAX_GAPS, on_gap=None) -> None:
        """``on_gap(start, seconds)`` is told of each gap as it ends: a session's record dies
        with a crashed transceiver, its log lines do not."""
        self._on_gap = on_gap
        self.first: float | None = None
        self.last = -math.inf  # the first packet takes the slow branch, which sets ``first``
        self.gaps: list[tuple[float, float]] = []  # (last packet before the gap, seconds)
        self.dropped = 0
        self._cap = cap

    def arrived(self, now: float) -> None:
        """A packet arrived at ``now``."""
        if now - self.last >= GAP_S:
            self._gap(now)
        self.last = now

    def _gap(self, now: float) -> None:
        if self.first is None:
            self.first = now
        elif len(self.gaps) < self._cap:
            self.gaps.append((self.last, now - self.last))
            if self._on_gap is not None:
                self._on_gap(self.last, now - self.last)
        else:
            self.dropped += 1

    def fields(self) -> dict[str, Any]:
        """The log fields: ``rx_gaps`` as ``[start_unix, ms]`` pairs, ``first_rx_unix``,
        ``last_rx_unix`` (null before the first packet), ``rx_gaps_dropped`` (beyond the cap)."""
        return {"rx_gaps": [[round(start, 3), round(s * 1000.0, 1)] for start, s in self.gaps],
                "first_rx_unix": None if self.first is None else round(self.first, 3),
                "last_rx_unix": None if self.first is None else round(self.last, 3),
                "rx_gaps_dropped": self.dropped}
