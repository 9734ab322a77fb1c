"""Real-time pacing on a fixed deadline grid, so per-tick delays do not add up to drift."""
from __future__ import annotations

import asyncio


class Pacer:
    """``await tick()`` returns at start, start + period, start + 2 * period, ...

    A late tick returns at once (the next ones catch up), unless it is more than ``max_late``
    behind: then the grid restarts from now, because bursting a long backlog would only overflow
    the receiver's jitter buffer.
    """

    def __init__(self, period: float, max_late: float = 0.1) -> None:
        self.period = period
        self.max_late = max_late
        self._loop = asyncio.get_running_loop()
        self._next: float | None = None

    async def tick(self) -> None:
        now = self._loop.time()
        if self._next is None or now - self._next > self.max_late:
            self._next = now
        elif self._next > now:
            await asyncio.sleep(self._next - now)
        self._next += self.period
