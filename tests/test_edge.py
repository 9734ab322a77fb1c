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

from scenarios.demo_edge import demo_plan
from scenarios.edge import Edge
from services.client.config import ClientConfig
from services.client.session import run_session
from tests.conftest import lab_fixture
from topology.netns import in_namespace


lab = lab_fixture("veedge")


def one_cluster(lab, tmp_path, redis: bool = True, mode: str = "shared") -> Edge:
    """The one-cluster edge of the demo in the lab namespace (nothing started yet)."""
    plan = demo_plan(mode, lab.name, *lab.addresses)
    if not redis:
        from dataclasses import replace
        plan = replace(plan, redis=False)
    return Edge(plan, tmp_path)


def test_audio_and_data_channel_both_ways_through_relay_transceiver_and_agent(lab, tmp_path):
    edge = one_cluster(lab, tmp_path)
    cluster, front = edge.plan.clusters[0], edge.plan.fronts[0]

    async def scenario():
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, edge.start)
            result = await run_session(ClientConfig(url=edge.signaling_url(front),
                                                    duration_s=2.0))
            counters = (await loop.run_in_executor(None, edge.relay_counters))["relay-demo"]
            with urllib.request.urlopen(f"{edge.control_url(cluster)}/status") as r:
                status = json.loads(r.read())
            return result, counters, status
        finally:
            await loop.run_in_executor(None, edge.stop)

    result, counters, status = in_namespace(lab.name, asyncio.run, scenario())
    assert result.ok, result.error
    assert result.echo_verified and result.datachannel_verified
    assert result.signaling_ms <= result.ice_connected_ms <= result.setup_ms
    assert result.loss_pct == 0
    assert counters["flows_created"] == 1
    assert counters["packets_to_server"] > 50 and counters["packets_to_client"] > 50
    assert status["sessions"] == 0  # the client's DELETE ended it
    assert status["event_loop"] == "uvloop"  # the transceiver's default (services/eventloops.py)


def test_every_service_of_an_edge_runs_at_its_realtime_priority(lab, tmp_path):
    """scenarios/priorities.py: the edge's services at one SCHED_FIFO priority, every thread;
    an Edge without one leaves them ordinary (test above: the same services, started plain)."""
    edge = Edge(demo_plan("shared", lab.name, *lab.addresses), tmp_path, realtime=4)
    try:
        edge.start()
        seen = {}
        for name, service in edge.services.items():
            tids = os.listdir(f"/proc/{service.process.pid}/task")
            seen[name] = {(os.sched_getscheduler(int(t)), os.sched_getparam(int(t)).sched_priority)
                          for t in tids}
    finally:
        edge.stop()
    assert {s.role for s in edge.services.values()} >= {"redis", "relay", "transceiver",
                                                         "agent", "signaling"}
    assert seen == {name: {(os.SCHED_FIFO, 4)} for name in edge.services}


async def _call_with_arrivals(http: aiohttp.ClientSession, edge: Edge):
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
    cluster = edge.plan.clusters[0]
    async with http.post(f"{edge.control_url(cluster)}/sessions",
                         params={"candidate": edge.plan.advertise(cluster)},
                         data=pc.localDescription.sdp,
                         headers={"Content-Type": "application/sdp"}) as r:
        assert r.status == 201, await r.text()
        answer, location = await r.text(), r.headers["Location"]
    await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
    await asyncio.wait_for(connected.wait(), 10)
    return pc, location, arrivals


def _restart_gap(lab, tmp_path, with_redis: bool, down_s: float, listen_s: float):
    """Kill the relay mid-call, start it again; when does the server's audio come back?"""

    edge = one_cluster(lab, tmp_path, redis=with_redis)
    cluster = edge.plan.clusters[0]

    async def scenario():
        loop = asyncio.get_running_loop()
        try:
            steps = [edge.start_agent] + ([edge.start_redis] if with_redis else []) + [
                edge.start_relay, edge.start_transceiver]
            for step in steps:
                await loop.run_in_executor(None, step, cluster)
            async with aiohttp.ClientSession() as http:
                pc, location, arrivals = await _call_with_arrivals(http, edge)
                await asyncio.sleep(1.5)
                assert len(arrivals) > 40  # audio is flowing through the relay
                killed_at = time.monotonic()
                edge.services["relay-demo"].process.kill()
                await asyncio.sleep(down_s)
                last_before = max(t for t in arrivals if t <= killed_at + 0.05)
                await loop.run_in_executor(None, edge.start_relay, cluster)
                ready_at = time.monotonic()
                deadline = ready_at + listen_s
                while time.monotonic() < deadline and not [t for t in arrivals if t > ready_at]:
                    await asyncio.sleep(0.01)
                resumed = [t for t in arrivals if t > ready_at]
                await asyncio.sleep(0.7)  # the relay publishes its counters twice a second
                counters = (await loop.run_in_executor(None, edge.relay_counters))["relay-demo"]
                await pc.close()
                async with http.delete(f"{edge.control_url(cluster)}{location}"):
                    pass
            first = resumed[0] if resumed else None
            return (first - ready_at if first else None,
                    first - last_before if first else None, counters)
        finally:
            await loop.run_in_executor(None, edge.stop)

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
    edge = one_cluster(lab, tmp_path, redis=False, mode="port-per-session")
    cluster, front = edge.plan.clusters[0], edge.plan.fronts[0]

    async def scenario():
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, edge.start)
            url = edge.signaling_url(front)
            out = []
            async with aiohttp.ClientSession() as http:
                for ctype, body, _ in BAD:
                    async with http.post(url, data=body, headers={"Content-Type": ctype}) as r:
                        out.append((r.status, await r.text()))
                # A well-formed call id ({cluster}~{transceiver index}~{session}) that names
                # no session: signaling forwards the DELETE and the transceiver answers 404.
                async with http.delete(f"{url}/{cluster.name}~0~nosuchsession") as r:
                    missing = r.status, await r.text()
                async with http.delete(f"{url}/garbage") as r:
                    garbage = r.status, await r.text()
            with urllib.request.urlopen(f"{edge.control_url(cluster)}/status") as r:
                sessions = json.loads(r.read())["sessions"]
            return out, missing, garbage, sessions
        finally:
            await loop.run_in_executor(None, edge.stop)

    out, missing, garbage, sessions = in_namespace(lab.name, asyncio.run, scenario())
    for (status, text), (_, _, want) in zip(out, BAD):
        assert status == want, (status, text)
        assert len(text.strip().splitlines()) == 1 and "Traceback" not in text
    assert missing == (404, "no such session\n")  # the transceiver's 404, not signaling's
    assert garbage == (404, "no such call\n")     # signaling's: not a call id at all
    assert sessions == 0


@pytest.mark.parametrize("mode", ["shared", "port-per-session"])
def test_public_udp_ports_are_measured_not_assumed(lab, tmp_path, mode):
    """With three live calls, read from /proc what the edge exposes on its public address:
    the relay's one port (shared), or a port per session (port-per-session)."""
    from services.client.runner import run_sessions

    edge = one_cluster(lab, tmp_path, redis=False, mode=mode)
    cluster, front = edge.plan.clusters[0], edge.plan.fronts[0]

    async def scenario():
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, edge.start)
            idle = await loop.run_in_executor(None, edge.public_bindings)
            calls = asyncio.create_task(run_sessions(
                ClientConfig(url=edge.signaling_url(front), duration_s=3.0, start_rate=20), 3))
            live = []
            for _ in range(60):  # sample while the calls are up
                await asyncio.sleep(0.1)
                with urllib.request.urlopen(f"{edge.control_url(cluster)}/status") as r:
                    if json.loads(r.read())["sessions"] == 3:
                        live = await loop.run_in_executor(None, edge.public_bindings)
                        break
            results = await calls
            return idle, live, results
        finally:
            await loop.run_in_executor(None, edge.stop)

    idle, live, results = in_namespace(lab.name, asyncio.run, scenario())
    assert all(r.ok for r in results), [r.error for r in results]
    assert live, "three sessions were never live at once"
    assert {b.address for b in idle + live} == {cluster.public}  # nothing else faces clients
    if mode == "shared":
        assert {(b.port, b.service) for b in idle} == {(3478, "relay-demo")}
        assert {(b.port, b.service) for b in live} == {(3478, "relay-demo")}
    else:
        assert idle == []  # no call, no port
        ports = {b.port for b in live}
        assert len(ports) == 3 and {b.service for b in live} == {"transceiver-demo"}


def test_a_stalled_transceiver_flags_the_session_it_served(lab, tmp_path):
    """SIGSTOP the transceiver for 200 ms mid-call (what a saturated host does to a process):
    its lag monitor reports it, and the session live then is flagged as saturated."""
    import signal

    from scenarios.saturation import LagWindows, flag
    from scenarios.timeline import merge_timeline

    edge = one_cluster(lab, tmp_path, redis=False)
    front = edge.plan.fronts[0]

    async def scenario():
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, edge.start)
            call = asyncio.create_task(run_session(ClientConfig(url=edge.signaling_url(front),
                                                                duration_s=3.0)))
            await asyncio.sleep(2.0)
            pid = edge.services["transceiver-demo"].process.pid
            os.kill(pid, signal.SIGSTOP)
            await asyncio.sleep(0.2)
            os.kill(pid, signal.SIGCONT)
            return await call
        finally:
            await loop.run_in_executor(None, edge.stop)

    result = in_namespace(lab.name, asyncio.run, scenario())
    assert result.ok, result.error
    lag = LagWindows.from_run(merge_timeline(tmp_path))
    worst = max(ms for _, _, ms in lag.windows["transceiver-demo"])
    assert worst >= 150, lag.windows
    row = {"client_region": "demo", "cluster_region": "demo", "architecture": "cluster-relay"}
    flag(row, lag, result.started_unix, result.ended_unix, result.setup_ms / 1000)
    assert row["saturated"] and "transceiver-demo" in row["saturated_by"], row
    # The same session, had it ended before the stall, would not be flagged.
    flag(row, lag, result.started_unix, result.started_unix + 0.5, result.setup_ms / 1000)
    assert not row["saturated"], (row, lag.windows)
