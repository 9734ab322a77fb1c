"""Scenarios: the compact CI scenario end to end (root), and the scenario file format."""
from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys

import pytest

from scenarios.spec import Scenario, ScenarioError
from tests.conftest import REPO

CI = REPO / "scenarios" / "ci.yaml"


def test_every_architecture_runs_every_session(ci_results):
    summary, _ = ci_results
    assert summary["calibration_ok"] and summary["backend"] == "userspace"
    archs = summary["architectures"]
    assert list(archs) == ["port-per-session", "cluster-relay", "global-relay"]
    for name, a in archs.items():
        assert a["sessions"] == 6 and a["ok"] == 6, name


def test_the_numbers_make_physical_sense(ci_results):
    summary, directory = ci_results
    archs = summary["architectures"]
    # apac-se -> na-east: the backbone path is far shorter than the inflated public one.
    g, p = archs["global-relay"], archs["port-per-session"]
    assert g["first_ice_rtt_ms"]["p50"] < p["first_ice_rtt_ms"]["p50"] - 50
    for name, a in archs.items():
        # Nothing beats the network floor the topology implies by more than the path's jitter
        # allows: a round trip's sd here is about 3 ms (1-2 ms per hop and direction), so the
        # median of 4 sessions may sit up to ~6 ms (3 sd of that median) below the mean floor.
        assert a["first_ice_rtt_over_floor_ms"]["p50"] > -6, name
        assert a["setup_over_floor_ms"]["p50"] > -10, name
    # First ICE RTT via the global relay: its median within 2 ms + 5% of the path RTT the
    # topology implies (single sessions see the path's jitter and the first check's set-up).
    rows = [r for r in csv.DictReader(open(directory / "sessions.csv"))
            if r["architecture"] == "global-relay"]
    floor = float(rows[0]["floor_media_rtt_ms"])
    assert all(float(r["floor_media_rtt_ms"]) == floor for r in rows)
    median = statistics.median(float(r["first_ice_rtt_ms"]) for r in rows)
    assert abs(median - floor) <= 2 + 0.05 * floor, (median, floor)
    # One UDP port per session against one per relay.
    assert p["public_udp_ports"] == 6
    assert archs["cluster-relay"]["public_udp_ports"] == 1
    assert g["public_udp_ports"] == 1


def test_results_folder_has_everything_and_nothing_else(ci_results):
    _, directory = ci_results
    names = {p.name for p in directory.iterdir()}
    assert {"config.json", "calibration.json", "sessions.csv", "samples.csv", "ports.csv",
            "relays.json", "summary.json", "logs"} <= names
    config = json.loads((directory / "config.json").read_text())
    assert config["backend"] == "userspace" and config["clusters"] == ["na-east"]
    sessions = list(csv.DictReader(open(directory / "sessions.csv")))
    assert len(sessions) == 18 and {r["cluster_region"] for r in sessions} == {"na-east"}
    samples = list(csv.DictReader(open(directory / "samples.csv")))
    assert samples and {r["architecture"] for r in samples} == {
        "port-per-session", "cluster-relay", "global-relay"}
    relays = json.loads((directory / "relays.json").read_text())
    assert relays["global-relay"]["ingress-apac-se"]["flows_created"] == 6


def test_scenario_files_are_checked(tmp_path):
    good = Scenario.load(CI)
    assert good.clusters == ("na-east",) and good.sessions_per_region == 6
    cases = {
        "clusters: []\nname: x\nsessions_per_region: 1\ncall_duration_s: 3\nstart_rate: 1\n":
            "clusters",
        "name: x\nclusters: [na-east]\nsessions_per_region: 0\ncall_duration_s: 3\nstart_rate: 1\n":
            "sessions_per_region",
        "name: x\nclusters: [na-east]\nsessions_per_region: 1\ncall_duration_s: 3\nstart_rate: 1\n"
        "architectures: [carrier-pigeon]\n": "architectures",
        "name: x\nclusters: [na-east]\nwhat: 1\n": "unknown field",
        "[1, 2": "not valid YAML",
    }
    for text, message in cases.items():
        path = tmp_path / "s.yaml"
        path.write_text(text)
        with pytest.raises(ScenarioError, match=message):
            Scenario.load(path)
    with pytest.raises(ScenarioError, match="does not exist"):
        Scenario.load(tmp_path / "missing.yaml")


def test_bad_region_is_a_one_line_error():
    proc = subprocess.run([sys.executable, "-m", "voiceedge", "scenario", str(CI), "--region",
                           "atlantis"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2 and "atlantis" in proc.stderr and "Traceback" not in proc.stderr
