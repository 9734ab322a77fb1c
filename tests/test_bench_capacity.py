"""``voiceedge bench capacity``: the demo edge at a list of sizes, with each process's lag."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.capacity import lag_of
from tests.conftest import REPO


def test_lag_is_summed_per_service_from_the_summaries(tmp_path):
    records = ({"service": "relay", "event": "loop_lag_summary", "seconds_observed": 10,
                "seconds_lagged": 1},
               {"service": "relay", "event": "flow_created"},
               {"service": "relay", "event": "loop_lag_summary", "seconds_observed": 10,
                "seconds_lagged": 2})
    lines = [json.dumps(r) for r in records] + ["not json"]
    (tmp_path / "relay-demo.log").write_text("\n".join(lines) + "\n")
    (tmp_path / "transceiver-demo.log").write_text(json.dumps(
        {"service": "transceiver", "event": "loop_lag_summary", "seconds_observed": 12,
         "seconds_lagged": 0}) + "\n")
    assert lag_of(tmp_path) == ({"relay": 3, "transceiver": 0}, {"relay": 20, "transceiver": 12})


@pytest.mark.netns  # the demo edge runs in a lab namespace
def test_two_small_sizes_run_and_report_their_own_cpu_and_lag(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "voiceedge", "bench", "capacity", "--sessions",
                           "1,3", "--duration", "3", "--rate", "5", "--workdir", str(tmp_path),
                           "--json"], capture_output=True, text=True, cwd=REPO, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)
    assert [r["sessions"] for r in rows] == [1, 3] and [r["ok"] for r in rows] == [1, 3]
    for r in rows:
        assert r["transceiver_cpu_ms_per_session_second"] > 0, r
        # every service measured over the same window, the relay with its worker processes
        cpu = r["services_cpu_ms_per_session_second"]
        assert cpu["transceiver"] > 0 and cpu["agent"] > 0 and "front" in cpu, r
        # The relay is measured too, but /proc counts CPU in 10 ms ticks and its share of one
        # 3 s call (about 300 datagrams) can be under one tick: 0 is a measurement there.
        assert isinstance(cpu["relay"], (int, float)) and cpu["relay"] >= 0, r
        services = {"transceiver", "relay", "signaling", "agent", "clients"}
        assert set(r["lagged_seconds"]) >= services, r
    assert (tmp_path / "3" / "sessions.jsonl").is_file()


def test_a_bad_size_list_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "voiceedge", "bench", "capacity", "--sessions",
                           "10,lots"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "voiceedge bench: --sessions '10,lots' is not a list like 10,100,200"]
