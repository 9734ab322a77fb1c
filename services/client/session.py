"""One measured call: offer -> POST -> answer -> ICE -> DTLS -> a few seconds of audio -> DELETE.

A full session decodes what it receives and checks the echo's level; a light one decodes
nothing (``light.py``) and checks the echo from payload sizes (``voiced.py``).

Lifecycle (``CallSession.run``): everything the session starts (its peer connection, the audio
consumer, the sampler, its HTTP client) is stopped and awaited before ``run`` returns, whatever
happened; expected failures become ``SessionResult.error`` (one line), never an exception.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

import aiohttp
import numpy as np
from aiortc import (RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCRtpSender,
                    RTCSessionDescription)
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtcconfiguration import RTCBundlePolicy

from services.client.config import FULL, KINDS, LIGHT, ClientConfig
from services.client.light import receive_without_decoding
from services.client.probes import RtpProbe, StunProbe
from services.client.results import MediaSample, SessionResult
from services.client.signaling import SignalingError, delete_session, post_offer
from services.client.tone import PreEncodedOpusTrack, opus_tone
from services.client.voiced import VoicedCount

log = logging.getLogger(__name__)

DATA_CHANNEL = "oai-events"
RTP_UNITS_PER_MS = 48.0   # Opus RTP clock (48 kHz): aiortc reports jitter in RTP timestamp units
MAX_EVENTS = 100          # event types kept per session


class SessionError(Exception):
    """An expected failure; its message is the session's one-line ``error``."""


def ping_event(index: int) -> dict:
    return {"type": "conversation.item.create",
            "item": {"type": "message", "role": "user",
                     "content": [{"type": "input_text", "text": f"ping {index}"}]}}


class CallSession:
    """One client session. Create, ``await run()`` once, read the returned ``SessionResult``."""

    def __init__(self, config: ClientConfig, index: int = 0,
                 http: aiohttp.ClientSession | None = None, kind: str = FULL) -> None:
        if kind not in KINDS:
            raise ValueError(f"client kind must be one of {', '.join(KINDS)}")
        self.config = config
        self.index = index
        self.kind = kind
        self.result = SessionResult(index=index, started_unix=0.0, client=kind)
        self._http = http
        self._t0 = 0.0
        self._pc: RTCPeerConnection | None = None
        self._location: str | None = None
        self._rtp = RtpProbe(VoicedCount(config.echo_skip_ms / 1000.0))
        self._stun = StunProbe()
        self._ice_connected_at: float | None = None
        self._failure: str | None = None
        self._closing = False
        self._setup_done = asyncio.Event()
        self._failed = asyncio.Event()
        self._sent_event: dict | None = None
        self._consumer: asyncio.Task | None = None
        self._sampler: asyncio.Task | None = None
        self._audio_seen = 0       # samples per channel received
        self._audio_sumsq = 0.0    # over samples after echo_skip_ms
        self._audio_n = 0

    def _ms(self, at: float | None = None) -> float:
        return round(((time.monotonic() if at is None else at) - self._t0) * 1000.0, 3)

    async def run(self) -> SessionResult:
        if self._t0:
            raise RuntimeError("a CallSession runs once")
        r = self.result
        r.started_unix = time.time()
        self._t0 = time.monotonic()
        http = self._http or aiohttp.ClientSession()
        try:
            try:
                async with asyncio.timeout(self.config.setup_timeout_s):
                    await self._setup(http)
            except TimeoutError:
                raise SessionError("setup timeout") from None
            r.stage = "call"
            await self._call()
            r.stage, r.ok = "done", True
        except (SessionError, SignalingError) as exc:
            r.error = str(exc)
        except Exception as exc:  # aiortc/aioice error or a bug: one line here, details in the log
            log.debug("session %d failed", self.index, exc_info=True)
            r.error = f"internal error: {type(exc).__name__}: {exc}"
        finally:
            try:
                await self._teardown(http)
            finally:
                if self._http is None:
                    await http.close()
                r.ended_unix = time.time()
        return r

    # -- setup ---------------------------------------------------------------------------------

    async def _setup(self, http: aiohttp.ClientSession) -> None:
        cfg, r = self.config, self.result
        servers = [RTCIceServer(urls=s.urls, username=s.username, credential=s.credential)
                   for s in cfg.ice_servers]
        # MAX_BUNDLE: audio and data channel share one ICE transport from the start (one socket
        # per host address, one set of candidates in the offer).
        pc = self._pc = RTCPeerConnection(RTCConfiguration(
            iceServers=servers, bundlePolicy=RTCBundlePolicy.MAX_BUNDLE))
        pc.on("iceconnectionstatechange", self._on_ice_state)
        pc.on("connectionstatechange", self._on_connection_state)
        pc.on("track", self._on_track)

        transceiver = pc.addTransceiver(PreEncodedOpusTrack(opus_tone(cfg.tone_hz)),
                                        direction="sendrecv")
        transceiver.setCodecPreferences(
            [c for c in RTCRtpSender.getCapabilities("audio").codecs
             if c.mimeType.lower() == "audio/opus"])
        self._rtp.attach(transceiver.receiver)
        if self.kind == LIGHT:
            receive_without_decoding(transceiver.receiver)

        channel = pc.createDataChannel(DATA_CHANNEL)
        channel.on("open", lambda: self._on_channel_open(channel))
        channel.on("message", self._on_channel_message)

        await pc.setLocalDescription(await pc.createOffer())  # gathers all candidates
        self._stun.attach(transceiver.receiver.transport.transport._connection)

        r.stage = "signaling"
        sent = time.monotonic()
        r.offer_ms = self._ms(sent)
        answer = await post_offer(http, cfg.url, pc.localDescription.sdp,
                                  cfg.signaling_timeout_s, cfg.headers)
        r.signaling_ms = round((time.monotonic() - sent) * 1000.0, 3)
        r.http_status, r.session_url = answer.status, answer.location
        self._location = answer.location

        r.stage = "connect"
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer.sdp, type="answer"))
        except Exception as exc:
            raise SessionError(f"unusable SDP answer: {type(exc).__name__}: {exc}") from None
        await self._setup_done.wait()
        if self._failure:
            raise SessionError(self._failure)

    def _fail(self, reason: str) -> None:
        if self._closing or self._failure:
            return
        self._failure = reason
        self._failed.set()
        self._setup_done.set()

    def _on_ice_state(self) -> None:
        state = self._pc.iceConnectionState
        if state in ("completed", "connected") and self.result.ice_connected_ms is None:
            self._ice_connected_at = time.monotonic()
            self.result.ice_connected_ms = self._ms(self._ice_connected_at)
        elif state == "failed":
            self._fail("ICE failed")

    def _on_connection_state(self) -> None:
        state = self._pc.connectionState
        if state == "connected" and self.result.setup_ms is None:
            self.result.setup_ms = self._ms()
            self._setup_done.set()
        elif state in ("failed", "closed"):
            self._fail(f"connection {state}")

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio" and self.kind == FULL and self._consumer is None:
            self._consumer = asyncio.create_task(self._consume(track),
                                                 name=f"client-{self.index}-audio-in")

    def _on_channel_open(self, channel) -> None:
        self.result.datachannel_open_ms = self._ms()
        self._sent_event = ping_event(self.index)
        channel.send(json.dumps(self._sent_event))

    def _on_channel_message(self, message: str | bytes) -> None:
        try:
            event = json.loads(message)
        except ValueError:
            event = None
        kind = str(event.get("type")) if isinstance(event, dict) else "(not a JSON object)"
        if len(self.result.events) < MAX_EVENTS:
            self.result.events.append(kind)
        if (kind == "agent.echo" and self._sent_event is not None
                and event.get("event") == self._sent_event):
            self.result.datachannel_verified = True

    # -- call ----------------------------------------------------------------------------------

    async def _consume(self, track: MediaStreamTrack) -> None:
        """Drain the remote track (else its queue grows) and sum the energy for the echo check."""
        skip = None
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            if skip is None:
                skip = int(self.config.echo_skip_ms / 1000.0 * frame.sample_rate)
            if self._audio_seen + frame.samples > skip:
                channels = len(frame.layout.channels)
                data = frame.to_ndarray().reshape(-1)[max(0, skip - self._audio_seen) * channels:]
                data = data.astype(np.float32)
                if frame.format.name.startswith("s16"):
                    data /= 32768.0
                self._audio_sumsq += float(np.dot(data, data))
                self._audio_n += data.size
            self._audio_seen += frame.samples

    async def _call(self) -> None:
        self._sampler = asyncio.create_task(self._sample_loop(),
                                            name=f"client-{self.index}-sampler")
        try:
            async with asyncio.timeout(self.config.duration_s):
                await self._failed.wait()
        except TimeoutError:
            return
        raise SessionError(f"{self._failure} during the call")

    async def _sample_loop(self) -> None:
        interval = self.config.sample_interval_s
        due = time.monotonic()
        while True:
            due += interval
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            jitter_ms, rtt_ms = await self._media_stats()
            self.result.samples.append(MediaSample(
                session=self.index, t_ms=self._ms(), packets_received=self._rtp.seq.received,
                packets_lost=self._rtp.seq.lost, jitter_ms=jitter_ms, rtt_ms=rtt_ms))

    async def _media_stats(self) -> tuple[float | None, float | None]:
        """(jitter of received audio, RTT of our sending stream) in ms, from getStats()."""
        jitter_ms = rtt_ms = None
        for stats in (await self._pc.getStats()).values():
            if stats.type == "inbound-rtp" and stats.kind == "audio" and stats.jitter is not None:
                jitter_ms = round(stats.jitter / RTP_UNITS_PER_MS, 3)
            elif (stats.type == "remote-inbound-rtp" and stats.kind == "audio"
                  and stats.roundTripTime is not None):
                rtt_ms = round(stats.roundTripTime * 1000.0, 3)
        return jitter_ms, rtt_ms

    # -- teardown ------------------------------------------------------------------------------

    async def _teardown(self, http: aiohttp.ClientSession) -> None:
        cfg, r = self.config, self.result
        self._closing = True
        if self._sampler is not None:
            self._sampler.cancel()
            await asyncio.gather(self._sampler, return_exceptions=True)
        self._rtp.detach()  # media counters cover the session up to the end of the call
        if r.setup_ms is not None:
            r.call_ms = round(self._ms() - r.setup_ms, 3)
            try:
                r.jitter_ms, r.rtt_ms = await asyncio.wait_for(self._media_stats(), 1.0)
            except Exception:  # stats are best effort on a dying connection
                log.debug("session %d: final getStats failed", self.index, exc_info=True)
            r.samples.append(MediaSample(  # the end of the call, off the 1 s grid
                session=self.index, t_ms=self._ms(), packets_received=self._rtp.seq.received,
                packets_lost=self._rtp.seq.lost, jitter_ms=r.jitter_ms, rtt_ms=r.rtt_ms))
        self._record_ice()

        if self._location is not None:
            try:
                r.delete_status = await delete_session(http, self._location,
                                                       cfg.teardown_timeout_s, cfg.headers)
                if r.delete_status not in (200, 204):
                    r.teardown_error = f"DELETE returned HTTP {r.delete_status}"
            except SignalingError as exc:
                r.teardown_error = str(exc)
        elif r.http_status is not None:
            r.teardown_error = "the answer had no Location header: session not deleted"

        if self._pc is not None:
            try:
                await asyncio.wait_for(self._pc.close(), cfg.teardown_timeout_s)
            except TimeoutError:
                r.teardown_error = r.teardown_error or "peer connection close timed out"
            except Exception as exc:
                log.debug("session %d: close failed", self.index, exc_info=True)
                r.teardown_error = r.teardown_error or f"close failed: {type(exc).__name__}: {exc}"
        if self._consumer is not None:
            # A receiver that never started (setup failed) never ends its track: do not wait.
            self._consumer.cancel()
            await asyncio.gather(self._consumer, return_exceptions=True)
        self._stun.detach()
        self._record_media()

    def _record_ice(self) -> None:
        r = self.result
        pair = self._stun.selected_pair()
        if pair is None:
            return
        r.ice_pair = f"{_hostport(*pair.local_addr)} -> {_hostport(*pair.remote_addr)}"
        rtt = self._stun.first_rtt_ms(pair)
        r.first_ice_rtt_ms = None if rtt is None else round(rtt, 3)
        if self._ice_connected_at is not None:
            rtt = self._stun.last_rtt_ms(pair, sent_after=self._ice_connected_at)
            r.consent_rtt_ms = None if rtt is None else round(rtt, 3)

    def _record_media(self) -> None:
        r = self.result
        if self._rtp.first_packet_at is not None:
            r.first_audio_ms = self._ms(self._rtp.first_packet_at)
        loss = self._rtp.seq.stats()
        r.packets_received = self._rtp.seq.received
        r.packets_expected, r.packets_lost = loss.expected, loss.lost
        r.loss_bursts = list(loss.bursts)
        r.loss_pct = round(loss.loss_pct, 3) if loss.expected else None
        voiced_pct = self._rtp.voiced.voiced_pct
        r.echo_voiced_pct = None if voiced_pct is None else round(voiced_pct, 1)
        if self.kind == LIGHT:
            r.echo_verified = (voiced_pct is not None
                               and voiced_pct >= self.config.echo_min_voiced_pct)
        elif self._audio_n:
            r.echo_rms = round(float(np.sqrt(self._audio_sumsq / self._audio_n)), 5)
            r.echo_verified = r.echo_rms >= self.config.echo_min_rms


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def run_session(config: ClientConfig, index: int = 0,
                      http: aiohttp.ClientSession | None = None, kind: str = FULL
                      ) -> SessionResult:
    """Run one session to the end; a failed session is ``SessionResult.error``, not an exception."""
    return await CallSession(config, index, http, kind).run()
