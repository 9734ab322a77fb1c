"""Bring your own edge, in a world: scenarios/external.yaml's external architecture (the
project's transceiver in port-per-session mode and its agent, started only through the
external mechanism from the scenario's commands) runs through the scenario runner next to the
baseline, with the real clients, the geo-steering front forwarding to its WHIP URL, the
floors, the port count from /proc, the saturation rule and the report."""
from __future__ import annotations

import csv
import json

import pytest

from tests.conftest import shipped_scenario

pytestmark = [pytest.mark.world]
EXT = "own-transceiver"
N = 6  # sessions_per_region of scenarios/external.yaml


@pytest.fixture(scope="module")
def external_run(tmp_path_factory):
    return shipped_scenario(tmp_path_factory, "external", "apac-se", ("--capture",))


def test_every_external_session_connects_through_the_front_to_the_external_edge(external_run):
    summary, directory = external_run
    sessions = list(csv.DictReader(open(directory / "sessions.csv")))
    ext = [r for r in sessions if r["architecture"] == EXT]
    assert len(ext) == N and all(r["ok"] == "True" for r in ext), [r["error"] for r in ext]
    assert {r["cluster_region"] for r in ext} == {"na-east"}  # from the front's call ids
    assert all(r["echo_verified"] == "True" for r in ext)
    # the front placed every call with the external edge's WHIP endpoint and saw it end
    timeline = directory / "logs" / EXT / "timeline.jsonl"
    records = [json.loads(line) for line in timeline.read_text().splitlines()]
    created = [r for r in records if r.get("event") == "call_created"]
    assert len(created) == N and {r["transceiver"] for r in created} == {
        created[0]["transceiver"]} and created[0]["transceiver"].endswith(":8900/sessions")
    assert len([r for r in records if r.get("event") == "call_deleted"]) == N
    # the external processes' own logs are in the timeline, under their service names
    sources = {r["source"] for r in records}
    assert {f"{EXT}-na-east-1", f"{EXT}-na-east-2", "front-apac-se"} <= sources, sources
    assert summary["architectures"][EXT]["sessions"] == N


def test_the_floor_ports_and_saturation_are_the_external_architectures(external_run):
    _, directory = external_run
    sessions = list(csv.DictReader(open(directory / "sessions.csv")))
    by_arch = {a: [r for r in sessions if r["architecture"] == a]
               for a in ("port-per-session", EXT)}
    # media over the public internet, like the baseline: the same floor for the same path
    assert {r["floor_media_rtt_ms"] for r in by_arch[EXT]} == {
        r["floor_media_rtt_ms"] for r in by_arch["port-per-session"]}
    assert all(float(r["floor_setup_ms"]) > 0 for r in by_arch[EXT])
    ports = {r["architecture"]: r for r in csv.DictReader(open(directory / "ports.csv"))}
    ext = ports[EXT]
    # a UDP port per live session, held by the external command's process (and counted from
    # /proc through the shell that started it)
    assert int(ext["concurrent_sessions"]) >= 1
    assert int(ext["public_udp_ports"]) >= int(ext["concurrent_sessions"])
    assert f"{EXT}-na-east-2@" in ext["bindings"] and "front" not in ext["bindings"]
    facts = json.loads((directory / "architectures.json").read_text())
    assert facts["baseline"] == "port-per-session"
    e = facts["architectures"][EXT]
    assert e["external"] and e["ports"] == "per-session" and e["media_link"] == "public"
    assert f"{EXT}-{{cluster}}-2" in e["path"]  # its processes are on a session's path
    assert e["verifies"] == ["audio", "datachannel", "envelope"]


def test_the_report_and_the_wire_cover_the_external_architecture(external_run):
    _, directory = external_run
    report = (directory / "report.md").read_text()
    assert EXT in report
    wire = json.loads((directory / "pcap" / "analysis.json").read_text())
    ext = next(a for a in wire["architectures"] if a["architecture"] == EXT)
    assert ext["wire"]["sessions"] >= N and ext["wire"]["public_ports"] >= N
