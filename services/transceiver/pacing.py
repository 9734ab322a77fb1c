"""One 20 ms clock for every outgoing track of a transceiver.

Each track pacing itself with ``asyncio.sleep`` costs a timer per session per frame, and the
event loop wakes at as many distinct instants as there are sessions. ``FrameClock`` keeps one
timer for all of them: subscribers (outbound.py) are called in turn on every tick, and
waiters (``reach``) are released together, so the loop wakes once per 20 ms for the whole
outbound side.
"""
from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("voiceedge.transceiver")


class FrameClock:
    """Ticks every ``period`` seconds of event-loop time from its first use. ``await reach(n)``
    returns once tick ``n`` has passed (at once if it has already: a late track catches up)."""

    def __init__(self, period: float = 0.02) -> None:
        self.period = period
        self._origin: float | None = None
        self._waiters: list[tuple[int, asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._subscribers: dict[object, object] = {}  # key -> callback(tick)
        self._beat: asyncio.TimerHandle | None = None
        self._due = 0.0    # when the next beat is due (event-loop time)
        self.late_s = 0.0  # how late the event loop ran the current beat

    def current(self) -> int:
        """The last tick that has passed (0 at the first use)."""
        now = asyncio.get_running_loop().time()
        if self._origin is None:
            self._origin = now
        # The epsilon: the loop may run a timer a hair before its due time.
        return int((now - self._origin) / self.period + 1e-6)

    async def reach(self, tick: int) -> None:
        if self.current() >= tick:
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.append((tick, future))
        self._arm()
        await future

    def _arm(self) -> None:
        if self._timer is None and self._waiters:
            due = min(tick for tick, _ in self._waiters)
            self._timer = asyncio.get_running_loop().call_at(self._origin + due * self.period,
                                                             self._fire)

    def _fire(self) -> None:
        self._timer = None
        now, waiting = self.current(), []
        for tick, future in self._waiters:
            if tick > now:
                waiting.append((tick, future))
            elif not future.done():  # a cancelled waiter (its track stopped) is dropped
                future.set_result(None)
        self._waiters = waiting
        self._arm()

    def subscribe(self, key, callback) -> None:
        """Call ``callback(tick)`` on every tick from the next one until ``unsubscribe(key)``.
        A callback that raises is unsubscribed (and logged)."""
        self._subscribers[key] = callback
        if self._beat is None:
            self._next_beat(self.current())

    def unsubscribe(self, key) -> None:
        self._subscribers.pop(key, None)

    def _next_beat(self, tick: int) -> None:
        self._due = self._origin + (tick + 1) * self.period
        self._beat = asyncio.get_running_loop().call_at(self._due, self._on_beat)

    def _on_beat(self) -> None:
        self._beat = None
        if not self._subscribers:
            return
        self.late_s = asyncio.get_running_loop().time() - self._due
        tick = self.current()
        for key, callback in list(self._subscribers.items()):
            try:
                callback(tick)
            except Exception:
                log.exception("frame clock subscriber failed; unsubscribed")
                self._subscribers.pop(key, None)
        self._next_beat(tick)

    def close(self) -> None:
        self._subscribers.clear()
        if self._beat is not None:
            self._beat.cancel()
            self._beat = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for _, future in self._waiters:
            future.cancel()
        self._waiters = []
