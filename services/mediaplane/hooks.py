"""What the native media plane needs of an aiortc session, and what aiortc needs back.

aiortc keeps ICE, DTLS, SDP and RTCP. For the plane to carry a connected session's RTP it is
given the SRTP keys (the DTLS-SRTP exporter, RFC 5764 4.2, read from aiortc's DTLS connection
the way aiortc's own ``_setup_srtp`` reads it) and the negotiated RTP parameters; aiortc's
sender is kept from sending RTP (``IdleSender``). What aiortc's RTCP still needs of the media
it no longer sees, ``sync_rtcp`` writes from the plane's statistics: the receive statistics
its receiver reports carry (one ``StreamStatistics`` per remote SSRC, set from the plane's,
which follow RFC 3550 A.3/A.8 as aiortc's do) and the sender report's last NTP/RTP timestamp
pair and counts. Called every ``SYNC_S``, an SR may describe the stream as it was up to that
long before; the pair itself is always one packet's.

Hooks into aiortc 1.16 internals (pinned): ``RTCDtlsTransport._ssl``, ``_role``,
``_srtp_profiles``; ``RTCRtpTransceiver._codecs``, ``_headerExtensions``;
``RTCRtpSender._run_rtp``, ``_ssrc`` and its private ``__rtp_started``, ``__rtp_exited``,
``__ntp_timestamp``, ``__rtp_timestamp``, ``__packet_count``, ``__octet_count``;
``RTCRtpReceiver.__remote_streams``.
"""
from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from aiortc.rtcrtpreceiver import StreamStatistics

SYNC_S = 0.25
_SENDER = "_RTCRtpSender__"
_RECEIVER = "_RTCRtpReceiver__"
_MID_URI = "urn:ietf:params:rtp-hdrext:sdes:mid"
_ABS_SEND_TIME_URI = "http://www.webrtc.org/experiments/rtp-hdrext/abs-send-time"


@dataclass(frozen=True)
class SrtpKeys:
    profile: int   # libsrtp's srtp_profile_t
    rx: bytes      # key and salt, the peer's direction
    tx: bytes


def srtp_keys(dtls) -> SrtpKeys:
    """The SRTP keys of a connected aiortc DTLS transport."""
    ssl = dtls._ssl
    name = ssl.get_selected_srtp_profile()
    profile = next(p for p in dtls._srtp_profiles if p.openssl_profile == name)
    material = ssl.export_keying_material(b"EXTRACTOR-dtls_srtp",
                                          2 * (profile.key_length + profile.salt_length))
    ours, theirs = (1, 0) if dtls._role == "server" else (0, 1)
    return SrtpKeys(profile.libsrtp_profile, profile.get_key_and_salt(material, theirs),
                    profile.get_key_and_salt(material, ours))


class IdleSender:
    """Stands in for ``RTCRtpSender._run_rtp`` (set before negotiation): aiortc sends no RTP
    (the plane does); it keeps the negotiated payload type and lets aiortc's RTCP run.
    ``release()`` hands the sending back to aiortc's own loop (a session the plane cannot
    carry)."""

    def __init__(self, sender) -> None:
        self.sender = sender
        self.payload_type: int | None = None
        self._original = sender._run_rtp
        self._released = False
        self._wake: asyncio.Future | None = None
        sender._run_rtp = self.run

    def release(self) -> None:
        self._released = True
        self.sender._run_rtp = self._original
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def run(self, codec) -> None:
        self.payload_type = codec.payloadType
        if self._released:
            return await self._original(codec)
        getattr(self.sender, _SENDER + "rtp_started").set()
        self._wake = asyncio.get_running_loop().create_future()
        try:
            await self._wake  # until aiortc cancels it, or release()
        except asyncio.CancelledError:
            getattr(self.sender, _SENDER + "rtp_exited").set()
            return
        await self._original(codec)


@dataclass(frozen=True)
class RtpParameters:
    """The plane's ``add`` arguments after the keys: what the session sends with."""
    ssrc: int
    seq: int
    timestamp: int
    payload_type: int
    mid: bytes
    mid_id: int
    abs_send_time_id: int


def rtp_parameters(transceiver, idle: IdleSender) -> RtpParameters:
    """The negotiated parameters (aiortc may call ``sender.send`` only after "connected"),
    with a random first sequence number and timestamp (RFC 3550 5.1)."""
    ids = {ext.uri: ext.id for ext in transceiver._headerExtensions}
    payload_type = (idle.payload_type if idle.payload_type is not None
                    else transceiver._codecs[0].payloadType)
    return RtpParameters(transceiver.sender._ssrc, random.randint(0, 0xFFFF),
                         random.randint(0, 0xFFFFFFFF), payload_type,
                         (transceiver.mid or "").encode(), ids.get(_MID_URI, 0),
                         ids.get(_ABS_SEND_TIME_URI, 0))


def sync_rtcp(receiver, sender, stats: dict) -> None:
    """aiortc's RTCP state from the plane's ``stats(channel)``."""
    if stats["packets_sent"]:
        setattr(sender, _SENDER + "ntp_timestamp", stats["last_ntp"])
        setattr(sender, _SENDER + "rtp_timestamp", stats["last_rtp_timestamp"])
        setattr(sender, _SENDER + "packet_count", stats["packets_sent"])
        setattr(sender, _SENDER + "octet_count", stats["octets_sent"])
    if not stats["have_ssrc"]:
        return
    streams = getattr(receiver, _RECEIVER + "remote_streams")
    stream = streams.get(stats["rx_ssrc"])
    if stream is None:
        streams.clear()  # a new remote SSRC: the old stream's report ends with it
        stream = streams[stats["rx_ssrc"]] = StreamStatistics(48000)
    stream.base_seq = stats["base_seq"]
    stream.max_seq = stats["max_seq"]
    stream.cycles = stats["cycles"]
    stream.packets_received = stats["packets_received"]
    stream._jitter_q4 = stats["jitter_q4"]
    # where the jitter estimate left off (RTP timestamp; arrival in clock-rate units of the
    # wall clock, as aiortc counts it): a packet that aiortc itself receives later (after
    # the plane let the session go) continues the same statistics
    stream._last_timestamp = stats["last_timestamp"]
    stream._last_arrival = stats["last_arrival"]
