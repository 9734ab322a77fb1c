"""A caller that speaks in turns and times what it hears (docs/conversation.md).

A conversation session sends, instead of the tone, the caller's lines (services/speech.py),
pre-encoded to Opus once per process, and silence between them. After each line it waits for
the agent's reply: it hears the reply as the full client's decoder hands it out (after aiortc's
jitter buffer), keeps that audio on its RTP timeline, and speaks the next line a pause after the
reply ended, or, on a barge-in turn, while the reply is still playing. Every time is wall
clock (``time.time()``), taken where the caller's audio leaves and the agent's arrives: the
world's hosts share one clock, so the analysis can set them against the agent's own.

What a turn records (``Turn``) and how the analysis splits it: docs/conversation.md.
"""
from __future__ import annotations

import asyncio
import functools
import math
import time
import wave
from dataclasses import asdict, dataclass
from pathlib import Path

import av
import numpy as np

from services import speech
from services.client.config import ConversationConfig
from services.client.tone import (PTIME_S, SAMPLE_RATE, SAMPLES_PER_PACKET, TIME_BASE,
                                  PreEncodedOpusTrack)
from services.client.voiced import VOICED_MIN_BYTES

VOICED_DBFS = -45.0          # a frame at or above this RMS counts as speech (the agent's VAD)
REPLY_GAP_S = 0.2            # inaudible this long ends a reply as heard (its pauses are shorter)
SCORE_RATE = 16_000          # what the received replies are kept at for P.862 wideband
SCORE_LEAD_S = 0.2           # audio kept before a reply's first audible frame


@dataclass(frozen=True)
class Line:
    """One caller line as 20 ms Opus payloads, and which of them is the last voiced one."""

    text: str
    payloads: tuple[bytes, ...]
    last_voiced: int


@functools.cache
def caller_lines() -> tuple[tuple[Line, ...], bytes]:
    """The caller's lines, and one payload of silence, encoded once per process."""
    from services.agent.pcm import rms_dbfs, to_frames
    lines = []
    for text in speech.CALLER_LINES:
        frames = to_frames(speech.synthesize(text))
        voiced = [i for i, f in enumerate(frames) if rms_dbfs(f) >= VOICED_DBFS]
        payloads = _encode(frames)
        lines.append(Line(text, payloads, voiced[-1] if voiced else len(payloads) - 1))
    return tuple(lines), _encode([bytes(SAMPLES_PER_PACKET * 2)] * 3)[-1]


def _encode(frames: list[bytes]) -> tuple[bytes, ...]:
    """Mono 48 kHz s16 frames as stereo Opus payloads, one per frame (as the tone is sent)."""
    codec = av.CodecContext.create("libopus", "w")
    codec.sample_rate, codec.layout, codec.format = SAMPLE_RATE, "stereo", "s16"
    codec.bit_rate, codec.time_base = 32_000, TIME_BASE
    codec.options = {"application": "voip"}
    out: list[bytes] = []
    for i, frame in enumerate(frames):
        mono = np.frombuffer(frame, dtype="<i2")
        f = av.AudioFrame.from_ndarray(np.repeat(mono, 2).reshape(1, -1), format="s16",
                                       layout="stereo")
        f.sample_rate, f.pts = SAMPLE_RATE, i * SAMPLES_PER_PACKET
        out.extend(bytes(p) for p in codec.encode(f))
    out.extend(bytes(p) for p in codec.encode(None))
    return tuple(p for p in out if p)[:len(frames)]


class SpeakingTrack(PreEncodedOpusTrack):
    """The caller's microphone: silence, or the line ``speak`` queued, one payload per 20 ms on
    ``PreEncodedOpusTrack``'s schedule. ``speak`` returns futures that complete when the line's
    first payload and its last voiced payload leave ``recv``: then aiortc packs and sends
    them."""

    def __init__(self, silence: bytes) -> None:
        super().__init__((silence,))
        self.silence = silence
        self._line: Line | None = None
        self._next = 0
        self._started: asyncio.Future | None = None
        self._voiced_out: asyncio.Future | None = None

    @property
    def speaking(self) -> bool:
        """Whether a line is still being sent."""
        return self._line is not None

    def speak(self, line: Line) -> tuple[asyncio.Future, asyncio.Future]:
        """Queue ``line``; futures of the wall-clock times its first payload and its last
        voiced payload went out."""
        loop = asyncio.get_running_loop()
        self._line, self._next = line, 0
        self._started, self._voiced_out = loop.create_future(), loop.create_future()
        return self._started, self._voiced_out

    def next_payload(self) -> bytes:
        line = self._line
        if line is None:
            return super().next_payload()   # silence
        payload = line.payloads[self._next]
        at = time.time()
        if self._next == 0 and not self._started.done():
            self._started.set_result(at)
        if self._next == line.last_voiced and not self._voiced_out.done():
            self._voiced_out.set_result(at)
        self._next += 1
        if self._next == len(line.payloads):
            self._line = None
        return payload


@dataclass
class Heard:
    """One stretch of audible reply, as the decoder handed it out."""

    first_unix: float      # its first audible frame out of the decoder
    last_unix: float       # its last audible frame out of the decoder
    start_sample: int      # on the received RTP timeline (48 kHz, from the first frame)
    end_sample: int


@dataclass
class Arrived:
    """One stretch of voiced reply packets as they arrived (before the jitter buffer)."""

    first_unix: float
    last_unix: float


class Ear:
    """The decoded audio the caller hears: kept on its RTP timeline (a lost or late frame
    leaves silence where it belonged, as a player without concealment would play it), cut into
    stretches of audible audio. A stream of a later attempt of the call (a reconnection: new
    SSRC, new timestamps) starts where its first frame was played, by the wall clock."""

    def __init__(self, seconds: float) -> None:
        self.audio = np.zeros(int(seconds * SAMPLE_RATE), dtype="<i2")
        self.heard: list[Heard] = []
        self.arrivals: list[Arrived] = []
        self.changed = asyncio.Event()
        self._t0: float | None = None     # when the first frame was played: sample 0
        self._streams: dict[object, tuple[int, int]] = {}   # stream: its first pts, its sample

    def hear(self, frame: av.AudioFrame, at: float, stream: object = None) -> None:
        """A decoded frame came out of the decoder at ``at`` (wall clock)."""
        data = frame.to_ndarray().reshape(-1)
        self.hear_pcm(data[::len(frame.layout.channels)], frame.pts or 0, at, stream)

    def hear_pcm(self, mono: np.ndarray, pts: int, at: float, stream: object = None) -> None:
        """Mono 48 kHz samples of RTP timestamp ``pts`` of ``stream``, played out at ``at``
        (wall clock)."""
        origin = self._streams.get(stream)
        if origin is None:
            if self._t0 is None:
                self._t0 = at
            origin = self._streams[stream] = (pts, round((at - self._t0) * SAMPLE_RATE))
        start = origin[1] + ((pts - origin[0]) & 0xFFFFFFFF)   # the timestamp wraps at 2^32
        if 0 <= start and start + mono.size <= self.audio.size:
            self.audio[start:start + mono.size] = mono
        power = float(np.mean(np.square(mono, dtype=np.float64))) if mono.size else 0.0
        if power <= 0 or 10 * math.log10(power / 32768.0 ** 2) < VOICED_DBFS:
            return
        last = self.heard[-1] if self.heard else None
        if last is not None and at - last.last_unix < REPLY_GAP_S:
            last.last_unix, last.end_sample = at, start + mono.size
        else:
            self.heard.append(Heard(at, at, start, start + mono.size))
        self.changed.set()

    def arrived(self, size: int, _at: float) -> None:
        """An RTP packet of ``size`` payload bytes arrived just now (RtpProbe's listener)."""
        self.arrived_at(size, time.time())

    def arrived_at(self, size: int, now: float) -> None:
        """An RTP packet of ``size`` payload bytes arrived at ``now`` (wall clock): a voiced one
        (an Opus payload of VOICED_MIN_BYTES or more, services/client/voiced.py) extends or
        starts a stretch."""
        if size < VOICED_MIN_BYTES:
            return
        last = self.arrivals[-1] if self.arrivals else None
        if last is not None and now - last.last_unix < REPLY_GAP_S:
            last.last_unix = now
        else:
            self.arrivals.append(Arrived(now, now))

    def arrived_after(self, at: float, before: float | None) -> Arrived | None:
        """The first stretch of voiced packets that started after ``at`` (and before
        ``before``)."""
        return next((a for a in self.arrivals
                     if a.first_unix > at and (before is None or a.first_unix < before)), None)

    def after(self, at: float) -> Heard | None:
        """The first stretch that started after ``at``."""
        return next((h for h in self.heard if h.first_unix > at), None)

    def last_heard_during(self, start: float, end: float) -> float | None:
        """When audio last came out of the decoder in a stretch that was playing at ``start``
        or began before ``end`` (a reply cut into at ``start`` may pause and resume, e.g. behind
        a stalled relay, before it stops for good)."""
        ends = [h.last_unix for h in self.heard
                if h.last_unix + PTIME_S >= start and h.first_unix <= end]
        return max(ends) if ends and any(h.first_unix <= start for h in self.heard
                                         if h.last_unix + PTIME_S >= start) else None


@dataclass
class Turn:
    """One caller line and the reply to it. Wall-clock seconds; None: did not happen."""

    turn: int
    barge_in: bool                         # spoken into the previous reply
    speech_start_unix: float | None = None  # its first payload out
    speech_end_unix: float | None = None    # its last voiced payload out
    # the reply it cut into (barge-in turns): that reply's last audible frame heard
    cut_reply_end_unix: float | None = None
    reply_arrived_unix: float | None = None  # the reply's first voiced packet arrived
    reply_heard_unix: float | None = None   # the first audible frame of the reply to it
    reply_end_unix: float | None = None     # the reply's last audible frame heard
    # the agent's own times (its events over the data channel)
    agent_voice_end_unix: float | None = None   # the line's last voiced frame arrived
    agent_detected_unix: float | None = None    # speech_stopped (the hangover ran out)
    agent_first_frame_unix: float | None = None  # the reply's first frame to the transceiver
    agent_status: str | None = None              # completed, cancelled
    # the reply's frames the agent sent later than its lead covers: each may have left 20 ms
    # of silence in what the caller hears (the testbed's load on the agent, not the network)
    agent_late_frames: int | None = None
    agent_barge_detected_unix: float | None = None  # barge-in: speech_started at the agent
    # what the caller's jitter buffer did to the reply while it was heard: ms concealed, and
    # ms inserted or removed to stretch time (Chromium's NetEq; None where not measured: the
    # aiortc caller's buffer does neither)
    playout_concealed_ms: float | None = None
    playout_stretched_ms: float | None = None
    audio: str | None = None                     # the reply heard, for scoring (a WAV file)


class Conversation:
    """Runs the caller's side of one call: ``run()`` speaks the lines in turn, the session
    feeds it decoded frames (``ear.hear``) and agent events (``on_agent_event``); ``turns()``
    says what happened."""

    def __init__(self, config: ConversationConfig, session: int, call_s: float,
                 mouth=None) -> None:
        self.config = config
        self.session = session
        lines, silence = caller_lines()
        self.lines = lines
        # what speaks the lines: aiortc's track, or another with its ``speak`` (the browser's)
        self.track = SpeakingTrack(silence) if mouth is None else mouth
        self.ear = Ear(call_s + 5.0)
        self.agent_events: list[dict] = []
        self._arrived: list[tuple[str, float]] = []   # each event's type, when it arrived
        self._turns: list[Turn] = []

    @property
    def current(self) -> Turn | None:
        """The line being spoken or last spoken (None before the first)."""
        return self._turns[-1] if self._turns else None

    async def run(self) -> None:
        """Every line, each after the reply to the one before (or into it); returns after the
        last reply was heard to its end, or timed out."""
        cfg = self.config
        for k in range(cfg.turns):
            turn = Turn(k, cfg.barge_in(self.session, k))
            self._turns.append(turn)
            started, voiced_out = self.track.speak(self.lines[(self.session + k) % len(self.lines)])
            turn.speech_start_unix = await started
            turn.speech_end_unix = await voiced_out
            heard = await self._wait(lambda: self.ear.after(turn.speech_end_unix),
                                     cfg.reply_timeout_s)
            if heard is None:
                continue
            if k + 1 < cfg.turns and cfg.barge_in(self.session, k + 1):
                await asyncio.sleep(max(0.0, heard.first_unix + cfg.barge_in_after_ms / 1000
                                        - time.time()))
            else:
                await self._reply_over(turn.speech_end_unix)
                await asyncio.sleep(cfg.pause_ms / 1000)

    async def _reply_over(self, since: float) -> None:
        """Until the reply to the line that ended at ``since`` is over: the agent said it sent
        its last frame (an agent that sends no events at all is taken at its silence) and
        nothing was audible for REPLY_GAP_S since. Silence alone is not enough: lost frames
        next to a pause of the reply would end it early. At most ``reply_timeout_s`` past the
        agent's word, or 30 s."""
        deadline = time.time() + 30.0
        while True:
            now = time.time()
            done = self._reply_done(since)
            if done is not None:
                deadline = min(deadline, done + self.config.reply_timeout_s)
            told = done is not None or not self.agent_events
            quiet_until = self.ear.heard[-1].last_unix + REPLY_GAP_S
            if (told and now >= quiet_until) or now >= deadline:
                return
            await asyncio.sleep(max(0.005, min(quiet_until - now, 0.05)))

    async def _wait(self, found, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        while (got := found()) is None:
            self.ear.changed.clear()
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await self.ear.changed.wait()
            except TimeoutError:
                return found()
        return got

    def _reply_done(self, since: float) -> float | None:
        """When the ``response.done`` of the reply to the line that ended at ``since`` arrived:
        the first one after the agent's first ``speech_stopped`` received since then. By
        arrival order on the ordered data channel, not by time: the ``response.done`` of a reply
        the line cut into can arrive after the line's end (an SCTP retransmission on a lossy
        downlink waits at least a second) and is not this line's reply."""
        heard_end = False
        for kind, at in self._arrived:
            if kind == "input_audio_buffer.speech_stopped" and at > since:
                heard_end = True
            elif kind == "response.done" and heard_end:
                return at
        return None

    def on_agent_event(self, event: dict, at: float | None = None) -> None:
        """An agent event arrived (at ``at``, wall clock; default now)."""
        kind = event.get("type")
        if kind in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                    "response.done"):
            self.agent_events.append(event)
            self._arrived.append((kind, time.time() if at is None else at))

    def turns(self, audio_dir: Path | None = None, name: str = "") -> list[dict]:
        """Every turn with what was heard and what the agent said it did; with ``audio_dir``,
        each completed reply heard is written there (16 kHz WAV) for scoring."""
        ear = self.ear
        stopped = [e for e in self.agent_events
                   if e["type"] == "input_audio_buffer.speech_stopped"]
        started = [e for e in self.agent_events
                   if e["type"] == "input_audio_buffer.speech_started"]
        done = [e["response"] for e in self.agent_events if e["type"] == "response.done"
                and isinstance(e.get("response"), dict)]
        out = []
        for i, t in enumerate(self._turns):
            nxt = self._turns[i + 1] if i + 1 < len(self._turns) else None
            if t.speech_end_unix is not None:
                heard = ear.after(t.speech_end_unix)
                if heard is not None and (nxt is None or nxt.speech_start_unix is None
                                          or heard.first_unix < nxt.speech_start_unix):
                    t.reply_heard_unix, t.reply_end_unix = heard.first_unix, heard.last_unix
                arrived = ear.arrived_after(t.speech_end_unix, None if nxt is None
                                            else nxt.speech_start_unix)
                if arrived is not None:
                    t.reply_arrived_unix = arrived.first_unix
                stop = _first(stopped, "audio_end_unix", t.speech_start_unix,
                              None if nxt is None else nxt.speech_start_unix)
                if stop is not None:
                    t.agent_voice_end_unix = stop.get("audio_end_unix")
                    t.agent_detected_unix = stop.get("detected_unix")
                    reply = _first(done, "first_frame_unix", t.agent_detected_unix, None)
                    if reply is not None:
                        t.agent_first_frame_unix = reply.get("first_frame_unix")
                        t.agent_status = reply.get("status")
                        t.agent_late_frames = reply.get("late_frames")
            if t.barge_in and t.speech_start_unix is not None and t.speech_end_unix is not None:
                # the reply it cut into: audio heard from the cut until the line was over
                t.cut_reply_end_unix = ear.last_heard_during(t.speech_start_unix,
                                                             t.speech_end_unix)
                barge = _first(started, "audio_start_unix", t.speech_start_unix, None)
                if barge is not None:
                    t.agent_barge_detected_unix = barge.get("detected_unix")
            if (audio_dir is not None and t.agent_status == "completed"
                    and t.reply_heard_unix is not None and (nxt is None or not nxt.barge_in)):
                heard = ear.after(t.speech_end_unix)
                t.audio = self._write_reply(audio_dir, f"{name}t{t.turn}.wav", heard)
            out.append(asdict(t))
        return out

    def _write_reply(self, audio_dir: Path, filename: str, heard: Heard) -> str:
        lead = int(SCORE_LEAD_S * SAMPLE_RATE)
        length = len(speech.synthesize(speech.AGENT_LINE)) + 2 * lead
        start = max(0, heard.start_sample - lead)
        clip = speech.resample(self.ear.audio[start:start + length], SAMPLE_RATE, SCORE_RATE)
        audio_dir.mkdir(parents=True, exist_ok=True)
        path = audio_dir / filename
        with wave.open(str(path), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(SCORE_RATE)
            w.writeframes(clip.tobytes())
        return path.name


def _first(items: list[dict], key: str, after: float | None, before: float | None) -> dict | None:
    """The first of ``items`` whose ``key`` time lies after ``after`` (and before ``before``)."""
    for item in items:
        at = item.get(key)
        if isinstance(at, (int, float)) and (after is None or at > after) and (
                before is None or at < before):
            return item
    return None

