"""The edge end to end on one host: client -> relay VIP -> transceiver -> agent, and back.

Real processes (redis-server, relay, transceiver, agent, signaling) in a lab network namespace,
real aiortc clients. Needs root.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import AudioStreamTrack

from scenarios.processes import ServiceProcess, http_ok, redis_cmd, tcp_open, voiceedge_cmd
from services.client.config import ClientConfig
from services.client.session import run_session
from services.relay.counters import scrape
from topology.netns import in_namespace, lab_namespace

EDGE = "10.77.0.1"
VIP, MEDIA = 3478, 3480
AGENT, CONTROL, REDIS, METRICS, SIGNALING = 28800, 28900, 26379, 29478, 28080


@pytest.fixture(scope="module")
def lab():
    if os.geteuid() != 0:
        pytest.skip("needs root for a network namespace")
    with lab_namespace("veedge") as ns:
        yield ns


class Edge:
    """Services started inside the namespace (call from a thread that is in it)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[str, ServiceProcess] = {}

    def start(self, name: str, cmd: list[str], ready) -> ServiceProcess:
        proc = ServiceProcess(name, cmd, self.workdir / f"{name}.log").start()
        self.procs[name] = proc
        return proc.wait_ready(ready)

    def agent(self) -> None:
        self.start("agent", voiceedge_cmd("agent", "--listen", "127.0.0.1", "--port", str(AGENT)),
                   lambda: tcp_open("127.0.0.1", AGENT))

    def redis(self) -> None:
        self.start("redis", redis_cmd("127.0.0.1", REDIS, self.workdir),
                   lambda: tcp_open("127.0.0.1", REDIS))

    def relay(self, with_redis: bool) -> None:
        routes = self.workdir / "routes.toml"
        routes.write_text(f'cluster_id = 1\n[routes]\n1 = "{EDGE}:{MEDIA}"\n')
        extra = ["--redis", f"redis://127.0.0.1:{REDIS}/0"] if with_redis else []
        self.start("relay", voiceedge_cmd(
            "relay", "--tier", "cluster", "--routes", str(routes), "--listen", EDGE, "--port",
            str(VIP), "--internal", f"{EDGE}:{VIP + 1}", "--hop-bind", EDGE, "--relay-id",
            "edge-test", "--metrics", f"127.0.0.1:{METRICS}", "--cpus", "none", *extra),
            lambda: http_ok(f"http://127.0.0.1:{METRICS}/metrics"))

    def transceiver(self) -> None:
        self.start("transceiver", voiceedge_cmd(
            "transceiver", "--cluster", "1", "--id", "1", "--media", f"{EDGE}:{MEDIA}",
            "--advertise", f"{EDGE}:{VIP}", "--control", f"127.0.0.1:{CONTROL}",
            "--agent", f"ws://127.0.0.1:{AGENT}"),
            lambda: http_ok(f"http://127.0.0.1:{CONTROL}/status"))

    def signaling(self) -> None:
        self.start("signaling", voiceedge_cmd(
            "signaling", "--listen", f"127.0.0.1:{SIGNALING}", "--transceiver",
            f"http://127.0.0.1:{CONTROL}"), lambda: http_ok(f"http://127.0.0.1:{SIGNALING}/healthz"))

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            proc.stop()


def relay_counters() -> dict[str, int]:
    return scrape(f"http://127.0.0.1:{METRICS}/metrics")


def test_audio_and_data_channel_both_ways_through_relay_transceiver_and_agent(lab, tmp_path):
    async def scenario():
        edge = Edge(tmp_path)
        loop = asyncio.get_running_loop()
        try:
            for step in (edge.agent, edge.redis, lambda: edge.relay(True), edge.transceiver,
                         edge.signaling):
                await loop.run_in_executor(None, step)
            result = await run_session(ClientConfig(
                url=f"http://127.0.0.1:{SIGNALING}/v1/calls", duration_s=2.0))
            counters = relay_counters()
            with urllib.request.urlopen(f"http://127.0.0.1:{CONTROL}/status") as r:
                status = json.loads(r.read())
            return result, counters, status
        finally:
            edge.stop()

    result, counters, status = in_namespace(lab.name, asyncio.run, scenario())
    assert result.ok, result.error
    assert result.echo_verified and result.datachannel_verified
    assert result.signaling_ms <= result.ice_connected_ms <= result.setup_ms
    assert result.loss_pct == 0
    assert counters["flows_created"] == 1
    assert counters["packets_to_server"] > 50 and counters["packets_to_client"] > 50
    assert status["sessions"] == 0  # the client's DELETE ended it


async def _call_with_arrivals(http: aiohttp.ClientSession):
    """A plain aiortc call to the transceiver; returns (pc, location, arrival times list)."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTrack(AudioStreamTrack())
    connected = asyncio.Event()
    arrivals: list[float] = []

    @pc.on("connectionstatechange")
    def _() -> None:
        if pc.connectionState == "connected":
            connected.set()

    @pc.on("track")
    def on_track(track) -> None:
        async def drain() -> None:
            while True:
                try:
                    await track.recv()
                except Exception:
                    return
        asyncio.ensure_future(drain())

    await pc.setLocalDescription(await pc.createOffer())
    receiver = next(t.receiver for t in pc.getTransceivers() if t.kind == "audio")
    original = receiver._handle_rtp_packet

    async def timestamped(packet, arrival_time_ms):
        arrivals.append(time.monotonic())
        await original(packet, arrival_time_ms=arrival_time_ms)

    receiver._handle_rtp_packet = timestamped
    async with http.post(f"http://127.0.0.1:{CONTROL}/sessions", data=pc.localDescription.sdp,
                         headers={"Content-Type": "application/sdp"}) as r:
        assert r.status == 201, await r.text()
        answer, location = await r.text(), r.headers["Location"]
    await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
    await asyncio.wait_for(connected.wait(), 10)
    return pc, location, arrivals


def _restart_gap(lab, tmp_path, with_redis: bool, down_s: float, listen_s: float):
    """Kill the relay mid-call, start it again; when does the server's audio come back?"""

    async def scenario():
        edge = Edge(tmp_path)
        loop = asyncio.get_running_loop()
        try:
            steps = [edge.agent] + ([edge.redis] if with_redis else []) + [
                lambda: edge.relay(with_redis), edge.transceiver]
            for step in steps:
                await loop.run_in_executor(None, step)
            async with aiohttp.ClientSession() as http:
                pc, location, arrivals = await _call_with_arrivals(http)
                await asyncio.sleep(1.5)
                assert len(arrivals) > 40  # audio is flowing through the relay
                killed_at = time.monotonic()
                edge.procs["relay"].kill()
                await asyncio.sleep(down_s)
                last_before = max(t for t in arrivals if t <= killed_at + 0.05)
                await loop.run_in_executor(None, lambda: edge.relay(with_redis))
                ready_at = time.monotonic()
                deadline = ready_at + listen_s
                while time.monotonic() < deadline and not [t for t in arrivals if t > ready_at]:
                    await asyncio.sleep(0.01)
                resumed = [t for t in arrivals if t > ready_at]
                await asyncio.sleep(0.7)  # the relay publishes its counters twice a second
                counters = relay_counters()
                await pc.close()
                async with http.delete(f"http://127.0.0.1:{CONTROL}{location}"):
                    pass
            first = resumed[0] if resumed else None
            return (first - ready_at if first else None,
                    first - last_before if first else None, counters)
        finally:
            edge.stop()

    return in_namespace(lab.name, asyncio.run, scenario())


def test_relay_restart_with_redis_resumes_audio_at_once(lab, tmp_path):
    after_ready, gap, counters = _restart_gap(lab, tmp_path, with_redis=True, down_s=0.5,
                                              listen_s=3.0)
    print(f"with Redis: audio back {after_ready * 1000:.0f} ms after the new relay was ready; "
          f"whole gap {gap * 1000:.0f} ms")
    assert after_ready is not None and after_ready <= 0.25
    assert counters["flows_recovered"] == 1 and counters.get("flows_created", 0) == 0


def test_relay_restart_without_redis_waits_for_a_consent_check(lab, tmp_path):
    after_ready, gap, counters = _restart_gap(lab, tmp_path, with_redis=False, down_s=0.5,
                                              listen_s=9.0)
    print(f"without Redis: audio back {after_ready * 1000:.0f} ms after the new relay was "
          f"ready; whole gap {gap * 1000:.0f} ms")
    assert after_ready is not None, "audio never came back (no consent check in 9 s?)"
    assert after_ready > 0.25  # nothing but a STUN check can re-create the flow
    assert counters["flows_created"] == 1 and counters.get("flows_recovered", 0) == 0
    assert counters["drops_unknown_not_stun"] > 0


BAD = [
    ("text/plain", b"v=0\r\n", 415),
    ("application/sdp", b"not sdp", 400),
    ("application/sdp", b"v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:0\r\n", 400),
    ("application/sdp", b"v=0\r\n" + b"a=x:" + b"y" * 70000 + b"\r\n", 413),
]


def test_signaling_refuses_bad_offers_and_deletes_calls(lab, tmp_path):
    async def scenario():
        edge = Edge(tmp_path)
        loop = asyncio.get_running_loop()
        try:
            for step in (edge.agent, edge.transceiver, edge.signaling):
                await loop.run_in_executor(None, step)
            url = f"http://127.0.0.1:{SIGNALING}/v1/calls"
            out = []
            async with aiohttp.ClientSession() as http:
                for ctype, body, _ in BAD:
                    async with http.post(url, data=body, headers={"Content-Type": ctype}) as r:
                        out.append((r.status, await r.text()))
                async with http.delete(f"{url}/t0.nosuchsession") as r:
                    missing = r.status
                async with http.delete(f"{url}/garbage") as r:
                    garbage = r.status
            with urllib.request.urlopen(f"http://127.0.0.1:{CONTROL}/status") as r:
                sessions = json.loads(r.read())["sessions"]
            return out, missing, garbage, sessions
        finally:
            edge.stop()

    out, missing, garbage, sessions = in_namespace(lab.name, asyncio.run, scenario())
    for (status, text), (_, _, want) in zip(out, BAD):
        assert status == want, (status, text)
        assert len(text.strip().splitlines()) == 1 and "Traceback" not in text
    assert missing == 404 and garbage == 404 and sessions == 0
