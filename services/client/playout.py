"""A conversation caller's audio jitter buffer: aiortc's, with the hole rule of a playout buffer.

aiortc's audio receiver holds 4 frames back (``JitterBuffer(capacity=16, prefetch=4)``: 80 ms)
but waits for a missing packet until the buffer overflows, 16 packets later, and then hands out
one frame per packet received, so from the first lost packet on every frame comes out 15
packets (300 ms) after it arrived, for the rest of the call, and the frames held behind the
hole are dropped (measured: docs/conversation.md). A caller's ear that slips by 200 ms at its
first loss would credit an architecture's loss to its delay. ``PlayoutBuffer`` gives a missing
packet up as soon as ``prefetch`` frames after it are complete, the point where a playout
buffer conceals it: the delay stays 80 ms, only the lost frame is missing. aiortc's ``add``
(its origin, overflow and reordering rules) is kept; pinned to aiortc 1.16: it replaces the
receiver's private buffer.
"""
from __future__ import annotations

from typing import Any

from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.utils import uint16_add

CAPACITY, PREFETCH = 16, 4   # aiortc's audio buffer


class PlayoutBuffer(JitterBuffer):
    """Frame k comes out when packet k + ``prefetch`` arrives (one packet per audio frame, as
    Opus at 20 ms sends); a packet still missing then is skipped and counted."""

    def __init__(self, capacity: int = CAPACITY, prefetch: int = PREFETCH) -> None:
        super().__init__(capacity=capacity, prefetch=prefetch)
        self.holes_skipped = 0
        self._newest: int | None = None

    def _remove_frame(self, sequence_number: int) -> JitterFrame | None:
        if self._newest is None or uint16_add(sequence_number, -self._newest) < 0x8000:
            self._newest = sequence_number
        ahead = uint16_add(self._newest, -self._origin)
        if ahead >= self._capacity:   # aiortc's add() reset its origin: start over from it
            self._newest, ahead = self._origin, 0
        while ahead >= self._prefetch:
            packet = self._packets[self._origin % self._capacity]
            self.remove(1)
            ahead -= 1
            if packet is None:
                self.holes_skipped += 1
                continue
            return JitterFrame(data=packet._data, timestamp=packet.timestamp)
        return None


def install(receiver: Any) -> PlayoutBuffer:
    """Give aiortc's audio ``receiver`` a ``PlayoutBuffer`` (before its first packet)."""
    buffer = PlayoutBuffer()
    receiver._RTCRtpReceiver__jitter_buffer = buffer
    return buffer
