"""The native media plane's Python side (``--media-path native``; the C is _mediaplane.c).

aiortc and aioice keep ICE, DTLS, SDP, RTCP and the session's lifecycle. When a session's DTLS
is up, ``NativeMedia.attach`` gives the plane its SRTP keys (the DTLS-SRTP exporter, RFC 5764
4.2, read from aiortc's DTLS connection as aiortc reads it) and its RTP parameters; from then
on its RTP is read, unprotected, queued for the agent, and sent back protected by the plane,
in batches: the shared socket's reads go through the plane (``SharedSocket.read_through``),
one ``tick`` per 20 ms of the transceiver's ``FrameClock`` sends every session's frame, and
the frames to and from the agent travel as one batch per tick over the agent frames link
(agentframes.py).

What aiortc still needs of the media it no longer sees, it is given every ``SYNC_S``: the
receive statistics its RTCP receiver reports carry (one ``StreamStatistics`` per caller SSRC,
written from the plane's own, which follow RFC 3550 A.3/A.8 as aiortc's do) and the sender
report's last NTP/RTP timestamp pair and counts (so an SR may describe the stream as it was up
to ``SYNC_S`` before; the pair itself is always one packet's). Hooks into aiortc 1.16 internals
(pinned): ``RTCDtlsTransport._ssl``, ``_role``, ``_srtp_profiles``; ``RTCRtpSender._run_rtp``,
``_ssrc`` and its private ``__rtp_started``, ``__rtp_exited``, ``__mid``,
``__rtp_header_extensions_map``, ``__ntp_timestamp``, ``__rtp_timestamp``, ``__packet_count``,
``__octet_count``; ``RTCRtpReceiver.__remote_streams``.
"""
from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass

from aiortc.rtcrtpreceiver import StreamStatistics

from services.gaps import ArrivalGaps
from services.mediapaths import MEDIA_PATHS, NATIVE, PYTHON  # noqa: F401 (re-exported)
from services.transceiver._mediaplane import Plane
from services.transceiver.media import silence_packet
from services.transceiver.opus import OpusSettings
from services.transceiver.pacing import FrameClock

log = logging.getLogger("voiceedge.transceiver")

OPUS, PCM16 = "opus", "pcm16"
AGENT_CODECS = (OPUS, PCM16)
SYNC_S = 0.25
_MAX_CATCH_UP = 5            # frames sent back to back after a stall (outbound.py's rule)
_SENDER = "_RTCRtpSender__"
_RECEIVER = "_RTCRtpReceiver__"
_MID_URI = "urn:ietf:params:rtp-hdrext:sdes:mid"
_ABS_SEND_TIME_URI = "http://www.webrtc.org/experiments/rtp-hdrext/abs-send-time"


@dataclass(frozen=True)
class SrtpKeys:
    profile: int   # libsrtp's srtp_profile_t
    rx: bytes      # key and salt, the client's direction
    tx: bytes


def srtp_keys(dtls) -> SrtpKeys:
    """The SRTP keys of a connected aiortc DTLS transport, as its ``_setup_srtp`` derives them."""
    ssl = dtls._ssl
    name = ssl.get_selected_srtp_profile()
    profile = next(p for p in dtls._srtp_profiles if p.openssl_profile == name)
    material = ssl.export_keying_material(b"EXTRACTOR-dtls_srtp",
                                          2 * (profile.key_length + profile.salt_length))
    ours, theirs = (1, 0) if dtls._role == "server" else (0, 1)
    return SrtpKeys(profile.libsrtp_profile, profile.get_key_and_salt(material, theirs),
                    profile.get_key_and_salt(material, ours))


class IdleSender:
    """Stands in for ``RTCRtpSender._run_rtp`` on the native path: aiortc sends no RTP (the
    plane does); it keeps the negotiated payload type and lets aiortc's RTCP run."""

    def __init__(self, sender) -> None:
        self.sender = sender
        self.payload_type: int | None = None
        sender._run_rtp = self.run

    async def run(self, codec) -> None:
        self.payload_type = codec.payloadType
        getattr(self.sender, _SENDER + "rtp_started").set()
        try:
            await asyncio.get_running_loop().create_future()  # until aiortc cancels it
        except asyncio.CancelledError:
            pass
        finally:
            getattr(self.sender, _SENDER + "rtp_exited").set()


@dataclass
class Attached:
    """One session on the plane."""
    channel: int
    receiver: object
    sender: object
    gaps: ArrivalGaps


class NativeMedia:
    """The plane of one shared socket. ``await start()``, ``attach``/``detach`` per session,
    ``await stop()``."""

    def __init__(self, mux, clock: FrameClock, capacity: int = 4096,
                 opus: OpusSettings = OpusSettings()) -> None:
        self._mux = mux
        self._clock = clock
        self._capacity = capacity
        self._silence = silence_packet(opus)
        self.plane: Plane | None = None
        self.frames = None               # agentframes.AgentFrames, when an agent is set
        self._attached: dict[int, Attached] = {}
        self._tick: int | None = None
        self._sync_task: asyncio.Task | None = None

    async def start(self, frames=None) -> None:
        self.plane = Plane(self._mux.fileno(), self._capacity)
        self._mux.read_through(self.plane)
        self.frames = frames
        if frames is not None:
            await frames.start(self.plane)
        self._clock.subscribe(self, self._on_tick)
        self._sync_task = asyncio.create_task(self._sync_forever())

    async def stop(self) -> None:
        self._clock.unsubscribe(self)
        if self._sync_task is not None:
            self._sync_task.cancel()
            await asyncio.gather(self._sync_task, return_exceptions=True)
        if self.frames is not None:
            await self.frames.stop()

    # ------------------------------------------------------------ sessions

    def attach(self, pc, idle: IdleSender, client: tuple[str, int], gaps: ArrivalGaps) -> int:
        """Move a connected session's RTP to the plane; returns its channel."""
        transceiver = pc.getTransceivers()[0]
        sender, receiver = transceiver.sender, transceiver.receiver
        keys = srtp_keys(sender.transport)
        # the negotiated parameters (aiortc may call sender.send only after "connected")
        ids = {ext.uri: ext.id for ext in transceiver._headerExtensions}
        payload_type = (idle.payload_type if idle.payload_type is not None
                        else transceiver._codecs[0].payloadType)
        channel = self.plane.add(
            client, self._mux.relay_of(client), keys.profile, keys.rx, keys.tx,
            sender._ssrc, random.randint(0, 0xFFFF), random.randint(0, 0xFFFFFFFF),
            payload_type, (transceiver.mid or "").encode(), ids.get(_MID_URI, 0),
            ids.get(_ABS_SEND_TIME_URI, 0), self._silence, False)
        self._attached[channel] = Attached(channel, receiver, sender, gaps)
        return channel

    def set_pcm(self, channel: int, pcm: bool) -> None:
        self.plane.set_pcm(channel, pcm)

    def detach(self, channel: int) -> dict | None:
        """Take the session off the plane; its last statistics (None if it was not on)."""
        attached = self._attached.pop(channel, None)
        if attached is None:
            return None
        stats = self.plane.stats(channel)
        self._sync(attached, stats)
        self.plane.remove(channel)
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

    # ------------------------------------------------------------ what aiortc reports

    async def _sync_forever(self) -> None:
        while True:
            await asyncio.sleep(SYNC_S)
            for attached in list(self._attached.values()):
                self._sync(attached, self.plane.stats(attached.channel))

    @staticmethod
    def _sync(attached: Attached, stats: dict | None) -> None:
        if stats is None:
            return
        first, last = stats["first_rx_unix"], stats["last_rx_unix"]
        attached.gaps.record(0.0, 0.0, first, last)
        for start, seconds in stats["gaps"]:
            attached.gaps.record(start, seconds, first, last)
        sender = attached.sender
        if stats["packets_sent"]:
            setattr(sender, _SENDER + "ntp_timestamp", stats["last_ntp"])
            setattr(sender, _SENDER + "rtp_timestamp", stats["last_rtp_timestamp"])
            setattr(sender, _SENDER + "packet_count", stats["packets_sent"])
            setattr(sender, _SENDER + "octet_count", stats["octets_sent"])
        if not stats["have_ssrc"]:
            return
        streams = getattr(attached.receiver, _RECEIVER + "remote_streams")
        stream = streams.get(stats["rx_ssrc"])
        if stream is None:
            streams.clear()  # a new caller SSRC: the old stream's report ends with it
            stream = streams[stats["rx_ssrc"]] = StreamStatistics(48000)
        stream.base_seq = stats["base_seq"]
        stream.max_seq = stats["max_seq"]
        stream.cycles = stats["cycles"]
        stream.packets_received = stats["packets_received"]
        stream._jitter_q4 = stats["jitter_q4"]
