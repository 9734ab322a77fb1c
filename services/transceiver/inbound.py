"""Caller RTP from the ICE connection straight into the session's receiver.

aiortc's path for every incoming SRTP packet: aioice puts it on the connection's queue, the
DTLS transport's task wakes up to take it, unprotects it and awaits the receiver. For an
audio-only session none of those awaits ever suspends, so ``SrtpShortcut`` does the same work
in the call that delivered the datagram: one task wake-up and queue hand-off less per packet.
DTLS records and SRTCP still take aiortc's own path (the handshake and RTCP may need to wait).

Hooks into aiortc 1.16 internals (pinned), per instance: ``RTCDtlsTransport._rx_srtp`` and
``RTCDtlsTransport._handle_rtp_data``; the connection side is ``EdgeConnection.media_sink``
(ice.py). The DTLS transport's own receive counters do not see these packets.

The shortcut also records when each packet arrived (``ArrivalGaps``, services/gaps.py), from the same
clock read that gives aiortc the packet's arrival time.
"""
from __future__ import annotations

import logging
from time import time

import pylibsrtp

from services.transceiver.eager import run_now
from services.gaps import ArrivalGaps

log = logging.getLogger("voiceedge.transceiver")
# aiortc's clock.current_ms() (ms since the NTP epoch, through datetime) costs ~1.2 µs; this
# is the same value from time.time(), which the arrival record needs anyway.
_NTP_EPOCH_MS = 2_208_988_800_000


def is_srtp(data: bytes) -> bool:
    """RTP (RFC 7983: first byte 128-191), and not RTCP (packet type 192-223)."""
    return len(data) > 12 and 127 < data[0] < 192 and not 191 < data[1] < 224


class SrtpShortcut:
    """``__call__(data)`` handles one SRTP packet of ``dtls`` as its receive task would."""

    def __init__(self, dtls, gaps: ArrivalGaps | None = None) -> None:
        self._dtls = dtls
        self.gaps = ArrivalGaps() if gaps is None else gaps
        self.packets = 0
        self.suspended = 0  # handlers that wanted to wait: never for audio (see module doc)

    def __call__(self, data: bytes) -> None:
        dtls = self._dtls
        srtp = dtls._rx_srtp
        if srtp is None or dtls.state != "connected":
            return
        now = time()
        try:
            data = srtp.unprotect(data)
        except pylibsrtp.Error:
            return
        self.packets += 1
        self.gaps.arrived(now)
        arrival_ms = int(now * 1000.0) + _NTP_EPOCH_MS
        if not run_now(dtls._handle_rtp_data(data, arrival_time_ms=arrival_ms)):
            # It awaited something (a video receiver's NACK or REMB) and was dropped with
            # its packet: that is why the shortcut is for audio-only sessions.
            self.suspended += 1


def shortcut_srtp(pc, gaps: ArrivalGaps | None = None) -> SrtpShortcut | None:
    """Install the shortcut on ``pc``'s (bundled) connection once DTLS is up, if every
    transceiver is audio, recording arrivals in ``gaps``; returns it, or None when it does
    not apply."""
    transceivers = pc.getTransceivers()
    if not transceivers or any(t.kind != "audio" for t in transceivers):
        return None
    dtls = transceivers[0].receiver.transport
    connection = dtls.transport._connection
    if not hasattr(connection, "media_sink"):  # not an EdgeConnection
        return None
    shortcut = SrtpShortcut(dtls, gaps)
    connection.media_sink = shortcut
    return shortcut
