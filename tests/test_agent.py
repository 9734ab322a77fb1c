"""The backend voice agent: pure pieces (PCM, VAD, pacing) and a real AgentServer on loopback,
driven through aiohttp's WebSocket client the way a transceiver drives it."""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import time
import weakref
from contextlib import asynccontextmanager

import aiohttp
import numpy as np
import pytest

from services.agent import pcm
from services.agent.cli import add_parser, config_from_args
from services.agent.config import AgentConfig
from voiceedge.errors import ConfigError
from services.agent.pacing import Pacer
from services.agent.server import AgentServer
from services.agent.vad import EnergyVad, VadEvent
from voiceedge.errors import UserError

LOUD = -6.0     # dBFS peak of the caller's "speech" in the tests
QUIET = 200     # square amplitude just above -45 dBFS (-44.3)
TOO_QUIET = 150  # just below (-46.8)


def run(coro, timeout: float = 10.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def square(amplitude: int, frames: int = 1) -> list[bytes]:
    """A square wave alternating +amplitude/-amplitude every sample: RMS == amplitude."""
    wave = np.tile(np.array([amplitude, -amplitude], dtype="<i2"), pcm.FRAME_SAMPLES // 2)
    return [wave.tobytes()] * frames


@asynccontextmanager
async def agent(**config):
    """A real AgentServer on 127.0.0.1, any port, and an HTTP client for it."""
    async with AgentServer(AgentConfig(host="127.0.0.1", port=0, **config)) as server:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{server.port}") as http:
            yield server, http


async def connect(http: aiohttp.ClientSession, session_id: str = "s1", start: bool = True):
    ws = await http.ws_connect(f"/v1/sessions/{session_id}")
    if start:
        await ws.send_json({"type": "session.started", "session_id": session_id,
                            "client": {"address": "198.51.100.7:50000"}, "region": "apac"})
        assert (await next_event(ws))["type"] == "session.created"
    return ws


async def next_event(ws, timeout: float = 2.0) -> dict:
    msg = await ws.receive(timeout=timeout)
    assert msg.type == aiohttp.WSMsgType.TEXT, f"expected an event, got {msg.type}: {msg.data!r:.80}"
    return json.loads(msg.data)


async def collect_until(ws, event_type: str, timeout: float = 3.0):
    """Messages until an event of ``event_type``: ([(arrival, frame)], [events], that event)."""
    frames, events = [], []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        msg = await ws.receive(timeout=max(0.01, deadline - loop.time()))
        if msg.type == aiohttp.WSMsgType.BINARY:
            frames.append((loop.time(), msg.data))
        elif msg.type == aiohttp.WSMsgType.TEXT:
            event = json.loads(msg.data)
            if event["type"] == event_type:
                return frames, events, event
            events.append(event)
        else:
            raise AssertionError(f"WebSocket ended while waiting for {event_type}: {msg}")


async def nothing_more(ws, wait: float = 0.2) -> bool:
    try:
        msg = await ws.receive(timeout=wait)
    except asyncio.TimeoutError:
        return True
    raise AssertionError(f"unexpected message: {msg.type} {msg.data!r:.80}")


async def metrics(http: aiohttp.ClientSession) -> dict[str, float]:
    text = await (await http.get("/metrics")).text()
    return {line.split("{")[0].removeprefix("voiceedge_agent_"): float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("voiceedge_agent_")}


# --- PCM ------------------------------------------------------------------------------------------

def test_frame_constants():
    assert (pcm.SAMPLE_RATE, pcm.FRAME_SAMPLES, pcm.FRAME_BYTES) == (48_000, 960, 1920)


def test_rms_dbfs_known_values():
    full = np.tile(np.array([32767, -32768], dtype="<i2"), 480).tobytes()
    assert pcm.rms_dbfs(full) == pytest.approx(0.0, abs=1e-3)
    assert pcm.rms_dbfs(square(16384)[0]) == pytest.approx(-6.0206, abs=1e-4)
    assert pcm.rms_dbfs(square(1)[0]) == pytest.approx(-90.309, abs=1e-3)
    assert pcm.rms_dbfs(pcm.SILENCE) == -math.inf
    # a full-scale sine (20 whole periods of 1 kHz in 20 ms) is 3.01 dB below the square
    sine = pcm.tone(1000, 20, peak_dbfs=0.0, fade_ms=0)[0]
    assert pcm.rms_dbfs(sine) == pytest.approx(-3.0103, abs=0.01)
    with pytest.raises(ValueError):
        pcm.rms_dbfs(b"")


def test_tone_is_whole_frames_at_its_frequency():
    frames = pcm.tone(440, 1000, peak_dbfs=-12.0)
    assert len(frames) == 50 and {len(f) for f in frames} == {pcm.FRAME_BYTES}
    samples = np.frombuffer(b"".join(frames), dtype="<i2").astype(float)
    assert int(np.argmax(np.abs(np.fft.rfft(samples)))) == 440  # 1 s of audio: 1 Hz bins
    assert np.max(np.abs(samples)) == pytest.approx(32767 * 10 ** (-12 / 20), rel=1e-3)
    assert samples[0] == 0 and abs(samples[-1]) < 50  # faded in and out
    short = pcm.tone(440, 30)
    assert len(short) == 2 and short[1][960:] == bytes(960)  # padded with silence
    assert pcm.silence(100) == [pcm.SILENCE] * 5


# --- VAD ------------------------------------------------------------------------------------------

def feed_all(vad: EnergyVad, frames: list[bytes]) -> list[tuple[int, VadEvent]]:
    """(index of the frame that produced it, event) for every event."""
    return [(i, e) for i, f in enumerate(frames) if (e := vad.feed(f)) is not None]


def test_vad_start_and_hangover():
    vad = EnergyVad(threshold_dbfs=-45.0, start_ms=40, hangover_ms=300)
    frames = pcm.silence(100) + square(QUIET, 25) + pcm.silence(400)
    assert feed_all(vad, frames) == [
        (6, VadEvent("speech_started", 100)),   # second voiced frame; speech began at frame 5
        (44, VadEvent("speech_stopped", 600)),  # 15th silent frame; speech ended at 600 ms
    ]
    assert not vad.speaking


def test_vad_threshold_and_short_sounds():
    vad = EnergyVad(threshold_dbfs=-45.0, start_ms=40, hangover_ms=300)
    assert feed_all(vad, square(TOO_QUIET, 50)) == []  # -46.8 dBFS: below the threshold
    assert feed_all(vad, (square(QUIET) + pcm.silence(20)) * 10) == []  # 20 ms clicks: too short
    assert not vad.speaking


def test_vad_pause_shorter_than_hangover_continues_speech():
    vad = EnergyVad(threshold_dbfs=-45.0, start_ms=20, hangover_ms=300)
    frames = square(QUIET, 5) + pcm.silence(280) + square(QUIET, 5) + pcm.silence(300)
    events = feed_all(vad, frames)
    assert [e.kind for _, e in events] == ["speech_started", "speech_stopped"]
    assert events[1] == (len(frames) - 1, VadEvent("speech_stopped", (5 + 14 + 5) * 20))


# --- pacing and config ----------------------------------------------------------------------------

def test_pacer_does_not_drift():
    async def main():
        pacer = Pacer(0.02)
        start = time.monotonic()
        for _ in range(26):
            await pacer.tick()
            time.sleep(0.01)  # work between ticks: a sleep(0.02) loop would take 25 * 30 ms
        return time.monotonic() - start - 0.01

    assert 0.49 <= run(main()) < 0.6  # 25 periods of 20 ms


def test_a_leading_pacer_runs_that_many_periods_ahead_without_drifting():
    async def main():
        pacer = Pacer(0.02, lead=2)
        start = time.monotonic()
        at = []
        for _ in range(28):
            await pacer.tick()
            at.append(time.monotonic() - start)
        return at

    at = run(main())
    assert at[2] < 0.01 < at[3]               # three at once: the two ahead and now's
    assert 0.49 <= at[-1] < 0.6               # then the grid: 25 periods after the third
    with pytest.raises(ValueError):
        Pacer(0.02, max_late=0.1, lead=5)     # that far ahead would look like a stall


def test_a_pacer_counts_the_ticks_later_than_its_lead_covers():
    """A frame sent ahead by two periods still makes its receiver's tick when the sender is
    a period late; three periods late, it may not: only those count."""
    async def main(stall):
        pacer = Pacer(0.02, max_late=0.2, lead=2)
        for i in range(8):
            await pacer.tick()
            if i == 4:
                time.sleep(stall)   # the event loop blocked: the next tick returns late
        return pacer.late

    assert run(main(0.025)) == 0    # one period late: the lead covers it
    assert run(main(0.07)) == 1     # 50 ms past the grid, beyond the lead's 40


def test_config_rejects_what_cannot_work():
    for bad in ({"mode": "parrot"}, {"port": 70000}, {"hangover_ms": 0}, {"reply_ms": -1},
                {"vad_threshold_dbfs": 3.0}, {"reply_freq_hz": 30_000},
                {"reply_lead_frames": 5}, {"reply_lead_frames": -1}, {"reply_jitter_ms": -1},
                {"reply_jitter_ms": 100}):
        with pytest.raises(ConfigError):
            AgentConfig(**bad)


def test_cli_arguments_become_config():
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["agent", "--port", "0", "--mode", "reply", "--hangover-ms", "200"])
    config = config_from_args(args)
    assert (config.port, config.mode, config.hangover_ms, config.host) == (0, "reply", 200, "0.0.0.0")
    with pytest.raises(UserError, match="reply_ms"):
        config_from_args(parser.parse_args(["agent", "--reply-ms", "0"]))


# --- the server: echo mode and events -------------------------------------------------------------

def test_echo_returns_identical_frames_in_order():
    frames = [np.full(pcm.FRAME_SAMPLES, i * 97 - 2000, dtype="<i2").tobytes() for i in range(50)]

    async def main():
        async with agent() as (server, http):
            ws = await connect(http)
            for frame in frames:
                await ws.send_bytes(frame)
            got = [(await ws.receive(timeout=2)).data for _ in frames]
            listing = await (await http.get("/v1/sessions")).json()
            await ws.close()
            return got, listing, await metrics(http)

    got, listing, m = run(main())
    assert got == frames
    [session] = listing["sessions"]
    assert session["session_id"] == "s1" and session["client"] == {"address": "198.51.100.7:50000"}
    assert session["counters"] == {
        "frames_in": 50, "frames_out": 50, "events_in": 1, "events_out": 1, "bad_frames": 0,
        "bad_events": 0, "responses_completed": 0, "responses_cancelled": 0}
    assert (m["frames_in_total"], m["frames_out_total"], m["events_out_total"]) == (50, 50, 1)


def test_session_created_and_client_event_echo():
    client_event = {"type": "response.create", "response": {"modalities": ["audio"]}, "n": [1, 2]}

    async def main():
        async with agent() as (server, http):
            ws = await connect(http, "call-42_x", start=False)
            await ws.send_json({"type": "session.started", "session_id": "call-42_x",
                                "client": {"address": "[2001:db8::1]:5000"}, "ufrag": "abcd"})
            created = await next_event(ws)
            await ws.send_json(client_event)
            echoed = await next_event(ws)
            await ws.close()
            return created, echoed

    created, echoed = run(main())
    assert created == {"type": "session.created", "session_id": "call-42_x", "mode": "echo",
                       "audio": {"encoding": "pcm_s16le", "sample_rate": 48000, "channels": 1,
                                 "frame_ms": 20, "frame_bytes": 1920}}
    assert echoed == {"type": "agent.echo", "event": client_event}


def test_bad_events_and_frames_are_reported_and_ignored():
    async def main():
        async with agent() as (server, http):
            ws = await connect(http)
            errors = []
            for text in ("{not json", "[1, 2]", '{"no": "type"}', '{"type": 7}',
                         '{"type": "session.started", "session_id": "s1"}'):
                await ws.send_str(text)
                errors.append(await next_event(ws))
            await ws.send_bytes(bytes(100))
            errors.append(await next_event(ws))
            await ws.send_bytes(bytes(pcm.FRAME_BYTES + 2))
            errors.append(await next_event(ws))
            await ws.send_bytes(square(1000)[0])  # still open, still echoing
            after = await ws.receive(timeout=2)
            counters = server.sessions["s1"].counters
            await ws.close()
            return errors, after, counters

    errors, after, counters = run(main())
    assert [(e["type"], e["code"]) for e in errors] == [("error", "bad_event")] * 5 + [
        ("error", "bad_frame")] * 2
    assert "already started" in errors[4]["message"]
    assert (errors[5]["size"], errors[6]["size"]) == (100, 1922)
    assert after.type == aiohttp.WSMsgType.BINARY and after.data == square(1000)[0]
    assert (counters.bad_events, counters.bad_frames, counters.frames_in) == (5, 2, 1)


def test_session_started_with_another_id_is_refused():
    async def main():
        async with agent() as (server, http):
            ws = await connect(http, "s1", start=False)
            await ws.send_json({"type": "session.started", "session_id": "s2"})
            error = await next_event(ws)
            started = server.sessions["s1"].started
            await ws.close()
            return error, started

    error, started = run(main())
    assert error["code"] == "bad_event" and "'s2'" in error["message"]
    assert started is False


def test_session_ended_closes_the_websocket_normally():
    async def main():
        async with agent() as (server, http):
            ws = await connect(http)
            await ws.send_json({"type": "session.ended", "reason": "hangup"})
            msg = await ws.receive(timeout=2)
            return msg, ws.close_code

    msg, code = run(main())
    assert msg.type == aiohttp.WSMsgType.CLOSE and code == 1000


# --- reply mode -----------------------------------------------------------------------------------

REPLY = {"mode": "reply", "vad_threshold_dbfs": -45.0, "hangover_ms": 300, "reply_ms": 1000}


def test_reply_after_speech_is_paced_in_real_time():
    async def main():
        async with agent(**REPLY) as (server, http):
            ws = await connect(http)
            for frame in pcm.tone(300, 500, LOUD) + pcm.silence(500):
                await ws.send_bytes(frame)
            frames, events, done = await collect_until(ws, "response.done")
            await ws.close()
            return frames, events, done

    frames, events, done = run(main())
    assert [e["type"] for e in events] == [
        "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
        "response.created", "response.audio.done"]
    assert events[0]["audio_start_ms"] == 0 and events[1]["audio_end_ms"] == 500
    rid = events[2]["response"]["id"]
    assert events[3] == {"type": "response.audio.done", "response_id": rid, "frames": 50}
    first_frame_unix = done["response"].pop("first_frame_unix")
    assert isinstance(done["response"].pop("late_frames"), int)   # this host's load: any
    assert done["response"] == {"id": rid, "status": "completed", "frames": 50}
    assert events[1]["audio_end_unix"] <= events[1]["detected_unix"] <= first_frame_unix
    assert [f for _, f in frames] == pcm.tone(440, 1000, -12.0)
    first = frames[0][0]
    in_half_second = sum(1 for t, _ in frames if t - first < 0.5)
    assert 20 <= in_half_second <= 30          # ~50 frames/s, not a burst
    assert 0.85 <= frames[-1][0] - first <= 1.3  # 49 periods of 20 ms


def test_barge_in_cancels_the_reply_at_once():
    async def main():
        async with agent(**REPLY) as (server, http):
            ws = await connect(http)
            for frame in pcm.tone(300, 500, LOUD) + pcm.silence(300):
                await ws.send_bytes(frame)
            await collect_until(ws, "response.created")
            frames = []
            while len(frames) < 10:
                msg = await ws.receive(timeout=2)
                assert msg.type == aiohttp.WSMsgType.BINARY
                frames.append(msg.data)
            for frame in pcm.tone(300, 60, LOUD):  # the caller speaks again
                await ws.send_bytes(frame)
            more, events, done = await collect_until(ws, "response.done")
            quiet = await nothing_more(ws, 0.3)
            counters = server.sessions["s1"].counters
            await ws.close()
            return frames + [f for _, f in more], events, done, quiet, counters

    frames, events, done, quiet, counters = run(main())
    # first the transceiver is told to drop the reply frames it holds (sent ahead of time)
    assert [e["type"] for e in events] == ["output_audio_buffer.clear",
                                           "input_audio_buffer.speech_started"]
    assert events[0]["response_id"] == done["response"]["id"]
    events = events[1:]
    assert events[0]["audio_start_ms"] == 800
    assert done["response"]["status"] == "cancelled"
    assert done["response"]["status_details"] == {"reason": "turn_detected"}
    assert done["response"]["frames"] == len(frames) < 20  # stopped long before its 50 frames
    assert (done["response"]["first_frame_unix"] < events[0]["detected_unix"]
            <= done["response"]["cancelled_unix"])
    assert quiet
    assert (counters.responses_cancelled, counters.responses_completed) == (1, 0)


def test_reply_times_on_the_wall_clock_split_the_turn():
    """Paced like a caller: the hangover shows between the last voiced frame's arrival and
    speech_stopped, the reply's first frame follows at once; a shorter hangover moves that
    share only (docs/conversation.md)."""
    async def turn(hangover_ms: int):
        async with agent(**{**REPLY, "hangover_ms": hangover_ms}) as (server, http):
            ws = await connect(http)
            pacer = Pacer(pcm.FRAME_SECONDS)
            sent_last_voiced = None
            for frame in pcm.tone(300, 400, LOUD) + pcm.silence(hangover_ms + 200):
                await pacer.tick()
                await ws.send_bytes(frame)
                if pcm.rms_dbfs(frame) > -45:
                    sent_last_voiced = time.time()
            frames, events, done = await collect_until(ws, "response.done")
            await ws.close()
            return sent_last_voiced, events[1], done["response"]

    for hangover_ms in (300, 250):
        sent, stopped, response = run(turn(hangover_ms))
        assert 0 <= stopped["audio_end_unix"] - sent < 0.015        # loopback: the arrival
        held = stopped["detected_unix"] - stopped["audio_end_unix"]
        assert hangover_ms / 1000 - 0.025 < held < hangover_ms / 1000 + 0.025
        assert 0 <= response["first_frame_unix"] - stopped["detected_unix"] < 0.015


def test_closed_session_releases_its_state_and_tasks():
    async def main():
        async with agent(**REPLY) as (server, http):
            baseline = asyncio.all_tasks()
            ws = await connect(http)
            for frame in pcm.tone(300, 200, LOUD) + pcm.silence(300):
                await ws.send_bytes(frame)
            await collect_until(ws, "response.created")
            await ws.receive(timeout=2)  # a reply frame: the player task is running
            session = server.sessions["s1"]
            player = session.tasks[0]
            ref = weakref.ref(session)
            del session
            await ws.close()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 2
            while server.sessions and loop.time() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # let the server's connection handler finish
            others = asyncio.all_tasks() - baseline  # the server's connection handler included
            health = await (await http.get("/healthz")).json()
            cancelled = player.cancelled()
            del player  # its CancelledError's traceback still reaches the session
            gc.collect()
            return dict(server.sessions), cancelled, ref(), others, health

    sessions, cancelled, leftover, others, health = run(main())
    assert sessions == {}
    assert cancelled
    assert leftover is None  # nothing keeps the session object alive
    assert others == set()
    assert (health["sessions_active"], health["sessions_total"]) == (0, 1)


# --- HTTP surface and lifecycle -------------------------------------------------------------------

def test_healthz_counts_sessions():
    async def main():
        async with agent() as (server, http):
            seen = [await (await http.get("/healthz")).json()]
            a = await connect(http, "a")
            b = await connect(http, "b")
            seen.append(await (await http.get("/healthz")).json())
            await a.close()
            while len(server.sessions) > 1:
                await asyncio.sleep(0.01)
            seen.append(await (await http.get("/healthz")).json())
            await b.close()
            return seen

    seen = run(main())
    assert [(h["sessions_active"], h["sessions_total"]) for h in seen] == [(0, 0), (2, 2), (1, 2)]
    assert seen[0] == {"status": "ok", "mode": "echo", "sessions_active": 0, "sessions_total": 0}


def test_refused_connections():
    async def main():
        async with agent() as (server, http):
            statuses = {}
            for sid in ("bad.id", "a" * 65, "sp%20ace", "%C3%A9"):
                try:
                    await http.ws_connect(f"/v1/sessions/{sid}")
                except aiohttp.WSServerHandshakeError as exc:
                    statuses[sid] = exc.status
            ws = await connect(http, "dup")
            try:
                await http.ws_connect("/v1/sessions/dup")
            except aiohttp.WSServerHandshakeError as exc:
                statuses["dup"] = exc.status
            plain = await http.get("/v1/sessions/ok")
            statuses["plain GET"] = plain.status
            body = await (await http.get("/v1/sessions/bad.id")).json()
            await ws.close()
            return statuses, body

    statuses, body = run(main())
    assert statuses == {"bad.id": 400, "a" * 65: 400, "sp%20ace": 400, "%C3%A9": 400,
                        "dup": 409, "plain GET": 426}
    assert "A-Za-z0-9" in body["error"]


def test_stop_closes_every_session_and_registries_are_per_server():
    async def main():
        async with agent() as (other, other_http):
            server = AgentServer(AgentConfig(port=0))
            await server.start()
            async with aiohttp.ClientSession(f"http://127.0.0.1:{server.port}") as http:
                sockets = [await connect(http, f"s{i}") for i in range(3)]
                await sockets[0].send_bytes(pcm.SILENCE)
                await sockets[0].receive(timeout=2)
                t0 = time.monotonic()
                stopping = asyncio.create_task(server.stop())
                await asyncio.sleep(0.2)  # a peer slow to answer the close still gets a clean one
                closes = [await ws.receive(timeout=2) for ws in sockets]
                await stopping
                took = time.monotonic() - t0
                other_metrics = await metrics(other_http)
            return server, closes, [ws.close_code for ws in sockets], took, other_metrics

    server, closes, codes, took, other_metrics = run(main())
    assert [m.type for m in closes] == [aiohttp.WSMsgType.CLOSE] * 3 and codes == [1001] * 3
    assert took < 1.5
    assert server.sessions == {} and server.totals().frames_in == 1
    assert (other_metrics["sessions_total"], other_metrics["frames_in_total"]) == (0, 0)
