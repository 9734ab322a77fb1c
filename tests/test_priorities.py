"""Who runs first on the shared cores (scenarios/priorities.py): the scenario's ``realtime``
field, and the services and clients started at those SCHED_FIFO priorities."""
from __future__ import annotations

import os
import sys
import time

import pytest

from scenarios.priorities import SOFTIRQ, Priorities, Raised, softirq_threads
from scenarios.processes import ServiceProcess
from scenarios.spec import Scenario, ScenarioError

BASE = ("name: s\nclusters: [na-east]\nsessions_per_region: 4\ncall_duration_s: 6\n"
        "start_rate: 1\narchitectures: [cluster-relay]\n")


def test_the_defaults_put_the_edge_above_its_callers_and_below_the_wire(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(BASE)
    assert Scenario.load(path).realtime == Priorities(services=5, clients=2)
    for value, expected in (("false", Priorities(0, 0)), ("true", Priorities(5, 2)),
                            ("{services: 7}", Priorities(7, 2)),
                            ("{services: 3, clients: 0}", Priorities(3, 0))):
        path.write_text(BASE + f"realtime: {value}\n")
        assert Scenario.load(path).realtime == expected, value


@pytest.mark.parametrize("value, message", [
    ("{services: 10}", "probes"),            # the calibration probes' priority: not below it
    ("{services: 3, clients: 4}", "clients <= services"),
    ("{services: -1}", "0 <= clients"),
    ("{services: 5.5}", "whole numbers"),
    ("{services: true}", "whole numbers"),
    ("{engine: 30}", "services: N, clients: M"),
    ("fast", "true, false"),
])
def test_bad_priorities_are_one_line(tmp_path, value, message):
    path = tmp_path / "s.yaml"
    path.write_text(BASE + f"realtime: {value}\n")
    with pytest.raises(ScenarioError, match=f"realtime: .*{message}"):
        Scenario.load(path)


# A child that starts a thread, then sleeps: the thread must run at the child's priority too.
CHILD = "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); " \
        "time.sleep(30)"


def _policies(pid: int) -> set[tuple[int, int]]:
    deadline = time.monotonic() + 10
    while True:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        if len(tids) >= 2 or time.monotonic() > deadline:
            return {(os.sched_getscheduler(t), os.sched_getparam(t).sched_priority)
                    for t in tids}
        time.sleep(0.05)


@pytest.mark.root
def test_a_service_and_its_threads_run_at_the_priority_given(tmp_path):
    fifo = ServiceProcess("fifo", [sys.executable, "-c", CHILD], tmp_path / "fifo.log",
                          realtime=4).start()
    ordinary = ServiceProcess("ordinary", [sys.executable, "-c", CHILD],
                              tmp_path / "ordinary.log").start()
    try:
        assert _policies(fifo.pid) == {(os.SCHED_FIFO, 4)}
        assert _policies(ordinary.pid) == {(os.SCHED_OTHER, 0)}
        assert os.sched_getscheduler(0) == os.SCHED_OTHER   # the caller is untouched
    finally:
        fifo.stop()
        ordinary.stop()


def test_priorities_not_allowed_fall_back_to_ordinary_and_say_why(monkeypatch):
    import scenarios.priorities as priorities

    def refuse(priority):
        from voiceedge.errors import ConfigError
        raise ConfigError(f"--realtime {priority} needs root or CAP_SYS_NICE")

    monkeypatch.setattr(priorities, "check_realtime", refuse)
    assert Priorities().usable() == (Priorities(0, 0),
                                     "SCHED_FIFO priority 5 needs root or CAP_SYS_NICE")
    assert Priorities(0, 0).usable() == (Priorities(0, 0), "")


@pytest.mark.root
def test_the_kernels_softirq_threads_run_with_the_wire_for_the_block_then_as_they_were():
    pids = softirq_threads()
    assert pids, "a Linux kernel has a ksoftirqd thread per CPU"
    before = {p: (os.sched_getscheduler(p), os.sched_getparam(p).sched_priority) for p in pids}
    with pytest.raises(RuntimeError):
        with Raised(softirq_threads(), SOFTIRQ):
            assert {(os.sched_getscheduler(p), os.sched_getparam(p).sched_priority)
                    for p in pids} == {(os.SCHED_FIFO, SOFTIRQ)}
            raise RuntimeError("a run that fails (or is stopped) puts them back too")
    assert {p: (os.sched_getscheduler(p), os.sched_getparam(p).sched_priority)
            for p in pids} == before
    with Raised(softirq_threads(), 0):   # ordinary runs leave them alone
        assert {p: (os.sched_getscheduler(p), os.sched_getparam(p).sched_priority)
                for p in pids} == before


@pytest.mark.root
def test_threads_run_at_a_priority_for_the_block_then_as_they_were():
    import threading

    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        mine = {threading.get_native_id(), other.native_id}
        with Raised(sorted(mine), 7):
            assert {(os.sched_getscheduler(t), os.sched_getparam(t).sched_priority)
                    for t in mine} == {(os.SCHED_FIFO, 7)}
        assert {os.sched_getscheduler(t) for t in mine} == {os.SCHED_OTHER}
    finally:
        stop.set()


STEPS_DOWN = ("import threading, time; from services.priority import step_down; "
              "threading.Thread(target=time.sleep, args=(30,)).start(); time.sleep(0.5); "
              "import sys; print('lowered', step_down(), file=sys.stderr, flush=True); "
              "time.sleep(30)")


@pytest.mark.root
def test_a_process_whose_calls_are_over_steps_down_with_every_thread(tmp_path):
    """services/priority.py: what a client runs once its calls are done (its exit) runs
    ordinary, every thread of it."""
    proc = ServiceProcess("steps-down", [sys.executable, "-c", STEPS_DOWN],
                          tmp_path / "steps-down.log", realtime=4).start()
    try:
        proc.wait_ready(lambda: "lowered 2" in proc.log_path.read_text(), timeout=15)
        assert _policies(proc.pid) == {(os.SCHED_OTHER, 0)}
    finally:
        proc.stop()
