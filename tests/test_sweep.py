"""Sweeps: the spec, the order points run in, and a real two-point sweep in an emulated world.

The world test (root: Mininet) runs a compact sweep of the public internet's rtt_scale (1.0 and
2.0) for one client region and one distant cluster, two architectures, three sessions each:
first with a time limit so small that it stops after its first point (exit 3, resumable), then
``--resume``, which runs only the other point in the same kind of world.
"""
from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from scenarios.spec import Scenario, ScenarioError
from scenarios.sweep import point_orders, rotated, run_order
from scenarios.sweepspec import SweepSpec, scenario_at
from tests.conftest import REPO, needs

SCENARIO = """\
name: sweeptest
description: The smallest sweep where the public internet's RTT matters.
clusters: [na-east]
sessions_per_region: 3
call_duration_s: 2
start_rate: 3
architectures: [port-per-session, global-relay]
calibration: {count: 60, rate: 100, at_load: false}
sweep:
  parameters:
    public_internet.rtt_scale: [1.0, 2.0]
"""


def parse(doc: dict) -> SweepSpec:
    return SweepSpec.parse(doc, "f.yaml")


def test_points_are_the_grid_first_parameter_outermost():
    spec = parse({"parameters": {"public_internet.rtt_scale": [1.0, 1.4],
                                 "public_internet.loss_pct": [0, 1, 3]}})
    assert [p.values for p in spec.points()] == [
        (("public_internet.rtt_scale", a), ("public_internet.loss_pct", b))
        for a in (1.0, 1.4) for b in (0, 1, 3)]
    assert [p.id for p in spec.points()] == [f"p0{i}" for i in range(6)]


def test_run_order_interleaves_and_walks_the_grid():
    one = parse({"parameters": {"public_internet.rtt_scale": [1.0, 1.2, 1.4, 1.6, 1.8]}})
    assert [p.id for p in run_order(one.points(), one)] == ["p00", "p04", "p01", "p03", "p02"]
    two = parse({"parameters": {"public_internet.rtt_scale": [1.0, 1.4, 1.8],
                                "public_internet.loss_pct": [0, 1]}})
    # rows outside-in (1.0, 1.8, 1.4), the columns serpentine
    assert [p.id for p in run_order(two.points(), two)] == [
        "p00", "p01", "p05", "p04", "p02", "p03"]
    archs = ("a", "b", "c")
    orders = point_orders(one.points(), one, archs)
    firsts = [orders[p.id][0] for p in run_order(one.points(), one)]
    assert firsts == ["a", "b", "c", "a", "b"]  # in the order run, not the points' indices
    assert all(sorted(o) == sorted(archs) for o in orders.values())
    assert rotated(("a", "b", "c"), 0) == ("a", "b", "c")
    assert rotated(("a", "b", "c"), 4) == ("b", "c", "a")


def test_a_point_is_the_scenario_with_its_values(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.replace("    public_internet.rtt_scale: [1.0, 2.0]",
                                     "    public_internet.rtt_scale: [1.0, 2.0]\n"
                                     "    sessions_per_region: [2, 4]"))
    scenario = Scenario.load(path)
    last = scenario.sweep.points()[-1]
    at = scenario_at(scenario, last)
    assert at.profiles == {"public_internet": {"rtt_scale": 2.0}}
    assert at.sessions_per_region == 4 and at.sweep is None
    assert scenario.profiles == {}  # the scenario itself is left as it was


@pytest.mark.parametrize("sweep, message", [
    ({"parameters": {"public_internet.rtt_scale": [1.0]}}, "at least two values"),
    ({"parameters": {"public_internet.rtt_scale": [1.0, 1.0]}}, "values repeat"),
    ({"parameters": {"nosuch.rtt_scale": [1, 2]}}, "unknown profile 'nosuch'"),
    ({"parameters": {"public_internet.nosuch": [1, 2]}}, "unknown parameter 'nosuch'"),
    ({"parameters": {"public_internet.rtt_scale": [1.0, -2]}}, "-2"),
    ({"parameters": {"weather": [1, 2]}}, "not a parameter"),
    ({"parameters": {"last_mile": ["last_mile_broadband", "dialup"]}}, "not profiles: dialup"),
    ({"parameters": {"clusters": [["na-east"], ["atlantis"]]}}, "atlantis"),
    ({"parameters": {"sessions_per_region": [1, 500]}}, "1..200"),
    ({"parameters": {"a.b": [1, 2], "c.d": [1, 2], "e.f": [1, 2]}}, "one or two parameters"),
    ({"parameters": {"public_internet.rtt_scale": [1, 2]}, "max_minutes": 0}, "max_minutes"),
    ({"parameters": {"public_internet.rtt_scale": [1 + i / 10 for i in range(9)],
                     "public_internet.loss_pct": list(range(8))}}, "at most 64"),
])
def test_bad_sweeps_are_one_line(tmp_path, sweep, message):
    import yaml

    doc = yaml.safe_load(SCENARIO)
    doc["sweep"] = sweep
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ScenarioError) as err:
        Scenario.load(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_every_shipped_sweep_loads():
    scenario = Scenario.load(REPO / "scenarios" / "sweep.yaml")
    assert [p.name for p in scenario.sweep.parameters] == ["public_internet.rtt_scale"]
    assert len(scenario.sweep.points()) >= 4


# ------------------------------------------------------------------ a real sweep


def sweep(path, out, *args, timeout=600):
    return subprocess.run([sys.executable, "-m", "voiceedge", "sweep", str(path), "--region",
                           "apac-se", "--results", str(out), "--json", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=timeout)


@pytest.fixture(scope="module")
@needs("world")
def two_point_sweep(tmp_path_factory):
    """(first run, resumed run, sweep folder): stopped after one point, then resumed."""
    path = tmp_path_factory.mktemp("sweep-file") / "sweeptest.yaml"
    path.write_text(SCENARIO)
    out = tmp_path_factory.mktemp("sweep-results")
    first = sweep(path, out, "--max-minutes", "0.01")
    assert first.returncode == 3, first.stderr[-3000:]
    [directory] = list(out.iterdir())
    resumed = sweep(path, out, "--resume", str(directory))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return json.loads(first.stdout), json.loads(resumed.stdout), directory, path


def test_a_stopped_sweep_says_how_long_and_resumes_only_what_is_left(two_point_sweep):
    first, resumed, directory, _ = two_point_sweep
    statuses = [p["status"] for p in first["points"].values()]
    assert sorted(statuses) == ["measured", "pending"]
    assert "would take about" in first["stopped"] and "--resume" in first["stopped"]
    doc = json.loads((directory / "sweep.json").read_text())
    assert all(p["status"] == "measured" for p in doc["points"])
    # the resumed run ran only p01, and p00 kept its record
    assert first["points"]["p00"] == resumed["points"]["p00"]
    assert [run["points"] for run in doc["runs"][:2]] == [["p00"], ["p01"]]
    assert doc["estimate"]["points_left"] == 1 and doc["estimate"]["seconds_per_point"] > 0


def test_each_point_is_calibrated_against_its_own_world(two_point_sweep):
    """The calibration of each point measured the public internet at that point's scale:
    twice the RTT at rtt_scale 2.0 as at 1.0 (the backbone unchanged)."""
    _, _, directory, _ = two_point_sweep

    def public_mean(point: str, kind: str) -> float:
        cal = json.loads((directory / "points" / point / "calibration.json").read_text())
        assert cal["ok"]
        return sum(p["mean_ms"] for p in cal["paths"] if p["kind"] == kind)

    ratio = public_mean("p01", "public") / public_mean("p00", "public")
    assert 1.9 < ratio < 2.1, ratio
    assert abs(public_mean("p01", "backbone") / public_mean("p00", "backbone") - 1) < 0.05


def test_points_rotate_the_architectures_and_measure_the_effect(two_point_sweep):
    _, _, directory, _ = two_point_sweep
    doc = json.loads((directory / "sweep.json").read_text())
    orders = [p["order"] for p in doc["points"]]
    assert orders[0] == list(reversed(orders[1]))
    with open(directory / "sessions.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["point"] for r in rows} == {"p00", "p01"}
    assert {r["public_internet.rtt_scale"] for r in rows} == {"1.0", "2.0"}
    assert len(rows) == 2 * 2 * 3 and all(r["ok"] == "True" for r in rows)
    for table in ("samples.csv", "ports.csv", "attempts.csv"):  # every table has its points
        with open(directory / table, newline="") as f:
            assert {r["point"] for r in csv.DictReader(f)} == {"p00", "p01"}, table

    def median(point: str, arch: str) -> float:
        values = sorted(float(r["first_ice_rtt_ms"]) for r in rows
                        if r["point"] == point and r["architecture"] == arch)
        return values[len(values) // 2]

    # Over the public internet, the first ICE RTT grows with its scale; over the backbone
    # (the global relay) it does not.
    assert median("p01", "port-per-session") > 1.5 * median("p00", "port-per-session")
    assert median("p01", "global-relay") < 1.2 * median("p00", "global-relay")


def test_resuming_a_finished_sweep_runs_nothing_and_another_sweeps_folder_is_refused(
        two_point_sweep, tmp_path):
    _, resumed, directory, path = two_point_sweep
    again = sweep(path, tmp_path, "--resume", str(directory), timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout)["points"] == resumed["points"]
    other = sweep(REPO / "scenarios" / "sweep.yaml", tmp_path, "--resume", str(directory),
                  timeout=60)
    assert other.returncode == 2 and "not this one's" in other.stderr


def test_a_load_point_starts_calls_for_its_live_count(tmp_path):
    """live_per_region L: calls start at L / call length a second per client region, and at
    least 3 L of them run (the scenario's count when larger), so the load holds."""
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.replace("call_duration_s: 2", "call_duration_s: 20")
                    .replace("    public_internet.rtt_scale: [1.0, 2.0]",
                             "    live_per_region: [0.5, 10, 60]"))
    scenario = Scenario.load(path)
    low, mid, high = (scenario_at(scenario, p) for p in scenario.sweep.points())
    assert (low.start_rate, low.sessions_per_region) == (0.025, 3)
    assert (mid.start_rate, mid.sessions_per_region) == (0.5, 30)
    assert (high.start_rate, high.sessions_per_region) == (3.0, 180)
    assert scenario.start_rate == 3 and scenario.sessions_per_region == 3
    # a base scenario's live_at_once gives way to the point's per-region load
    path.write_text(path.read_text().replace("start_rate: 3", "live_at_once: 30"))
    point = scenario_at(Scenario.load(path), next(iter(Scenario.load(path).sweep.points())))
    assert point.live_at_once is None and point.for_client_regions(3).start_rate == 0.025


def test_a_live_count_out_of_range_is_one_line(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.replace("    public_internet.rtt_scale: [1.0, 2.0]",
                                     "    live_per_region: [5, 500]"))
    with pytest.raises(ScenarioError, match=r"live calls per client region 0.5\.\.60$"):
        Scenario.load(path)


def test_the_shipped_load_sweep_loads():
    scenario = Scenario.load(REPO / "scenarios" / "sweep-load.yaml")
    assert [p.name for p in scenario.sweep.parameters] == ["live_per_region"]
    assert scenario.media_path == scenario.light_path == "native"
