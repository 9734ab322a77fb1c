"""The outbound Opus encoder's settings (no codec imports: the CLI reads them)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OpusSettings:
    """The outbound encoder. Defaults measured in docs/transceiver.md ("CPU per
    session-second"): restricted low delay (CELT only, 2.5 ms lookahead instead of 6.5 ms)
    at complexity 0 costs about a third of libopus's ``voip`` default per frame, at the same
    32 kbit/s, which CELT carries as full-band voice."""

    application: str = "lowdelay"   # libopus: voip, audio or lowdelay
    complexity: int = 0             # 0..10
    bitrate: int = 32000


APPLICATIONS = ("voip", "audio", "lowdelay")
