"""Light and full clients through the real edge (relay, transceiver, agent: separate processes
in a lab namespace, as in the demo), and the parts that say which session was which.

A light client decodes nothing: it measures from RTP headers and checks the echo from payload
sizes. The edge's agent echoes (the echo is verified) or, in reply mode with a long hangover,
never answers a caller that keeps talking (the echo must not be verified).
"""
from __future__ import annotations

import asyncio
import json
import threading

import pytest

from scenarios.demo_edge import demo_plan
from scenarios.edge import Edge
from scenarios.processes import tcp_open, voiceedge_cmd
from scenarios.runner import SESSION_FIELDS
from scenarios.spec import Scenario, ScenarioError
from services.client.config import FULL, LIGHT, ClientConfig
from services.client.runner import kinds, run_sessions
from services.client.session import run_session
from services.client.voiced import VOICED_MIN_BYTES, VoicedCount
from tests.conftest import needs, scenario_file
from topology.netns import in_namespace, lab_namespace
from voiceedge.errors import UserError

pytestmark = pytest.mark.shareable  # make test runs it beside another (pyproject)

CALL_S = 4.0  # long enough for RTCP: a sender report, then the receiver report with its RTT


class SilentAgentEdge(Edge):
    """The demo's edge with an agent that never answers: reply mode replies when the caller
    stops talking, and the client's tone does not stop within the hangover."""

    def start_agent(self, cluster):
        port = self.plan.ports.agent
        return self.add(f"agent-{cluster.name}", cluster.host, voiceedge_cmd(
            "agent", "--listen", "127.0.0.1", "--port", str(port), "--mode", "reply",
            "--hangover-ms", "600000"), "agent", lambda: tcp_open("127.0.0.1", port))


def running_edge(kind: type[Edge], prefix: str, logs):
    with lab_namespace(prefix) as ns:
        edge = kind(demo_plan("shared", ns.name, *ns.addresses), logs)
        with edge:
            yield ns, edge


@pytest.fixture(scope="module")
@needs("netns")
def echo_edge(tmp_path_factory):
    yield from running_edge(Edge, "velight", tmp_path_factory.mktemp("echo-edge"))


@pytest.fixture(scope="module")
@needs("netns")
def silent_edge(tmp_path_factory):
    yield from running_edge(SilentAgentEdge, "vesilent", tmp_path_factory.mktemp("silent-edge"))


def config(edge: Edge, **kw) -> ClientConfig:
    return ClientConfig(url=edge.signaling_url(edge.plan.fronts[0]),
                        **{"duration_s": CALL_S, "setup_timeout_s": 5.0, **kw})


def call(ns, coro):
    return in_namespace(ns.name, asyncio.run, coro)


def decoder_threads() -> int:
    """aiortc's decoder threads alive in this process (one per receiver that decodes)."""
    return sum(1 for t in threading.enumerate() if t.name == "audio-decoder")


# -- through the edge ----------------------------------------------------------------------------

def test_a_light_session_measures_from_rtp_and_verifies_the_echo(echo_edge):
    ns, edge = echo_edge
    r = call(ns, run_session(config(edge), index=3, kind=LIGHT))

    assert r.ok, r.error
    assert r.client == LIGHT
    assert r.offer_ms + r.signaling_ms <= r.ice_connected_ms <= r.setup_ms <= r.first_audio_ms
    assert 0 < r.first_ice_rtt_ms < 100
    assert r.rtt_ms is not None and 0 < r.rtt_ms < 100          # RTCP, our sending stream
    assert r.jitter_ms is not None and 0 <= r.jitter_ms < 50     # aiortc's receive statistics
    assert r.packets_received > 0.6 * 50 * CALL_S
    assert r.packets_lost == 0 and r.loss_pct == 0 and r.loss_bursts == []
    assert r.echo_rms is None                                    # nothing was decoded
    assert r.echo_voiced_pct > 80 and r.echo_verified
    assert r.datachannel_verified
    assert any(s.rtt_ms is not None for s in r.samples)
    assert r.samples[-1].packets_received == r.packets_received


def test_full_and_light_sessions_side_by_side_say_which_they_were(echo_edge, tmp_path):
    ns, edge = echo_edge
    results_file = tmp_path / "sessions.jsonl"
    seen: list[int] = []

    async def main():
        run = asyncio.create_task(run_sessions(config(edge, duration_s=3.0, full_sessions=1,
                                                      start_rate=20.0), 2,
                                               results_path=results_file))
        await asyncio.sleep(2.0)  # both calls are on
        seen.append(decoder_threads())
        return await run

    before = decoder_threads()
    full, light = call(ns, main())

    assert (full.client, light.client) == (FULL, LIGHT)
    assert full.ok and light.ok, (full.error, light.error)
    assert seen == [before + 1], "the light session decoded, or the full one did not"
    assert full.echo_verified and full.echo_rms > 0.05
    assert light.echo_verified and light.echo_rms is None
    # the payload check agrees with the decoded one where both are measured
    assert full.echo_voiced_pct > 80 and light.echo_voiced_pct > 80
    lines = {x["index"]: x for x in map(json.loads, results_file.read_text().splitlines())}
    assert lines[0]["client"] == FULL and lines[1]["client"] == LIGHT


def test_a_light_session_whose_agent_sends_nothing_does_not_verify_the_echo(silent_edge):
    ns, edge = silent_edge

    async def main():
        cfg = config(edge, duration_s=2.0)
        return await asyncio.gather(run_session(cfg, 0, kind=LIGHT),
                                     run_session(cfg, 1, kind=FULL))

    light, full = call(ns, main())

    assert light.ok and full.ok, (light.error, full.error)
    assert light.packets_received > 0.6 * 50 * 2.0   # the transceiver sends silence
    assert light.echo_voiced_pct is not None and light.echo_voiced_pct < 5
    assert not light.echo_verified
    assert full.echo_rms < 0.01 and not full.echo_verified  # the decoding check agrees


# -- which sessions are which --------------------------------------------------------------------

@pytest.mark.parametrize("n, full, expected", [
    (5, None, [0, 1, 2, 3, 4]), (5, 0, []), (10, 2, [0, 5]), (7, 2, [0, 3]), (3, 9, [0, 1, 2]),
])
def test_full_sessions_are_spread_over_the_run(n, full, expected):
    k = kinds(n, full)
    assert len(k) == n and set(k) <= {FULL, LIGHT}
    assert [i for i, x in enumerate(k) if x == FULL] == expected


def test_a_phase_shifts_the_full_sessions_so_regions_take_turns():
    """Ten regions of 45 sessions with 2 full each (REGION=all): with phases k/10, no two
    regions' full sessions share an index; without, all ten ran theirs at once."""
    full_at = [[i for i, x in enumerate(kinds(45, 2, k / 10)) if x == FULL] for k in range(10)]
    assert full_at[0] == [0, 22] and full_at[5] == [11, 33] and full_at[9] == [20, 42]
    flat = [i for at in full_at for i in at]
    assert len(set(flat)) == len(flat) == 20
    assert [i for i, x in enumerate(kinds(45, 2)) if x == FULL] == full_at[0]


def test_voiced_count_skips_the_start_and_counts_by_payload_size():
    v = VoicedCount(skip_s=0.2)
    v.add(200, at=10.0)                          # first packet: the skip starts here
    v.add(200, at=10.1)
    assert v.voiced_pct is None
    for i in range(10):
        v.add(VOICED_MIN_BYTES if i < 3 else 3, at=10.2 + i * 0.02)
    assert (v.counted, v.voiced) == (10, 3) and v.voiced_pct == pytest.approx(30.0)


def test_client_config_and_cli_take_the_number_of_full_clients():
    import argparse
    from services.client import cli

    with pytest.raises(ValueError):
        ClientConfig(url="http://x/", full_sessions=-1)
    with pytest.raises(ValueError):
        ClientConfig(url="http://x/", echo_min_voiced_pct=0)
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["client", "--url", "http://x/", "--full-clients", "2"])
    assert cli.config_from_args(args).full_sessions == 2
    args = parser.parse_args(["client", "--url", "http://x/"])
    assert cli.config_from_args(args).full_sessions is None   # all full, as before
    args = parser.parse_args(["client", "--url", "http://x/", "--full-clients", "-1"])
    with pytest.raises(UserError, match="--full-clients"):
        cli.config_from_args(args)


def test_scenario_field_full_clients_per_region(tmp_path):
    base = "name: x\nclusters: [na-east]\ncall_duration_s: 3\nstart_rate: 1\n"

    def load(extra: str) -> Scenario:
        return scenario_file(tmp_path, base + extra)

    assert load("sessions_per_region: 7\n").full_clients_per_region == 2
    assert load("sessions_per_region: 1\n").full_clients_per_region == 1
    assert load("sessions_per_region: 7\nfull_clients_per_region: 0\n"
                ).full_clients_per_region == 0
    assert load("sessions_per_region: 7\nfull_clients_per_region: 7\n"
                ).full_clients_per_region == 7
    for bad in ("8", "-1", "two", "1.5", "true"):
        with pytest.raises(ScenarioError,
                           match=r"full_clients_per_region: 0\.\.sessions_per_region \(7\)"):
            load(f"sessions_per_region: 7\nfull_clients_per_region: {bad}\n")
    assert "client" in SESSION_FIELDS
