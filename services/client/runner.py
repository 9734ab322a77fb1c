"""Many sessions: started at a fixed rate, optionally capped in number, isolated from each other."""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from services.client.config import FULL, LIGHT, ClientConfig
from services.client.results import SessionResult
from services.client.session import CallSession


class _JsonLines:
    """Appends results (one line each), their samples and their RTP arrivals to optional
    files, flushed per session."""

    def __init__(self, results_path: Path | str | None, samples_path: Path | str | None,
                 arrivals_path: Path | str | None = None) -> None:
        self._results: TextIO | None = open(results_path, "a") if results_path else None
        self._samples: TextIO | None = open(samples_path, "a") if samples_path else None
        self._arrivals: TextIO | None = open(arrivals_path, "a") if arrivals_path else None

    def write(self, result: SessionResult) -> None:
        if self._results is not None:
            self._results.write(result.to_json(with_samples=False) + "\n")
            self._results.flush()
        if self._samples is not None:
            self._samples.writelines(s.to_json() + "\n" for s in result.samples)
            self._samples.flush()
        if self._arrivals is not None:
            self._arrivals.write(json.dumps({"index": result.index,
                                             "arrivals": result.rx_arrivals},
                                            separators=(",", ":")) + "\n")
            self._arrivals.flush()

    def close(self) -> None:
        for f in (self._results, self._samples, self._arrivals):
            if f is not None:
                f.close()


def kinds(n: int, full: int | None) -> list[str]:
    """The client kind of each of ``n`` sessions: ``full`` of them full (all when None), spread
    evenly over the run so that they sample its whole ramp, the others light."""
    if full is None or full >= n:
        return [FULL] * n
    chosen = {j * n // full for j in range(full)}
    return [FULL if i in chosen else LIGHT for i in range(n)]


async def run_sessions(config: ClientConfig, n: int, *,
                       results_path: Path | str | None = None,
                       samples_path: Path | str | None = None,
                       arrivals_path: Path | str | None = None,
                       on_result: Callable[[SessionResult], None] | None = None,
                       ) -> list[SessionResult]:
    """Run ``n`` sessions, session i starting at i / config.start_rate s (later if
    config.concurrency sessions are still running); return their results in index order.
    ``config.full_sessions`` of them are full clients, the others light (``kinds``).

    Each result is written (and ``on_result`` called) as soon as its session ends. A session
    never raises, so one failure cannot disturb the others; if this coroutine is cancelled,
    the running sessions are cancelled and torn down (DELETE, close) before it returns.
    """
    out = _JsonLines(results_path, samples_path, arrivals_path)
    slots = asyncio.Semaphore(config.concurrency) if config.concurrency else None
    results: list[SessionResult] = []
    tasks: list[asyncio.Task] = []
    kind_of = kinds(n, config.full_sessions)

    async def one(index: int) -> None:
        try:
            result = await CallSession(config, index, kind=kind_of[index]).run()
        finally:
            if slots is not None:
                slots.release()
        results.append(result)
        out.write(result)
        if on_result is not None:
            on_result(result)

    t0 = time.monotonic()
    try:
        for i in range(n):
            delay = t0 + i / config.start_rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if slots is not None:
                await slots.acquire()
            tasks.append(asyncio.create_task(one(i), name=f"client-session-{i}"))
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        out.close()
    return sorted(results, key=lambda r: r.index)
