"""Outgoing audio: a tone encoded to Opus once, then sent as pre-encoded packets in real time.

aiortc's RTCRtpSender packs an ``av.Packet`` from a track as is (``OpusEncoder.pack``: only
the pts is converted to the 48 kHz RTP clock), so a session costs no encoder CPU.
"""
from __future__ import annotations

import asyncio
import fractions
import functools
import time

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

SAMPLE_RATE = 48_000
PTIME_S = 0.020
SAMPLES_PER_PACKET = int(SAMPLE_RATE * PTIME_S)  # 960
TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)


@functools.cache
def opus_tone(freq_hz: float = 440.0, seconds: float = 1.0, amplitude: float = 0.3,
              bitrate: int = 32_000) -> tuple[bytes, ...]:
    """20 ms Opus packets of a stereo sine tone; loops seamlessly when freq_hz * seconds is whole.

    Cached per process: the result is immutable and the same for every session.
    """
    codec = av.CodecContext.create("libopus", "w")
    codec.sample_rate = SAMPLE_RATE
    codec.layout = "stereo"
    codec.format = "s16"
    codec.bit_rate = bitrate
    codec.time_base = TIME_BASE
    codec.options = {"application": "voip"}

    n_packets = max(1, round(seconds / PTIME_S))
    t = np.arange(n_packets * SAMPLES_PER_PACKET) / SAMPLE_RATE
    mono = (amplitude * 32767 * np.sin(2 * np.pi * freq_hz * t)).astype(np.int16)
    stereo = np.repeat(mono, 2)  # packed s16: L R L R ...
    packets: list[bytes] = []
    for i in range(n_packets):
        chunk = stereo[i * 2 * SAMPLES_PER_PACKET:(i + 1) * 2 * SAMPLES_PER_PACKET]
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="stereo")
        frame.sample_rate = SAMPLE_RATE
        frame.pts = i * SAMPLES_PER_PACKET
        packets.extend(bytes(p) for p in codec.encode(frame))
    packets.extend(bytes(p) for p in codec.encode(None))
    # The flush adds a packet of look-ahead; keep exactly one period so the loop has no seam.
    return tuple(p for p in packets if p)[:n_packets]


class PreEncodedOpusTrack(MediaStreamTrack):
    """An audio track of pre-encoded Opus ``av.Packet``s, one per 20 ms on a monotonic schedule.

    Late calls catch up (the schedule does not drift), as a capture device's buffer would.
    """

    kind = "audio"

    def __init__(self, payloads: tuple[bytes, ...]) -> None:
        super().__init__()
        if not payloads:
            raise ValueError("no Opus payloads to send")
        self._payloads = payloads
        self._index = 0
        self._start: float | None = None

    async def recv(self) -> av.Packet:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        delay = self._start + self._index * PTIME_S - now
        if delay > 0:
            await asyncio.sleep(delay)
        packet = av.Packet(self.next_payload())
        packet.pts = self._index * SAMPLES_PER_PACKET
        packet.time_base = TIME_BASE
        self._index += 1
        return packet

    def next_payload(self) -> bytes:
        """The payload of the packet due now (the payloads in a loop)."""
        return self._payloads[self._index % len(self._payloads)]
