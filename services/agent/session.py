"""One call session: what the agent does with the frames and events of one WebSocket."""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, Protocol, Sequence

from services.agent import protocol
from services.agent.config import AgentConfig
from services.agent.frameslink import FramesLink, LinkedChannel
from services.agent.pacing import Pacer
from services.agent.pcm import FRAME_BYTES, FRAME_SECONDS
from services.agent.vad import EnergyVad, VadEvent


class Channel(Protocol):
    """The session's way back to the transceiver (an aiohttp WebSocketResponse in the server)."""

    async def send_bytes(self, data: bytes) -> None: ...

    async def send_str(self, data: str) -> None: ...


@dataclass
class SessionCounters:
    frames_in: int = 0      # well-formed audio frames received
    frames_out: int = 0     # audio frames sent (echo or reply)
    events_in: int = 0      # text messages received, well-formed or not
    events_out: int = 0     # text messages sent, errors included
    bad_frames: int = 0
    bad_events: int = 0
    responses_completed: int = 0
    responses_cancelled: int = 0  # stopped early: barge-in, session.ended, or the WebSocket closed

    def add(self, other: "SessionCounters") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class Response:
    id: str
    status: str = "in_progress"  # -> completed | cancelled
    frames: int = 0
    first_frame_unix: float | None = None   # its first frame handed to the transceiver
    cancelled_unix: float | None = None
    late_frames: int = 0   # frames sent later than the lead covers (Pacer.late)


@dataclass
class VoiceTimes:
    """Wall-clock arrival of the caller's frames that the VAD's events are about: the first
    frame of the current voiced run and the last voiced frame (the world's hosts share one
    clock, so the analysis sets them against the client's own times: docs/conversation.md)."""

    run_start_unix: float | None = None
    last_voiced_unix: float | None = None

    def feed(self, voiced: bool, at: float) -> None:
        if voiced:
            if self.run_start_unix is None:
                self.run_start_unix = at
            self.last_voiced_unix = at
        else:
            self.run_start_unix = None


class Session:
    """Feed it with ``on_frame``/``on_text``; ``close`` stops whatever it still runs.

    In reply mode a reply plays in its own task, paced in real time; the receive side keeps
    running meanwhile so that the caller's speech can interrupt it (barge-in).
    """

    def __init__(self, session_id: str, config: AgentConfig, channel: Channel,
                 reply_frames: Sequence[bytes],
                 links: Callable[[str], FramesLink | None] = lambda name: None) -> None:
        self.id = session_id
        self.mode = config.mode
        self.codec = "pcm16"   # or "opus": Opus payloads as they arrived (echo mode only)
        self._links = links
        self._link: tuple[FramesLink, int] | None = None
        self.counters = SessionCounters()
        self.started = False
        self.ended = False
        self.client: dict[str, Any] | None = None
        self._channel = channel
        self._reply_frames = reply_frames
        self._reply_lead = config.reply_lead_frames
        self._reply_jitter_s = config.reply_jitter_ms / 1000.0
        self._random = random.Random()
        self._vad = (EnergyVad(config.vad_threshold_dbfs, config.vad_start_ms, config.hangover_ms)
                     if config.mode == "reply" else None)
        self._voice = VoiceTimes()
        self._responses = 0
        self._response: Response | None = None
        self._player: asyncio.Task | None = None

    @property
    def tasks(self) -> list[asyncio.Task]:
        """Tasks this session owns that have not finished."""
        return [t for t in (self._player,) if t is not None and not t.done()]

    async def on_frame(self, data: bytes) -> None:
        if self.codec == "opus":
            if not 0 < len(data) <= protocol.OPUS_MAX_BYTES:
                self.counters.bad_frames += 1
                return
            self.counters.frames_in += 1
            await self._send_frame(data)  # echo: the payload as it came
            return
        if len(data) != FRAME_BYTES:
            self.counters.bad_frames += 1
            await self._send_event(protocol.error(
                "bad_frame", f"binary message of {len(data)} bytes; a frame is exactly "
                f"{FRAME_BYTES} bytes (20 ms of 48 kHz mono s16le); ignored", size=len(data)))
            return
        self.counters.frames_in += 1
        if self._vad is None:
            await self._send_frame(data)
            return
        event = self._vad.feed(data)
        self._voice.feed(self._vad.voiced, time.time())
        if event is not None:
            await self._on_vad(event)

    async def on_text(self, text: str) -> None:
        self.counters.events_in += 1
        try:
            event = protocol.parse_event(text)
        except protocol.BadEvent as exc:
            self.counters.bad_events += 1
            await self._send_event(protocol.error("bad_event", f"{exc}; ignored"))
            return
        kind = event["type"]
        if kind == protocol.SESSION_STARTED:
            await self._on_started(event)
        elif kind == protocol.SESSION_ENDED:
            self.ended = True
            await self._stop_reply()
        else:
            await self._send_event(protocol.echo(event))

    async def close(self) -> None:
        """Stop a playing reply without telling the peer (it is gone or going)."""
        self.ended = True
        if self._link is not None:
            self._link[0].leave(self._link[1], self)
        await self._stop_reply()

    async def _on_started(self, event: dict[str, Any]) -> None:
        claimed = event.get("session_id", self.id)
        problem = ("session already started" if self.started else
                   f"session_id {claimed!r} is not the URL's {self.id!r}" if claimed != self.id
                   else None)
        if problem:
            self.counters.bad_events += 1
            await self._send_event(protocol.error("bad_event", f"session.started: {problem}; ignored"))
            return
        self.started = True
        client = event.get("client")
        self.client = client if isinstance(client, dict) else None
        link_name = self._join_link(event.get("frames"))
        await self._send_event(protocol.session_created(self.id, self.mode, self.codec,
                                                        link_name))

    def _join_link(self, frames: Any) -> str | None:
        """Move the session's frames to the frames link ``session.started`` names, in the
        codec it offers that this mode takes (echo: Opus first; reply: PCM only)."""
        if not isinstance(frames, dict):
            return None
        link = self._links(str(frames.get("link")))
        channel = frames.get("channel")
        if link is None or not isinstance(channel, int) or not 0 <= channel < 1 << 32:
            return None
        codecs = frames.get("codecs") or ["pcm16"]
        if self.mode == "echo" and "opus" in codecs:
            self.codec = "opus"
        elif "pcm16" not in codecs:
            return None
        link.join(channel, self)
        self._link = (link, channel)
        self._channel = LinkedChannel(link, channel, self._channel)
        return link.name

    async def _on_vad(self, event: VadEvent) -> None:
        voice, now = self._voice, time.time()
        if event.kind == "speech_started":
            # Barge-in: cancel before anything else is awaited, so no reply frame follows.
            interrupted = self._cancel_reply()
            if interrupted is not None and self._reply_lead:
                # the frames sent ahead and queued at the transceiver go unplayed
                await self._send_event(protocol.output_audio_buffer_clear(interrupted.id))
            await self._send_event(protocol.speech_started(
                event.audio_ms, voice.run_start_unix, now))
            if interrupted is not None:
                await self._stop_reply()
                await self._send_event(protocol.response_done(
                    interrupted.id, interrupted.frames, interrupted.first_frame_unix,
                    cancelled_unix=interrupted.cancelled_unix,
                    late_frames=interrupted.late_frames))
        else:
            await self._send_event(protocol.speech_stopped(
                event.audio_ms, voice.last_voiced_unix, now))
            await self._start_reply()

    async def _start_reply(self) -> None:
        await self._stop_reply()
        self._responses += 1
        response = self._response = Response(f"resp_{self._responses}")
        await self._send_event(protocol.response_created(response.id))
        if not self.ended:
            self._player = asyncio.create_task(self._play(response), name=f"agent-reply-{self.id}")

    def _cancel_reply(self) -> Response | None:
        """Cancel a reply still sending audio; returns it, now marked cancelled."""
        response = self._response
        if response is None or response.status != "in_progress":
            return None  # none, or it finished its audio and is only sending its done events
        response.status = "cancelled"
        response.cancelled_unix = time.time()
        self.counters.responses_cancelled += 1
        if self._player is not None:
            self._player.cancel()
        return response

    async def _stop_reply(self) -> None:
        self._cancel_reply()
        player, self._player = self._player, None
        if player is not None:
            # asyncio.wait, not await: a cancellation of *this* task must still propagate.
            await asyncio.wait([player])
            if not player.cancelled() and player.exception() is not None:
                raise player.exception()
        self._response = None

    async def _play(self, response: Response) -> None:
        pacer = Pacer(FRAME_SECONDS, lead=self._reply_lead)
        try:
            for frame in self._reply_frames:
                await pacer.tick()
                if self._reply_jitter_s:
                    await asyncio.sleep(self._random.uniform(0.0, self._reply_jitter_s))
                if response.first_frame_unix is None:
                    response.first_frame_unix = time.time()
                await self._send_frame(frame)
                response.frames += 1
                response.late_frames = pacer.late
            response.status = "completed"
            self.counters.responses_completed += 1
            await self._send_event(protocol.response_audio_done(response.id, response.frames))
            await self._send_event(protocol.response_done(response.id, response.frames,
                                                          response.first_frame_unix,
                                                          late_frames=response.late_frames))
        except ConnectionError:
            pass  # the WebSocket closed under us; the server's handler cleans up

    async def _send_frame(self, frame: bytes) -> None:
        await self._channel.send_bytes(frame)
        self.counters.frames_out += 1

    async def _send_event(self, event: dict[str, Any]) -> None:
        await self._channel.send_str(protocol.dump(event))
        self.counters.events_out += 1
