"""Knowing when the testbed measures itself: lag monitors (services/lag.py) and the sessions
they flag (scenarios/saturation.py)."""
from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest

from scenarios.saturation import ENGINE, LagWindows, flag, session_path
from services.lag import LagWatch, LoopLagMonitor


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.events.append(json.loads(str(record.msg)))


@pytest.fixture
def captured():
    logger = logging.getLogger(f"test.lag.{time.monotonic_ns()}")
    logger.setLevel(logging.INFO)
    handler = Capture()
    logger.addHandler(handler)
    logger.propagate = False
    return logger, handler.events


def test_a_second_lags_when_lateness_is_sustained_or_one_stall_is_long(captured):
    logger, events = captured
    watch = LagWatch(logger, expected=20)
    # second 100: one 15 ms stall in 20 samples (session set-up work): not lagged
    # second 101: 3 of 20 samples 6 ms late (15% >= 10%): lagged
    # second 102: one 120 ms stall: lagged; second 103: all on time
    plan = {100: [0.015] + [0.001] * 19, 101: [0.006] * 3 + [0.001] * 17,
            102: [0.12] + [0.0] * 19, 103: [0.0] * 20}
    for second, lates in plan.items():
        for k, late in enumerate(lates):
            watch.note(late, second + k / 20)
    watch.close()
    lags = [(e["window_start"], e["max_ms"], e["late"]) for e in events
            if e["event"] == "loop_lag"]
    assert lags == [(101.0, 6.0, 3), (102.0, 120.0, 1)]
    [summary] = [e for e in events if e["event"] == "loop_lag_summary"]
    assert (summary["seconds_observed"], summary["seconds_lagged"]) == (4, 2)


def test_a_second_seen_only_in_part_needs_as_many_late_samples_as_a_whole_one(captured):
    """A watch that starts late in a second sees a few samples: one late among them is not 10%
    of the second."""
    logger, events = captured
    watch = LagWatch(logger, expected=20)
    for k, late in enumerate([0.014, 0.0, 0.0]):           # second 100: 3 samples, 1 late
        watch.note(late, 100.85 + k * 0.05)
    for k in range(20):                                    # second 101: 2 of 20 late
        watch.note(0.006 if k < 2 else 0.0, 101 + k / 20)
    watch.close()
    assert [e["window_start"] for e in events if e["event"] == "loop_lag"] == [101.0]


def test_the_loop_monitor_sees_a_blocked_event_loop(captured):
    logger, events = captured

    async def main() -> None:
        async with LoopLagMonitor(logger, tick=0.01):
            await asyncio.sleep(0.1)
            time.sleep(0.15)  # the loop is blocked: nothing runs for 150 ms
            await asyncio.sleep(0.1)

    asyncio.run(main())
    lags = [e for e in events if e["event"] == "loop_lag"]
    assert lags and max(e["max_ms"] for e in lags) >= 140, events


def test_the_loop_monitor_following_a_clock_sees_a_blocked_loop_without_a_timer_of_its_own(
        captured):
    """A service with a 20 ms clock of its own (the transceiver's FrameClock) lends its beats
    to the monitor: a stall shows as the beat's lateness, and the monitor runs no task."""
    from services.transceiver.pacing import FrameClock

    logger, events = captured

    async def main() -> tuple:
        clock = FrameClock(period=0.01)
        async with LoopLagMonitor(logger, tick=0.01) as monitor:
            monitor.follow(clock)
            own_task = monitor._task
            await asyncio.sleep(0.1)
            time.sleep(0.15)  # the loop is blocked: the next beat runs 150 ms late
            await asyncio.sleep(0.1)
            samples = monitor.watch._samples
        clock.close()
        return own_task, samples

    own_task, samples = asyncio.run(main())
    assert own_task is None and samples > 0
    lags = [e for e in events if e["event"] == "loop_lag"]
    assert lags and max(e["max_ms"] for e in lags) >= 140, events


def test_a_stall_that_is_a_garbage_collection_says_so(captured):
    """A full collection of a big object graph stalls the loop: the lagged second carries how
    long the collections in it took, and the summary the longest."""
    import gc
    logger, events = captured

    async def main() -> None:
        async with LoopLagMonitor(logger, tick=0.01):
            await asyncio.sleep(0.05)
            garbage = [[{} for _ in range(20)] for _ in range(100_000)]  # 2 M objects to walk
            collected_at = time.perf_counter()
            gc.collect()
            took = time.perf_counter() - collected_at
            del garbage
            await asyncio.sleep(0.05)
            return took

    took = asyncio.run(main())
    summary = next(e for e in events if e["event"] == "loop_lag_summary")
    assert summary["gc_max_ms"] >= 0.9 * took * 1000.0, (summary, took)


def test_a_collection_is_counted_in_the_second_it_ended_with_the_lateness_it_caused(captured):
    logger, events = captured
    watch = LagWatch(logger, expected=20)
    watch.note(0.0, now_unix=100.2)
    watch.collected(0.25, now_unix=101.05)   # ended in second 101 ...
    watch.note(0.26, now_unix=101.06)        # ... where the monitor, waking, saw the stall
    watch.note(0.0, now_unix=102.0)
    watch.close()
    lagged = [e for e in events if e["event"] == "loop_lag"]
    assert [(e["window_start"], e["gc_ms"], e["gc_max_ms"]) for e in lagged] == [
        (101.0, 250.0, 250.0)]


def test_the_loop_monitor_sees_a_loop_that_is_always_a_little_late(captured):
    """Busy callbacks of 8 ms each, back to back: no single long stall, but late throughout."""
    logger, events = captured

    async def main() -> None:
        async with LoopLagMonitor(logger, tick=0.01):
            end = time.monotonic() + 1.2
            while time.monotonic() < end:
                time.sleep(0.008)
                await asyncio.sleep(0)

    asyncio.run(main())
    lags = [e for e in events if e["event"] == "loop_lag"]
    assert lags and all(e["max_ms"] < 100 for e in lags), events


def test_a_loop_that_keeps_up_reports_no_lag(captured):
    logger, events = captured

    async def main() -> None:
        async with LoopLagMonitor(logger, tick=0.01):
            await asyncio.sleep(0.3)

    asyncio.run(main())
    assert not [e for e in events if e["event"] == "loop_lag"]
    assert [e for e in events if e["event"] == "loop_lag_summary"]


def test_session_paths_name_the_services_each_architecture_crosses():
    assert set(session_path("apac-se", "na-east", "port-per-session")) == {
        "client-apac-se", "front-apac-se", ENGINE, "transceiver-na-east", "agent-na-east"}
    assert "relay-na-east" in session_path("apac-se", "na-east", "cluster-relay")
    assert "ingress-apac-se" not in session_path("apac-se", "na-east", "cluster-relay")
    assert {"ingress-apac-se", "relay-na-east"} <= set(
        session_path("apac-se", "na-east", "global-relay"))


def test_a_session_is_flagged_only_by_lag_on_its_path_while_it_was_live(tmp_path):
    timeline = tmp_path / "timeline.jsonl"
    records = [
        {"ts": "x", "event": "loop_lag", "source": "transceiver-na-east", "window_start": 100.0,
         "window_s": 1.0, "max_ms": 9.0},
        {"ts": "x", "event": "loop_lag", "source": "transceiver-eu-west", "window_start": 105.0,
         "window_s": 1.0, "max_ms": 50.0},
        {"ts": "x", "event": "flow_created", "source": "relay-na-east"},
    ]
    timeline.write_text("".join(json.dumps(r) + "\n" for r in records))
    lag = LagWindows.from_run(timeline, {"110": 3.5})

    def session(cluster="na-east", arch="cluster-relay", start=99.5, end=100.5) -> dict:
        row = {"client_region": "apac-se", "cluster_region": cluster, "architecture": arch}
        flag(row, lag, start, end)
        return row

    hit = session()
    assert hit["saturated"] and hit["saturated_by"] == "transceiver-na-east 9 ms"
    assert not session(start=101.0, end=104.0)["saturated"]        # not live then
    assert not session(start=104.5, end=106.0)["saturated"]        # eu-west is not its path
    assert session(cluster="eu-west", start=104.5, end=106.0)["saturated"]
    engine = session(start=109.0, end=112.0)                        # the engine: every path
    assert engine["saturated"] and engine["saturated_by"] == f"{ENGINE} 3.5 ms"
    assert session(start=None, end=None)["saturated"] is None       # never started: unknown


def test_lag_in_a_long_call_taints_it_only_during_setup_or_for_a_fifth_of_the_call():
    lag = LagWindows()
    row = lambda: {"client_region": "au", "cluster_region": "na-east",  # noqa: E731
                   "architecture": "port-per-session"}

    def flagged(*windows: float) -> bool:
        lag.windows.clear()
        for start in windows:
            lag.add("transceiver-na-east", start, 1.0, 30.0)
        r = row()
        flag(r, lag, started=100.0, ended=110.0, setup_s=1.0)  # set-up 100-101, call 101-110
        return r["saturated"]

    assert flagged(100.5)             # during set-up: setup, first ICE, first audio are tainted
    assert not flagged(105.0)         # one second of a 9 s call: 11%
    assert flagged(104.0, 105.0)      # two seconds: 22% of the call
    assert not flagged(111.0)         # after the session
    flagged(104.0, 105.0, 104.5)      # overlapping windows count once
    assert lag.covered(["transceiver-na-east"], 104.5, 106.5) == pytest.approx(1.5)
