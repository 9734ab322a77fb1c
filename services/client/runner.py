"""Many sessions: started at a fixed rate, optionally capped in number, isolated from each other."""
from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path

from services.client.config import FULL, LIGHT, ClientConfig
from services.client.results import JsonLines, SessionResult
from services.client.session import ASKED, NETWORK, CallSession, warm_up
from services.gcpolicy import SessionCollections
from services.logs import log_event

log = logging.getLogger("voiceedge.client")
# A scenario launches its clients while its services (and any browser) start: minutes at most.
START_FILE_WAIT_S = 600.0
START_FILE_POLL_S = 0.01
LATE_S = 0.05  # a first call later than this after its given start is logged (calls_late)


def kinds(n: int, full: int | None, phase: float = 0.0) -> list[str]:
    """The client kind of each of ``n`` sessions: ``full`` of them full (all when None), spread
    evenly over the run so that they sample its whole ramp, the others light. ``phase`` (0 to
    1) shifts them by that share of the spacing: client processes of different regions given
    different phases do not run their full sessions, the costly ones, at the same time."""
    if full is None or full >= n:
        return [FULL] * n
    chosen = {int((j + phase) * n / full) for j in range(full)}
    return [FULL if i in chosen else LIGHT for i in range(n)]


async def run_sessions(config: ClientConfig, n: int, *,
                       results_path: Path | str | None = None,
                       samples_path: Path | str | None = None,
                       arrivals_path: Path | str | None = None,
                       on_result: Callable[[SessionResult], None] | None = None,
                       index_base: int = 0) -> list[SessionResult]:
    """Run ``n`` sessions, session i starting at (i + config.phase) / config.start_rate s
    (later if config.concurrency sessions are still running); return their results in index order.
    ``config.full_sessions`` of them are full clients, the others light (``kinds``). Session
    i is recorded as index ``index_base + i`` (several client processes of one region).

    Each result is written (and ``on_result`` called) as soon as its session ends. A session
    never raises, so one failure cannot disturb the others; if this coroutine is cancelled,
    the running sessions are cancelled and torn down (DELETE, close) before it returns.
    The process's oldest-generation collections follow the sessions (services/gcpolicy.py).
    """
    out = JsonLines(results_path, samples_path, arrivals_path)
    pump = None
    if config.light_path == "native" and (config.full_sessions or 0) < n:
        from services.client.pump import PHASES, LightPump
        from services.client.tone import opus_tone

        pump = LightPump(opus_tone(config.tone_hz), capacity=max(n, 1),
                         phases=1 if config.conversation is None else PHASES)
        await pump.start()
    slots = asyncio.Semaphore(config.concurrency) if config.concurrency else None
    results: list[SessionResult] = []
    tasks: list[asyncio.Task] = []
    kind_of = kinds(n, config.full_sessions, config.phase)

    live: set[CallSession] = set()

    async def one(i: int) -> None:
        gc_policy.session_started()
        session = CallSession(config, index_base + i, kind=kind_of[i], pump=pump)
        live.add(session)
        try:
            result = await session.run()
        finally:
            live.discard(session)
            if slots is not None:
                slots.release()
        results.append(result)
        gc_policy.session_ended(live=len(tasks) - len(results))
        out.write(result)
        if on_result is not None:
            on_result(result)

    def restart_all(new_network: bool = False) -> None:
        """SIGUSR1: an ice_restart fault; SIGUSR2: the host's network changed (a handover),
        so each call restarts over a new connection (scenarios/faultkinds/)."""
        trigger = NETWORK if new_network else ASKED
        started = sum(session.request_ice_restart(new_network, trigger)
                      for session in list(live))
        log_event(log, "ice_restart_requested", sessions=len(live), started=started,
                  new_network=new_network)

    loop = asyncio.get_running_loop()
    restarts = _on_signal(loop, signal.SIGUSR1, restart_all)
    restarts = _on_signal(loop, signal.SIGUSR2, lambda: restart_all(True)) and restarts
    log_event(log, "client_warm_up", ms=await warm_up(config))
    gc_policy = SessionCollections(log)
    gc_policy.start()
    start_at = config.start_at_unix
    if config.start_file is not None:
        start_at = await start_time_from(Path(config.start_file))
    t0 = await _first_due(start_at)
    try:
        for i in range(n):
            delay = t0 + (i + config.phase) / config.start_rate - time.monotonic()
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
        if restarts:
            loop.remove_signal_handler(signal.SIGUSR1)
            loop.remove_signal_handler(signal.SIGUSR2)
        if pump is not None:
            await pump.stop()
        out.close()
        gc_policy.stop()
    return sorted(results, key=lambda r: r.index)


def _on_signal(loop: asyncio.AbstractEventLoop, sig: int, callback) -> bool:
    """``callback`` on ``sig`` (only the main thread's loop can take signals: a client run
    from another thread, in tests, has no restart on demand)."""
    try:
        loop.add_signal_handler(sig, callback)
    except (RuntimeError, ValueError):
        return False
    return True


class StartFileError(Exception):
    """The start file never came, or holds no time."""


async def start_time_from(path: Path, timeout: float = START_FILE_WAIT_S) -> float:
    """The Unix time a run writes into ``path`` once all its clients are up (waited for)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return float(path.read_text())
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise StartFileError(f"no start time in {path} after {timeout:g} s") from None
        except ValueError:  # written as a whole by a rename; anything else is not ours
            raise StartFileError(f"{path} does not hold a Unix time") from None
        await asyncio.sleep(START_FILE_POLL_S)


async def _first_due(start_at_unix: float | None) -> float:
    """The monotonic time session 0 is due: ``start_at_unix`` (waited for), or now. A client
    up after it starts at once and logs how late (``calls_late``): its schedule then runs that
    much behind the clock it was given."""
    if start_at_unix is not None:
        wait = start_at_unix - time.time()
        if wait > 0:
            await asyncio.sleep(wait)
        elif wait < -LATE_S:
            log_event(log, "calls_late", level=logging.WARNING, late_s=round(-wait, 3),
                      due_unix=start_at_unix)
    return time.monotonic()
