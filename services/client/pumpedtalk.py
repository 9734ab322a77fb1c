"""A conversation caller on the native pump (``--light-path native``; docs/conversation.md).

The full caller (conversation.py on aiortc) has its RTP, SRTP, jitter buffer and decoder
thread in Python. On the pump, sockets, SRTP, RTCP and Opus decoding are the plane's (C), and
Python sees what the caller hears once per 20 ms, batched. Each tick of its send group,
``PumpedTalk``

- queues the line's next pre-encoded payload(s) just before the plane sends them
  (``outgoing``): the line's first and last voiced payload are timed there
  (``SpeakingTrack.next_payload``, as when aiortc's sender pulls it from the track);
- takes what the plane heard for the session since its last tick (``take_heard``: each packet's
  payload, sequence number, RTP timestamp and wall-clock arrival), feeds the voiced arrivals to
  the ear, runs the full caller's jitter buffer (playout.PlayoutBuffer: frame k comes out when
  packet k + 4 arrives; or aiortc's own, per ``jitter_buffer``) and has the plane decode the
  frames it releases, in that order, with libopus; each frame is heard at the arrival of the
  packet that released it.

The full caller stays the reference; tests/test_conversation.py runs both on one agent.
"""
from __future__ import annotations

import struct

import numpy as np
from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtp import RtpPacket

from services.client.conversation import Conversation
from services.client.playout import CAPACITY, PREFETCH, PlayoutBuffer

_HEARD = struct.Struct("=dHIH")   # _mediaplane.c's HEARD_HEAD: arrival, seq, timestamp, length
_RECORD = struct.Struct("!IH")    # put_batch's: channel, length
_LENGTH = struct.Struct("=H")     # decode's: length


class PumpedTalk:
    """One conversation's media on the pump's plane, on channel ``channel``."""

    def __init__(self, talk: Conversation, plane, channel: int, group: int = 0) -> None:
        self.talk = talk
        self.group = group   # the pump's send phase it ticks in
        self._plane = plane
        self._channel = channel
        self._playout = (PlayoutBuffer() if talk.config.jitter_buffer == "playout"
                         else JitterBuffer(capacity=CAPACITY, prefetch=PREFETCH))

    def outgoing(self, frames: int) -> bytes:
        """put_batch records of the line's next ``frames`` payloads (none between lines: the
        plane's script, silence, goes out then)."""
        track, out = self.talk.track, []
        for _ in range(frames):
            if not track.speaking:
                break
            payload = track.next_payload()
            out.append(_RECORD.pack(self._channel, len(payload)) + payload)
        return b"".join(out)

    def hear(self) -> None:
        """What arrived since the last call, through the playout rule, decoded, into the ear."""
        blob = self._plane.take_heard(self._channel)
        if not blob:
            return
        ear, playout = self.talk.ear, self._playout
        released: list[tuple[bytes, int, float]] = []
        off = 0
        while off < len(blob):
            at, seq, timestamp, size = _HEARD.unpack_from(blob, off)
            off += _HEARD.size
            payload = blob[off:off + size]
            off += size
            ear.arrived_at(size, at)
            packet = RtpPacket(sequence_number=seq, timestamp=timestamp, payload=payload)
            packet._data = payload   # what aiortc's depayloader hands the buffer for Opus
            _, frame = playout.add(packet)
            if frame is not None:
                released.append((frame.data, frame.timestamp, at))
        if not released:
            return
        pcm = np.frombuffer(self._plane.decode(self._channel, b"".join(
            _LENGTH.pack(len(data)) + data for data, _, _ in released)), dtype="<i2")
        step = pcm.size // len(released)
        for k, (_, timestamp, at) in enumerate(released):
            ear.hear_pcm(pcm[k * step:(k + 1) * step], timestamp, at, self._channel)
