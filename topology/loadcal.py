"""Calibration at load: the calls' paths probed again while the calls run.

The idle calibration proves the world is the configured one before any call; this proves it
stayed so under the run's own load. The impairment engine's figures are taken over the probe
window, from two snapshots of its stats: its CPU, the packets it released per second and how
late it released them. The probes add their own packets (``parallel`` x ``rate`` per second),
which the figures include.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from topology.calibrate import CalibrationReport, calibrate
from topology.impairment.backend import ImpairmentError
from topology.impairment.engine import histogram_percentile
from topology.world import ImpairedLink, World


@dataclass(frozen=True)
class EngineWindow:
    """The userspace engine over one window (all None for a backend without an engine)."""

    seconds: float
    cpu_pct: float | None          # of one core
    releases_per_s: float | None   # delayed packets released (the engine's packet rate)
    lateness_p50_us: float | None
    lateness_p99_us: float | None

    @classmethod
    def between(cls, before: dict, after: dict, seconds: float) -> "EngineWindow":
        cpu0, cpu1 = before.get("cpu_seconds"), after.get("cpu_seconds")
        hist0, hist1 = before.get("lateness_hist"), after.get("lateness_hist")
        if cpu0 is None or cpu1 is None or hist0 is None or hist1 is None or seconds <= 0:
            return cls(round(seconds, 2), None, None, None, None)
        window = {us: n - hist0.get(us, 0) for us, n in hist1.items() if n > hist0.get(us, 0)}
        count = sum(window.values())
        return cls(round(seconds, 2), round(100 * (cpu1 - cpu0) / seconds, 1),
                   round(count / seconds, 1),
                   histogram_percentile(sorted(window.items()), 0.50, count),
                   histogram_percentile(sorted(window.items()), 0.99, count))


@dataclass
class LoadCalibration:
    """One architecture's calibration while its calls ran."""

    architecture: str
    live_sessions_min: int
    live_sessions_max: int
    live_sessions_mean: float
    engine: EngineWindow
    report: CalibrationReport

    @property
    def ok(self) -> bool:
        return self.report.ok

    def to_dict(self) -> dict:
        return {"architecture": self.architecture, "ok": self.ok,
                "live_sessions_min": self.live_sessions_min,
                "live_sessions_max": self.live_sessions_max,
                "live_sessions_mean": self.live_sessions_mean,
                "engine": asdict(self.engine), **self.report.to_dict()}


def calibrate_under_load(world: World, architecture: str, links: list[ImpairedLink],
                         live: Callable[[], int], count: int = 100, rate: float = 100.0,
                         parallel: int = 3) -> LoadCalibration:
    """Probe ``links`` (and the unimpaired path) now, sampling ``live()`` sessions meanwhile."""
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append(live())
            done.wait(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    before, started = engine_stats(world), time.monotonic()
    sampler.start()
    try:
        report = calibrate(world, count=count, rate=rate, parallel=parallel, links=links,
                           in_child=True)
    finally:
        done.set()
        sampler.join(timeout=2)
    seconds = time.monotonic() - started
    engine = EngineWindow.between(before, engine_stats(world), seconds)
    samples = samples or [0]
    return LoadCalibration(architecture, min(samples), max(samples),
                           round(sum(samples) / len(samples), 1), engine, report)


def engine_stats(world: World) -> dict:
    """The impairment backend's stats now ({} if its engine is gone)."""
    try:
        return world.backend.stats()
    except ImpairmentError:  # the engine died: the probes have shown it, no engine figures
        return {}
