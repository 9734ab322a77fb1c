"""The E-model (ITU-T G.107), simplified as usual for VoIP planning: R factor and MOS per call.

R = (R0 - Is) - Id - Ie_eff + A, with the G.107 defaults giving R0 - Is = 93.2 and A = 0
(wired access). Id is the simplified delay impairment (Cole & Rosenbluth, 2001) with its knee at
177.3 ms one-way; Ie_eff is the G.107 effective equipment impairment under packet loss; MOS(R) is
the G.107 Annex B conversion. docs/analysis.md states the assumptions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Codec:
    """A codec's E-model parameters: equipment impairment Ie and packet-loss robustness Bpl."""

    name: str
    ie: float
    bpl: float
    frame_ms: float


# Assumption: no narrowband G.113 Ie/Bpl values for Opus exist. Opus at voice bitrates is
# transparent on the narrowband R scale (Ie = 0), and its concealment is taken to be as good as
# G.711 with G.711 Appendix I PLC, Bpl = 25.1 (G.113 Appendix I) - pessimistic for Opus.
OPUS = Codec("opus", ie=0.0, bpl=25.1, frame_ms=20.0)


@dataclass(frozen=True)
class EModel:
    """E-model parameters; one-way delay = rtt/2 + jitter_factor x jitter + codec frame."""

    r0_minus_is: float = 93.2
    advantage: float = 0.0
    codec: Codec = OPUS
    jitter_factor: float = 2.0

    def one_way_delay(self, rtt_ms: float, jitter_ms: float) -> float:
        """Mouth-to-ear delay, ms: network one way + jitter buffer + packetization."""
        return rtt_ms / 2 + self.jitter_factor * jitter_ms + self.codec.frame_ms

    def r_factor(self, one_way_ms: float, loss_pct: float, burst_r: float = 1.0) -> float:
        """R for a one-way delay (ms), a packet loss (%) and a burst ratio."""
        return (self.r0_minus_is - delay_impairment(one_way_ms)
                - effective_equipment_impairment(self.codec, loss_pct, burst_r) + self.advantage)

    def mos(self, rtt_ms: float, jitter_ms: float, loss_pct: float, burst_r: float = 1.0) -> float:
        """MOS-CQE of a call from its media RTT, jitter (ms), loss (%) and burst ratio."""
        return mos_from_r(self.r_factor(self.one_way_delay(rtt_ms, jitter_ms), loss_pct, burst_r))


def delay_impairment(one_way_ms: float) -> float:
    """Id = 0.024 d + 0.11 (d - 177.3) H(d - 177.3), d one-way mouth-to-ear delay in ms."""
    d = max(one_way_ms, 0.0)
    return 0.024 * d + (0.11 * (d - 177.3) if d > 177.3 else 0.0)


def effective_equipment_impairment(codec: Codec, loss_pct: float, burst_r: float = 1.0) -> float:
    """Ie_eff = Ie + (95 - Ie) Ppl / (Ppl / BurstR + Bpl), Ppl in percent (G.107 eq. 7-29)."""
    if loss_pct < 0 or burst_r <= 0:
        raise ValueError(f"loss {loss_pct} % and burst ratio {burst_r} must be >= 0 and > 0")
    return codec.ie + (95 - codec.ie) * loss_pct / (loss_pct / burst_r + codec.bpl)


def mos_from_r(r: float) -> float:
    """G.107 Annex B: 1 below R = 0, 4.5 above R = 100, the cubic between (floored at 1)."""
    if math.isnan(r):
        return math.nan
    if r <= 0:
        return 1.0
    if r >= 100:
        return 4.5
    return max(1.0, 1 + 0.035 * r + r * (r - 60) * (100 - r) * 7e-6)


def burst_ratio(packets_received: int, packets_lost: int, bursts: list[int]) -> float:
    """G.107 BurstR of a two-state Markov loss model fitted to one session's loss runs.

    p = P(lost | previous received) ~ bursts / received, q = P(received | previous lost) =
    bursts / lost, BurstR = 1 / (p + q): 1 for random loss, above 1 for bursty loss. Estimates
    below 1 (a few isolated losses) are sampling noise and are reported as 1.
    """
    runs, lost = len(bursts), sum(bursts) or packets_lost
    if runs == 0 or lost <= 0 or packets_received <= 0:
        return 1.0
    return max(1.0, 1.0 / (runs / packets_received + runs / lost))
