"""The compact fault scenario (scenarios/ci-faults.yaml) end to end: a real world, real
services, real clients; a relay killed -9 and restarted with Redis, then a cluster outage,
during the calls. Its fault budgets (analysis/budgets.yaml, ``faults:``) are the CI gate.
Needs root (Mininet)."""
from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from analysis.budgets import BudgetFile, check_faults
from tests.conftest import shipped_scenario

pytestmark = pytest.mark.world


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory):
    return shipped_scenario(tmp_path_factory, "ci-faults", "apac-se")


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _outage_timeline(directory) -> list:
    """What a failed budget needs to be read: the calls started after the outage (seconds
    from it to their start and connection, where) and how long each offer took at its
    transceiver (the transceivers' session_created: answer_ms from the request's arrival,
    negotiate_ms from its body's)."""
    records = json.loads((directory / "faults.json").read_text())["faults"]
    at = next(r["at_unix"] for r in records if r["fault"] == "outage")
    calls = [(a["session"], a["attempt"], round(float(a["started_unix"]) - at, 3),
              a["connected_unix"] and round(float(a["connected_unix"]) - at, 3),
              a["cluster_region"], a["error"]) for a in _rows(directory / "attempts.csv")
             if float(a["started_unix"]) > at]
    offers = []
    for log in directory.glob("logs/*/transceiver-*.log"):
        for line in log.read_text().splitlines():
            if '"session_created"' in line:
                r = json.loads(line)
                offers.append((log.stem, r["session"], r["answer_ms"], r["negotiate_ms"]))
    return [("outage_at_unix", at), *sorted(calls, key=lambda c: c[2]), *offers]


def test_the_compact_fault_run_is_inside_every_fault_budget(fault_run, tmp_path):
    _, directory = fault_run
    budgets = BudgetFile.load().faults
    assert budgets is not None and budgets.scenario.endswith("ci-faults.yaml")
    verdicts = check_faults(directory, budgets)
    assert verdicts and all(v.ok for v in verdicts), (
        [(v.fault, v.architecture, v.budget, v.measured, v.note) for v in verdicts if not v.ok],
        _outage_timeline(directory))
    proc = subprocess.run([sys.executable, "-m", "voiceedge", "budgets", str(directory),
                           "--json"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert {v["set"] for v in json.loads(proc.stdout)} == {"fault"}


def test_the_killed_relay_left_no_orphan_and_the_calls_moved_after_the_outage(fault_run):
    summary, directory = fault_run
    records = {r["fault"]: r for r in json.loads((directory / "faults.json").read_text())["faults"]}
    kill = records["relay-restart"]["detail"]
    assert len(kill["processes_before"]) >= 2  # the relay and its worker
    assert kill["orphans_at_restart"] == [] and kill["port_holders_not_new"] == []
    assert set(kill["port_holders_after"]) <= set(kill["processes_after"])
    assert set(kill["processes_after"]).isdisjoint(kill["processes_before"])
    # the new relay's one worker carried the recovered flows
    assert kill["worker_counters_after_restart"]["0"]["flows_recovered"] >= 1

    outage_at = records["outage"]["at_unix"]
    # The faults count from the clients' clock: the outage came 0.3 s before a call was due,
    # so first_new_session_s is the move to the next cluster, not the wait for a call.
    assert 8.7 <= outage_at - records["outage"]["clock_unix"] < 8.9
    first_after = min(float(a["started_unix"]) for a in _rows(directory / "attempts.csv")
                      if float(a["started_unix"]) > outage_at)
    assert 0.2 < first_after - outage_at < 0.5
    changes = [r for r in _rows(directory / "steering.csv")
               if r["event"] == "steering_changed" and float(r["unix"]) > outage_at]
    assert changes and changes[0]["cluster"] == "na-east"
    noticed = float(changes[0]["unix"])
    assert noticed - outage_at < 2.0  # the fronts noticed within the fault budget's 2 s
    # Calls placed once the front noticed all go to na-east. (A call whose offer was already
    # with the front as the outage began can still be placed at eu-west in between: seen
    # 45 ms after the outage's start, for a session started 170 ms before it.)
    calls = [r for r in _rows(directory / "steering.csv") if r["event"] == "call_created"]
    before = {r["cluster"] for r in calls if float(r["unix"]) < outage_at}
    after = {r["cluster"] for r in calls if float(r["unix"]) > noticed}
    assert before == {"eu-west"} and after == {"na-east"}

    # Every call placed again after the outage went to na-east, and every session's last
    # call connected.
    attempts = _rows(directory / "attempts.csv")
    moved = [a for a in attempts if int(a["attempt"]) > 0
             and float(a["started_unix"]) > outage_at and a["connected_unix"]]
    assert moved and all(a["cluster_region"] == "na-east" for a in moved)
    last = {}
    for a in attempts:
        if int(a["attempt"]) >= int(last.get(a["session"], {"attempt": -1})["attempt"]):
            last[a["session"]] = a
    assert all(a["connected_unix"] for a in last.values()), last
    faults = {r["fault"]: r for r in _rows(directory / "faults.csv")}
    assert int(faults["outage"]["sessions_affected"]) >= 3
    assert int(faults["relay-restart"]["reconnections"]) == 0
    html = (directory / "report.html").read_text()
    assert "Faults" in html and "fault-outage" in html
    assert summary["faults"] and {f["fault"] for f in summary["faults"]} == {"relay-restart",
                                                                            "outage"}
