"""The transceiver with real aiortc peers inside a lab network namespace (needs root).

aioice ignores loopback, so every WebRTC test runs in a namespace of its own with a veth pair
(topology/netns.py); nothing leaves it. The control-API tests at the end need no peer that
connects: they run on loopback with a static offer.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import socket
import urllib.request

import aiohttp
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection
from aiortc.mediastreams import AudioStreamTrack
from prometheus_client.parser import text_string_to_metric_families

from scenarios.processes import ServiceProcess, http_ok, voiceedge_cmd
from services.logs import Event
from services.transceiver import cli
from services.transceiver.server import TransceiverConfig, TransceiverServer
from tests.conftest import free_port, lab_fixture
from tests.offers import STATIC_OFFER, offer_answer
from topology.netns import in_namespace

pytestmark = pytest.mark.shareable  # make test runs it beside another (pyproject)

EDGE = "10.77.0.1"


lab = lab_fixture("vetest")


def run_in(lab, coro):
    return in_namespace(lab.name, asyncio.run, coro)


async def call(http: aiohttp.ClientSession, url: str, timeout: float = 10.0, audio=True):
    """Offer from a plain aiortc peer, wait until DTLS is up; returns (pc, location)."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    if audio:
        pc.addTrack(AudioStreamTrack())
    pc.createDataChannel("oai-events")
    connected = asyncio.Event()

    @pc.on("connectionstatechange")
    def _() -> None:
        if pc.connectionState == "connected":
            connected.set()

    location, answer = await offer_answer(http, url, pc)
    await asyncio.wait_for(connected.wait(), timeout)
    return pc, location, answer


def local_config(**overrides) -> TransceiverConfig:
    """An in-process transceiver on the lab's edge address, control API on a free port."""
    return TransceiverConfig(cluster_id=1, transceiver_id=1, media_host=EDGE,
                             control=("127.0.0.1", 0), **overrides)


async def offer_only(http: aiohttp.ClientSession, url: str):
    """POST an offer from a peer that will never connect; returns (peer, status, text)."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTrack(AudioStreamTrack())
    await pc.setLocalDescription(await pc.createOffer())
    async with http.post(url, data=pc.localDescription.sdp,
                         headers={"Content-Type": "application/sdp"}) as r:
        return pc, r.status, await r.text()


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=2) as r:
        return json.loads(r.read())


@pytest.mark.parametrize("mode, expected", [("shared", lambda n: 1),
                                            ("port-per-session", lambda n: n)])
def test_udp_sockets_held_by_the_transceiver_process(lab, tmp_path, mode, expected):
    """Shared mode: one socket whatever the number of sessions; baseline: one per session."""
    port = 18900 if mode == "shared" else 18901
    media = f"{EDGE}:3480" if mode == "shared" else f"{EDGE}:0"
    proc = ServiceProcess("transceiver", voiceedge_cmd(
        "transceiver", "--cluster", "1", "--id", "3", "--mode", mode, "--media", media,
        "--control", f"127.0.0.1:{port}"), tmp_path / "t.log", netns=lab.name).start()
    base = f"http://127.0.0.1:{port}"

    async def scenario():
        async with aiohttp.ClientSession() as http:
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: proc.wait_ready(lambda: http_ok(f"{base}/status")))
            calls = [await call(http, f"{base}/sessions") for _ in range(6)]
            status = get_json(f"{base}/status")
            for pc, location, answer in calls:
                candidates = [l for l in answer.splitlines() if l.startswith("a=candidate")]
                assert len({c.split()[4:6][0] + c.split()[5] for c in candidates}) == 1
                async with http.delete(base + location) as r:
                    assert r.status == 204
                await pc.close()
            return status, get_json(f"{base}/status")

    try:
        during, after = run_in(lab, scenario())
    finally:
        proc.stop()
    assert during["sessions"] == 6
    assert during["udp_sockets"] == expected(6)
    assert after["sessions"] == 0
    assert after["udp_sockets"] == (1 if mode == "shared" else 0)


def test_sessions_end_cleanly_and_leave_nothing_behind(lab):
    """100 sessions set up and torn down in sequence: no growth in fds, tasks or mux state."""

    async def scenario():
        cfg = local_config()
        async with TransceiverServer(cfg) as server, aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{server.control_port}/sessions"

            async def one():
                pc, location, _ = await call(http, url)
                async with http.delete(f"http://127.0.0.1:{server.control_port}{location}") as r:
                    assert r.status == 204
                await pc.close()

            for _ in range(5):  # warm up: codecs, thread pools, caches
                await one()
            await asyncio.sleep(0.5)
            gc.collect()
            fds0, tasks0 = len(os.listdir("/proc/thread-self/fd")), len(asyncio.all_tasks())
            for _ in range(100):
                await one()
            await asyncio.sleep(1.0)
            gc.collect()
            fds1, tasks1 = len(os.listdir("/proc/thread-self/fd")), len(asyncio.all_tasks())
            mux = server.mux
            return (fds0, fds1, tasks0, tasks1, len(server.sessions), mux.sessions,
                    len(mux._by_addr), server.sessions_total)

    fds0, fds1, tasks0, tasks1, live, registered, learned, total = run_in(lab, scenario())
    assert total == 105 and live == 0 and registered == 0 and learned == 0
    assert fds1 <= fds0, (fds0, fds1)
    assert tasks1 <= tasks0, (tasks0, tasks1)


def test_client_closing_ends_the_server_session(lab):
    async def scenario():
        cfg = local_config(setup_timeout=2.0)
        async with TransceiverServer(cfg) as server, aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{server.control_port}/sessions"
            pc, _, _ = await call(http, url)
            assert len(server.sessions) == 1
            await pc.close()  # DTLS close_notify: the server side closes its session too
            for _ in range(50):
                if not server.sessions:
                    break
                await asyncio.sleep(0.1)
            return len(server.sessions), server.mux.sessions

    assert run_in(lab, scenario()) == (0, 0)


def test_setup_timeout_releases_a_session_that_never_connects(lab):
    async def scenario():
        cfg = local_config(setup_timeout=1.0)
        async with TransceiverServer(cfg) as server, aiohttp.ClientSession() as http:
            pc, status, _ = await offer_only(http, f"http://127.0.0.1:{server.control_port}/sessions")
            assert status == 201
            await pc.close()  # the client goes away before any ICE check
            await asyncio.sleep(1.6)
            return len(server.sessions), server.mux.sessions

    assert run_in(lab, scenario()) == (0, 0)


def test_capacity_gives_503_and_nothing_half_allocated(lab):
    async def scenario():
        cfg = local_config(max_sessions=1)
        async with TransceiverServer(cfg) as server, aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{server.control_port}/sessions"
            pc, _, _ = await call(http, url)
            other, status, text = await offer_only(http, url)
            await other.close()
            await pc.close()
            return status, text, server.sessions_refused, server.mux.sessions

    status, text, refused, registered = run_in(lab, scenario())
    assert status == 503 and "capacity" in text and refused == 1 and registered <= 1


BAD_OFFERS = [
    ("text/plain", b"v=0\r\n", 415, "Content-Type"),
    ("application/sdp", b"hello", 400, "v=0"),
    ("application/sdp", b"v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n", 400, "no audio"),
    ("application/sdp", b"v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:0\r\n", 400, "BUNDLE"),
    ("application/sdp", b"v=0\r\n" + b"a=x:" + b"y" * 70000 + b"\r\n", 413, "larger"),
    ("application/sdp", b"\xff\xfe", 400, "UTF-8"),
]


def test_bad_offers_get_4xx_with_one_line_and_allocate_nothing(lab):
    async def scenario():
        cfg = local_config()
        out = []
        async with TransceiverServer(cfg) as server, aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{server.control_port}/sessions"
            for ctype, body, _, _ in BAD_OFFERS:
                async with http.post(url, data=body, headers={"Content-Type": ctype}) as r:
                    out.append((r.status, await r.text()))
            # Well framed, BUNDLE and audio, but aiortc cannot negotiate it (no DTLS fingerprint).
            offer = ("v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0\r\n"
                     "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\n"
                     "a=rtpmap:111 opus/48000/2\r\n")
            async with http.post(url, data=offer, headers={"Content-Type": "application/sdp"}) as r:
                out.append((r.status, await r.text()))
            return out, len(server.sessions), server.mux.sessions

    results, live, registered = run_in(lab, scenario())
    for (status, text), (_, _, want_status, want_text) in zip(results, BAD_OFFERS):
        assert status == want_status and want_text in text, (status, text)
        assert len(text.strip().splitlines()) == 1 and "Traceback" not in text
    status, text = results[-1]
    assert 400 <= status < 500 and len(text.strip().splitlines()) == 1
    assert live == 0 and registered == 0


# --- control API on loopback: a static offer, no ICE traffic, no namespace --------------------

def events_named(caplog, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if isinstance(r.msg, Event) and r.msg.name == name]


def cli_config(*argv: str) -> TransceiverConfig:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    return cli.config_from_args(parser.parse_args(["transceiver", *argv]))


@pytest.mark.parametrize("env_secret", [None, "a deployment's own secret, 32+ bytes"])
def test_the_development_secret_is_flagged_in_status_metrics_and_log(monkeypatch, caplog,
                                                                      env_secret):
    if env_secret is None:
        monkeypatch.delenv("VOICEEDGE_UFRAG_SECRET", raising=False)
    else:
        monkeypatch.setenv("VOICEEDGE_UFRAG_SECRET", env_secret)
    caplog.set_level(logging.INFO, "voiceedge.transceiver")
    cfg = cli_config("--cluster", "1", "--id", "2", "--media", "127.0.0.1:0", "--control",
                     f"127.0.0.1:{free_port(socket.SOCK_STREAM)}")

    async def scenario():
        async with TransceiverServer(cfg) as server, aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{server.control_port}"
            status = await (await http.get(f"{base}/status")).json()
            return status, await (await http.get(f"{base}/metrics")).text()

    status, text = asyncio.run(scenario())
    dev = env_secret is None
    assert status["ufrag_dev_secret"] is dev
    [gauge] = [s for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "voiceedge_ufrag_dev_secret"]
    assert gauge.labels == {"service": "transceiver"} and gauge.value == int(dev)
    warnings = events_named(caplog, "ufrag_dev_secret")
    assert len(warnings) == int(dev)
    assert all(r.levelno == logging.WARNING for r in warnings)
    [started] = events_named(caplog, "transceiver_started")
    assert started.msg.fields["ufrag_dev_secret"] is dev


def test_the_brief_status_is_the_load_and_only_the_load():
    """The front's health probe (/status?brief=1) reads sessions and capacity (and the live
    sessions of each API key: none here); the full status's per-session and per-process
    walks are not in it."""
    cfg = cli_config("--cluster", "1", "--id", "2", "--media", "127.0.0.1:0", "--control",
                     f"127.0.0.1:{free_port(socket.SOCK_STREAM)}", "--max-sessions", "7")

    async def scenario():
        async with TransceiverServer(cfg) as server, aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{server.control_port}"
            return [await (await http.get(f"{base}/status{q}")).json() for q in ("?brief=1", "")]

    brief, full = asyncio.run(scenario())
    assert brief == {"cluster_id": 1, "transceiver_id": 2, "mode": full["mode"], "sessions": 0,
                     "capacity": 7, "media_path": "python", "owners": {}}
    assert {"session_details", "process", "udp_sockets"} <= set(full)


def test_delete_of_an_unknown_session_is_404_and_of_a_live_one_204(caplog):
    caplog.set_level(logging.INFO, "voiceedge.transceiver")

    async def scenario():
        cfg = TransceiverConfig(cluster_id=1, transceiver_id=1, media_host="127.0.0.1",
                                control=("127.0.0.1", 0))
        async with TransceiverServer(cfg) as server, aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{server.control_port}"
            out = {}
            for name, path in (("unknown", "/sessions/AAAAAAAAAAAAAAAA"),
                               ("empty", "/sessions/")):
                async with http.delete(base + path) as r:
                    out[name] = r.status, await r.text()
            async with http.post(f"{base}/sessions", data=STATIC_OFFER,
                                 headers={"Content-Type": "application/sdp"}) as r:
                assert r.status == 201, await r.text()
                location = r.headers["Location"]
            for name in ("live", "again"):
                async with http.delete(base + location) as r:
                    out[name] = r.status, await r.text()
            return out, location, len(server.sessions), server.mux.sessions

    out, location, live, registered = asyncio.run(scenario())
    assert out["unknown"] == (404, "no such session\n")
    assert out["empty"][0] == 404
    assert out["live"] == (204, "") and out["again"] == (404, "no such session\n")
    session = location.removeprefix("/sessions/")
    assert len(session) == 16 and live == 0 and registered == 0
    [created] = events_named(caplog, "session_created")
    [closed] = events_named(caplog, "session_closed")
    assert created.msg.fields["session"] == closed.msg.fields["session"] == session
    assert closed.msg.fields["reason"] == "deleted"


def test_more_than_a_hundred_sessions_each_get_their_agent_websocket_at_once():
    """aiohttp's default pool holds 100 connections: the transceiver's must not, or the 101st
    call's agent link waits for another call to end (seen at 100 sessions on the native path,
    whose frames link takes one connection too)."""
    from services.agent.config import AgentConfig
    from services.agent.server import AgentServer
    from tests.conftest import until

    calls = 105

    async def scenario():
        async with AgentServer(AgentConfig(port=0)) as agent:
            cfg = TransceiverConfig(cluster_id=1, transceiver_id=1, media_host="127.0.0.1",
                                    control=("127.0.0.1", 0), max_sessions=calls,
                                    agent_url=f"ws://127.0.0.1:{agent.port}")
            async with TransceiverServer(cfg) as server, aiohttp.ClientSession() as http:
                base = f"http://127.0.0.1:{server.control_port}"
                for _ in range(calls):
                    async with http.post(f"{base}/sessions", data=STATIC_OFFER,
                                         headers={"Content-Type": "application/sdp"}) as r:
                        assert r.status == 201, await r.text()
                await until(lambda: len(agent.sessions) >= calls, timeout=5.0)
                return len(agent.sessions)

    assert asyncio.run(scenario()) == calls


def test_the_media_path_and_agent_codec_options():
    base = ("--cluster", "1", "--id", "1")
    assert cli_config(*base).media_path == "python"
    native = cli_config(*base, "--media-path", "native", "--agent-codec", "opus")
    assert (native.media_path, native.agent_codecs) == ("native", ("opus",))
    assert cli_config(*base, "--media-path", "native").agent_codecs == ("opus", "pcm16")
    assert cli_config(*base, "--media-path", "native").srtp == "openssl"
    assert cli_config(*base, "--media-path", "native", "--srtp", "libsrtp").srtp == "libsrtp"
    per_session = cli_config(*base, "--media-path", "native", "--mode", "port-per-session")
    assert (per_session.media_path, per_session.mode) == ("native", "port-per-session")
    from voiceedge.errors import UserError
    with pytest.raises(UserError, match="IPv4"):
        cli_config(*base, "--media-path", "native", "--media", "[::1]:3480")
