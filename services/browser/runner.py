"""Many browser sessions in one headless Chromium, started at a fixed rate.

Every session's page is loaded first, each in a context of its own (session.py: the renderers'
start-up is not beside the calls); then ``on_ready`` is called and session i starts
start_delay_s + i / start_rate s later; each result is written as soon as its session ends (one JSON line: the
``SessionResult``
fields plus ``browser``, the extras of view.py; its samples to the samples file). While the
sessions run, the browser's process tree is measured once a second (usage.py) for what it
costs.

Lifecycle: the browser, its profile and the tone file are gone when ``run_browser`` returns,
also when it fails or is cancelled (running sessions are cancelled and their contexts
closed first, after the last call: closing a renderer costs CPU too).
"""
from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from yarl import URL

from services.browser.chromium import Chromium
from services.browser.config import BrowserConfig
from services.browser.session import PreparedSession
from services.browser.usage import Usage, measure
from services.browser.view import BrowserExtras
from services.client.results import JsonLines, SessionResult
from voiceedge import reaper

USAGE_INTERVAL_S = 1.0


@dataclass
class BrowserRun:
    """What a run did: results in index order, their extras, and the browser's own figures."""

    results: list[SessionResult] = field(default_factory=list)
    extras: dict[int, BrowserExtras] = field(default_factory=dict)  # by session index
    version: str | None = None
    launch_ms: float | None = None
    usage: dict = field(default_factory=dict)  # cost.summary()


class _Cost:
    """The browser tree's CPU and memory over a run: a look when it is ready (launched, every
    page loaded), one a second while sessions run (peak memory), one after the last call."""

    def __init__(self) -> None:
        self.launched: Usage | None = None
        self.last: Usage | None = None
        self.peak_pss_kib = 0
        self.peak_live = 0
        self.live = 0
        self.session_seconds = 0.0   # of call, over the ended sessions

    def look(self) -> None:
        usage = measure()
        if self.launched is None:
            self.launched = usage
        self.last = usage
        if usage.total_pss_kib > self.peak_pss_kib:
            self.peak_pss_kib = usage.total_pss_kib
        self.peak_live = max(self.peak_live, self.live)

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(USAGE_INTERVAL_S)
            self.look()

    def summary(self, sessions: int) -> dict:
        if self.launched is None or self.last is None:
            return {}
        a, b = self.launched, self.last
        cpu = {role: round(b.cpu_s.get(role, 0.0) - a.cpu_s.get(role, 0.0), 3)
               for role in b.cpu_s}
        total = round(b.total_cpu_s - a.total_cpu_s, 3)
        mib = 1 / 1024
        # "ready": launched with every session's page loaded, before the first call
        return {
            "ready_cpu_s": round(a.total_cpu_s, 3),
            "ready_pss_mib": round(a.total_pss_kib * mib, 1),
            "ready_processes": a.processes,
            "sessions_cpu_s": total, "sessions_cpu_s_by_role": cpu,
            "cpu_ms_per_session": round(total * 1000 / sessions, 1) if sessions else None,
            "cpu_ms_per_session_second": (round(total * 1000 / self.session_seconds, 1)
                                          if self.session_seconds else None),
            "peak_pss_mib": round(self.peak_pss_kib * mib, 1),
            "peak_live_sessions": self.peak_live,
            "pss_mib_per_live_session": (
                round((self.peak_pss_kib - a.total_pss_kib) * mib / self.peak_live, 1)
                if self.peak_live else None),
        }


def origin_of(url: str) -> str:
    u = URL(url)
    return str(u.origin())


async def run_browser(config: BrowserConfig, n: int, *,
                      results_path: str | Path | None = None,
                      samples_path: str | Path | None = None,
                      on_launch: Callable[[Chromium], None] | None = None,
                      on_ready: Callable[[], None] | None = None,
                      on_result: Callable[[SessionResult, BrowserExtras], None] | None = None,
                      ) -> BrowserRun:
    """Run ``n`` sessions (pages loaded first, then session i at i / start_rate s); return
    what they measured."""
    run = BrowserRun()
    out = JsonLines(results_path, samples_path)
    cost = _Cost()
    tasks: list[asyncio.Task] = []
    sessions: list[PreparedSession] = []

    async def one(session: PreparedSession) -> None:
        cost.live += 1
        try:
            result, extras = await session.run()
        finally:
            cost.live -= 1
        cost.session_seconds += (result.call_ms or 0.0) / 1000.0
        run.results.append(result)
        run.extras[result.index] = extras
        out.write(result, {"browser": extras.to_dict()})
        if on_result is not None:
            on_result(result, extras)

    try:
        with tempfile.TemporaryDirectory(prefix="voiceedge-browser-") as workdir:
            reaper.track_dir(workdir)  # removed even if this process is killed
            async with Chromium(config.chromium, origin_of(config.url), Path(workdir),
                                config.tone_hz) as browser:
                run.version, run.launch_ms = browser.version, browser.launch_ms
                if on_launch is not None:
                    on_launch(browser)
                watch = None
                try:
                    for i in range(n):
                        sessions.append(PreparedSession(browser, config, i))
                        await sessions[-1].prepare()
                    cost.look()  # the calls' cost is counted from here
                    if on_ready is not None:
                        on_ready()
                    watch = asyncio.create_task(cost.watch(), name="browser-usage")
                    t0 = time.monotonic() + config.start_delay_s
                    for i, session in enumerate(sessions):
                        delay = t0 + i / config.start_rate - time.monotonic()
                        if delay > 0:
                            await asyncio.sleep(delay)
                        tasks.append(asyncio.create_task(one(session),
                                                         name=f"browser-session-{i}"))
                    await asyncio.gather(*tasks)
                finally:
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                    if watch is not None:
                        watch.cancel()
                        await asyncio.gather(watch, return_exceptions=True)
                        cost.look()
                        run.usage = cost.summary(len(run.results))
                    await asyncio.gather(*(s.close() for s in sessions))
    finally:
        out.close()
    run.results.sort(key=lambda r: r.index)
    return run
