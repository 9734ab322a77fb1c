"""Faults as scenario steps: the spec, and the injector against a real edge (root: a lab
namespace with the real relay, transceiver, agent, Redis and signaling processes)."""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from scenarios.demo_edge import demo_plan
from scenarios.edge import Edge
from scenarios.faults import FaultInjector
from scenarios.faultspec import FaultSpec
from scenarios.spec import Scenario, ScenarioError
from services.procfs import alive
from tests.conftest import lab_fixture

pytestmark = pytest.mark.shareable  # make test runs it beside another (pyproject)

lab = lab_fixture("vefault")

BASE = """name: t
clusters: [na-east, eu-west]
sessions_per_region: 2
call_duration_s: 5
start_rate: 1
faults:
"""


@pytest.mark.parametrize("fault, message", [
    ("{at_s: 1, kind: meteor, target: cluster/na-east}", "kind: one of"),
    ("{at_s: 1, kind: relay_kill, target: na-east}", "target 'na-east'"),
    ("{at_s: 1, kind: relay_kill, target: cluster/na-east, duration_s: 3}",
     "relay_kill takes no duration_s"),
    ("{at_s: 1, kind: redis_down, target: cluster/na-east}", "redis_down needs duration_s"),
    ("{at_s: 1, kind: relay_kill, target: cluster/ap-x}", "ap-x is not one of the clusters"),
    ("{at_s: 1, kind: transceiver_crash, target: cluster/na-east/2}",
     "the clusters run transceivers 1..1"),
    ("{at_s: 1, kind: link_down, target: backbone/na-east/na-east, duration_s: 1}",
     "backbone/A/B"),
    ("{at_s: -1, kind: relay_kill, target: cluster/na-east}", "at_s: 0..3600"),
    ("{kind: relay_kill, target: cluster/na-east}", "at_s is required"),
    ("{at_s: 1, kind: loss_burst, target: public/au/na-east, duration_s: 2}",
     "loss_pct is required"),
    ("{at_s: 1, kind: cluster_outage, target: ingress/au}",
     "cluster_outage targets cluster, not ingress/au"),
])
def test_bad_faults_are_one_clear_line(tmp_path, fault, message):
    path = tmp_path / "s.yaml"
    path.write_text(BASE + f"  - {fault}\n")
    with pytest.raises(ScenarioError) as err:
        Scenario.load(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_shipped_fault_scenarios_load():
    root = Path(__file__).parent.parent / "scenarios"
    full = Scenario.load(root / "faults.yaml")
    kinds = {f.kind for f in full.faults}
    assert kinds == {"relay_kill", "redis_down", "transceiver_crash", "cluster_outage",
                     "link_down", "loss_burst"}
    assert any(f.kind == "relay_kill" and not f.options.redis for f in full.faults)
    assert full.transceivers_per_cluster == 2
    compact = Scenario.load(root / "ci-faults.yaml")
    assert [f.kind for f in compact.faults] == ["relay_kill", "cluster_outage"]
    mobility = Scenario.load(root / "mobility.yaml")
    assert [f.kind for f in mobility.faults] == ["nat_rebind", "handover", "ice_restart"]
    assert mobility.nat is not None


def _until(done, wait_s: float) -> None:
    """Return once ``done()`` holds, or ``wait_s`` after the call at the latest: what a sleep
    of ``wait_s`` waited for, without the rest of the sleep once it has happened."""
    deadline = time.monotonic() + wait_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)


def _inject(edge: Edge, fault: FaultSpec, wait_s: float, done=lambda record: False):
    """Inject ``fault``; stop the injector once ``done(record)`` holds, or after ``wait_s``."""
    injector = FaultInjector((fault,), edge, world=None)
    injector.start()
    record = injector.records[0]
    _until(lambda: done(record), wait_s)
    return injector.stop()[0]


def test_relay_kill_leaves_no_orphan_and_the_new_relay_alone_holds_the_port(lab, tmp_path):
    """kill -9 of the relay's main process only (its worker is not signalled): the worker
    dies with its parent, and after the restart only the new relay's processes hold the port."""
    edge = Edge(demo_plan("shared", lab.name, *lab.addresses), tmp_path)
    with edge:
        before = edge.processes("relay-demo")
        assert len(before) >= 2  # the main process and its worker
        fault = FaultSpec.parse({"at_s": 0.2, "kind": "relay_kill", "target": "cluster/demo",
                                 "restart_after_s": 0.5}, 0)
        # The fault's last step is reading the new relay's counters (COUNTERS_AFTER_S after
        # it is ready): stop then, at the latest 5 s after the start as before.
        record = _inject(edge, fault, 5.0,
                         lambda r: "worker_counters_after_restart" in r.detail)
        assert record.note == "", record.note
        d = record.detail
        assert d["processes_before"] == before
        assert d["orphans_at_restart"] == []
        assert not any(alive(pid) for pid in before)
        assert set(d["processes_after"]).isdisjoint(before) and len(d["processes_after"]) >= 2
        assert d["port_holders_after"] and set(d["port_holders_after"]) <= set(d["processes_after"])
        assert d["port_holders_not_new"] == []
        assert record.at_unix < record.end_unix < record.ready_unix
        assert record.end_unix - record.at_unix >= 0.5
        assert record.redis is True
        # what the analysis will read of its kind (analysis/faulteffect.py)
        assert record.effect == {"hits": ["cluster/demo"], "measures": ["gap_over_restart_ms"],
                                 "steers": False}
        assert set(record.detail["worker_counters_at_end"]) == {"0"}
        assert set(record.detail["worker_counters_after_restart"]) == {"0"}
        assert edge.services["relay-demo"].process.alive()


def test_transceiver_crash_and_restart_and_a_fault_not_reached(lab, tmp_path):
    edge = Edge(replace(demo_plan("shared", lab.name, *lab.addresses)), tmp_path)
    with edge:
        old = edge.processes("transceiver-demo")
        crash = FaultSpec.parse({"at_s": 0.1, "kind": "transceiver_crash",
                                 "target": "cluster/demo", "restart_after_s": 0.3}, 0)
        late = FaultSpec.parse({"at_s": 60, "kind": "redis_down", "target": "cluster/demo",
                                "duration_s": 1}, 1)
        injector = FaultInjector((crash, late), edge, world=None)
        injector.start()
        # until the crashed transceiver is started again (its processes listed), 4 s at most
        # as before; the late fault is not reached either way
        _until(lambda: "started" in injector.records[0].detail, 4.0)
        done, not_reached = injector.stop()
        assert done.detail["killed"]["transceiver-demo"] == old
        assert not any(alive(p) for p in old)
        new = edge.processes("transceiver-demo")
        assert new and set(new).isdisjoint(old)
        assert done.at_unix < done.end_unix < done.ready_unix
        assert not_reached.at_unix is None and "not reached" in not_reached.note


def test_an_outage_that_lasts_stays_down_and_is_recorded_as_lasting(lab, tmp_path):
    """A cluster outage without a duration: everything of the cluster is down until the end;
    stop() does not start it again (the edge stops next) and says the fault lasted."""
    edge = Edge(demo_plan("shared", lab.name, *lab.addresses), tmp_path)
    with edge:
        outage = FaultSpec.parse({"at_s": 0.1, "kind": "cluster_outage",
                                  "target": "cluster/demo"}, 0)
        injector = FaultInjector((outage,), edge, world=None)
        clock = time.time() + 0.4  # the clients' first call is due then: at_s counts from it
        injector.start(clock)
        time.sleep(1.4)
        assert not edge.services["transceiver-demo"].process.alive()
        assert not edge.services["relay-demo"].process.alive()
        record = injector.stop()[0]
        assert record.clock_unix == round(clock, 6) and record.at_unix >= clock + 0.1
        assert record.end_unix is None and record.ready_unix is None
        assert "lasted" in record.note
        assert not edge.services["transceiver-demo"].process.alive()
        assert sorted(record.detail["killed"]) == ["agent-demo", "redis-demo", "relay-demo",
                                                   "transceiver-demo"]


def test_a_fault_target_outside_the_run_is_one_clear_line():
    """faults.yaml names ingress/apac-se: run for eu clients, that ingress does not exist."""
    from scenarios.runner import ScenarioRunner

    scenario = Scenario.load(Path(__file__).parent.parent / "scenarios" / "faults.yaml")
    with pytest.raises(ScenarioError, match="fault ingress: ingress/apac-se: apac-se is not a "
                                            "client region of this run"):
        ScenarioRunner(scenario, "eu")


def test_a_late_client_is_said_on_every_fault(tmp_path):
    from scenarios.faults import FaultRecord
    from scenarios.runner import _note_late_clients

    (tmp_path / "client-apac-se.log").write_text(
        '{"event": "client_started"}\n'
        '{"event": "calls_late", "late_s": 0.734, "due_unix": 1796543728.25}\n')
    (tmp_path / "relay-eu-west.log").write_text('{"event": "ready"}\n')
    records = [FaultRecord("kill", "relay_kill", "cluster/eu-west", "global-relay", 3.5),
               FaultRecord("outage", "cluster_outage", "cluster/eu-west", "global-relay", 8.7,
                           note="lasted to the end of the calls")]
    _note_late_clients(records, tmp_path)
    assert records[0].note.startswith("a client's first call came 0.73 s after it was due")
    assert records[1].note.startswith("lasted to the end of the calls; a client's first call")
    on_time = [FaultRecord("kill", "relay_kill", "cluster/eu-west", "global-relay", 3.5)]
    (tmp_path / "client-apac-se.log").write_text('{"event": "client_started"}\n')
    assert _note_late_clients(on_time, tmp_path)[0].note == ""
