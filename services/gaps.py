"""Arrival gaps: long pauses between consecutive received RTP packets of one call.

One tracker for both ends of a call. The client (services/client/) feeds it every packet it
receives from the server, on ``time.monotonic()``, across the call's reconnections (a gap that
spans one runs from the old connection's last packet to the new one's first) and converts to
the wall clock with one offset taken when it is built (``ArrivalGaps.monotonic()``: a clock step
during the call cannot bend a gap). The transceiver (services/transceiver/inbound.py) feeds it
the caller's packets on ``time.time()``. ``arrived`` is on every packet's path: a subtraction,
a compare and an assignment; the rest happens once per gap.
"""
from __future__ import annotations

import math
import time

from voiceedge.results import GAP_MIN_MS  # 60 ms: the one threshold; the analysis reads it too

MAX_GAPS = 500      # kept per session; the others are only counted


class ArrivalGaps:
    """Gaps of ``min_ms`` or more between consecutive arrivals: ``gaps`` holds (start on the
    wall clock: the packet before the gap, seconds, attempt) per gap, where ``attempt`` is
    the tag set when the packet that ended it arrived (the client's call attempt)."""

    __slots__ = ("first", "_last", "gaps", "dropped", "attempt", "unix_offset", "_min_s",
                 "_cap", "_on_gap")

    def __init__(self, min_ms: float = GAP_MIN_MS, cap: int = MAX_GAPS,
                 unix_offset: float = 0.0, on_gap=None) -> None:
        """``unix_offset``: added to an arrival time to put it on the wall clock (0 for
        ``time.time()``); ``on_gap(start, seconds)`` is told of each listed gap as it ends
        (a session's record dies with a crashed transceiver, its log lines do not)."""
        if not min_ms > 0 or cap < 0:
            raise ValueError("min_ms must be positive and cap at least 0")
        self._min_s = min_ms / 1000.0
        self._cap = cap
        self._on_gap = on_gap
        self.unix_offset = unix_offset
        self.attempt = 0
        self.first: float | None = None   # the first packet's arrival
        self._last = -math.inf            # the first packet takes the slow branch
        self.gaps: list[tuple[float, float, int]] = []
        self.dropped = 0                  # gaps beyond the cap, counted only

    @classmethod
    def monotonic(cls, **kwargs) -> "ArrivalGaps":
        """A tracker fed ``time.monotonic()``: its offset to the wall clock taken now."""
        return cls(unix_offset=time.time() - time.monotonic(), **kwargs)

    def arrived(self, at: float) -> None:
        """A packet arrived at ``at`` (a clock set back makes no gap)."""
        if at - self._last >= self._min_s:
            self._gap(at)
        self._last = at

    def _gap(self, at: float) -> None:
        if self.first is None:
            self.first = at
        elif len(self.gaps) < self._cap:
            start, seconds = self._last + self.unix_offset, at - self._last
            self.gaps.append((start, seconds, self.attempt))
            if self._on_gap is not None:
                self._on_gap(start, seconds)
        else:
            self.dropped += 1

    def record(self, start: float, seconds: float, first: float, last: float) -> None:
        """What another tracker measured (the native media plane, on the wall clock): a gap
        of ``seconds`` after the packet at ``start``; ``first`` and ``last`` its first and
        latest arrival (0: none yet). Only for trackers with no offset (``time.time()``)."""
        if first and self.first is None:
            self.first = first
        if last:
            self._last = max(self._last, last)
        if seconds <= 0:
            return
        if len(self.gaps) < self._cap:
            self.gaps.append((start, seconds, self.attempt))
            if self._on_gap is not None:
                self._on_gap(start, seconds)
        else:
            self.dropped += 1

    @property
    def last(self) -> float | None:
        """The latest packet's arrival (None before the first)."""
        return None if self.first is None else self._last

    @property
    def count(self) -> int:
        return len(self.gaps) + self.dropped

    def unix(self, at: float | None) -> float | None:
        """An arrival time on the wall clock (None stays None)."""
        return None if at is None else round(at + self.unix_offset, 6)

    def listed(self) -> list[list]:
        """The gaps as the client's results carry them: [start_unix, ms, attempt]."""
        return [[round(start, 6), round(seconds * 1000.0, 3), attempt]
                for start, seconds, attempt in self.gaps]

    def fields(self) -> dict:
        """The transceiver's log fields: ``rx_gaps`` as [start_unix, ms] pairs,
        ``first_rx_unix``, ``last_rx_unix`` (null before the first packet) and
        ``rx_gaps_dropped`` (beyond the cap)."""
        seen = self.first is not None
        return {"rx_gaps": [[round(start, 3), round(seconds * 1000.0, 1)]
                            for start, seconds, _ in self.gaps],
                "first_rx_unix": round(self.first + self.unix_offset, 3) if seen else None,
                "last_rx_unix": round(self._last + self.unix_offset, 3) if seen else None,
                "rx_gaps_dropped": self.dropped}
