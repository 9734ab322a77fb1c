"""The session's outgoing audio, sent from the shared frame clock instead of a task each.

aiortc's ``RTCRtpSender._run_rtp`` is a task per session that wakes every 20 ms, awaits the
track, builds and serializes the RTP packet and awaits the SRTP/ICE send (none of which ever
waits here). ``TickSender`` does the same on the transceiver's ``FrameClock`` tick for every
session in one pass: no task wake-up, timer or coroutine chain per packet, one clock reading
per packet instead of two.

It stands in for one sender's ``_run_rtp`` (an instance attribute, set before aiortc calls
``send``), and keeps what aiortc's RTCP sender reports read: hooks into aiortc 1.16 internals
(pinned), per instance: ``RTCRtpSender._run_rtp``, its private ``__rtp_started``,
``__rtp_exited``, ``__mid``, ``__rtp_header_extensions_map``, ``__ntp_timestamp``,
``__rtp_timestamp``, ``__octet_count``, ``__packet_count``, and
``RTCDtlsTransport._send_rtp``. Not kept: the RTP history for retransmissions (aiortc
answers NACKs only for video).
"""
from __future__ import annotations

import asyncio

from aiortc import clock
from aiortc.rtp import RtpPacket
from aiortc.rtcrtpsender import random_sequence_number
from aiortc.utils import random32, uint16_add, uint32_add

from services.transceiver.eager import run_now
from services.transceiver.media import AgentAudioTrack
from services.transceiver.pacing import FrameClock

_MAX_CATCH_UP = 5  # frames sent back to back after a stall; beyond that time is skipped
_P = "_RTCRtpSender__"  # aiortc's name-mangled private attributes


class TickSender:
    """Plays ``track`` through ``sender`` on ``frame_clock``: install with ``play_on_tick``."""

    def __init__(self, sender, track: AgentAudioTrack, frame_clock: FrameClock) -> None:
        self._sender = sender
        self._track = track
        self._clock = frame_clock
        self._tick: int | None = None
        self._done: asyncio.Future | None = None
        self._payload_type = 0
        self._sequence = random_sequence_number()
        self._timestamp_origin = random32()
        self.packets = 0

    async def run(self, codec) -> None:
        """Replaces ``sender._run_rtp(codec)``: lives until aiortc cancels it (sender.stop),
        the track ends, or the transport refuses to send."""
        sender = self._sender
        self._payload_type = codec.payloadType
        self._done = asyncio.get_running_loop().create_future()
        getattr(sender, _P + "rtp_started").set()
        self._clock.subscribe(self, self._on_tick)
        self._on_tick(self._clock.current())  # the first packet now, as aiortc's loop would
        try:
            await self._done
        except asyncio.CancelledError:
            pass
        finally:
            self._clock.unsubscribe(self)
            self._track.stop()
            getattr(sender, _P + "rtp_exited").set()

    def _finish(self) -> None:
        self._clock.unsubscribe(self)
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def _on_tick(self, tick: int) -> None:
        if self._track.readyState != "live":
            self._finish()
            return
        if self._tick is None:
            self._tick = tick - 1
        behind = tick - self._tick
        if behind > _MAX_CATCH_UP:
            self._track.skip(behind - _MAX_CATCH_UP)
            self._tick = tick - _MAX_CATCH_UP
        while self._tick < tick:
            self._tick += 1
            try:
                self._send(self._track.next_packet())
            except ConnectionError:  # DTLS is gone: aiortc's loop ends here too
                self._finish()
                return

    def _send(self, frame) -> None:
        sender = self._sender
        if not sender._enabled:
            return
        ntp = clock.current_ntp_time()
        packet = RtpPacket(payload_type=self._payload_type, sequence_number=self._sequence,
                           timestamp=uint32_add(self._timestamp_origin, frame.pts))
        packet.ssrc = sender._ssrc
        packet.payload = frame.data
        packet.marker = 1  # as aiortc marks the last packet of every frame
        packet.extensions.abs_send_time = (ntp >> 14) & 0x00FFFFFF
        packet.extensions.mid = getattr(sender, _P + "mid")
        data = packet.serialize(getattr(sender, _P + "rtp_header_extensions_map"))
        run_now(sender.transport._send_rtp(data))
        setattr(sender, _P + "ntp_timestamp", ntp)
        setattr(sender, _P + "rtp_timestamp", packet.timestamp)
        setattr(sender, _P + "octet_count", getattr(sender, _P + "octet_count") + len(frame.data))
        setattr(sender, _P + "packet_count", getattr(sender, _P + "packet_count") + 1)
        self._sequence = uint16_add(self._sequence, 1)
        self.packets += 1


def play_on_tick(sender, track: AgentAudioTrack, frame_clock: FrameClock) -> TickSender:
    """Make ``sender`` (from ``pc.addTrack(track)``, before negotiation) send ``track`` from
    ``frame_clock``'s tick instead of its own task."""
    tick_sender = TickSender(sender, track, frame_clock)
    sender._run_rtp = tick_sender.run
    return tick_sender
