"""Media between a WebRTC session and the backend agent (docs/agent-protocol.md).

Inbound: the caller's Opus frames are decoded to mono PCM in the event loop and handed to the
agent link. Outbound: PCM frames from the agent are encoded to mono Opus here and played,
paced in real time, on the session's outgoing track; silence fills the gaps.

Why not aiortc's own codec path: it decodes in a thread per receiver and encodes through the
default executor, two cross-thread hand-offs per 20 ms frame, which cost more CPU than the
codec itself (stereo, 96 kbit/s). Decoding and encoding mono voice inline, and giving aiortc
encoded packets (which it only packetizes), took the transceiver from ~53 to the figure in
docs/transceiver.md per session-second.
"""
from __future__ import annotations

import asyncio
import collections
import fractions
import time

import av
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

SAMPLE_RATE = 48000
FRAME_SAMPLES = 960           # 20 ms
FRAME_BYTES = FRAME_SAMPLES * 2
_TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)
_MAX_QUEUE = 5                # frames (100 ms) before the oldest is dropped: bounded latency


class OpusMonoDecoder:
    """Opus payloads -> 20 ms mono s16le PCM frames."""

    def __init__(self) -> None:
        self._codec = av.CodecContext.create("libopus", "r")
        self._codec.format = "s16"
        self._codec.layout = "mono"
        self._codec.sample_rate = SAMPLE_RATE

    def decode(self, payload: bytes) -> list[bytes]:
        try:
            frames = self._codec.decode(av.Packet(payload))
        except av.FFmpegError:
            return []
        return [bytes(f.planes[0])[:f.samples * 2] for f in frames]


class OpusMonoEncoder:
    """20 ms mono s16le PCM frames -> Opus packets for aiortc to packetize."""

    def __init__(self, bitrate: int = 32000) -> None:
        self._codec = av.CodecContext.create("libopus", "w")
        self._codec.bit_rate = bitrate
        self._codec.format = "s16"
        self._codec.layout = "mono"
        self._codec.sample_rate = SAMPLE_RATE
        self._codec.time_base = _TIME_BASE
        self._codec.options = {"application": "voip"}
        self._frame = av.AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        self._frame.sample_rate = SAMPLE_RATE
        self._frame.time_base = _TIME_BASE

    def encode(self, pcm: bytes, pts: int) -> list[av.Packet]:
        frame = self._frame  # one frame object, refilled: from_ndarray costs more than Opus
        frame.planes[0].update(pcm)
        frame.pts = pts
        packets = self._codec.encode(frame)
        for packet in packets:  # libopus delays its output: stamp packets with our clock
            packet.pts = pts
            packet.time_base = _TIME_BASE
        return packets


class InlineDecoder:
    """Stands in for an aiortc RTCRtpReceiver's decoder queue: decodes each encoded frame
    when it is put, in the event loop, and hands the PCM to ``sink``.

    aiortc still starts its decoder thread, which reads ``get() -> None`` and ends at once.
    """

    def __init__(self, sink) -> None:
        self._decoder = OpusMonoDecoder()
        self._sink = sink

    def put(self, item) -> None:
        if item is None:
            return
        _codec, encoded_frame = item
        for pcm in self._decoder.decode(encoded_frame.data):
            self._sink(pcm)

    def get(self):
        return None


class PassThroughJitter:
    """Stands in for aiortc's jitter buffer: every Opus packet is a frame, delivered at once.

    aiortc's buffer holds 4 frames (60-80 ms) before the first one; for a voice agent the
    audio should reach the model as it arrives, and its own buffering is its business.
    """

    def add(self, packet) -> tuple[bool, JitterFrame]:
        return False, JitterFrame(data=packet._data, timestamp=packet.timestamp)


def decode_inline(receiver, sink) -> None:
    """Make ``receiver`` (before it starts receiving) pass each Opus packet straight to an
    in-loop decoder that calls ``sink(pcm)``. Hooks private attributes of aiortc 1.16's
    RTCRtpReceiver (pinned): its jitter buffer and its decoder queue."""
    receiver._RTCRtpReceiver__jitter_buffer = PassThroughJitter()
    receiver._RTCRtpReceiver__decoder_queue = InlineDecoder(sink)


class AgentAudioTrack(MediaStreamTrack):
    """The session's outgoing audio: agent frames, or silence, every 20 ms."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._queue: collections.deque[bytes] = collections.deque()
        self._silence = bytes(FRAME_BYTES)
        self._start: float | None = None
        self._pts = 0
        self._encoder = OpusMonoEncoder()
        self.frames_played = 0
        self.frames_dropped = 0

    def push(self, pcm: bytes) -> None:
        if len(pcm) != FRAME_BYTES:
            return
        if len(self._queue) >= _MAX_QUEUE:
            self._queue.popleft()
            self.frames_dropped += 1
        self._queue.append(pcm)

    async def recv(self) -> av.Packet:
        """The next 20 ms, Opus-encoded (aiortc sends an av.Packet without re-encoding)."""
        while True:
            if self.readyState != "live":
                raise MediaStreamError
            if self._start is None:
                self._start = time.monotonic()
            else:
                self._pts += FRAME_SAMPLES
                wait = self._start + self._pts / SAMPLE_RATE - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
            pcm = self._queue.popleft() if self._queue else self._silence
            if pcm is not self._silence:
                self.frames_played += 1
            packets = self._encoder.encode(pcm, self._pts)
            if packets:
                return packets[0]
