"""Real-time pacing on a fixed deadline grid, so per-tick delays do not add up to drift."""
from __future__ import annotations

import asyncio


class Pacer:
    """``await tick()`` returns at start, start + period, start + 2 * period, ...

    A late tick returns at once (the next ones catch up), unless it is more than ``max_late``
    behind: then the grid restarts from now, because bursting a long backlog would only overflow
    the receiver's jitter buffer. With ``lead`` the grid starts ``lead`` periods before now:
    the first ``lead + 1`` ticks return at once, and every later one that far ahead of real time.

    ``late`` counts the ticks that returned more than ``lead`` periods after their time on the
    grid: a frame sent then reaches a receiver that plays on its own 20 ms tick after that
    frame's turn may have passed (it hears silence there: nothing was lost in transit).
    """

    def __init__(self, period: float, max_late: float = 0.1, lead: int = 0) -> None:
        if lead < 0 or lead * period >= max_late:
            raise ValueError(f"lead {lead} must be at least 0 and under max_late")
        self.period = period
        self.max_late = max_late
        self.lead = lead
        self._loop = asyncio.get_running_loop()
        self._next: float | None = None
        self.late = 0

    async def tick(self) -> None:
        now = self._loop.time()
        if self._next is not None and now - self._next > self.lead * self.period:
            self.late += 1
        if self._next is None or now - self._next > self.max_late:
            self._next = now - self.lead * self.period
        elif self._next > now:
            await asyncio.sleep(self._next - now)
        self._next += self.period
