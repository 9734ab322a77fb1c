"""How a measured one-way delay is judged against the configured one: one rule for calibration's
probes (topology/calibrate.py) and the captures' hops (analysis/pcap/hops.py), in a leaf module
(it imports nothing of the project).

- mean within max(1 ms, 5%) + 0.5 ms per hop of the configured delay;
- spread within 25% + 0.5 ms of the configured jitter, the standard deviation estimated robustly
  (IQR / 1.349, exact for normal jitter), so a handful of datagrams held up by a busy host's
  scheduling cannot fail a link (the plain standard deviation is returned too).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DelayExpectation:
    """The configured one-way delay of a path: mean, jitter, hops crossed, jitter's shape."""

    mean_ms: float
    sd_ms: float
    hops: int = 1
    distribution: str = "normal"


def mean_tolerance_ms(exp: DelayExpectation) -> float:
    """How far a measured mean one-way delay may be from the configured one."""
    return max(1.0, 0.05 * exp.mean_ms) + 0.5 * exp.hops


def judge_delays(exp: DelayExpectation, delays: list[float]
                 ) -> tuple[float | None, float | None, float | None, bool, bool]:
    """(mean, standard deviation, robust spread (IQR / 1.349), mean_ok, sd_ok) of one-way
    delays against what ``exp`` configures."""
    mean = statistics.fmean(delays) if delays else None
    sd = statistics.pstdev(delays) if len(delays) > 1 else None
    robust = None
    if len(delays) >= 8:
        q1, q3 = np.percentile(delays, [25, 75])
        robust = float(q3 - q1) / 1.349
    mean_ok = mean is not None and abs(mean - exp.mean_ms) <= mean_tolerance_ms(exp)
    # A uniform delay's IQR / 1.349 is 1.284 times its standard deviation.
    expected_spread = exp.sd_ms * (1.284 if exp.distribution == "uniform" else 1.0)
    sd_ok = robust is not None and abs(robust - expected_spread) <= 0.25 * expected_spread + 0.5
    return mean, sd, robust, mean_ok, sd_ok
