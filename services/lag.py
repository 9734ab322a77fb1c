"""Is this process keeping up? Scheduling lag, measured where a process waits.

A process that cannot get the CPU when it should (the host is saturated, or its own event loop
is busy) delays everything that passes through it, and the testbed would then measure itself.
Each process of a run notes how late it woke for something it scheduled (an event-loop timer,
a relay worker's periodic sweep, the impairment engine's release times) and logs one
``loop_lag`` event per second that ``lagged`` (below: sustained lateness, or one long stall):

    {"event": "loop_lag", "window_start": 1764497533.0, "window_s": 1.0, "max_ms": 12.4,
     "samples": 50, "late": 9, ...}

Windows are whole wall-clock seconds, so the runner can match them with the sessions that were
live then (scenarios/saturation.py). ``loop_lag_summary`` at the end gives the totals. The
event-loop monitor also times Python's garbage collections: a lagged second says how much of
it was collection (``gc_ms``, ``gc_max_ms``), the summary the longest one: a stall that is
the collector's is the process's own, not the host's.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import time
from dataclasses import dataclass

from services.logs import log_event

# When a second counts as lagged. One stall is not saturation: setting up a session stalls a
# loop 5-15 ms here (key generation, SDP, a relay's first-packet path), the architecture's own
# per-session work. A process that cannot keep up is late again and again: a second is lagged
# when at least SUSTAINED of its samples were LATE_MS late or more, or when one stall reached
# STALL_MS (long enough to show in a setup time on its own).
LATE_MS = 5.0
SUSTAINED = 0.10
STALL_MS = 100.0
TICK_S = 0.02            # how often the event-loop monitor wakes (one audio frame)


def lagged(samples: int, late: int, max_ms: float, expected: float) -> bool:
    """The rule above, for one second: ``samples`` taken of ``expected`` (fewer in a second the
    watch only partly saw: they do not make one late sample a sustained lag), ``late`` of them
    LATE_MS or more."""
    return max_ms >= STALL_MS or late / max(samples, expected, 1) >= SUSTAINED


@dataclass
class LagWatch:
    """Collects lateness samples; logs each wall-clock second that ``lagged``."""

    logger: logging.Logger
    expected: float = 1 / TICK_S   # samples a second when on time
    seconds_observed: int = 0
    seconds_lagged: int = 0
    max_ms: float = 0.0
    _second: int | None = None
    _second_max: float = 0.0
    _samples: int = 0
    _late: int = 0
    _gc_s: float = 0.0
    _gc_max_s: float = 0.0
    gc_max_s: float = 0.0

    def note(self, late_s: float, now_unix: float | None = None) -> None:
        """One sample: ``late_s`` seconds later than scheduled, observed at ``now_unix``."""
        self._at(now_unix)
        late_ms = max(0.0, late_s * 1000.0)
        self._second_max = max(self._second_max, late_ms)
        self._samples += 1
        self._late += late_ms >= LATE_MS
        self.max_ms = max(self.max_ms, late_ms)

    def collected(self, seconds: float, now_unix: float | None = None) -> None:
        """A garbage collection that took ``seconds`` ended at ``now_unix``: counted in that
        second, where the lateness it caused is noted too (the monitor wakes right after)."""
        self._at(now_unix)
        self._gc_s += seconds
        self._gc_max_s = max(self._gc_max_s, seconds)
        self.gc_max_s = max(self.gc_max_s, seconds)

    def _at(self, now_unix: float | None) -> None:
        """Start the window of ``now_unix``'s second (closing the last one) if it is new."""
        second = int(time.time() if now_unix is None else now_unix)
        if second != self._second:
            self._close()
            self._second, self._second_max, self._samples, self._late = second, 0.0, 0, 0
            self._gc_s = self._gc_max_s = 0.0

    def _close(self) -> None:
        if self._second is None:
            return
        self.seconds_observed += 1
        if lagged(self._samples, self._late, self._second_max, self.expected):
            self.seconds_lagged += 1
            log_event(self.logger, "loop_lag", level=logging.WARNING,
                      window_start=float(self._second), window_s=1.0,
                      max_ms=round(self._second_max, 2), samples=self._samples,
                      late=self._late, gc_ms=round(self._gc_s * 1000.0, 2),
                      gc_max_ms=round(self._gc_max_s * 1000.0, 2))

    def close(self) -> None:
        """Flush the current second and log the summary."""
        self._close()
        self._second = None
        log_event(self.logger, "loop_lag_summary", seconds_observed=self.seconds_observed,
                  seconds_lagged=self.seconds_lagged, max_ms=round(self.max_ms, 2),
                  late_ms=LATE_MS, sustained=SUSTAINED, stall_ms=STALL_MS,
                  gc_max_ms=round(self.gc_max_s * 1000.0, 2))


class LoopLagMonitor:
    """``async with LoopLagMonitor(logger):`` a task that wakes every ``tick`` seconds and notes
    how late the event loop ran it."""

    def __init__(self, logger: logging.Logger, tick: float = TICK_S) -> None:
        self.watch = LagWatch(logger, expected=1 / tick)
        self._tick = tick
        self._task: asyncio.Task | None = None
        self._gc_started: float | None = None

    async def __aenter__(self) -> "LoopLagMonitor":
        self._task = asyncio.create_task(self._run(), name="loop-lag-monitor")
        gc.callbacks.append(self._on_gc)
        return self

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            self.watch.collected(time.perf_counter() - self._gc_started)
            self._gc_started = None

    async def __aexit__(self, *exc) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self.watch.close()

    def follow(self, clock) -> None:
        """Take the samples from ``clock``'s beats instead of a timer of the monitor's own: a
        service whose loop already wakes every ``tick`` seconds (the transceiver's FrameClock,
        services/transceiver/pacing.py) is not woken twice as often to be watched. The clock
        says how late each beat ran (``late_s``), the same lateness of the same kind of
        timer."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        clock.subscribe(self, lambda _tick: self.watch.note(clock.late_s))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + self._tick
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            now = loop.time()
            self.watch.note(now - due)
            due = max(due + self._tick, now)  # after a stall, measure from now on
