"""One call on the transceiver: the peer connection, its agent link, and its lifecycle.

A session lives from the offer to the first of: DELETE, the client closing, ICE/DTLS failure,
consent loss (aioice closes the connection), the setup timeout (aioice never fails on its own
when the offer had no end-of-candidates), or the agent going away. ``close`` releases
everything: the peer connection (and with it the mux registration or the session's socket),
the agent WebSocket and every task.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

import aiohttp
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from services import icerestart
from services.icerestart import IceCredentials
from services.logs import log_event
from services.wire.sdpfrag import IceFragment
from services.transceiver.ice import IcePlan, ice_plan, selected_pair, selected_remote_address
from services.transceiver.eager import write_now
from services.gaps import ArrivalGaps
from services.transceiver.inbound import shortcut_srtp
from services.transceiver.media import AgentAudioTrack, decode_inline
from services.mediaplane.hooks import IdleSender, media_stats
from services.transceiver.nativeplane import AGENT_CODECS, NativeMedia
from services.transceiver.opus import OpusSettings
from services.transceiver.outbound import play_on_tick
from services.transceiver.pacing import FrameClock

log = logging.getLogger("voiceedge.transceiver")
_RESERVED_EVENTS = ("session.started", "session.ended")  # docs/agent-protocol.md
_CLEAR = "output_audio_buffer.clear"  # the agent's, to this session's queued reply frames


@dataclass
class SessionStats:
    created: float = field(default_factory=time.monotonic)
    connected_at: float | None = None
    closed_at: float | None = None
    close_reason: str | None = None
    frames_to_agent: int = 0
    events_to_agent: int = 0
    events_to_client: int = 0
    frames_cleared: int = 0       # agent frames dropped unplayed by output_audio_buffer.clear


class Session:
    """A server-side WebRTC session bridged to the agent."""

    def __init__(self, session_id: str, plan: IcePlan, agent_url: str | None,
                 http: aiohttp.ClientSession, setup_timeout: float, on_closed,
                 opus: OpusSettings = OpusSettings(), clock: FrameClock | None = None,
                 native: NativeMedia | None = None,
                 agent_codecs: tuple[str, ...] = AGENT_CODECS) -> None:
        self.id = session_id
        self.plan = plan
        self.stats = SessionStats()
        self._agent_url = agent_url
        self._http = http
        self._setup_timeout = setup_timeout
        self._on_closed = on_closed
        self._pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self._clock = clock or FrameClock()
        self._outbound = AgentAudioTrack(opus, self._clock)
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._ws_ready = asyncio.Event()
        self._connected = asyncio.Event()
        self._channel = None
        self._to_client: list[str] = []  # agent events waiting for the data channel to open
        self._tasks: set[asyncio.Task] = set()
        self._closing = False
        self._srtp_shortcut = None
        # the native media path (nativeplane.py): the plane carries the RTP once DTLS is up
        self._native = native
        self._agent_codecs = agent_codecs
        self._idle: IdleSender | None = None
        self.channel: int | None = None       # on the plane
        self.agent_codec: str | None = None   # what the agent took at session.created
        self._native_stats: dict | None = None
        # the caller's RTP, recorded by the SRTP shortcut; each gap logged as it ends
        self.rx = ArrivalGaps(on_gap=self._log_gap)
        self.ice_restarts = 0
        self._restarting: asyncio.Task | None = None   # the last ICE restart's checks

    def _log_gap(self, start: float, seconds: float) -> None:
        log_event(log, "rx_gap", session=self.id, start_unix=round(start, 3),
                  ms=round(seconds * 1000.0, 1))

    @property
    def state(self) -> str:
        return "closed" if self._closing else self._pc.connectionState

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def start(self, offer_sdp: str) -> str:
        """Apply the offer and return the answer SDP (with its one candidate)."""
        pc = self._pc
        pc.on("track", self._on_track)
        pc.on("datachannel", self._on_datachannel)
        pc.on("connectionstatechange", self._on_state)
        with ice_plan(self.plan):
            await pc.setRemoteDescription(RTCSessionDescription(offer_sdp, "offer"))
        if self._native is not None:
            sender = pc.addTrack(self._outbound)
            receiver = next(t.receiver for t in pc.getTransceivers() if t.sender is sender)
            self._idle = IdleSender(sender, receiver)
        else:
            play_on_tick(pc.addTrack(self._outbound), self._outbound, self._clock)
        await pc.setLocalDescription(await pc.createAnswer())
        self._spawn(self._guard_setup())
        if self._agent_url:
            self._spawn(self._agent_link())
        return pc.localDescription.sdp

    async def close(self, reason: str) -> None:
        if self._closing:
            return
        self._closing = True
        self.stats.closed_at = time.monotonic()
        self.stats.close_reason = reason
        current = asyncio.current_task()
        try:
            for task in list(self._tasks):
                if task is not current:
                    task.cancel()
            if self._ws is not None:
                if not self._ws.closed:
                    try:
                        await self._ws.send_str(json.dumps({"type": "session.ended",
                                                            "reason": reason}))
                    except (ConnectionError, RuntimeError):
                        pass
                await self._ws.close()
            if self.channel is not None:
                self._native_stats = self._native.detach(self.channel)
            self._outbound.stop()
            await self._pc.close()
            pending = [t for t in self._tasks if t is not current]
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        finally:  # logged even if the teardown failed: the arrival record is the session's
            log_event(log, "session_closed", session=self.id, reason=reason,
                      ufrag=self.plan.ufrag, ice_restarts=self.ice_restarts,
                      frames_to_agent=self.stats.frames_to_agent,
                      events_to_agent=self.stats.events_to_agent,
                      events_to_client=self.stats.events_to_client,
                      frames_cleared=self.stats.frames_cleared,
                      srtp_inline=self._srtp_shortcut.packets if self._srtp_shortcut else None,
                      media_path="native" if self._native is not None else "python",
                      agent_codec=self.agent_codec, **self._native_fields(), **self.rx.fields())
            self._on_closed(self)

    # ------------------------------------------------------------ ICE restart

    @property
    def ufrag(self) -> str:
        """The session's server ufrag now (an ICE restart gives it a new one)."""
        connection = self._ice_connection()
        return connection.local_username if connection is not None else self.plan.ufrag

    def _ice_connection(self):
        for transceiver in self._pc.getTransceivers()[:1]:
            return transceiver.receiver.transport.transport._connection
        return None

    def restart_ice(self, offer: IceFragment, local: IceCredentials) -> IceFragment:
        """Restart the session's ICE in place (services/icerestart.py) with the client's new
        credentials and candidates and ours (``local``: the same routing hint, new random bits
        and password); returns our fragment for the answer. The selected pair carries the
        media until the client nominates one under the new credentials; DTLS is untouched."""
        connection = self._ice_connection()
        if self._closing or connection is None or self._pc.connectionState != "connected":
            raise RestartRefused(409, "the session is not connected")
        if self._restarting is not None and not self._restarting.done():
            raise RestartRefused(409, "an ICE restart of this session is in progress")
        if offer.ufrag == connection.remote_username:
            raise RestartRefused(422, "the same ice-ufrag: a PATCH here restarts ICE (a new "
                                      "ice-ufrag and ice-pwd); trickle is not supported")
        previous = connection.local_username
        icerestart.begin(connection, local, IceCredentials(offer.ufrag, offer.pwd))
        if self.plan.mux is not None:
            self.plan.mux.rename(connection._protocols[0], previous)
        self.ice_restarts += 1
        log_event(log, "ice_restart", session=self.id, previous_ufrag=previous,
                  ufrag=local.ufrag, candidates=len(offer.candidates))
        self._restarting = asyncio.create_task(
            self._finish_restart(connection, list(offer.candidates), time.monotonic()))
        self._tasks.add(self._restarting)
        self._restarting.add_done_callback(self._tasks.discard)
        return IceFragment(local.ufrag, local.pwd, tuple(connection.local_candidates), offer.mid)

    async def _finish_restart(self, connection, candidates, started: float) -> None:
        try:
            await icerestart.complete(connection, candidates, final=False)
        except ConnectionError as exc:
            log_event(log, "ice_restart_failed", level=logging.WARNING, session=self.id,
                      reason=str(exc))
            return
        pair = connection._nominated.get(1)
        log_event(log, "ice_restarted", session=self.id,
                  ms=round((time.monotonic() - started) * 1000.0, 1),
                  client=_hostport(pair.remote_addr) if pair is not None else None)

    def _native_fields(self) -> dict:
        stats = self._native_stats
        if stats is None:
            return {}
        jitter_ms, rtt_ms = media_stats(stats)
        return {"native_rtp_in": stats["packets_received"],
                "native_rtp_out": stats["packets_sent"], "native_rtcp_in": stats["rtcp_in"],
                "native_rtcp_out": stats["rtcp_out"], "native_rtt_ms": rtt_ms,
                "native_jitter_ms": jitter_ms}

    # ------------------------------------------------------------ peer connection events

    async def _guard_setup(self) -> None:
        await asyncio.sleep(self._setup_timeout)
        if self._pc.connectionState != "connected":
            await self.close("setup timeout")

    async def _on_state(self) -> None:
        state = self._pc.connectionState
        if state == "connected" and self.stats.connected_at is None:
            self.stats.connected_at = time.monotonic()
            self._srtp_shortcut = shortcut_srtp(self._pc, self.rx)
            if self._native is not None:
                self.channel = self._native.attach(self._pc, self._idle,
                                                   selected_pair(self._pc), self.rx)
            self._follow_moves()
            self._connected.set()
            log_event(log, "session_connected", session=self.id,
                      setup_s=round(self.stats.connected_at - self.stats.created, 4))
        elif state in ("failed", "closed") and not self._closing:
            self._spawn(self.close(f"connection {state}"))

    def _follow_moves(self) -> None:
        """When the client nominates a pair to a new address (a NAT rebinding, a handover:
        docs/mobility.md), aioice sends there; the native plane is told too."""
        for transceiver in self._pc.getTransceivers()[:1]:
            connection = transceiver.receiver.transport.transport._connection
            if hasattr(connection, "on_moved"):   # an EdgeConnection
                connection.on_moved = self._on_moved

    def _on_moved(self, before, pair) -> None:
        moved = None
        if self._native is not None and self.channel is not None:
            try:
                moved = self._native.move(self.channel, pair)
            except ValueError as exc:   # another session's address: the plane keeps the old
                moved = f"refused: {exc}"
        log_event(log, "session_moved", session=self.id, previous=_hostport(before.remote_addr),
                  client=_hostport(pair.remote_addr), plane=moved)

    def _on_track(self, track) -> None:
        if track.kind != "audio":
            return
        for transceiver in self._pc.getTransceivers():
            if transceiver.receiver.track is track:
                decode_inline(transceiver.receiver, self._to_agent_audio)

    def _on_datachannel(self, channel) -> None:
        self._channel = channel

        @channel.on("message")
        def on_message(message) -> None:
            if isinstance(message, str):
                self._spawn(self._to_agent_text(message))

        for text in self._to_client:
            channel.send(text)
            self.stats.events_to_client += 1
        self._to_client.clear()

    # ------------------------------------------------------------ agent link

    async def _agent_link(self) -> None:
        try:
            self._ws = await self._http.ws_connect(f"{self._agent_url}/v1/sessions/{self.id}",
                                                   heartbeat=None, max_msg_size=1 << 20)
        except (aiohttp.ClientError, OSError) as exc:
            log_event(log, "agent_unreachable", level=logging.WARNING, session=self.id,
                      error=str(exc))
            self._spawn(self.close("agent unreachable"))
            return
        await self._connected.wait()  # media can flow now, and the client's address is known
        client = selected_remote_address(self._pc)
        started = {"type": "session.started", "session_id": self.id, "ufrag": self.plan.ufrag,
                   "mode": self.plan.mode,
                   "client": {"address": f"{client[0]}:{client[1]}" if client else None}}
        if self.channel is not None:
            frames = self._native.frames
            await frames.wait_up()
            started["frames"] = {"link": frames.name, "channel": self.channel,
                                 "codecs": list(self._agent_codecs)}
        await self._ws.send_str(json.dumps(started))
        self._ws_ready.set()
        async for message in self._ws:
            if message.type == aiohttp.WSMsgType.BINARY:
                self._outbound.push(message.data)
            elif message.type == aiohttp.WSMsgType.TEXT:
                if self.agent_codec is None:
                    self._on_agent_created(message.data)
                if _CLEAR in message.data and self._clear_output(message.data):
                    continue
                self._to_client_text(message.data)
            else:
                break
        if not self._closing:
            self._spawn(self.close("agent closed"))

    def _on_agent_created(self, text: str) -> None:
        """The agent's ``session.created``: the codec of the session's frames (on the native
        path, PCM sessions are decoded and encoded by the plane)."""
        try:
            event = json.loads(text)
        except ValueError:
            return
        if not isinstance(event, dict) or event.get("type") != "session.created":
            return
        audio = event.get("audio") if isinstance(event.get("audio"), dict) else {}
        self.agent_codec = "opus" if audio.get("encoding") == "opus" else "pcm16"
        if self.channel is not None:
            if not isinstance(event.get("frames"), dict):
                log_event(log, "agent_without_frames_link", level=logging.WARNING,
                          session=self.id)
            self._native.set_pcm(self.channel, self.agent_codec == "pcm16")

    def _clear_output(self, text: str) -> bool:
        """The agent's ``output_audio_buffer.clear`` (a barge-in): the reply frames queued for
        the client go unplayed. True if ``text`` was that event (it is not forwarded)."""
        try:
            event = json.loads(text)
        except ValueError:
            return False
        if not isinstance(event, dict) or event.get("type") != _CLEAR:
            return False
        if self._native is not None and self.channel is not None:
            cleared = self._native.clear(self.channel)
        else:
            cleared = self._outbound.clear()
        self.stats.frames_cleared += cleared
        return True

    def _to_agent_audio(self, pcm: bytes) -> None:
        """Caller audio -> agent, one PCM frame per WebSocket message, written at once (no
        task per frame). Audio that arrives before the agent answered is dropped: queued, it
        would only add latency."""
        ws = self._ws
        if ws is None or not self._ws_ready.is_set() or ws.closed or self._native is not None:
            return
        if write_now(ws.send_bytes(pcm)):
            self.stats.frames_to_agent += 1

    async def _to_agent_text(self, text: str) -> None:
        try:
            kind = json.loads(text).get("type")
        except (ValueError, AttributeError):
            kind = None  # not ours to judge: the agent answers bad_event
        if kind in _RESERVED_EVENTS:
            return  # only the transceiver speaks for the session's lifecycle
        await self._ws_ready.wait()
        try:
            await self._ws.send_str(text)
            self.stats.events_to_agent += 1
        except (ConnectionError, RuntimeError):
            pass

    def _to_client_text(self, text: str) -> None:
        channel = self._channel
        if channel is not None and channel.readyState == "open":
            channel.send(text)
            self.stats.events_to_client += 1
        elif len(self._to_client) < 100:
            self._to_client.append(text)


class RestartRefused(Exception):
    """An ICE restart this session cannot take now: ``status`` for the HTTP answer."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def _hostport(addr) -> str:
    return f"{addr[0]}:{addr[1]}"
