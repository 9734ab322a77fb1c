"""The echo check without decoding: how many received Opus payloads carry sound.

An Opus encoder spends few bytes on silence: the edge's mono 32 kbit/s encoder
(services/transceiver/media.py) sends 3-35 byte packets for silence, 70-160 for the echoed
tone; aiortc's own encoder sends more for both. A payload of ``VOICED_MIN_BYTES`` or more
counts as voiced. It says that sound comes back, not how loud: a full client's RMS check
(services/client/session.py) does that.
"""
from __future__ import annotations

from dataclasses import dataclass

VOICED_MIN_BYTES = 50


@dataclass
class VoicedCount:
    """Payloads received from ``skip_s`` after the first one on, and the voiced among them."""

    skip_s: float
    min_bytes: int = VOICED_MIN_BYTES
    counted: int = 0
    voiced: int = 0
    _from: float | None = None

    def add(self, size: int, at: float) -> None:
        if self._from is None:
            self._from = at + self.skip_s
        if at >= self._from:
            self.counted += 1
            self.voiced += size >= self.min_bytes

    @property
    def voiced_pct(self) -> float | None:
        return 100.0 * self.voiced / self.counted if self.counted else None
