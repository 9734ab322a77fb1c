"""The native media path end to end, beside the Python one: real aiortc clients, the real echo
agent, a transceiver with ``media_path`` python or native, in a lab namespace (root). Both
paths must give the caller the same call: its tone back, RTCP receiver reports that make an
RTT, the same packet counts; the native one with the caller's RTP never reaching Python."""
from __future__ import annotations

import asyncio
import math

import aiohttp
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection

from services.agent.config import AgentConfig
from services.agent.server import AgentServer
from services.transceiver.server import TransceiverConfig, TransceiverServer
from tests.conftest import lab_fixture
from tests.offers import offer_answer
from tests.test_transceiver_media import ToneTrack, rms
from topology.netns import in_namespace

EDGE = "10.77.0.1"
CLIENTS = 2
FRAMES = 150   # 3 s heard

lab = lab_fixture("venative")


async def _client(server, http, url) -> dict:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTrack(ToneTrack())
    channel = pc.createDataChannel("oai-events")
    heard: list[float] = []
    done = asyncio.Event()
    events: list[str] = []
    channel.on("message", events.append)

    @pc.on("track")
    def on_track(track):
        async def read():
            while len(heard) < FRAMES:
                heard.append(rms((await track.recv()).to_ndarray().tobytes()))
            done.set()
        asyncio.ensure_future(read())

    location, _ = await offer_answer(http, url, pc)
    await asyncio.wait_for(done.wait(), 20)
    await asyncio.sleep(1.6)   # one more RTCP interval (0.5-1.5 s) for the receiver reports
    stats = await pc.getStats()
    remote = [s for s in stats.values() if s.type == "remote-inbound-rtp"]
    inbound = [s for s in stats.values() if s.type == "inbound-rtp"]
    session = server.sessions[location.rsplit("/", 1)[1]]
    result = {"heard": heard, "rtt_ms": [s.roundTripTime * 1000 for s in remote],
              "received": inbound[0].packetsReceived, "lost": inbound[0].packetsLost,
              "agent_codec": session.agent_codec, "channel": session.channel,
              "created": [e for e in events if "session.created" in e]}
    async with http.delete(url.rsplit("/", 1)[0] + location) as response:
        result["deleted"] = response.status
    await pc.close()
    return result


def _run(lab, media_path: str, codecs: tuple[str, ...], mode: str = "echo") -> tuple[list, dict]:
    async def scenario():
        async with AgentServer(AgentConfig(port=0, mode=mode)) as agent:
            cfg = TransceiverConfig(cluster_id=1, transceiver_id=1, media_host=EDGE,
                                    control=("127.0.0.1", 0), media_path=media_path,
                                    agent_codecs=codecs,
                                    agent_url=f"ws://127.0.0.1:{agent.port}")
            async with TransceiverServer(cfg) as server, aiohttp.ClientSession() as http:
                url = f"http://127.0.0.1:{server.control_port}/sessions"
                results = await asyncio.gather(*(_client(server, http, url)
                                                 for _ in range(CLIENTS)))
                return results, {"mux": dict(vars(server.mux.counters)),
                                 "native": server.native.counters() if server.native else None,
                                 "left": server.native.sessions if server.native else 0,
                                 "links": {n: (l.records_in, l.unknown_channel)
                                           for n, l in agent.links.items()}}

    return in_namespace(lab.name, asyncio.run, scenario())


def _heard_the_tone(heard: list[float]) -> bool:
    return max(heard) > 8000 / math.sqrt(2) * 0.5


@pytest.mark.netns
def test_both_media_paths_echo_the_tone_with_the_same_rtcp_and_counts(lab):
    python, _ = _run(lab, "python", ("opus", "pcm16"))
    native, server = _run(lab, "native", ("opus", "pcm16"))
    for r in python + native:
        assert _heard_the_tone(r["heard"]) and min(r["heard"]) == 0.0, r["heard"]
        assert r["rtt_ms"] and 0 < r["rtt_ms"][-1] < 20, r["rtt_ms"]  # RR from the transceiver
        assert r["lost"] == 0 and r["deleted"] == 204
    assert {r["agent_codec"] for r in native} == {"opus"}   # the echo agent takes Opus
    assert all(r["channel"] is None for r in python)
    # the same call on both paths: packets received within a couple of frames of each other
    # (150 frames heard, then one RTCP interval), RTTs within 1 ms on this quiet host
    for p, n in zip(python, native):
        assert abs(p["received"] - n["received"]) <= 0.15 * p["received"], (p, n)
        assert abs(p["rtt_ms"][-1] - n["rtt_ms"][-1]) < 1.0, (p["rtt_ms"], n["rtt_ms"])
    c = server["native"]
    assert c["rtp_in"] >= CLIENTS * FRAMES and c["rtp_out"] >= CLIENTS * FRAMES
    drops = {k: v for k, v in c.items() if k.startswith(("drop_", "batch_")) and v}
    assert not drops, drops
    # Python saw only STUN, DTLS and RTCP of these sessions: a small share of the datagrams
    assert server["mux"]["delivered"] == c["to_python"] < c["rtp_in"] / 10, server
    assert server["left"] == 0   # every session left the plane


@pytest.mark.netns
def test_the_native_path_decodes_for_an_agent_that_takes_pcm(lab):
    """An agent offered pcm16 only gets 20 ms PCM frames (decoded by the plane) and its echo
    is encoded by the plane: the caller hears its tone."""
    native, server = _run(lab, "native", ("pcm16",))
    for r in native:
        assert r["agent_codec"] == "pcm16" and _heard_the_tone(r["heard"]), r["heard"]
    assert server["native"]["drop_decode"] == server["native"]["drop_encode"] == 0
