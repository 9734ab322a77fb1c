"""The light clients' native pump (services/client/pump.py) beside aiortc's light path: the same
sessions against a real transceiver and echo agent in a lab namespace (root) must report the
same call (echo verified, packets, loss, jitter and RTT measured), the pumped ones saying so."""
from __future__ import annotations

import asyncio

import pytest

from services.agent.config import AgentConfig
from services.agent.server import AgentServer
from services.client.config import ClientConfig
from services.client.runner import run_sessions
from services.transceiver.server import TransceiverConfig, TransceiverServer
from tests.conftest import lab_fixture
from topology.netns import in_namespace

EDGE = "10.77.0.1"
SESSIONS = 3
DURATION_S = 4.0

lab = lab_fixture("vepump")


def _calls(lab, light_path: str, media_path: str = "native"):
    async def scenario():
        async with AgentServer(AgentConfig(port=0)) as agent:
            cfg = TransceiverConfig(cluster_id=1, transceiver_id=1, media_host=EDGE,
                                    control=("127.0.0.1", 0), media_path=media_path,
                                    agent_url=f"ws://127.0.0.1:{agent.port}")
            async with TransceiverServer(cfg) as server:
                client = ClientConfig(url=f"http://127.0.0.1:{server.control_port}/sessions",
                                      duration_s=DURATION_S, start_rate=20, full_sessions=0,
                                      light_path=light_path, record_arrivals=True)
                return await run_sessions(client, SESSIONS)

    return in_namespace(lab.name, asyncio.run, scenario())


@pytest.mark.netns
def test_pumped_light_sessions_measure_the_same_call_as_aiortcs(lab):
    python, native = _calls(lab, "python"), _calls(lab, "native")
    assert [r.media_path for r in python] == ["python"] * SESSIONS
    assert [r.media_path for r in native] == ["native"] * SESSIONS
    for r in python + native:
        assert r.ok and r.client == "light", r.error
        assert r.echo_verified and r.echo_voiced_pct > 80, r.echo_voiced_pct
        assert r.loss_pct == 0 and r.packets_expected == r.packets_received
        assert r.jitter_ms is not None and r.jitter_ms < 5, r.jitter_ms
        assert r.rtt_ms is not None and 0 < r.rtt_ms < 20, r.rtt_ms   # RTCP both ways
        assert r.first_audio_ms is not None and r.first_audio_ms >= r.setup_ms
        assert len(r.rx_arrivals) == r.packets_received   # the arrival log, packet by packet
        times = [at for _, _, at in r.rx_arrivals]
        assert times == sorted(times) and r.first_rx_unix <= times[0] <= r.last_rx_unix
    expected = DURATION_S * 50
    for p, n in zip(python, native):
        assert abs(p.packets_received - n.packets_received) <= 0.1 * expected, (p, n)
        assert abs(p.rtt_ms - n.rtt_ms) < 1.0, (p.rtt_ms, n.rtt_ms)


@pytest.mark.netns
def test_the_pump_carries_light_sessions_against_the_python_transceiver_too(lab):
    """The pump is the client's own: it works whatever the edge's media path."""
    for r in _calls(lab, "native", media_path="python"):
        assert r.ok and r.media_path == "native" and r.echo_verified, r
