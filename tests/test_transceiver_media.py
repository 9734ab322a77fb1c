"""The transceiver's outbound audio: the shared frame clock, the encoder settings, cached
silence, the agent WebSocket writes, and the whole echo path with real aiortc peers."""
from __future__ import annotations

import asyncio
import fractions
import math

import aiohttp
import av
import numpy as np
import pytest
from aiohttp import web
from aiortc import RTCConfiguration, RTCPeerConnection
from aiortc.mediastreams import MediaStreamTrack

from services.agent.config import AgentConfig
from services.agent.server import AgentServer
from services.transceiver import cli
from services.transceiver.inbound import is_srtp, shortcut_srtp
from services.transceiver.media import (FRAME_BYTES, FRAME_SAMPLES, AgentAudioTrack,
                                        OpusMonoDecoder, OpusMonoEncoder, OpusPacket,
                                        silence_packet)
from services.transceiver.opus import APPLICATIONS, OpusSettings
from services.transceiver.pacing import FrameClock
from services.transceiver.server import TransceiverConfig, TransceiverServer
from services.transceiver.session import write_now
from tests.conftest import lab_fixture
from tests.offers import offer_answer
from topology.netns import in_namespace

EDGE = "10.77.0.1"


def tone_frame(k: int, amplitude: float = 8000.0) -> bytes:
    t = (np.arange(FRAME_SAMPLES) + k * FRAME_SAMPLES) / 48000.0
    return (amplitude * np.sin(2 * math.pi * 440.0 * t)).astype("<i2").tobytes()


def rms(pcm: bytes) -> float:
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    return float(np.sqrt(np.mean(samples ** 2))) if len(samples) else 0.0


# ------------------------------------------------------------ FrameClock

def test_frame_clock_releases_waiters_at_their_tick_and_late_ones_at_once():
    async def scenario():
        loop = asyncio.get_running_loop()
        clock = FrameClock(period=0.01)
        start = clock.current()
        origin = loop.time()
        released = {}

        async def wait(name, tick):
            await clock.reach(tick)
            released[name] = (clock.current(), loop.time() - origin)

        await asyncio.gather(wait("a", start + 1), wait("b", start + 1), wait("c", start + 3))
        late_at = loop.time()
        await clock.reach(start + 1)  # passed long ago: no wait
        late_wait = loop.time() - late_at
        clock.close()
        return start, released, late_wait

    start, released, late_wait = asyncio.run(scenario())
    assert start == 0
    assert released["a"][0] >= 1 and released["b"][0] >= 1 and released["c"][0] >= 3
    assert released["c"][1] >= 0.03 - 0.002
    assert late_wait < 0.01


def test_frame_clock_skips_a_cancelled_waiter_and_close_cancels_the_rest():
    async def scenario():
        clock = FrameClock(period=0.01)
        clock.current()
        gone = asyncio.create_task(clock.reach(2))
        kept = asyncio.create_task(clock.reach(2))
        await asyncio.sleep(0)
        gone.cancel()
        await kept  # released although a waiter of the same tick was cancelled
        stuck = asyncio.create_task(clock.reach(10_000))
        await asyncio.sleep(0)
        clock.close()
        with pytest.raises(asyncio.CancelledError):
            await stuck
        return gone.cancelled(), clock._timer

    cancelled, timer = asyncio.run(scenario())
    assert cancelled and timer is None


def test_frame_clock_calls_subscribers_every_tick_and_drops_one_that_raises():
    async def scenario():
        clock = FrameClock(period=0.005)
        seen: dict[str, list[int]] = {"a": [], "b": []}

        def bad(tick):
            raise RuntimeError("boom")

        clock.subscribe("a", seen["a"].append)
        clock.subscribe("bad", bad)
        clock.subscribe("b", seen["b"].append)
        await asyncio.sleep(0.06)
        clock.unsubscribe("a")
        count_a = len(seen["a"])
        await asyncio.sleep(0.03)
        subscribers = set(clock._subscribers)
        clock.close()
        return seen, count_a, subscribers

    seen, count_a, subscribers = asyncio.run(scenario())
    assert subscribers == {"b"}
    assert len(seen["a"]) == count_a >= 5
    assert len(seen["b"]) > count_a
    assert seen["b"] == sorted(seen["b"]) and len(set(seen["b"])) == len(seen["b"])


# ------------------------------------------------------------ encoder and cached silence

@pytest.mark.parametrize("application", APPLICATIONS)
def test_every_encoder_setting_gives_packets_that_decode_to_the_tone(application):
    encoder = OpusMonoEncoder(OpusSettings(application=application, complexity=0))
    decoder = OpusMonoDecoder()
    out = []
    for k in range(20):
        packet = encoder.encode(tone_frame(k))
        assert len(packet) <= 32000 / 8 / 50 * 2.5  # about 32 kbit/s, not stereo 96
        out += decoder.decode(packet)
    assert len(out) == 20 and all(len(pcm) == FRAME_BYTES for pcm in out)
    assert rms(b"".join(out[5:])) > 8000 / math.sqrt(2) * 0.5


def test_the_cached_silence_packet_is_tiny_and_decodes_to_silence():
    packet = silence_packet(OpusSettings())
    assert 0 < len(packet) <= 8
    decoder = OpusMonoDecoder()
    pcm = b"".join(frame for _ in range(5) for frame in decoder.decode(packet))
    assert len(pcm) == 5 * FRAME_BYTES and rms(pcm) == 0.0


def test_the_track_encodes_audio_and_the_end_of_it_then_sends_cached_silence():
    async def scenario():
        track = AgentAudioTrack(clock=FrameClock(period=0.001))
        got = [await track.recv() for _ in range(5)]  # nothing played yet: cached silence
        encoded_before = track.frames_encoded
        for k in range(4):
            track.push(tone_frame(k))
        got += [await track.recv() for _ in range(12)]
        track.stop()
        return got, encoded_before, track

    got, encoded_before, track = asyncio.run(scenario())
    assert encoded_before == 0
    assert all(isinstance(p, OpusPacket) for p in got[:5])
    assert track.frames_played == 4
    assert track.frames_encoded == 4 + 3  # the audio, and the first silent frames after it
    assert isinstance(got[-1], OpusPacket) and bytes(got[-1]) == silence_packet(OpusSettings())
    pts = [p.pts for p in got]
    assert pts == sorted(pts) and len(set(pts)) == len(pts)
    assert all(p.time_base == fractions.Fraction(1, 48000) for p in got)
    decoder = OpusMonoDecoder()
    pcm = [frame for p in got for frame in decoder.decode(bytes(p))]
    assert max(rms(frame) for frame in pcm) > 1000  # the tone is in there


def test_the_track_sends_an_agents_opus_as_it_is_and_cached_silence_right_after():
    """An agent that encodes its own audio (a TTS streaming Opus): the track passes its
    payloads through (the native plane does the same: tests/test_mediaplane.py)."""
    payloads = [b"\x78" + bytes([k]) * 60 for k in range(3)]

    async def scenario():
        track = AgentAudioTrack(clock=FrameClock(period=0.001))
        for p in payloads + [bytes(1300)]:   # the last is neither PCM nor Opus: dropped
            track.push(p)
        got = [bytes(await track.recv()) for _ in range(5)]
        track.stop()
        return got, track

    got, track = asyncio.run(scenario())
    silence = silence_packet(OpusSettings())
    assert got == payloads + [silence, silence]
    assert track.frames_played == 3 and track.frames_encoded == 0


def test_cli_sets_the_encoder():
    import argparse

    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["transceiver", "--cluster", "1", "--id", "1",
                              "--opus-application", "voip", "--opus-complexity", "5"])
    assert cli.config_from_args(args).opus == OpusSettings(application="voip", complexity=5)
    args = parser.parse_args(["transceiver", "--cluster", "1", "--id", "1"])
    assert cli.config_from_args(args).opus == OpusSettings()


# ------------------------------------------------------------ SRTP shortcut

def test_only_rtp_takes_the_shortcut_and_only_in_audio_only_sessions():
    rtp = bytes([0x80, 111]) + bytes(20)
    assert is_srtp(rtp) and is_srtp(bytes([0x90, 0xEF]) + bytes(20))  # marker bit, PT 111
    assert not is_srtp(bytes([0x80, 200]) + bytes(20))   # RTCP sender report
    assert not is_srtp(bytes([0x81, 201]) + bytes(20))   # RTCP receiver report
    assert not is_srtp(bytes([0x16, 0xFE]) + bytes(20))  # DTLS
    assert not is_srtp(bytes([0x80, 111]))               # too short for RTP

    class Fake:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    connection = Fake(media_sink=None)
    dtls = Fake(transport=Fake(_connection=connection))
    audio = Fake(kind="audio", receiver=Fake(transport=dtls))
    video = Fake(kind="video", receiver=Fake(transport=dtls))
    assert shortcut_srtp(Fake(getTransceivers=lambda: [audio, video])) is None
    assert connection.media_sink is None
    shortcut = shortcut_srtp(Fake(getTransceivers=lambda: [audio]))
    assert connection.media_sink is shortcut


# ------------------------------------------------------------ agent WebSocket writes

def test_write_now_sends_in_order_without_a_task_and_reports_a_closed_socket():
    async def scenario():
        received: list[bytes] = []
        done = asyncio.Event()

        async def handler(request):
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            async for message in ws:
                received.append(message.data)
                if len(received) == 50:
                    done.set()
            return ws

        app = web.Application()
        app.router.add_get("/ws", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"http://127.0.0.1:{port}/ws")
            tasks = len(asyncio.all_tasks())
            sent = [write_now(ws.send_bytes(bytes([k]) * FRAME_BYTES)) for k in range(50)]
            tasks_after = len(asyncio.all_tasks())
            await asyncio.wait_for(done.wait(), 5)
            await ws.close()
            after_close = write_now(ws.send_bytes(b"x"))
        await runner.cleanup()
        return received, sent, tasks, tasks_after, after_close

    received, sent, tasks, tasks_after, after_close = asyncio.run(scenario())
    assert all(sent) and tasks_after == tasks
    assert [m[0] for m in received] == list(range(50))
    assert after_close is False


# ------------------------------------------------------------ the echo path, real peers

class ToneTrack(MediaStreamTrack):
    """A 440 Hz tone, real time, as aiortc's encoder takes it."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._k = 0
        self._start = None

    async def recv(self):
        loop = asyncio.get_running_loop()
        if self._start is None:
            self._start = loop.time()
        await asyncio.sleep(max(0.0, self._start + self._k * 0.02 - loop.time()))
        frame = av.AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        frame.planes[0].update(tone_frame(self._k))
        frame.sample_rate, frame.pts = 48000, self._k * FRAME_SAMPLES
        frame.time_base = fractions.Fraction(1, 48000)
        self._k += 1
        return frame


lab = lab_fixture("vemedia")


def test_a_real_peer_hears_its_tone_echoed_through_the_shared_clock_and_encoder(lab):
    """Three aiortc clients on one transceiver (one FrameClock) with the echo agent: each
    hears silence, then its tone back (caller RTP by the SRTP shortcut, frames to the agent
    by task-free writes, back as lowdelay Opus sent from the shared tick)."""

    async def client(server, http, url):
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTrack(ToneTrack())
        pc.createDataChannel("oai-events")
        heard: list[float] = []
        done = asyncio.Event()

        @pc.on("track")
        def on_track(track):
            async def read():
                while len(heard) < 100:
                    frame = await track.recv()
                    heard.append(rms(frame.to_ndarray().tobytes()))
                done.set()
            asyncio.ensure_future(read())

        location, _ = await offer_answer(http, url, pc)
        await asyncio.wait_for(done.wait(), 15)
        session = server.sessions[location.rsplit("/", 1)[1]]
        shortcut = session._srtp_shortcut
        stats = await session._pc.getStats()  # what RTCP sender reports are made of
        sent = [s.packetsSent for s in stats.values() if s.type == "outbound-rtp"]
        await pc.close()
        return heard, shortcut.packets, shortcut.suspended, sent

    async def scenario():
        async with AgentServer(AgentConfig(port=0)) as agent:
            cfg = TransceiverConfig(cluster_id=1, transceiver_id=1, media_host=EDGE,
                                    control=("127.0.0.1", 0),
                                    agent_url=f"ws://127.0.0.1:{agent.port}")
            async with TransceiverServer(cfg) as server, aiohttp.ClientSession() as http:
                url = f"http://127.0.0.1:{server.control_port}/sessions"
                return await asyncio.gather(*(client(server, http, url) for _ in range(3)))

    for levels, inline, suspended, sent in in_namespace(lab.name, asyncio.run, scenario()):
        assert max(levels) > 8000 / math.sqrt(2) * 0.5, levels  # the tone came back
        assert min(levels) == 0.0  # silence (cached packets) before the echo started
        assert inline >= 50 and suspended == 0  # caller RTP took the SRTP shortcut
        assert len(sent) == 1 and sent[0] >= 100  # the tick sender keeps aiortc's counters
