"""The transceiver on the native media path (``--media-path native``; services/mediaplane/).

aiortc and aioice keep ICE, DTLS, SDP and the session's lifecycle. When a session's DTLS is
up, ``NativeMedia.attach`` gives the plane its SRTP keys, RTP parameters and CNAME
(services/mediaplane/hooks.py); from then on its RTP and RTCP are the plane's: read,
unprotected, queued for the agent, sent back protected, in batches. The shared socket's reads
go through the plane (``SharedSocket.read_through``); in port-per-session mode (no shared
socket) each session's own socket is read through it once attached (hooks.py's
``SessionSocket``). One ``tick`` per 20 ms of the
transceiver's ``FrameClock`` sends every session's frame (and the reports that are due), and
the frames to and from the agent travel as one batch per tick over the agent frames link
(agentframes.py). Once a second the sessions' arrival gaps are read off the plane.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from services import libopus
from services.gaps import ArrivalGaps
from services.mediapaths import OPENSSL
from services.mediaplane._mediaplane import Plane
from services.mediaplane.hooks import (IdleSender, SessionSocket, cname, rtp_parameters,
                                      srtp_keys)
from services.transceiver.media import silence_packet
from services.transceiver.opus import OpusSettings
from services.transceiver.pacing import FrameClock

log = logging.getLogger("voiceedge.transceiver")

OPUS, PCM16 = "opus", "pcm16"
AGENT_CODECS = (OPUS, PCM16)
_MAX_CATCH_UP = 5            # frames sent back to back after a stall (outbound.py's rule)
GAPS_S = 1.0                 # the plane keeps 16 gaps a session between reads


@dataclass
class Attached:
    """One session on the plane."""
    channel: int
    gaps: ArrivalGaps
    socket: SessionSocket | None = None   # its own socket (port-per-session mode)


class NativeMedia:
    """The plane of one shared socket (``mux``), or of every session's own socket (``mux``
    None: port-per-session). ``await start()``, ``attach``/``detach`` per session, ``await
    stop()``."""

    def __init__(self, mux, clock: FrameClock, capacity: int = 4096,
                 opus: OpusSettings = OpusSettings(), srtp: str = OPENSSL) -> None:
        self._mux = mux
        self._srtp = srtp
        self._clock = clock
        self._capacity = capacity
        self._silence = silence_packet(opus)
        self._opus = opus
        self.plane: Plane | None = None
        self.frames = None               # agentframes.AgentFrames, when an agent is set
        self._attached: dict[int, Attached] = {}
        self._tick: int | None = None
        self._gaps_task: asyncio.Task | None = None

    async def start(self, frames=None) -> None:
        # pcm16 sessions' encoders as the Python path's (media.py): the same OpusSettings
        encoder = dict(opus_application=libopus.APPLICATION[self._opus.application],
                       opus_bitrate=self._opus.bitrate, opus_complexity=self._opus.complexity)
        if self._mux is not None:
            self.plane = Plane(self._mux.fileno(), self._capacity, self._srtp, **encoder)
            self._mux.read_through(self.plane)
        else:
            self.plane = Plane(-1, self._capacity, self._srtp, **encoder)
        self.frames = frames
        if frames is not None:
            await frames.start(self.plane)
        self._clock.subscribe(self, self._on_tick)
        self._gaps_task = asyncio.create_task(self._gaps_forever())

    async def stop(self) -> None:
        self._clock.unsubscribe(self)
        if self._gaps_task is not None:
            self._gaps_task.cancel()
            await asyncio.gather(self._gaps_task, return_exceptions=True)
        if self.frames is not None:
            await self.frames.stop()

    # ------------------------------------------------------------ sessions

    def attach(self, pc, idle: IdleSender, pair, gaps: ArrivalGaps) -> int:
        """Move a connected session's RTP to the plane; returns its channel. ``pair``: its
        selected candidate pair (aioice's); in port-per-session mode its socket is the
        session's own (the transceiver gathers host candidates only)."""
        socket = None
        if self._mux is None:
            socket = SessionSocket.of(pair)
            if socket is None:
                raise ValueError("a port-per-session pair without a socket of its own")
        transceiver = pc.getTransceivers()[0]
        keys, rtp = srtp_keys(transceiver.sender.transport), rtp_parameters(transceiver, idle)
        client = tuple(pair.remote_addr) if socket is None else socket.peer
        try:
            channel = self.plane.add(
                client, self._mux.relay_of(client) if self._mux is not None else None,
                keys.profile, keys.rx, keys.tx, rtp.ssrc, rtp.seq, rtp.timestamp,
                rtp.payload_type, rtp.mid, rtp.mid_id, rtp.abs_send_time_id, self._silence,
                False, socket.fd if socket is not None else -1, rtcp=True, cname=cname(pc),
                turn_channel=socket.turn_channel if socket is not None else 0)
        except BaseException:
            if socket is not None:
                socket.discard()
            raise
        if socket is not None:
            socket.read_through(self.plane, channel)
        self._attached[channel] = Attached(channel, gaps, socket)
        return channel

    def move(self, channel: int, pair) -> bool:
        """The session's client moved to ``pair``'s address (a pair it nominated after the
        first): the plane sends there and takes its datagrams from there. A session through a
        TURN channel stays (its server's address did not change); False then."""
        attached = self._attached.get(channel)
        if attached is None:
            return False
        socket = attached.socket
        if socket is not None and socket.turn_channel:
            return False
        client = tuple(pair.remote_addr)
        relay = self._mux.relay_of(client) if self._mux is not None else None
        return self.plane.move(channel, client, relay)

    def clear(self, channel: int) -> int:
        """Drop the session's agent frames not yet sent (a barge-in); how many."""
        return self.plane.clear(channel) if channel in self._attached else 0

    def set_pcm(self, channel: int, pcm: bool) -> None:
        self.plane.set_pcm(channel, pcm)

    def detach(self, channel: int) -> dict | None:
        """Take the session off the plane, with a last report and BYE (as aiortc ends its
        RTCP); its last statistics (None if it was not on)."""
        attached = self._attached.pop(channel, None)
        if attached is None:
            return None
        stats = self.plane.stats(channel)
        self._record_gaps(attached, stats)
        self.plane.remove(channel, True)
        if attached.socket is not None:
            attached.socket.give_back()
        return stats

    @property
    def sessions(self) -> int:
        return len(self._attached)

    def counters(self) -> dict[str, int]:
        return self.plane.counters() if self.plane is not None else {}

    # ------------------------------------------------------------ per tick

    def _on_tick(self, tick: int) -> None:
        frames = 1 if self._tick is None else min(max(tick - self._tick, 1), _MAX_CATCH_UP)
        self._tick = tick
        if self.frames is not None:
            batch = self.plane.take_batch()
            if batch is not None:
                self.frames.send(batch)
        if self._attached:
            self.plane.tick(frames)

    # ------------------------------------------------------------ arrival gaps

    async def _gaps_forever(self) -> None:
        while True:
            await asyncio.sleep(GAPS_S)
            for attached in list(self._attached.values()):
                self._record_gaps(attached, self.plane.stats(attached.channel))

    @staticmethod
    def _record_gaps(attached: Attached, stats: dict | None) -> None:
        if stats is None:
            return
        first, last = stats["first_rx_unix"], stats["last_rx_unix"]
        attached.gaps.record(0.0, 0.0, first, last)
        for start, seconds in stats["gaps"]:
            attached.gaps.record(start, seconds, first, last)
