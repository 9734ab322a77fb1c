"""Scenarios: the compact CI scenario end to end (root), and the scenario file format."""
from __future__ import annotations

import csv
import json
import math
import os
import statistics
import subprocess
import sys

import pytest

from scenarios.spec import Scenario, ScenarioError
from tests.conftest import REPO, needs, scenario_file
from topology.impairment.backend import detect

CI = REPO / "scenarios" / "ci.yaml"
N = Scenario.load(CI).sessions_per_region  # sessions per architecture (one client region)
ROUND_TRIP_SD_MS = 3.0  # one round trip's sd on the CI world's path (1-2 ms per hop and direction)


@pytest.fixture(scope="module")
@needs("netns")
def kernel_backend() -> str:
    """The backend this kernel supports, as the runner's automatic choice must find it."""
    found = detect()
    return getattr(found, "name", found)


def test_every_architecture_runs_every_session(ci_results, kernel_backend):
    summary, _ = ci_results
    assert summary["calibration_ok"] and summary["backend"] == kernel_backend
    archs = summary["architectures"]
    assert list(archs) == ["port-per-session", "cluster-relay", "global-relay"]
    for name, a in archs.items():
        assert a["sessions"] == N and a["ok"] == N, name


def _column(directory, arch: str, name: str) -> list[float]:
    return [float(r[name]) for r in csv.DictReader(open(directory / "sessions.csv"))
            if r["architecture"] == arch and r[name] not in ("", None)]


def test_the_ci_world_is_not_saturated(ci_results):
    """The CI scenario is sized for the 2-core machine: no session measured while a process on
    its path lagged (scenarios/saturation.py), so its figures are the architectures'."""
    summary, directory = ci_results
    flagged = [(r["architecture"], r["session"], r["saturated_by"])
               for r in csv.DictReader(open(directory / "sessions.csv")) if r["saturated"] == "True"]
    assert not flagged, flagged
    assert all(a["saturated"] == 0 for a in summary["architectures"].values())


def test_the_numbers_make_physical_sense(ci_results):
    summary, directory = ci_results
    archs = summary["architectures"]
    g, p = archs["global-relay"], archs["port-per-session"]
    # The global relay's first-ICE advantage over the baseline is the one the configured
    # paths imply (the public path's RTT minus the backbone path's, from the world's own
    # impairments), whatever the profiles say: measured medians within 5 ms + 10% of it.
    implied = (statistics.median(_column(directory, "port-per-session", "floor_media_rtt_ms"))
               - statistics.median(_column(directory, "global-relay", "floor_media_rtt_ms")))
    measured = (statistics.median(_column(directory, "port-per-session", "first_ice_rtt_ms"))
                - statistics.median(_column(directory, "global-relay", "first_ice_rtt_ms")))
    assert abs(measured - implied) <= 5 + 0.1 * abs(implied), (measured, implied)
    for name, a in archs.items():
        # Nothing beats the network floor the topology implies by more than the path's jitter
        # allows: a round trip's sd here is about 3 ms (1-2 ms per hop and direction), so the
        # median of 4 sessions may sit up to ~6 ms (3 sd of that median) below the mean floor.
        assert a["first_ice_rtt_over_floor_ms"]["p50"] > -6, name
        assert a["setup_over_floor_ms"]["p50"] > -10, name
        # The call's RTT (RTCP) averages many round trips: its median sits on the floor or
        # above it. A receive time taken before the receiving host's emulated ingress delay
        # (the kernel's stamp) put it 6 ms under it (the last mile's one way).
        over = [float(r["rtt_ms"]) - float(r["floor_media_rtt_ms"])
                for r in csv.DictReader(open(directory / "sessions.csv"))
                if r["architecture"] == name and r["rtt_ms"] not in ("", None)]
        assert over and statistics.median(over) > -2, (name, over)
        # A consent check's RTT is one round trip, like the first check's: the median of n of
        # them may sit 3 sd of that median below the mean floor (sd 3 ms a round trip; the
        # 4 s calls here often end before the first check, so n is often 0 or 1).
        over = [float(r["consent_rtt_ms"]) - float(r["floor_media_rtt_ms"])
                for r in csv.DictReader(open(directory / "sessions.csv"))
                if r["architecture"] == name and r["consent_rtt_ms"] not in ("", None)]
        if over:
            allowed = 3 * 1.2533 * ROUND_TRIP_SD_MS / math.sqrt(len(over))
            assert statistics.median(over) > -allowed, (name, over, allowed)
    # First ICE RTT via the global relay: its median within 2 ms + 5% of the path RTT the
    # topology implies (single sessions see the path's jitter and the first check's set-up).
    rows = [r for r in csv.DictReader(open(directory / "sessions.csv"))
            if r["architecture"] == "global-relay"]
    floor = float(rows[0]["floor_media_rtt_ms"])
    assert all(float(r["floor_media_rtt_ms"]) == floor for r in rows)
    median = statistics.median(float(r["first_ice_rtt_ms"]) for r in rows)
    assert abs(median - floor) <= 2 + 0.05 * floor, (median, floor)
    # Measured from /proc at the peak of concurrent sessions: a port per live session against
    # one per relay (the cluster relay; the ingress relay on the VIP).
    assert p["peak_sessions"] >= 2, "sessions never overlapped: no peak to measure at"
    assert abs(p["public_udp_ports"] - p["peak_sessions"]) <= 1, p
    assert archs["cluster-relay"]["public_udp_ports"] == 1
    assert g["public_udp_ports"] == 1


def test_the_world_is_calibrated_again_while_the_calls_run(ci_results, kernel_backend):
    summary, directory = ci_results
    at_load = json.loads((directory / "calibration_at_load.json").read_text())
    assert list(at_load) == ["port-per-session", "cluster-relay", "global-relay"]
    assert summary["calibration_at_load_ok"] == {arch: True for arch in at_load}
    for arch, cal in at_load.items():
        assert cal["ok"] and cal["live_sessions_max"] >= 1, (arch, cal)
        # the calls' paths only: the client region's last mile, and both ways between it
        # and the cluster over the public internet and the backbone, plus the unimpaired path
        probed = {(p["kind"], p["src"], p["dst"]) for p in cal["paths"]}
        assert probed == {("last_mile_up", "apac-se", "apac-se"),
                          ("last_mile_down", "apac-se", "apac-se"),
                          ("public", "apac-se", "na-east"), ("public", "na-east", "apac-se"),
                          ("backbone", "apac-se", "na-east"), ("backbone", "na-east", "apac-se"),
                          ("unimpaired", "apac-se", "apac-se")}, (arch, probed)
        engine = cal["engine"]
        if kernel_backend == "userspace":  # measured over the probe window, from the engine
            assert engine["cpu_pct"] > 0 and engine["releases_per_s"] > 0, engine
            assert engine["lateness_p50_us"] <= engine["lateness_p99_us"], engine
    idle = json.loads((directory / "calibration.json").read_text())["engine"]
    if kernel_backend == "userspace":
        assert idle["releases_per_s"] > 0 and idle["lateness_p99_us"] is not None
    report = (directory / "report.md").read_text()
    assert "at load: global-relay" in report and "idle (before the calls)" in report


def test_where_the_hosts_cpu_went_is_measured_per_architecture(ci_results, kernel_backend):
    _, directory = ci_results
    windows = json.loads((directory / "host_cpu.json").read_text())
    assert list(windows) == ["port-per-session", "cluster-relay", "global-relay"]
    services = {"port-per-session": {"transceiver", "agent", "signaling"},
                "cluster-relay": {"relay", "transceiver"},
                "global-relay": {"ingress", "relay", "transceiver"}}
    for arch, w in windows.items():
        groups = w["groups"]
        assert w["seconds"] >= 2 and w["cpus"] == os.cpu_count(), (arch, w)
        assert services[arch] <= set(groups) and "runner" in groups, (arch, groups)
        assert groups["clients"] > 0 and groups["transceiver"] > 0, (arch, groups)
        if kernel_backend == "userspace":
            assert groups["engine"] > 0, (arch, groups)
        # what the groups claim is part of what the host was busy with (tick-sampled)
        assert sum(groups.values()) <= w["busy_pct"] * 1.2 + 2, (arch, w)
        probe = w["idle_probe"]   # a process with no work, at the clients' priority
        assert probe["seconds"] >= 2 and 0 <= probe["lagged_seconds"] <= probe["seconds"], w
    logs = directory / "logs" / "global-relay"
    assert '"loop_lag_summary"' in (logs / "idle-probe.log").read_text()
    assert "Host CPU while the calls ran" in (directory / "report.md").read_text()


def test_results_folder_has_everything_and_nothing_else(ci_results, kernel_backend):
    _, directory = ci_results
    names = {p.name for p in directory.iterdir()}
    assert {"config.json", "calibration.json", "sessions.csv", "samples.csv", "ports.csv",
            "relays.json", "summary.json", "stats.csv", "stats.json", "logs",
            "calibration_at_load.json", "impairment.json", "steering.csv",
            "architectures.json"} <= names
    facts = json.loads((directory / "architectures.json").read_text())
    assert facts["baseline"] == "port-per-session"
    assert list(facts["architectures"]) == ["port-per-session", "cluster-relay", "global-relay"]
    assert [a["media_link"] for a in facts["architectures"].values()] == [
        "public", "public", "backbone"]
    impairment = json.loads((directory / "impairment.json").read_text())
    assert impairment["backend"] == kernel_backend and impairment["interfaces"]
    assert all("dropped_loss" in c for c in impairment["interfaces"].values())
    config = json.loads((directory / "config.json").read_text())
    assert config["backend"] == kernel_backend and config["clusters"] == ["na-east"]
    assert config["baseline"] == "port-per-session"
    # idle cores polled through the run where this guest has haltpoll (tests/test_haltpoll.py)
    if os.access("/sys/module/haltpoll/parameters/guest_halt_poll_ns", os.W_OK):
        assert config["halt_polling"].startswith("2000 us"), config["halt_polling"]
    sessions = list(csv.DictReader(open(directory / "sessions.csv")))
    assert len(sessions) == 3 * N and {r["cluster_region"] for r in sessions} == {"na-east"}
    samples = list(csv.DictReader(open(directory / "samples.csv")))
    assert samples and {r["architecture"] for r in samples} == {
        "port-per-session", "cluster-relay", "global-relay"}
    steering = list(csv.DictReader(open(directory / "steering.csv")))
    calls = [r for r in steering if r["event"] == "call_created"]
    assert len(calls) == 3 * N and {r["cluster"] for r in calls} == {"na-east"}
    assert {(r["client_region"], r["front"], r["nearest"], r["reason"]) for r in calls} == {
        ("apac-se", "front-apac-se", "True", "nearest")}
    assert {r["architecture"] for r in calls} == {"port-per-session", "cluster-relay",
                                                  "global-relay"}
    assert "Where each client region was steered" in (directory / "report.md").read_text()
    relays = json.loads((directory / "relays.json").read_text())
    assert relays["global-relay"]["ingress-apac-se"]["flows_created"] == N
    # MOS needs a media RTT (RTCP RR): every ok session that measured one has a MOS.
    rated = [r for r in sessions if r["ok"] == "True" and r["rtt_ms"]]
    assert len(rated) >= 2 * N and all(r["mos"] for r in rated)


def test_each_architecture_has_one_timeline_of_every_service(ci_results):
    _, directory = ci_results
    lines = (directory / "logs" / "global-relay" / "timeline.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    stamps = [r["ts"] for r in records]
    assert stamps == sorted(stamps)
    sources = {r["source"] for r in records}
    assert {"agent-na-east", "relay-na-east", "transceiver-na-east", "ingress-apac-se",
            "front-apac-se", "client-apac-se"} <= sources, sources
    assert all({"ts", "level", "service", "event"} <= set(r) for r in records
               if r["event"] != "timeline_skipped")


def test_scenario_files_are_checked(tmp_path):
    good = Scenario.load(CI)
    assert good.clusters == ("na-east",) and good.sessions_per_region == 12
    cases = {
        "clusters: []\nname: x\nsessions_per_region: 1\ncall_duration_s: 3\nstart_rate: 1\n":
            "clusters",
        "name: x\nclusters: [na-east]\nsessions_per_region: 0\ncall_duration_s: 3\nstart_rate: 1\n":
            "sessions_per_region",
        "name: x\nclusters: [na-east]\nsessions_per_region: 1\ncall_duration_s: 3\nstart_rate: 1\n"
        "architectures: [carrier-pigeon]\n": "architectures",
        "name: x\nclusters: [na-east]\nwhat: 1\n": "unknown field",
        "[1, 2": "not valid YAML",
        "name: x\nclusters: [na-east]\nsessions_per_region: 1\ncall_duration_s: 3\nstart_rate: 1\n"
        "calibration: {at_load: sometimes}\n": "at_load is true or false",
    }
    for text, message in cases.items():
        path = tmp_path / "s.yaml"
        path.write_text(text)
        with pytest.raises(ScenarioError, match=message):
            Scenario.load(path)
    with pytest.raises(ScenarioError, match="does not exist"):
        Scenario.load(tmp_path / "missing.yaml")


@pytest.mark.netns  # the runner asks the kernel for netem (a namespace) before it reads --region
def test_bad_region_is_a_one_line_error():
    proc = subprocess.run([sys.executable, "-m", "voiceedge", "scenario", str(CI), "--region",
                           "atlantis"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2 and "atlantis" in proc.stderr and "Traceback" not in proc.stderr


def test_not_root_is_one_line_and_exit_2_before_any_folder(tmp_path, as_nobody):
    out = tmp_path / "results"
    proc = subprocess.run([*as_nobody, sys.executable, "-m", "voiceedge", "scenario", str(CI), "--region",
                           "apac-se", "--results", str(out)], capture_output=True, text=True,
                          cwd=REPO, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "root" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_min_success_pct_is_checked(tmp_path):
    path = tmp_path / "s.yaml"
    base = "name: x\nclusters: [na-east]\nsessions_per_region: 1\ncall_duration_s: 3\nstart_rate: 1\n"
    path.write_text(base + "min_success_pct: 90\n")
    assert Scenario.load(path).min_success_pct == 90
    path.write_text(base + "min_success_pct: 120\n")
    with pytest.raises(ScenarioError, match="min_success_pct"):
        Scenario.load(path)


def test_a_client_mix_is_read_and_checked(tmp_path):
    path = tmp_path / "s.yaml"
    base = "name: x\nclusters: [na-east]\ncall_duration_s: 3\nstart_rate: 1\n"
    path.write_text(base + "clients: {aiortc: 5, chromium: 2}\n")
    mixed = Scenario.load(path)
    assert (mixed.sessions_per_region, mixed.chromium_per_region) == (5, 2)
    path.write_text(base + "clients: {chromium: 1}\n")
    assert (Scenario.load(path).sessions_per_region, Scenario.load(path).chromium_per_region) \
        == (0, 1)
    path.write_text(base + "sessions_per_region: 3\n")
    assert Scenario.load(path).chromium_per_region == 0
    for mix, message in (("{aiortc: 5, firefox: 1}", "client type"),
                         ("{aiortc: 0, chromium: 0}", "at least one session"),
                         ("{chromium: -1}", "chromium: 0..200"),
                         ("{chromium: 21}", "at most 20"),
                         ("[aiortc]", "a mapping")):
        path.write_text(base + f"clients: {mix}\n")
        with pytest.raises(ScenarioError, match=message):
            Scenario.load(path)
    path.write_text(base + "sessions_per_region: 3\nclients: {aiortc: 3}\n")
    with pytest.raises(ScenarioError, match="not both"):
        Scenario.load(path)


def test_every_shipped_scenario_loads():
    shipped = {p.name: Scenario.load(p) for p in (REPO / "scenarios").glob("*.yaml")}
    assert {"default.yaml", "browsers.yaml", "ci.yaml"} <= set(shipped)
    assert shipped["default.yaml"].chromium_per_region == 0  # the main job runs no browser
    browsers, default = shipped["browsers.yaml"], shipped["default.yaml"]
    assert browsers.chromium_per_region >= 1
    # the default's world and architectures, at a load a browser per region leaves measurable
    assert (browsers.clusters, browsers.architectures) == (default.clusters, default.architectures)
    apac = default.for_client_regions(3)   # calls live at once per region, REGION=apac
    assert browsers.call_duration_s * browsers.start_rate < apac.call_duration_s * apac.start_rate


def test_the_load_as_calls_live_at_once_is_spread_over_the_client_regions(tmp_path):
    path = tmp_path / "s.yaml"
    base = ("name: s\nclusters: [na-east]\nsessions_per_region: 10\ncall_duration_s: 15\n"
            "architectures: [cluster-relay]\n")
    path.write_text(base + "live_at_once: 63\n")
    sc = Scenario.load(path)
    assert sc.live_at_once == 63
    assert sc.for_client_regions(3).start_rate == pytest.approx(1.4)
    assert sc.for_client_regions(10).start_rate == pytest.approx(0.42)
    for extra, message in (("live_at_once: 63\nstart_rate: 1\n", "one of them"),
                           ("", "one of them"), ("live_at_once: 0\n", "1..2000")):
        path.write_text(base + extra)
        with pytest.raises(ScenarioError, match=message):
            Scenario.load(path)
    path.write_text(base + "live_at_once: 2000\n")
    with pytest.raises(ScenarioError, match="calls a second per region"):
        Scenario.load(path).for_client_regions(1)
    path.write_text(base + "start_rate: 0.5\n")
    assert Scenario.load(path).for_client_regions(10).start_rate == 0.5   # as given


def test_a_world_of_many_client_regions_runs_its_own_load(tmp_path):
    """many_regions: with more client regions than more_than, its calls live at once and
    sessions a region instead of the file's; up to more_than, the file's."""
    base = ("name: s\nclusters: [na-east]\nsessions_per_region: 45\ncall_duration_s: 15\n"
            "full_clients_per_region: 2\narchitectures: [cluster-relay]\nlive_at_once: 63\n")
    sc = scenario_file(tmp_path, base + "many_regions: {more_than: 3, live_at_once: 40, "
                                        "sessions_per_region: 30}\n")
    apac, wide = sc.for_client_regions(3), sc.for_client_regions(10)
    assert (apac.live_at_once, apac.sessions_per_region) == (63, 45)
    assert apac.start_rate == pytest.approx(1.4)
    assert (wide.live_at_once, wide.sessions_per_region) == (40, 30)
    assert wide.start_rate == pytest.approx(40 / 150)
    assert wide.full_clients_per_region == 2
    for block, message in (("{more_than: 3}", "more_than and live_at_once"),
                           ("{more_than: 3, live_at_once: 40, rate: 1}", "more_than and"),
                           ("{more_than: 0, live_at_once: 40}", "more_than: 1..1000"),
                           ("{more_than: 3, live_at_once: 40, sessions_per_region: 0}",
                            "sessions_per_region: 1..200")):
        with pytest.raises(ScenarioError, match=message):
            scenario_file(tmp_path, base + f"many_regions: {block}\n")
    with pytest.raises(ScenarioError, match="needs live_at_once"):
        scenario_file(tmp_path, base.replace("live_at_once: 63", "start_rate: 1")
                      + "many_regions: {more_than: 3, live_at_once: 40}\n")


def test_a_sweep_point_of_sessions_is_not_overridden_by_many_regions(tmp_path):
    from scenarios.sweepspec import SweepPoint, scenario_at

    sc = scenario_file(tmp_path, "name: s\nclusters: [na-east]\nsessions_per_region: 45\n"
                       "call_duration_s: 15\narchitectures: [cluster-relay]\nlive_at_once: 63\n"
                       "many_regions: {more_than: 3, live_at_once: 40, "
                       "sessions_per_region: 30}\n")
    wide = scenario_at(sc, SweepPoint(0, (("sessions_per_region", 12),))).for_client_regions(10)
    assert (wide.sessions_per_region, wide.live_at_once) == (12, 40)
