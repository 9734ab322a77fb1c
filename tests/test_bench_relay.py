"""`voiceedge bench relay --json`: runs every phase end to end and prints only JSON."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.root  # as another user the bench stops at once: "[Errno 1] Operation not permitted"
def test_bench_relay_json_is_complete_and_lossless_at_a_low_rate():
    proc = subprocess.run(
        [sys.executable, "-m", "voiceedge", "bench", "relay", "--json", "--rate", "4000",
         "--flows", "10", "--seconds", "0.5", "--rounds", "1"],
        capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)  # nothing but JSON on stdout
    phases = {(p["phase"], p["workers"]): p for p in report["phases"]}
    assert set(phases) == {("direct", 0), ("relay", 1), ("relay", 2), ("naive", 1)}
    for p in phases.values():
        assert p["sent"] == 2000 and p["lost"] == 0 and p["relay_drops"] == 0
        assert p["latency_p50_us"] > 0
    for key in (("relay", 1), ("relay", 2), ("naive", 1)):
        assert phases[key]["cpu_us_per_packet"] > 0
        assert phases[key]["added_p50_us"] is not None
    assert phases[("relay", 1)]["batch_mean"] >= 1


def test_bench_relay_rejects_bad_arguments():
    proc = subprocess.run([sys.executable, "-m", "voiceedge", "bench", "relay", "--rate", "0"],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
