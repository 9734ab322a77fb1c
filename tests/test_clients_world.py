"""Browsers and TURN in a Mininet world (root): clients in apac-ne, aiortc and headless Chromium
side by side, through the global relay and relay-only through coturn on their region's edge
host (to a port-per-session transceiver in na-east), with the same calls and impairment; with
packet captures. The one place `make test` runs Chromium in the emulated regions."""
from __future__ import annotations

import csv
import json
import math
import os
import statistics

import pytest

from tests.conftest import run_scenario

pytestmark = [pytest.mark.world, pytest.mark.browser]

RETRY_RTO_MS = 500        # aioice's first STUN retransmission timeout (RFC 8489's 500 ms)
AIORTC, CHROMIUM = 2, 2   # per architecture; the two browsers offer gathered, then immediate
SESSIONS = AIORTC + CHROMIUM
SCENARIO = f"""\
name: clients-test
description: Both client types through the global relay and TURN.
clusters: [na-east]
clients: {{aiortc: {AIORTC}, chromium: {CHROMIUM}}}
full_clients_per_region: 1
# 5 s: the data channel opens about 1.2 s in, and one lost SCTP packet on this lossy path holds
# the ordered channel until aiortc's retransmission (its first RTO is 3 s); a 3 s call ended
# first, now and then, with the envelope check unverified
call_duration_s: 5
start_rate: 1
architectures: [global-relay, turn]
# 100 probes a path, as the world tests: with 20, a correct 1 ms jitter fails its spread
# check by chance in ~1% of paths (docs/topology.md); no second calibration at load
calibration: {{count: 100, rate: 100, at_load: false}}
"""


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("clients")
    path = root / "clients.yaml"
    path.write_text(SCENARIO)
    return run_scenario(path, "apac-ne", root / "results", args=("--capture",))


def _sessions(directory, arch: str, client: str | None = None) -> list[dict]:
    return [r for r in csv.DictReader(open(directory / "sessions.csv"))
            if r["architecture"] == arch and client in (None, r["client_type"])]


def _turn_address(directory) -> str:
    """coturn's listening and relay address, from the configuration the edge wrote."""
    conf = (directory / "logs" / "turn" / "turn-apac-ne.conf").read_text()
    return next(line.split("=", 1)[1] for line in conf.splitlines()
                if line.startswith("listening-ip="))


def _browser_lines(directory, arch: str) -> dict[int, dict]:
    """The browser client's own JSON lines (with its ``browser`` extras), by session index."""
    path = directory / "logs" / arch / "sessions-apac-ne-chromium.jsonl"
    return {r["index"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_every_session_of_both_client_types_is_tagged_and_ok(mixed_run):
    summary, directory = mixed_run
    assert {a: (s["sessions"], s["ok"]) for a, s in summary["architectures"].items()} == {
        "global-relay": (SESSIONS, SESSIONS), "turn": (SESSIONS, SESSIONS)}
    for arch in ("global-relay", "turn"):
        rows = _sessions(directory, arch)
        assert sorted((r["client_type"], int(r["session"])) for r in rows) == (
            [("aiortc", i) for i in range(AIORTC)]
            + [("chromium", AIORTC + i) for i in range(CHROMIUM)])
        for r in rows:
            assert r["echo_verified"] == "True" and r["datachannel_verified"] == "True", r
            # both client types asked for the project's edge's checks, and passed them
            assert r["verifies"] == r["verified"] == "audio,datachannel,envelope", r
            assert r["datachannel_echo"] == "envelope", r
        assert summary["verification"][arch]["fully_verified"] == SESSIONS
        styles = {r["offer_style"] for r in rows if r["client_type"] == "chromium"}
        assert styles == {"gathered", "immediate"}, (arch, styles)
        assert summary["clients"][arch]["chromium"]["immediate"]["ok"] == 1
    report = (directory / "report.md").read_text()
    assert "Setup timeline by client type and offer style" in report
    assert "| global-relay | chromium | immediate | 1/1 (" in report


def test_browsers_reach_the_relay_vip_and_the_immediate_offer_has_no_candidates(mixed_run):
    _, directory = mixed_run
    vip = json.loads((directory / "logs" / "global-relay" / "front-apac-ne.json").read_text())[
        0]["advertise"]
    lines = _browser_lines(directory, "global-relay")
    for r in _sessions(directory, "global-relay", "chromium"):
        # the browser's selected pair ends at the anycast VIP, as the aiortc clients' do
        assert r["ice_pair"].split(" -> ")[1] == vip, r["ice_pair"]
        extras = lines[int(r["session"])]["browser"]
        if r["offer_style"] == "immediate":
            assert extras["offer_candidates"] == 0 and not r["gathered_ms"]
        else:
            assert extras["offer_candidates"] > 0
            assert float(r["gathered_ms"]) <= float(r["offer_ms"])
        assert (float(r["offer_ms"]) < float(r["ice_connected_ms"]) <= float(r["setup_ms"])
                <= float(r["first_audio_ms"])), r
    for r in _sessions(directory, "global-relay", "aiortc"):
        assert r["ice_pair"].split(" -> ")[1] == vip, r["ice_pair"]


def test_every_turn_session_relays_through_its_regions_turn_server(mixed_run):
    _, directory = mixed_run
    turn_address = _turn_address(directory)
    ports = {r["architecture"]: r for r in csv.DictReader(open(directory / "ports.csv"))}
    cluster = {b.split(" ")[1].rsplit(":", 1)[0] for b in ports["turn"]["bindings"].split("; ")
               if b.startswith("transceiver-na-east@")}
    assert len(cluster) == 1, cluster
    impairments = json.loads((directory / "config.json").read_text())["impairments"]
    up, down = (impairments[f"last_mile_{d} apac-ne->apac-ne"] for d in ("up", "down"))
    last_mile_rtt = up["delay_ms"] + down["delay_ms"]
    # The round trip's configured spread: sd 1.4 ms for 1 ms of normal jitter each way. The old
    # lower bound, 3 ms below the mean (2.1 sd), failed by chance about once in eight runs
    # (about 8 transactions a run; 8.6 and 8.8 ms seen for 12): 4.5 sd below it fails once
    # in some 10^5 transactions and still refuses a round trip shorter than the last mile's.
    spread = 4.5 * math.hypot(up["jitter_ms"], down["jitter_ms"])
    browsers = _browser_lines(directory, "turn")
    for r in _sessions(directory, "turn"):
        local, remote = r["ice_pair"].split(" -> ")
        assert local.split(":")[0] == turn_address, r["ice_pair"]  # a relay candidate
        assert {remote.split(":")[0]} == cluster  # the transceiver's own per-session port
        if r["client_type"] == "chromium":
            assert browsers[int(r["session"])]["browser"]["local_candidate"] == "relay"
            continue
        calls = json.loads(r["turn_transactions"])
        kinds = [(method, outcome) for method, _, _, outcome, _ in calls]
        assert kinds[:2] == [("Allocate", "401"), ("Allocate", "ok")], kinds
        assert ("ChannelBind", "ok") in kinds, kinds
        # the TURN server is in the client's region: each request a last-mile round trip after
        # its last transmission. The last mile loses 0.1% each way, so now and then a request
        # or its answer is lost and aioice sends it again after 500 ms, then 1 s more, ...
        for method, _, rtt, _, sends in calls:
            assert sends >= 1, calls
            retransmitted_after = RETRY_RTO_MS * (2 ** (sends - 1) - 1)
            assert (last_mile_rtt - spread <= rtt - retransmitted_after
                    <= last_mile_rtt + 15), (method, rtt, sends, last_mile_rtt)
    gathered = {arch: statistics.median(float(r["gathered_ms"]) for r in
                                        _sessions(directory, arch, "aiortc"))
                for arch in ("global-relay", "turn")}
    # two requests to the TURN server before the offer can go: at least one last-mile RTT more
    assert gathered["turn"] - gathered["global-relay"] >= last_mile_rtt, gathered


def test_the_turn_servers_ports_are_counted_with_the_transceivers(mixed_run):
    _, directory = mixed_run
    ports = {r["architecture"]: r for r in csv.DictReader(open(directory / "ports.csv"))}
    turn, relay = ports["turn"], ports["global-relay"]
    peak = int(turn["concurrent_sessions"])
    assert peak >= 2, "sessions never overlapped: no peak to measure at"
    bindings = set(turn["bindings"].split("; "))
    at_turn = {b.rsplit(":", 1)[1] for b in bindings if b.startswith("turn-apac-ne@edge1 ")}
    assert "3478" in at_turn  # its listening port
    assert len(at_turn - {"3478"}) >= peak, bindings  # a relay port per live allocation
    transceiver = [b for b in bindings if b.startswith("transceiver-na-east@cluster")]
    assert abs(len(transceiver) - peak) <= 1, bindings
    assert int(turn["public_udp_ports"]) == len(at_turn) + len(transceiver)
    assert int(relay["public_udp_ports"]) == 1
    report = (directory / "report.md").read_text()
    assert "TURN's setup overhead" in report and "TURN: 1 listening + " in report


def test_the_wire_sees_every_hop_through_the_turn_server(mixed_run):
    _, directory = mixed_run
    wire = {a["architecture"]: a for a in json.loads(
        (directory / "pcap" / "analysis.json").read_text())["architectures"]}
    assert not [(a, h["direction"], h["hop"]) for a, w in wire.items() for h in w["hops"]
                if not h["ok"]]
    turn = wire["turn"]
    hops = {(h["direction"], h["hop"]) for h in turn["hops"]}
    assert {("up", "TURN server apac-ne"), ("down", "TURN server apac-ne"),
            ("up", "public internet apac-ne->na-east"),
            ("down", "public internet na-east->apac-ne")} <= hops
    assert not any("backbone" in hop or "relay" in hop for _, hop in hops), hops
    facts = turn["wire"]
    assert facts["sessions"] == SESSIONS and facts["public_ports"] == 1
    assert facts["relay_forwards"] > 0 and facts["relay_forwards_unexpected"] == 0
    control = {(x["method"], x["outcome"]): x for x in facts["turn"]["transactions"]}
    # every session, browser or not, allocated once after the credential challenge
    assert control[("Allocate", "401")]["count"] >= SESSIONS
    assert control[("Allocate", "success")]["count"] == SESSIONS
    assert control[("ChannelBind", "success")]["count"] >= SESSIONS


def test_the_run_leaves_no_turn_server_and_no_browser(mixed_run):
    _, directory = mixed_run
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if (b"turnserver" in cmdline and str(directory).encode() in cmdline) or (
                b"chromium" in cmdline and b"voiceedge-browser-" in cmdline):
            left.append((pid, cmdline[:80]))
    assert not left


def test_every_call_carried_a_token_of_the_runs_key_and_no_credential_was_kept(mixed_run):
    """The fronts check API keys: each client process (aiortc, and Chromium's pages through
    their URL's fragment) carried a call token minted from a key generated for the run, and
    neither the key nor a token is in any file of the results."""
    _, directory = mixed_run
    for arch in ("global-relay", "turn"):
        records = [json.loads(line) for line in
                   (directory / "logs" / arch / "timeline.jsonl").read_text().splitlines()]
        created = [r for r in records if r.get("event") == "call_created"]
        assert len(created) >= SESSIONS
        assert all(r["caller"].startswith("testbed.") for r in created), created
        assert not [r for r in records if r.get("event") == "call_refused"]
        issued = [r["user"] for r in records if r.get("event") == "turn_credential_issued"]
        assert arch != "turn" or (len(issued) >= SESSIONS
                                  and all("-testbed." in u for u in issued)), issued
    for path in directory.rglob("*"):
        if path.is_file() and path.suffix not in (".pcap", ".wav", ".png"):
            text = path.read_bytes()
            assert b"vek_testbed_" not in text and b"vet_" not in text, path
