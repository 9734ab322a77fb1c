"""Idle cores that poll before they halt, for a run (scenarios/haltpoll.py): set on this
guest's real haltpoll driver and restored after, exceptions included; left alone when asked
or when the driver is not there; the scenario's ``halt_poll_us``."""
from __future__ import annotations

import os

import pytest

from scenarios.haltpoll import PARAMETERS, HaltPolling
from scenarios.spec import Scenario, ScenarioError
from tests.conftest import scenario_file

WINDOW, SHRINK = PARAMETERS / "guest_halt_poll_ns", PARAMETERS / "guest_halt_poll_allow_shrink"
writable = pytest.mark.skipif(not os.access(WINDOW, os.W_OK),
                              reason="needs the haltpoll cpuidle driver's parameters, as root")


def read() -> tuple[str, str]:
    return WINDOW.read_text().strip(), SHRINK.read_text().strip()


@writable
def test_a_run_sets_the_polling_window_and_puts_back_what_it_found():
    before = read()
    with HaltPolling(1500) as polling:
        assert read() == ("1500000", "N")
        assert polling.state.startswith("1500 us")
    assert read() == before
    with pytest.raises(KeyboardInterrupt):
        with HaltPolling(700):
            assert read() == ("700000", "N")
            raise KeyboardInterrupt   # Ctrl-C mid-run
    assert read() == before


@writable
def test_zero_leaves_the_host_alone():
    before = read()
    with HaltPolling(0) as polling:
        assert read() == before
    assert polling.state == "left as the host has it" and read() == before


def test_without_the_driver_the_run_says_so_and_goes_on(tmp_path):
    with HaltPolling(2000, parameters=tmp_path / "absent") as polling:
        pass
    assert polling.state.startswith("not available")


def test_the_scenario_field(tmp_path):
    base = ("name: h\nclusters: [na-east]\nsessions_per_region: 2\ncall_duration_s: 4\n"
            "start_rate: 2\n")

    def load(extra: str) -> Scenario:
        return scenario_file(tmp_path, base + extra)

    assert load("").halt_poll_us == 2000
    assert load("halt_poll_us: 0\n").halt_poll_us == 0
    for bad in ("-1", "true", "20000", "fast"):
        with pytest.raises(ScenarioError, match="halt_poll_us"):
            load(f"halt_poll_us: {bad}\n")
