"""One measured call: offer -> POST -> answer -> ICE -> DTLS -> a few seconds of audio -> DELETE.

A full session decodes what it receives and checks the echo's level; a light one decodes
nothing (``light.py``) and checks the echo from payload sizes (``voiced.py``).

A session is one logical call. When its connection fails during the call (ICE failed,
connection failed or closed, or no RTP for ``media_timeout_s``), it calls again as a real
client would: a new peer connection and offer to the same URL, at most ``reconnect_attempts``
times in all, while the old connection is DELETEd and closed in the background. The call
keeps its end (first DTLS-connected moment + ``duration_s``). A failed first setup is not
retried. Each connection is an attempt (``_Connection``); docs/client.md has the rules.

ICE servers: the configured ones, or with ``ice_from_signaling`` the front's (``GET
/v1/ice-servers``, fetched before the session's clock starts: ``iceservers.py``); relay-only
when either says so. Each attempt's TURN requests are timed (``turnlog.py``); the first
attempt's go to ``SessionResult.turn_transactions``, and ``gathered_ms`` marks the end of its
ICE gathering (under TURN: the allocation).

Lifecycle (``CallSession.run``): everything the session starts (its peer connections, the audio
consumers, the sampler, the background teardowns, its HTTP client) is stopped and awaited
before ``run`` returns, whatever happened, also when it is cancelled; expected failures become
``SessionResult.error`` (one line), never an exception.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import numpy as np
from aiortc import (RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCRtpSender,
                    RTCSessionDescription)
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtcconfiguration import RTCBundlePolicy, RTCIceTransportPolicy

from services.client import playout
from services.client.bundle import bundled_answer
from services.client.config import FULL, KINDS, LIGHT, ClientConfig
from services.client.conversation import Conversation
from services.client.iceservers import RELAY, IceServersError, IceSettings
from services.client.iceservers import fetch as fetch_ice_servers
from services.client.light import receive_without_decoding
from services.client.probes import RtpProbe, StunProbe
from services.client.renominate import renominate
from services import icerestart
from services.client.restart import restart_ice
from services.client.results import MediaSample, SessionResult
from services.client.signaling import SignalingError, delete_session, post_offer
from services.client.tone import PreEncodedOpusTrack, opus_tone
from services.client.turnlog import TurnLog, recording
from services.client.verify import ENVELOPE, datachannel_counts, echo_form, verified
from services.client.voiced import VoicedCount
from services.gaps import ArrivalGaps
from services.mediaplane.hooks import IdleSender

if TYPE_CHECKING:
    from services.client.pump import LightPump

log = logging.getLogger(__name__)

DATA_CHANNEL = "oai-events"
RTP_UNITS_PER_MS = 48.0   # Opus RTP clock (48 kHz): aiortc reports jitter in RTP timestamp units
MAX_EVENTS = 100          # event types kept per session
MEDIA_TIMEOUT = "media timeout"
# The watchdog looks twice before it calls a connection dead, this far apart or as long as the
# event loop was late to wake it: packets a lagging loop has received but not yet handed to
# the probe get their turn first.
WATCHDOG_GRACE_S = 0.05
RETIRED_DELETE_TIMEOUT_S = 1.0  # DELETE of a failed connection's session: best effort
# After this much silence on a connected call the client renominates its pair (a NAT may have
# moved its port: renominate.py), beside the watchdog; the renomination has this long to bring
# the media back
RENOMINATE_AFTER_S = 0.5
RENOMINATE_WAIT_S = 1.0
# When a renomination has not brought the media back this long after its check, the call
# restarts ICE once, over new connections, beside it (docs/mobility.md: the recovery ladder);
# the watchdog waits for that restart before it calls again. The restart has this long.
RESCUE_AFTER_S = 0.5
RESCUE_RESTART_S = 1.0
# what made a call restart ICE (the last field of its ``ice_restarts`` entries)
ASKED, NETWORK, SILENCE = "asked", "network", "silence"
_UNSET = object()


class SessionError(Exception):
    """An expected failure; its message is the session's one-line ``error``."""


def ping_event(index: int) -> dict:
    return {"type": "conversation.item.create",
            "item": {"type": "message", "role": "user",
                     "content": [{"type": "input_text", "text": f"ping {index}"}]}}


class _Connection:
    """One attempt of a session: its peer connection, the signaling of its offer, its probes."""

    def __init__(self, number: int, reason: str, voiced: VoicedCount, gaps: ArrivalGaps,
                 record_arrivals: bool = False) -> None:
        self.number = number                 # 0: the first call
        self.pc: RTCPeerConnection | None = None
        self.location: str | None = None
        self.http_status: int | None = None
        self.rtp = RtpProbe(voiced, gaps, record_arrivals)
        self.stun = StunProbe()
        self.turn = TurnLog()                # its TURN requests (services/client/turnlog.py)
        self.ice_connected_at: float | None = None
        self.connected_at: float | None = None   # DTLS connected (monotonic)
        self.failure: str | None = None
        self.closing = False
        self.setup_done = asyncio.Event()
        self.failed = asyncio.Event()
        self.sent_event: dict | None = None
        self.consumer: asyncio.Task | None = None
        self.idle: IdleSender | None = None      # the native pump's stand-in sender
        self.pump_channel: int | None = None     # on the pump's plane, once connected
        self.stats: tuple[float | None, float | None] | None = None  # (jitter, rtt) at its end
        self.delete_status: int | None = None
        self.teardown_error: str | None = None
        self.record = {"attempt": number, "reason": reason,
                       "started_unix": round(time.time(), 6), "connected_unix": None,
                       "location": None, "cluster": None, "transceiver": None, "error": None}

    def fail(self, reason: str) -> None:
        if self.closing or self.failure:
            return
        self.failure = reason
        self.failed.set()
        self.setup_done.set()


async def warm_up(config: ClientConfig) -> float:
    """Pay a process's one-time costs before its first call: the tone's Opus packets and
    aiortc's first peer connection and offer (about 25 ms on an idle host, 100 ms beside a
    starting browser). Otherwise the first session's gathering and setup measured them, not
    the network. No ICE servers: gathering binds host sockets and sends nothing. Returns the
    milliseconds it took."""
    started = time.monotonic()
    if config.conversation is not None:
        from services.client.conversation import caller_lines
        caller_lines()  # espeak-ng and the Opus encoding, once per process
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        pc.addTransceiver(PreEncodedOpusTrack(opus_tone(config.tone_hz)), direction="sendrecv")
        pc.createDataChannel(DATA_CHANNEL)
        await pc.setLocalDescription(await pc.createOffer())
    finally:
        await pc.close()
    return round((time.monotonic() - started) * 1000.0, 2)


class CallSession:
    """One client session. Create, ``await run()`` once, read the returned ``SessionResult``."""

    def __init__(self, config: ClientConfig, index: int = 0,
                 http: aiohttp.ClientSession | None = None, kind: str = FULL,
                 pump: "LightPump | None" = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"client kind must be one of {', '.join(KINDS)}")
        self.config = config
        self.index = index
        self.kind = kind
        self.result = SessionResult(index=index, started_unix=0.0, client=kind,
                                    verifies=list(config.verifies))
        self._http = http
        self._pump = pump if kind == LIGHT else None
        self._t0 = 0.0
        self._voiced = VoicedCount(config.echo_skip_ms / 1000.0)
        self._gaps = ArrivalGaps.monotonic()  # the call's, across its attempts
        self._conns: list[_Connection] = []
        self._conn: _Connection | None = None      # the current attempt
        self._ice = IceSettings(config.ice_servers, config.ice_transport_policy)
        self._retiring: set[asyncio.Task] = set()  # teardowns of failed attempts
        self._renominating: asyncio.Task | None = None  # renominate.py, beside the watchdog
        self._rescued_for = _UNSET   # the silence (its last packet) an ICE restart was tried for
        self._restarting: asyncio.Task | None = None    # an ICE restart (restart.py)
        self._http_in_use: aiohttp.ClientSession | None = None
        self._http_opened: list[aiohttp.ClientSession] = []   # closed at the end
        self._sampler: asyncio.Task | None = None
        self._audio_seen = 0       # samples per channel received
        self._audio_sumsq = 0.0    # over samples after echo_skip_ms
        self._audio_n = 0
        # A conversation (conversation.py): sessions speak in turns instead of the tone, full
        # ones through aiortc, light ones on the native pump (pumpedtalk.py).
        self._talk = None
        if config.conversation is not None:
            if kind == LIGHT and self._pump is None:
                raise ValueError("a light session holds a conversation only on the native pump "
                                 "(light_path native)")
            self._talk = Conversation(config.conversation, index, config.duration_s)
        self._talking: asyncio.Task | None = None

    @property
    def conversation(self) -> Conversation | None:
        """The conversation this session holds (with ``config.conversation``)."""
        return self._talk

    @property
    def receiving(self) -> bool:
        """Whether an RTP packet has arrived yet (on any attempt)."""
        return self._gaps.first is not None

    def _ms(self, at: float | None = None) -> float:
        return round(((time.monotonic() if at is None else at) - self._t0) * 1000.0, 3)

    async def run(self) -> SessionResult:
        if self._t0:
            raise RuntimeError("a CallSession runs once")
        r = self.result
        ice_error = await self._fetch_ice_servers()  # before the session's clock starts
        r.started_unix = time.time()
        self._t0 = time.monotonic()
        http = self._http
        if http is None:
            http = aiohttp.ClientSession()
            self._http_opened.append(http)
        self._http_in_use = http
        try:
            if ice_error:
                raise SessionError(ice_error)
            first = self._new_connection("first")
            try:
                async with asyncio.timeout(self.config.setup_timeout_s):
                    await self._connect(first, http)
            except TimeoutError:
                if not self._retry_setup(first, http, "setup timeout"):
                    raise SessionError("setup timeout") from None
                await self._reconnect(http, "setup timeout", self._retry_deadline())
            except SessionError as exc:
                if not self._retry_setup(first, http, str(exc)):
                    raise
                await self._reconnect(http, str(exc), self._retry_deadline())
            r.stage = "call"
            await self._call()
            r.stage, r.ok = "done", True
        except (SessionError, SignalingError) as exc:
            r.error = str(exc)
        except Exception as exc:  # aiortc/aioice error or a bug: one line here, details in the log
            log.debug("session %d failed", self.index, exc_info=True)
            r.error = f"internal error: {type(exc).__name__}: {exc}"
        finally:
            if r.error and self._conn is not None and self._conn.record["error"] is None:
                self._conn.record["error"] = r.error
            try:
                await self._teardown(self._http_in_use)
            finally:
                for mine in self._http_opened:
                    await mine.close()
                r.ended_unix = time.time()
                if self._conns:
                    r.turn_transactions = self._conns[0].turn.rows(self._t0)
                offset = self._gaps.unix_offset
                r.rx_arrivals = [[ssrc, seq, round(at + offset, 6)] for c in self._conns
                                 for ssrc, seq, at in c.rtp.arrivals or ()]
        return r

    async def _fetch_ice_servers(self) -> str | None:
        """With ``ice_from_signaling``, the front's ICE servers and policy for this session
        (relay-only stays forced by ``ice_transport_policy``); the error line if it failed.
        Like a browser page that fetched them before creating its peer connection, this is
        before the session's timeline starts (docs/turn.md)."""
        cfg = self.config
        if not cfg.ice_from_signaling:
            return None
        try:
            got = await fetch_ice_servers(cfg.url, cfg.signaling_timeout_s, cfg.headers)
        except IceServersError as exc:
            return str(exc)
        policy = RELAY if cfg.ice_transport_policy == RELAY else got.policy
        self._ice = IceSettings(got.servers, policy)
        return None

    def _retry_setup(self, conn: _Connection, http: aiohttp.ClientSession, reason: str) -> bool:
        """With ``retry_setup``: a first setup the edge answered (201) but whose media never
        connected is retired, to be called again (True)."""
        if not (self.config.retry_setup and self.config.reconnect_attempts
                and conn.http_status == 201):
            return False
        conn.record["error"] = reason
        self._retire(conn, http)
        return True

    def _retry_deadline(self) -> float:
        """How long the calls after a failed first setup may go on: each its setup time."""
        cfg = self.config
        return time.monotonic() + (cfg.setup_timeout_s + max(cfg.reconnect_backoff_s)) * (
            cfg.reconnect_attempts + 1)

    # -- setup (of every attempt) --------------------------------------------------------------

    def _new_connection(self, reason: str) -> _Connection:
        conn = _Connection(len(self._conns), reason, self._voiced, self._gaps,
                           self.config.record_arrivals)
        self._gaps.attempt = conn.number  # the gaps its packets end are its own
        self._conns.append(conn)
        self._conn = conn
        self.result.attempts.append(conn.record)
        return conn

    async def _connect(self, conn: _Connection, http: aiohttp.ClientSession) -> None:
        """Build ``conn``'s peer connection, offer, answer, until DTLS is connected. The first
        attempt's timeline is the session's."""
        with recording(conn.turn):  # its TURN client's requests, timed (turnlog.py)
            await self._connect_recorded(conn, http)

    async def _connect_recorded(self, conn: _Connection, http: aiohttp.ClientSession) -> None:
        cfg, r = self.config, self.result
        first = conn.number == 0
        servers = [RTCIceServer(urls=s.urls, username=s.username, credential=s.credential)
                   for s in self._ice.servers]
        policy = (RTCIceTransportPolicy.RELAY if self._ice.policy == RELAY
                  else RTCIceTransportPolicy.ALL)
        # MAX_BUNDLE: audio and data channel share one ICE transport from the start (one socket
        # per host address, one set of candidates in the offer). Relay-only: one TURN
        # allocation, no host candidates.
        pc = conn.pc = RTCPeerConnection(RTCConfiguration(
            iceServers=servers, iceTransportPolicy=policy,
            bundlePolicy=RTCBundlePolicy.MAX_BUNDLE))
        pc.on("iceconnectionstatechange", lambda: self._on_ice_state(conn))
        pc.on("connectionstatechange", lambda: self._on_connection_state(conn))
        pc.on("track", lambda track: self._on_track(conn, track))

        track = (self._talk.track if self._talk is not None
                 else PreEncodedOpusTrack(opus_tone(cfg.tone_hz)))
        transceiver = pc.addTransceiver(track, direction="sendrecv")
        transceiver.setCodecPreferences(
            [c for c in RTCRtpSender.getCapabilities("audio").codecs
             if c.mimeType.lower() == "audio/opus"])
        conn.rtp.attach(transceiver.receiver)
        if self._talk is not None and self.kind == FULL:
            conn.rtp.listener = self._talk.ear.arrived
            if cfg.conversation.jitter_buffer == "playout":
                playout.install(transceiver.receiver)
        if self.kind == LIGHT:
            receive_without_decoding(transceiver.receiver)
        if self._pump is not None:
            conn.idle = self._pump.prepare(transceiver)

        channel = pc.createDataChannel(DATA_CHANNEL)
        channel.on("open", lambda: self._on_channel_open(conn, channel))
        channel.on("message", lambda message: self._on_channel_message(conn, message))

        await pc.setLocalDescription(await pc.createOffer())  # gathers all candidates
        if first:
            r.gathered_ms = self._ms()
        conn.stun.attach(transceiver.receiver.transport.transport._connection)

        sent = time.monotonic()
        if first:
            r.stage, r.offer_ms = "signaling", self._ms(sent)
        answer = await post_offer(http, cfg.url, pc.localDescription.sdp,
                                  cfg.signaling_timeout_s, cfg.headers)
        conn.location, conn.http_status = answer.location, answer.status
        conn.record.update(location=answer.location, cluster=answer.cluster,
                           transceiver=answer.transceiver)
        if first:
            r.signaling_ms = round((time.monotonic() - sent) * 1000.0, 3)
            r.http_status, r.session_url = answer.status, answer.location
            r.cluster, r.transceiver = answer.cluster, answer.transceiver
            r.stage = "connect"
        try:
            # The BUNDLE tag's candidates in every bundled m-line: aiortc reads the last one's.
            await pc.setRemoteDescription(RTCSessionDescription(sdp=bundled_answer(answer.sdp),
                                                                type="answer"))
        except Exception as exc:
            raise SessionError(f"unusable SDP answer: {type(exc).__name__}: {exc}") from None
        await conn.setup_done.wait()
        if conn.failure:
            raise SessionError(conn.failure)

    def _on_ice_state(self, conn: _Connection) -> None:
        state = conn.pc.iceConnectionState
        if state in ("completed", "connected") and conn.ice_connected_at is None:
            conn.ice_connected_at = time.monotonic()
            if conn.number == 0:
                self.result.ice_connected_ms = self._ms(conn.ice_connected_at)
        elif state == "failed":
            conn.fail("ICE failed")

    def _on_connection_state(self, conn: _Connection) -> None:
        state = conn.pc.connectionState
        if state == "connected" and conn.connected_at is None:
            conn.connected_at = time.monotonic()
            conn.record["connected_unix"] = round(time.time(), 6)
            if conn.number == 0:
                self.result.setup_ms = self._ms(conn.connected_at)
            if conn.idle is not None:
                self._to_pump(conn)
            conn.setup_done.set()
        elif state in ("failed", "closed"):
            conn.fail(f"connection {state}")

    def _to_pump(self, conn: _Connection) -> None:
        """Hand the connected attempt's RTP to the native pump (aiortc keeps it when the pair
        goes through TURN)."""
        pair = conn.stun.selected_pair()
        channel = (self._pump.attach(conn.pc, conn.idle, pair, conn.rtp, self._talk)
                   if pair else None)
        if channel is None:
            conn.idle.release()
            if self._talk is not None:   # aiortc's light receive path hears nothing
                conn.fail("a conversation on the native pump needs a direct or TURN/UDP pair")
            return
        conn.pump_channel = channel
        self.result.media_path = "native"

    def _on_track(self, conn: _Connection, track: MediaStreamTrack) -> None:
        if track.kind == "audio" and self.kind == FULL and conn.consumer is None:
            conn.consumer = asyncio.create_task(
                self._consume(track), name=f"client-{self.index}-{conn.number}-audio-in")

    def _on_channel_open(self, conn: _Connection, channel) -> None:
        if conn.number == 0:
            self.result.datachannel_open_ms = self._ms()
        conn.sent_event = ping_event(self.index)
        channel.send(json.dumps(conn.sent_event))

    def _on_channel_message(self, conn: _Connection, message: str | bytes) -> None:
        try:
            event = json.loads(message)
        except ValueError:
            event = None
        kind = str(event.get("type")) if isinstance(event, dict) else "(not a JSON object)"
        r = self.result
        if len(r.events) < MAX_EVENTS:
            r.events.append(kind)
        if self._talk is not None and isinstance(event, dict):
            self._talk.on_agent_event(event)
        form = echo_form(conn.sent_event, message)
        if form is not None and r.datachannel_echo != ENVELOPE:  # the envelope, once seen, stays
            r.datachannel_echo = form

    # -- call ----------------------------------------------------------------------------------

    async def _consume(self, track: MediaStreamTrack) -> None:
        """Drain the remote track (else its queue grows) and sum the energy for the echo check."""
        skip = None
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            if self._talk is not None:
                self._talk.ear.hear(frame, time.time(), track)
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
        """The call until its end; a failed connection is replaced (``_reconnect``)."""
        end = self._conn.connected_at + self.config.duration_s
        self._sampler = asyncio.create_task(self._sample_loop(),
                                            name=f"client-{self.index}-sampler")
        if self._talk is not None:  # the call ends with its last reply (duration_s at most)
            self._talking = asyncio.create_task(self._talk.run(),
                                                name=f"client-{self.index}-talk")
        while True:
            conn = self._conn
            reason = await self._watch(conn, end)
            if reason is None:
                return
            conn.record["error"] = reason
            log.debug("session %d: attempt %d: %s", self.index, conn.number, reason)
            http = self._http_in_use   # a new network's (a handover) from then on
            self._retire(conn, http)
            await self._reconnect(http, reason, end)
            if time.monotonic() >= end:
                return

    async def _watch(self, conn: _Connection, end: float) -> str | None:
        """Wait until ``end`` or the conversation's end (None) or until ``conn`` fails (why).
        The media watchdog: no RTP packet for ``media_timeout_s`` since the later of the call's
        last packet and ``conn``'s connected moment. It wakes about once per
        ``media_timeout_s``, not per packet."""
        timeout = self.config.media_timeout_s
        second_look, late = False, 0.0
        renominated_for = None   # the silence (its last packet) a renomination was sent for
        waited_for = _UNSET      # ... and the watchdog waited for an ICE restart in
        while True:
            now = time.monotonic()
            if now >= end:
                return None
            if self._talking is not None and self._talking.done():  # the conversation is over
                if not self._talking.cancelled() and self._talking.exception() is not None:
                    raise self._talking.exception()  # a bug: the session's internal error
                return None
            last = self._gaps.last
            base = max(conn.connected_at, last or 0.0)
            if last is None:   # no packet yet: look again soon, the first may come any time
                suspect = now + RENOMINATE_AFTER_S
            elif renominated_for == last:
                suspect = None
            else:
                suspect = base + RENOMINATE_AFTER_S
                if self._restarting is not None and not self._restarting.done():
                    suspect = None   # new checks are under way: not on the old pair
                elif now >= suspect:
                    renominated_for, suspect = last, None
                    self._spawn_renomination(conn, last)
            due = base + timeout
            if now < due:
                second_look = False
            elif second_look:   # the last rung before a new call: an ICE restart
                if waited_for == last:
                    return MEDIA_TIMEOUT   # waited for one in this silence already
                waited_for, second_look = last, False
                if not await self._rescue(conn, end, last):
                    return conn.failure or MEDIA_TIMEOUT
                continue   # the media may be back: look again
            else:  # as long again as the loop was late to wake us: its backlog goes first
                second_look, due = True, now + max(WATCHDOG_GRACE_S, late)
            wake = min(due, end) if suspect is None else min(due, end, suspect)
            try:
                async with asyncio.timeout(wake - now):
                    await self._failed_or_talked(conn)
            except TimeoutError:
                late = time.monotonic() - wake
                continue
            if conn.failure is None:
                continue  # the conversation is over (the top of the loop says so)
            return conn.failure

    def _spawn_renomination(self, conn: _Connection, before: float) -> None:
        if conn.pc is None or (self._renominating is not None and not self._renominating.done()):
            return
        self._renominating = asyncio.create_task(self._renominate(conn, before),
                                                 name=f"client-{self.index}-renominate")

    async def _renominate(self, conn: _Connection, before: float | None) -> None:
        """The media stopped ``RENOMINATE_AFTER_S`` ago on a connection ICE still holds:
        renominate its pair (a NAT may have moved the client's port: renominate.py) and
        note it if the media comes back within ``RENOMINATE_WAIT_S``. If it has not come
        back ``RESCUE_AFTER_S`` after the check (or the check could not be sent), the next
        rung starts beside it: an ICE restart, which the watchdog waits for before it calls
        again."""
        gaps, detected = self._gaps, time.time()
        check = asyncio.ensure_future(renominate(conn.pc))
        rescue_at = time.monotonic() + RESCUE_AFTER_S
        try:
            async with asyncio.timeout(RENOMINATE_WAIT_S):
                while gaps.last == before:
                    refused = check.done() and not check.result()
                    if self._rescued_for != before and (refused
                                                        or time.monotonic() >= rescue_at):
                        self._start_rescue(before)   # the next rung, beside this one
                    if refused:
                        return
                    await asyncio.sleep(0.01)
        except TimeoutError:
            check.cancel()
            return
        refused = check.done() and not check.result()
        check.cancel()   # the media may come back before the check's answer: stop its retries
        if self._rescued_for == before or refused:
            return   # back, but by the restart: its own record says so
        r = self.result
        r.renominations += 1
        r.renominated.append([None if before is None else round(before + gaps.unix_offset, 6),
                              round(detected, 6), round(_first_after(gaps, before), 6)])
        log.debug("session %d: renominated, media back", self.index)

    def _start_rescue(self, before: float | None) -> bool:
        """Restart ICE over new connections for the silence after ``before`` (a renomination
        did not bring the media back: the path, not only the address, may have changed);
        once per silence."""
        self._rescued_for = before
        return self.request_ice_restart(True, SILENCE, RESCUE_RESTART_S)

    async def _rescue(self, conn: _Connection, end: float, last: float | None) -> bool:
        """The media is still gone at the watchdog's time: wait for the ICE restart under
        way (at most ``RESCUE_RESTART_S``: one asked for earlier may have longer), or start
        one. False when none could start or ``conn`` failed meanwhile: call again."""
        running = self._restarting is not None and not self._restarting.done()
        if not running and (self._rescued_for == last or not self._start_rescue(last)):
            return False
        watching = asyncio.ensure_future(self._failed_or_talked(conn))
        try:
            await asyncio.wait([self._restarting, watching],
                               timeout=max(0.0, min(end - time.monotonic(), RESCUE_RESTART_S)),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            watching.cancel()
        return conn.failure is None

    def request_ice_restart(self, new_network: bool = False, trigger: str = ASKED,
                            timeout: float = icerestart.RESTART_TIMEOUT_S) -> bool:
        """Restart ICE on the current connection, if it is connected and not restarting
        already (an ``ice_restart`` fault: the client process was sent SIGUSR1); False when
        there is nothing to restart. ``new_network``: the host moved to another access
        network (SIGUSR2, a ``handover``): the connections to the front are gone with the
        old one (a keep-alive connection would now reach another front, which never heard
        of it), so signaling opens new ones from here on, as a browser does on a network
        change. ``trigger`` is recorded with it (``ASKED``, ``NETWORK``, ``SILENCE``);
        ``timeout`` bounds it, the PATCH and the checks together."""
        conn = self._conn
        if (conn is None or conn.pc is None or conn.closing or conn.location is None
                or conn.pc.connectionState != "connected" or self._http_in_use is None
                or (self._restarting is not None and not self._restarting.done())):
            return False
        if new_network:
            self._http_in_use = aiohttp.ClientSession()
            self._http_opened.append(self._http_in_use)
        self._restarting = asyncio.create_task(self._restart_ice(conn, trigger, timeout),
                                               name=f"client-{self.index}-ice-restart")
        return True

    async def _restart_ice(self, conn: _Connection, trigger: str, timeout: float) -> None:
        """One ICE restart through the call's resource; recorded in ``ice_restarts``."""
        sent = time.time()
        got = await restart_ice(conn.pc, self._http_in_use, conn.location, timeout,
                                headers=self.config.headers)
        self.result.ice_restarts.append([round(sent, 6), got.ok, got.patch_ms, got.ms,
                                         got.reason, trigger])
        log.debug("session %d: ICE restart %s", self.index, got)

    async def _failed_or_talked(self, conn: _Connection) -> None:
        """Until ``conn`` fails or the conversation (if any) is over."""
        if self._talking is None:
            await conn.failed.wait()
            return
        failed = asyncio.ensure_future(conn.failed.wait())
        try:
            await asyncio.wait([failed, self._talking], return_when=asyncio.FIRST_COMPLETED)
        finally:
            failed.cancel()

    async def _reconnect(self, http: aiohttp.ClientSession, reason: str, end: float) -> None:
        """Call again until an attempt connects; SessionError when the attempts run out, or
        the call's end comes first."""
        cfg, r = self.config, self.result
        while r.reconnections < cfg.reconnect_attempts:
            wait = cfg.backoff_s(r.reconnections)
            if time.monotonic() + wait >= end:
                break
            await asyncio.sleep(wait)
            r.reconnections += 1
            conn = self._new_connection(reason)
            try:
                async with asyncio.timeout(cfg.setup_timeout_s):
                    await self._connect(conn, http)
                return
            except TimeoutError:
                reason = "setup timeout"
            except (SessionError, SignalingError) as exc:
                reason = str(exc)
            conn.record["error"] = reason
            log.debug("session %d: attempt %d: %s", self.index, conn.number, reason)
            self._retire(conn, http)
        raise SessionError(f"lost after {r.reconnections} reconnection attempts: {reason}")

    def _retire(self, conn: _Connection, http: aiohttp.ClientSession) -> None:
        """Stop counting a failed attempt's media now; DELETE and close it in the background
        (awaited in ``_teardown``), so that the next attempt does not wait for it."""
        conn.closing = True
        conn.rtp.detach()
        if conn.number == 0:
            self._record_ice(conn)  # before its STUN probe is detached
        if self._conn is conn:
            self._conn = None
        task = asyncio.create_task(
            self._close(conn, http, min(RETIRED_DELETE_TIMEOUT_S, self.config.teardown_timeout_s)),
            name=f"client-{self.index}-{conn.number}-retire")
        self._retiring.add(task)

    async def _sample_loop(self) -> None:
        interval = self.config.sample_interval_s
        due = time.monotonic()
        while True:
            due += interval
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            jitter_ms = rtt_ms = None
            conn = self._conn
            if conn is not None and conn.connected_at is not None:
                try:
                    jitter_ms, rtt_ms = await self._media_stats(conn)
                except Exception:  # a connection failing under the sampler
                    log.debug("session %d: getStats failed", self.index, exc_info=True)
            received, lost = self._packets()
            self.result.samples.append(MediaSample(
                session=self.index, t_ms=self._ms(), packets_received=received,
                packets_lost=lost, jitter_ms=jitter_ms, rtt_ms=rtt_ms))

    def _packets(self) -> tuple[int, int]:
        """Packets received and lost so far, over every attempt."""
        return (sum(c.rtp.seq.received for c in self._conns),
                sum(c.rtp.seq.lost for c in self._conns))

    async def _media_stats(self, conn: _Connection) -> tuple[float | None, float | None]:
        """(jitter of received audio, RTT of our sending stream) in ms, from getStats() (or
        the native pump's RTCP, which takes aiortc's place)."""
        if conn.pump_channel is not None:
            return self._pump.media_stats(conn.pump_channel)
        jitter_ms = rtt_ms = None
        for stats in (await conn.pc.getStats()).values():
            if stats.type == "inbound-rtp" and stats.kind == "audio" and stats.jitter is not None:
                jitter_ms = round(stats.jitter / RTP_UNITS_PER_MS, 3)
            elif (stats.type == "remote-inbound-rtp" and stats.kind == "audio"
                  and stats.roundTripTime is not None):
                rtt_ms = round(stats.roundTripTime * 1000.0, 3)
        return jitter_ms, rtt_ms

    # -- teardown ------------------------------------------------------------------------------

    async def _teardown(self, http: aiohttp.ClientSession) -> None:
        cfg, r = self.config, self.result
        for task in (self._sampler, self._talking, self._renominating, self._restarting):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        conn, self._conn = self._conn, None
        ended_ms = self._ms()
        if conn is not None:
            conn.closing = True
            conn.rtp.detach()  # media counters cover the session up to the end of the call
            if conn.number == 0:
                self._record_ice(conn)
            await self._close(conn, http, cfg.teardown_timeout_s)
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
            self._retiring.clear()
        if self._conns:  # the last attempt's DELETE and close, in the foreground or not
            last = self._conns[-1]
            r.delete_status, r.teardown_error = last.delete_status, last.teardown_error
        stats = [c.stats for c in self._conns if c.stats is not None]
        if stats:
            r.jitter_ms, r.rtt_ms = stats[-1]
        if r.setup_ms is not None:
            r.call_ms = round(ended_ms - r.setup_ms, 3)
            received, lost = self._packets()
            r.samples.append(MediaSample(  # the end of the call, off the 1 s grid
                session=self.index, t_ms=ended_ms, packets_received=received,
                packets_lost=lost, jitter_ms=r.jitter_ms, rtt_ms=r.rtt_ms))
        self._record_media()

    async def _close(self, conn: _Connection, http: aiohttp.ClientSession,
                     delete_timeout_s: float) -> None:
        """The end of one attempt: its final getStats (if it connected), DELETE of its session,
        its peer connection closed, its consumer and probes gone. Outcomes go on ``conn``."""
        cfg = self.config
        if conn.connected_at is not None:
            try:
                conn.stats = await asyncio.wait_for(self._media_stats(conn), 1.0)
            except Exception:  # stats are best effort on a dying connection
                log.debug("session %d: final getStats failed", self.index, exc_info=True)
        if conn.pump_channel is not None:  # its last arrivals counted, its socket aioice's
            self._pump.detach(conn.pump_channel)
            conn.pump_channel = None
        if conn.location is not None:
            try:
                conn.delete_status = await delete_session(http, conn.location, delete_timeout_s,
                                                          cfg.headers)
                if conn.delete_status not in (200, 204):
                    conn.teardown_error = f"DELETE returned HTTP {conn.delete_status}"
            except SignalingError as exc:
                conn.teardown_error = str(exc)
        elif conn.http_status is not None:
            conn.teardown_error = "the answer had no Location header: session not deleted"

        if conn.pc is not None:
            try:
                await asyncio.wait_for(conn.pc.close(), cfg.teardown_timeout_s)
            except TimeoutError:
                conn.teardown_error = conn.teardown_error or "peer connection close timed out"
            except Exception as exc:
                log.debug("session %d: close failed", self.index, exc_info=True)
                conn.teardown_error = (conn.teardown_error
                                       or f"close failed: {type(exc).__name__}: {exc}")
        if conn.consumer is not None:
            # A receiver that never started (setup failed) never ends its track: do not wait.
            conn.consumer.cancel()
            await asyncio.gather(conn.consumer, return_exceptions=True)
        conn.stun.detach()

    def _record_ice(self, conn: _Connection) -> None:
        r = self.result
        pair = conn.stun.selected_pair()
        if pair is None:
            return
        r.ice_pair = f"{_hostport(*pair.local_addr)} -> {_hostport(*pair.remote_addr)}"
        rtt = conn.stun.first_rtt_ms(pair)
        r.first_ice_rtt_ms = None if rtt is None else round(rtt, 3)
        if conn.ice_connected_at is not None:
            rtt = conn.stun.last_rtt_ms(pair, sent_after=conn.ice_connected_at)
            r.consent_rtt_ms = None if rtt is None else round(rtt, 3)

    def _record_media(self) -> None:
        r, gaps = self.result, self._gaps
        if self._conns and self._conns[0].rtp.first_packet_at is not None:
            r.first_audio_ms = self._ms(self._conns[0].rtp.first_packet_at)
        # Each attempt's connection has its own SSRC and sequence numbers: loss per attempt.
        for loss in (c.rtp.seq.stats() for c in self._conns):
            r.packets_expected += loss.expected
            r.packets_lost += loss.lost
            r.loss_bursts.extend(loss.bursts)
        r.packets_received = self._packets()[0]
        r.loss_pct = round(100.0 * r.packets_lost / r.packets_expected, 3) \
            if r.packets_expected else None
        r.rx_gaps, r.rx_gaps_unlisted = gaps.listed(), gaps.dropped
        r.first_rx_unix, r.last_rx_unix = gaps.unix(gaps.first), gaps.unix(gaps.last)
        voiced_pct = self._voiced.voiced_pct
        r.echo_voiced_pct = None if voiced_pct is None else round(voiced_pct, 1)
        if self.kind == LIGHT:
            r.echo_verified = (voiced_pct is not None
                               and voiced_pct >= self.config.echo_min_voiced_pct)
        elif self._audio_n:
            r.echo_rms = round(float(np.sqrt(self._audio_sumsq / self._audio_n)), 5)
            r.echo_verified = r.echo_rms >= self.config.echo_min_rms
        if self._talk is not None:  # the audio check of a conversation: a reply was heard
            audio_dir = Path(self.config.audio_dir) if self.config.audio_dir else None
            r.turns = self._talk.turns(audio_dir, f"s{self.index}-")
            r.echo_verified = any(t["reply_heard_unix"] is not None for t in r.turns)
        verifies = self.config.verifies
        r.datachannel_verified = datachannel_counts(verifies, r.datachannel_echo)
        r.verified = verified(verifies, r.echo_verified, r.datachannel_echo)


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def run_session(config: ClientConfig, index: int = 0,
                      http: aiohttp.ClientSession | None = None, kind: str = FULL
                      ) -> SessionResult:
    """Run one session to the end; a failed session is ``SessionResult.error``, not an exception."""
    return await CallSession(config, index, http, kind).run()


def _first_after(gaps: ArrivalGaps, before: float | None) -> float:
    """The wall-clock arrival of the first packet after the silence that began at ``before``
    (the gap it ended), not the latest: the check's answer may come after the media did (a
    retransmission), and the media's return is what a renomination is timed by."""
    if before is not None:
        start = before + gaps.unix_offset
        for gap_start, seconds, _ in reversed(gaps.gaps):
            if gap_start == start:
                return gap_start + seconds
    return gaps.last + gaps.unix_offset
