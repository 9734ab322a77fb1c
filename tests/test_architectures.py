"""scenarios/architectures/: the registry finds one module per architecture, the facts the runner
writes for the analysis, and the syntax of an external architecture (bring your own edge)."""
from __future__ import annotations

import json

import pytest

from scenarios import architectures
from scenarios.architectures.external import External
from scenarios.edge import ClusterPlan, Edge, EdgePlan, FrontPlan, FrontRoute, Host, IngressPlan
from scenarios.runner import write_architectures
from scenarios.spec import Scenario, ScenarioError
from tests.conftest import REPO

BASE = ("name: x\nclusters: [na-east]\nsessions_per_region: 1\ncall_duration_s: 3\n"
        "start_rate: 1\n")
CLUSTER = ClusterPlan("na-east", 2, Host("cluster2", "/proc/1/ns/net"), public="10.2.4.2",
                      internal="10.2.5.2")


def test_the_registry_is_the_modules_of_the_package_in_their_order():
    assert architectures.names() == ("port-per-session", "cluster-relay", "global-relay",
                                     "turn")
    assert architectures.default_names() == ("port-per-session", "cluster-relay",
                                             "global-relay")
    assert architectures.baseline() == "port-per-session"
    with pytest.raises(KeyError, match="carrier-pigeon"):
        architectures.get("carrier-pigeon")


def test_a_new_architecture_is_one_new_module(tmp_path, monkeypatch):
    (tmp_path / "carrier_pigeon.py").write_text(
        "from scenarios.architectures.base import Architecture\n"
        "ARCHITECTURE = Architecture(name='carrier-pigeon', label='pigeon', colour='#123456',"
        " order=50)\n")
    monkeypatch.setattr(architectures, "__path__", [*architectures.__path__, str(tmp_path)])
    architectures.registry.cache_clear()
    try:
        assert architectures.names()[-1] == "carrier-pigeon"
        path = tmp_path / "s.yaml"
        path.write_text(BASE + "architectures: [port-per-session, carrier-pigeon]\n")
        scenario = Scenario.load(path)
        assert scenario.architecture("carrier-pigeon").colour == "#123456"
        plan = EdgePlan("carrier-pigeon", (CLUSTER,))
        assert plan.advertise(CLUSTER) is None and not plan.relayed
    finally:
        monkeypatch.undo()
        architectures.registry.cache_clear()
    assert "carrier-pigeon" not in architectures.names()


def test_what_each_architecture_tells_the_runner():
    get = architectures.get
    vip = EdgePlan("global-relay", (CLUSTER,), relay_vip="203.0.113.10")
    assert vip.advertise(CLUSTER) == "203.0.113.10:3478"
    assert EdgePlan("cluster-relay", (CLUSTER,)).advertise(CLUSTER) == "10.2.4.2:3478"
    assert EdgePlan("port-per-session", (CLUSTER,)).advertise(CLUSTER) is None
    assert get("global-relay").relay_listen(CLUSTER) == "10.2.5.2"   # faces the backbone
    assert get("cluster-relay").relay_listen(CLUSTER) == "10.2.4.2"
    assert [a.media_link for a in map(get, architectures.names())] == [
        "public", "public", "backbone", "public"]
    assert get("turn").client_args() == ["--ice-from-signaling"]
    assert get("global-relay").client_args() == []
    assert [r.program for r in get("turn").requirements] == ["turnserver"]
    assert get("global-relay").session_path("apac-se", "na-east") == [
        "client-apac-se", "front-apac-se", "impairment-engine", "ingress-apac-se",
        "transceiver-na-east", "agent-na-east", "relay-na-east"]
    assert get("port-per-session").session_path("apac-se", None) == [
        "client-apac-se", "front-apac-se", "impairment-engine"]
    with pytest.raises(ValueError, match="relay_vip"):
        EdgePlan("global-relay", (CLUSTER,))
    with pytest.raises(ValueError, match="TURN"):
        EdgePlan("turn", (CLUSTER,))


def test_architectures_json_has_what_the_analysis_reads(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(BASE + "architectures: [global-relay, turn]\n")
    write_architectures(tmp_path, Scenario.load(path))
    doc = json.loads((tmp_path / "architectures.json").read_text())
    assert doc["baseline"] == "port-per-session" and list(doc["architectures"]) == [
        "global-relay", "turn"]
    turn = doc["architectures"]["turn"]
    assert turn == {"label": "TURN (coturn)", "colour": "#CC79A7", "role": "compared",
                    "path": ["client-{client}", "front-{client}", "impairment-engine",
                             "transceiver-{cluster}", "agent-{cluster}"],
                    "media_link": "public", "ports": "per-session",
                    "fixed_ports_per_client_region": 1, "turn": True, "external": False,
                    "ingress": False, "verifies": ["audio", "datachannel", "envelope"]}


EXTERNAL = """architectures: [port-per-session, my-edge]
external:
  my-edge:
    cluster:
      - run: "{voiceedge} agent --port 8800"
        ready: "127.0.0.1:8800"
      - [my-server, --bind, "{public}", --api, "{internal}:9000"]
    ingress: "my-ingress --vip {vip} --backbone {backbone}"
    signaling: "http://{internal}:9000/whip/{cluster}"
    verifies: [audio]
"""


def test_an_external_architecture_is_read_from_the_scenario(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(BASE + EXTERNAL)
    scenario = Scenario.load(path)
    edge = scenario.architecture("my-edge")
    assert isinstance(edge, External) and edge.external and edge.ingress
    assert edge.media_link == "backbone"  # an ingress in the client's region: the backbone
    assert edge.signaling_url(CLUSTER) == "http://10.2.5.2:9000/whip/na-east"
    assert edge.path[-3:] == ("my-edge-ingress-{client}-1", "my-edge-{cluster}-1",
                              "my-edge-{cluster}-2")
    assert edge.cluster_commands[1].render({"public": "1.2.3.4", "internal": "5.6.7.8"}) == [
        "my-server", "--bind", "1.2.3.4", "--api", "5.6.7.8:9000"]
    assert edge.cluster_commands[0].render({"voiceedge": "ve"}) == [
        "/bin/sh", "-c", "ve agent --port 8800"]
    assert edge.verifies == ("audio",)
    plan = EdgePlan(edge, (CLUSTER,), relay_vip="203.0.113.10")
    assert plan.architecture == "my-edge" and plan.advertise(CLUSTER) is None
    route = Edge(plan, tmp_path).front_route(CLUSTER)
    assert route == {"whip": ["http://10.2.5.2:9000/whip/na-east"], "capacity": 500}


@pytest.mark.parametrize("entry, message", [
    ("my-edge: {signaling: 'http://{internal}/'}", "needs cluster"),
    ("my-edge: {cluster: 'srv {nope}', signaling: 'http://{internal}/'}",
     "unknown placeholder {nope}"),
    ("my-edge: {cluster: 'srv', signaling: 'ftp://{internal}/'}", "http:// or https://"),
    ("my-edge: {cluster: 'srv', signaling: 'http://{internal}:99999/'}", "bad port"),
    ("my-edge: {cluster: 'srv', signaling: 'http://{vip}/'}", "unknown placeholder {vip}"),
    ("my-edge: {cluster: 'srv', signaling: 'http://x/', color: red}", "unknown field"),
    ("my-edge: {cluster: [], signaling: 'http://x/'}", "at least one command"),
    ("my-edge: {cluster: [{run: srv, ready: nowhere}], signaling: 'http://x/'}", "HOST:PORT"),
    ("my-edge: {cluster: [[srv, 3]], signaling: 'http://x/'}", "argv list of strings"),
    ("my-edge: {cluster: 'srv', signaling: 'http://x/', verifies: [smell]}", "verifies"),
    ("my-edge: {cluster: 'srv', signaling: 'http://x/', ports: many}", "ports"),
    ("my-edge: {cluster: 'srv', signaling: 'http://x/', capacity: 0}", "capacity"),
    ("My_Edge: {cluster: 'srv', signaling: 'http://x/'}", "lower-case"),
    ("turn: {cluster: 'srv', signaling: 'http://x/'}", "built-in"),
    ("other: {cluster: 'srv', signaling: 'http://x/'}", "other not in architectures"),
    ("[]", "a mapping of name"),
])
def test_a_bad_external_architecture_is_one_clear_line(tmp_path, entry, message):
    path = tmp_path / "s.yaml"
    archs = "[turn, my-edge]" if "turn:" in entry else "[my-edge]"
    if "other:" in entry:
        archs = "[port-per-session]"
    path.write_text(BASE + f"architectures: {archs}\nexternal:\n  " + entry.replace(
        "\n", "\n  ") + "\n")
    with pytest.raises(ScenarioError, match=message) as err:
        Scenario.load(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_the_shipped_external_scenario_starts_the_transceiver_by_commands():
    scenario = Scenario.load(REPO / "scenarios" / "external.yaml")
    edge = scenario.architecture("own-transceiver")
    assert edge.external and edge.ports == "per-session" and edge.media_link == "public"
    argv = edge.cluster_commands[1].render({"voiceedge": "ve", "cluster_id": 2,
                                            "public": "10.2.4.2", "internal": "10.2.5.2"})
    assert "--mode port-per-session --media 10.2.4.2:0 --control 10.2.5.2:8900" in argv[2]
    assert edge.signaling_url(CLUSTER) == "http://10.2.5.2:8900/sessions"
    front = FrontPlan("apac-se", Host("edge1", "/proc/1/ns/net"), "203.0.113.20",
                      (FrontRoute("na-east", 230.0),))
    ingress = IngressPlan("apac-se", Host("edge1", "/proc/1/ns/net"), "203.0.113.10",
                          "10.1.5.2")
    plan = EdgePlan(edge, (CLUSTER,), (front,), (ingress,), relay_vip="203.0.113.10")
    assert plan.public_addresses() == {"cluster2": {"10.2.4.2"}, "edge1": {"203.0.113.10"}}
