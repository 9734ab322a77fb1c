"""The light client's receive path: RTP packets are measured by the probes, never decoded.

aiortc 1.16 (pinned) hands every received RTP packet, after its statistics (the jitter in
``getStats()``, the receiver reports the server's RTT needs) and depayloading, to a jitter
buffer, then to a decoder thread (stereo 48 kHz Opus) and the track. Those two hand-offs and
the decoding are most of a full client's receive cost. ``receive_without_decoding`` replaces,
on one receiver, the jitter buffer by one that keeps nothing and the decoder queue by one
that ends the decoder thread at once; the receiver's track then never yields a frame.
"""
from __future__ import annotations

from typing import Any


class DiscardJitter:
    """Stands in for aiortc's jitter buffer: no frame is ever complete."""

    def add(self, packet: Any) -> tuple[bool, None]:
        return False, None


class NoDecoder:
    """Stands in for the receiver's decoder queue: ``get()`` is None, so aiortc's decoder
    thread ends (and ends the track) as soon as it starts."""

    def put(self, item: Any) -> None:
        pass

    def get(self) -> None:
        return None


def receive_without_decoding(receiver: Any) -> None:
    """Hook ``receiver`` (an RTCRtpReceiver that has not started receiving) so that nothing
    it receives is buffered or decoded. Private attributes of aiortc 1.16's RTCRtpReceiver."""
    receiver._RTCRtpReceiver__jitter_buffer = DiscardJitter()
    receiver._RTCRtpReceiver__decoder_queue = NoDecoder()
