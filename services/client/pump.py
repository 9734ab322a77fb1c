"""The light clients' native pump (``--light-path native``): one media plane for every light
session of a client process (services/mediaplane/).

A light session sets up as ever in aiortc (ICE, DTLS, the data channel); once connected, on a
host candidate pair, ``LightPump.attach`` moves its RTP to the plane: the plane reads the
session's own socket (its readiness callback is the plane's ``read_session``; STUN, DTLS and
RTCP go back to aioice as before), sends the pre-encoded tone on the process's one 20 ms
clock, and logs every arrival, which ``DRAIN_S`` later feeds the session's ``RtpProbe``
exactly as aiortc's receive path would have (sequence numbers, voiced payloads, arrival gaps,
the arrival log). The plane keeps the session's RTCP too (reports sent and read in C), so
``media_stats`` gives the jitter and RTT the client would have read from aiortc's getStats.
A conversation's caller (``attach(..., talk=)``, pumpedtalk.py) sends its lines instead of the
tone and hears what arrives, each tick of its send phase. A pair through a TURN server over UDP
goes through the plane too, as ChannelData on the allocation's socket (TURN over TCP stays on
the Python path). The socket is read through the plane by hooks.py's ``SessionSocket``.
"""
from __future__ import annotations

import asyncio
import logging
import struct
from dataclasses import dataclass

from services.client.conversation import Conversation
from services.client.pumpedtalk import PumpedTalk
from services.mediaplane._mediaplane import Plane
from services.mediaplane.hooks import (IdleSender, SessionSocket, cname, media_stats,
                                      rtp_parameters, srtp_keys)
from services.transceiver.pacing import FrameClock

log = logging.getLogger("voiceedge.client")
DRAIN_S = 0.1
_ARRIVAL = struct.Struct("=dIHH")
_MAX_CATCH_UP = 5
# A conversation caller's send phase: one of PHASES in the 20 ms frame, by session. A real
# caller's frames reach the transceiver's 20 ms tick at a phase of their own; one tick for
# every session of a process would give all of a region's calls one wait for that tick
# (0-20 ms, fixed for the run) and move its uplink share by it.
PHASES = 4
_SILENCE = b"\xf8\xff\xfe"   # a 20 ms silent Opus frame: sent only if the script were empty


@dataclass
class _Pumped:
    channel: int
    probe: object          # services.client.probes.RtpProbe
    socket: SessionSocket


class LightPump:
    """``await start()``; per session ``prepare(sender)`` before negotiation, ``attach`` once
    connected (None: it stays on the Python path), ``detach`` before closing; ``await
    stop()``."""

    def __init__(self, script: tuple[bytes, ...], capacity: int = 1024,
                 phases: int = 1) -> None:
        self.plane = Plane(-1, capacity)
        self._script = _records(script)
        self._phases = phases   # PHASES for a process of conversations: ticks every 20/phases ms
        self._clock = FrameClock(0.02 / phases)
        self._tick: int | None = None
        self._sessions: dict[int, _Pumped] = {}
        self._talkers: dict[int, PumpedTalk] = {}
        self._drainer: asyncio.Task | None = None
        self.attached_total = 0

    async def start(self) -> None:
        self._clock.subscribe(self, self._on_tick)
        self._drainer = asyncio.create_task(self._drain_forever())

    async def stop(self) -> None:
        for channel in list(self._sessions):
            self.detach(channel)
        self._clock.close()
        if self._drainer is not None:
            self._drainer.cancel()
            await asyncio.gather(self._drainer, return_exceptions=True)

    @staticmethod
    def prepare(transceiver) -> IdleSender:
        """Keep aiortc from sending RTP and RTCP (call before negotiation)."""
        return IdleSender(transceiver.sender, transceiver.receiver)

    def attach(self, pc, idle: IdleSender, pair, probe,
               talk: Conversation | None = None) -> int | None:
        """Move a connected session's RTP to the plane, if its pair is direct or through TURN
        over UDP (hooks.SessionSocket); returns its channel, or None (it stays on aiortc). A
        conversation's session (``talk``) sends its lines and silence, and hears."""
        socket = SessionSocket.of(pair)
        if socket is None:
            return None
        transceiver = pc.getTransceivers()[0]
        keys, rtp = srtp_keys(transceiver.sender.transport), rtp_parameters(transceiver, idle)
        group = talk.session % self._phases if talk is not None else 0
        try:
            channel = self.plane.add(
                socket.peer, None, keys.profile, keys.rx, keys.tx, rtp.ssrc, rtp.seq,
                rtp.timestamp, rtp.payload_type, rtp.mid, rtp.mid_id, rtp.abs_send_time_id,
                _SILENCE, False, socket.fd,
                self._script if talk is None else _records((talk.track.silence,)),
                rtcp=True, cname=cname(pc), turn_channel=socket.turn_channel,
                keep=talk is not None, group=group)
        except BaseException:
            socket.discard()
            raise
        socket.read_through(self.plane, channel)
        self._sessions[channel] = _Pumped(channel, probe, socket)
        if talk is not None:
            self._talkers[channel] = PumpedTalk(talk, self.plane, channel, group)
        self.attached_total += 1
        return channel

    def media_stats(self, channel: int) -> tuple[float | None, float | None]:
        """(jitter of what the session hears, RTT of what it sends) in ms, as getStats'."""
        return media_stats(self.plane.stats(channel))

    def detach(self, channel: int) -> None:
        """Give the session's socket back to aioice, after its last arrivals are counted and
        its last report and BYE are sent."""
        pumped = self._sessions.pop(channel, None)
        if pumped is None:
            return
        self._drain(pumped)
        talker = self._talkers.pop(channel, None)
        if talker is not None:
            talker.hear()
        self.plane.remove(channel, True)
        pumped.socket.give_back()

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    def counters(self) -> dict[str, int]:
        return self.plane.counters()

    def _on_tick(self, tick: int) -> None:
        if self._phases == 1:
            frames = 1 if self._tick is None else min(max(tick - self._tick, 1), _MAX_CATCH_UP)
            self._tick = tick
            if self._sessions:
                self._send(frames, -1)
            return
        last, self._tick = tick - 1 if self._tick is None else self._tick, tick
        if not self._sessions:
            return
        for group in range(self._phases):   # each group whose beat (group mod phases) passed
            frames = (tick - group) // self._phases - (last - group) // self._phases
            if frames > 0:
                self._send(min(frames, _MAX_CATCH_UP), group)

    def _send(self, frames: int, group: int) -> None:
        """``frames`` frames of every session of ``group`` (all: -1): a conversation's line
        queued first; then what its callers heard, into their ears."""
        talkers = [t for t in self._talkers.values() if group < 0 or t.group == group]
        lines = b"".join(t.outgoing(frames) for t in talkers)
        if lines:
            self.plane.put_batch(lines)
        self.plane.tick(frames, group)
        for talker in talkers:
            talker.hear()

    def _drain(self, pumped: _Pumped) -> None:
        """The logged arrivals into the session's probe."""
        blob = self.plane.take_arrivals(pumped.channel)
        if blob:
            arrived = pumped.probe.arrived
            for at, ssrc, seq, size in _ARRIVAL.iter_unpack(blob):
                arrived(ssrc, seq, size, at)

    async def _drain_forever(self) -> None:
        while True:
            await asyncio.sleep(DRAIN_S)
            for pumped in list(self._sessions.values()):
                self._drain(pumped)


def _records(payloads) -> bytes:
    """A plane script: records [u32 ignored][u16 length][payload]."""
    return b"".join(struct.pack("!IH", 0, len(p)) + p for p in payloads)
