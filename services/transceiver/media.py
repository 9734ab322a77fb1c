"""Media between a WebRTC session and the backend agent (docs/agent-protocol.md).

Inbound: the caller's Opus frames are decoded to mono PCM in the event loop and handed to the
agent link. Outbound: PCM frames from the agent are queued on the session's outgoing track,
encoded to mono Opus when their 20 ms comes (outbound.py plays every session's track on the
shared frame clock); silence fills the gaps.

Why not aiortc's own codec path: it decodes in a thread per receiver and encodes through the
default executor, two cross-thread hand-offs per 20 ms frame, which cost more CPU than the
codec itself (stereo, 96 kbit/s). Decoding and encoding mono voice inline with libopus
(services/libopus.py), and giving aiortc encoded packets (which it only packetizes), is what
docs/transceiver.md measures per session-second.
"""
from __future__ import annotations

import collections
import fractions

from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from services import libopus
from services.transceiver.opus import OpusSettings
from services.transceiver.pacing import FrameClock

SAMPLE_RATE = 48000
FRAME_SAMPLES = 960           # 20 ms
FRAME_BYTES = FRAME_SAMPLES * 2
_TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)
_MAX_QUEUE = 5                # frames (100 ms) before the oldest is dropped: bounded latency
_CODED_SILENCE = 3            # silent frames encoded after audio before the cached packet
OPUS_MAX = 1275               # the largest Opus packet: an agent's frame up to this is Opus


class OpusMonoDecoder:
    """Opus payloads -> 20 ms mono s16le PCM frames."""

    def __init__(self) -> None:
        self._decoder = libopus.Decoder()

    def decode(self, payload: bytes) -> list[bytes]:
        if not payload:
            return []
        try:
            pcm = self._decoder.decode(payload)
        except libopus.OpusError:
            return []
        return [pcm[i:i + FRAME_BYTES] for i in range(0, len(pcm), FRAME_BYTES)]


class OpusMonoEncoder:
    """20 ms mono s16le PCM frames -> Opus packets for aiortc to packetize."""

    def __init__(self, settings: OpusSettings = OpusSettings()) -> None:
        self._encoder = libopus.Encoder(settings.application, settings.bitrate,
                                        settings.complexity, FRAME_SAMPLES)

    def encode(self, pcm: bytes) -> bytes:
        return self._encoder.encode(pcm)


class OpusPacket:
    """An encoded frame as aiortc's Opus packetizer reads it (``pts``, ``time_base``,
    ``bytes()``): aiortc sends it without re-encoding."""

    __slots__ = ("data", "pts", "time_base")

    def __init__(self, data: bytes, pts: int) -> None:
        self.data, self.pts, self.time_base = data, pts, _TIME_BASE

    def __bytes__(self) -> bytes:
        return self.data


_SILENCE_PACKETS: dict[OpusSettings, bytes] = {}


def silence_packet(settings: OpusSettings) -> bytes:
    """The Opus packet of a silent 20 ms frame with these settings (a few bytes), made once."""
    packet = _SILENCE_PACKETS.get(settings)
    if packet is None:
        encoder, silence = OpusMonoEncoder(settings), bytes(FRAME_BYTES)
        for _ in range(4):  # past the encoder's start-up: a steady-state silent frame
            packet = encoder.encode(silence)
        _SILENCE_PACKETS[settings] = packet
    return packet


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
    """The session's outgoing audio: agent frames, or silence, every 20 ms of ``clock``. A
    frame is 20 ms of PCM (encoded here), or an Opus payload from an agent that encodes its own
    audio (a TTS that streams Opus), sent as it is.

    Silence costs no encoder call once it has lasted ``_CODED_SILENCE`` frames: the first
    silent frames after audio are encoded (the decoder hears the sound end as the encoder
    shaped it, and both end up in the same silent state), the rest are one cached packet."""

    kind = "audio"

    def __init__(self, settings: OpusSettings = OpusSettings(),
                 clock: FrameClock | None = None) -> None:
        super().__init__()
        self._queue: collections.deque[bytes] = collections.deque()
        self._silence = bytes(FRAME_BYTES)
        self._silence_packet = silence_packet(settings)
        self._silent = _CODED_SILENCE  # nothing played yet: no sound to end
        self._clock = clock or FrameClock()
        self._tick: int | None = None
        self._pts = 0
        self._encoder = OpusMonoEncoder(settings)
        self.frames_played = 0
        self.frames_dropped = 0
        self.frames_encoded = 0

    def push(self, frame: bytes) -> None:
        if len(frame) != FRAME_BYTES and not 0 < len(frame) <= OPUS_MAX:
            return
        if len(self._queue) >= _MAX_QUEUE:
            self._queue.popleft()
            self.frames_dropped += 1
        self._queue.append(frame)

    async def recv(self) -> OpusPacket:
        """The next 20 ms, Opus-encoded, paced on the clock (aiortc's own send loop; the
        transceiver's sessions are played by outbound.py instead)."""
        if self.readyState != "live":
            raise MediaStreamError
        if self._tick is None:
            self._tick = self._clock.current()
        else:
            self._tick += 1
            await self._clock.reach(self._tick)
        return self.next_packet()

    def next_packet(self) -> OpusPacket:
        """The next 20 ms now: the agent's next frame, or silence."""
        pts = self._pts
        self._pts += FRAME_SAMPLES
        if self._queue:
            self.frames_played += 1
            pcm = self._queue.popleft()
            if len(pcm) != FRAME_BYTES:   # Opus already: no sound of our encoder to end
                self._silent = _CODED_SILENCE
                return OpusPacket(pcm, pts)
            self._silent = 0
        elif self._silent < _CODED_SILENCE:
            self._silent += 1
            pcm = self._silence
        else:
            return OpusPacket(self._silence_packet, pts)
        self.frames_encoded += 1
        return OpusPacket(self._encoder.encode(pcm), pts)

    def clear(self) -> int:
        """Drop the agent frames not yet played (a barge-in); how many."""
        cleared = len(self._queue)
        self._queue.clear()
        return cleared

    def skip(self, frames: int) -> None:
        """Let ``frames`` x 20 ms pass unsent (the sender fell too far behind real time)."""
        self._pts += frames * FRAME_SAMPLES
