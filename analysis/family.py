"""Statements that survive many comparisons: a sweep compares every architecture with the
baseline on every metric at every point, and at a 5% level each comparison alone would call a
difference in about one of twenty null cases. Holm's step-down adjustment keeps the chance of
even one false 'significantly better/worse' in the whole family at ``alpha``; a practical
margin per metric keeps a significant but negligible difference (0.3 ms of setup from 200
sessions) from being called better or worse."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

ALPHA = 0.05  # the family-wise error: the chance of any false "significantly better/worse"

# The smallest difference of medians worth a statement, per sweep metric: below it two
# architectures are "no different" however significant (docs/sweeps.md, "Statistics").
MARGINS = {
    "setup_ms": 5.0,
    "setup_over_floor_ms": 5.0,
    "first_ice_rtt_ms": 2.0,
    "first_ice_rtt_over_floor_ms": 2.0,
    "rtt_ms": 2.0,
    "jitter_ms": 0.5,
    "loss_pct": 0.5,
    "mos": 0.05,
}


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the input's order (NaN stays NaN and is not counted: a
    comparison with nothing measured is no statement). Reject where adjusted < alpha."""
    ranked = sorted((p, i) for i, p in enumerate(pvalues) if not math.isnan(p))
    m = len(ranked)
    out = [math.nan] * len(pvalues)
    running = 0.0
    for k, (p, i) in enumerate(ranked):
        running = max(running, min(1.0, (m - k) * p))  # step-down: never below a smaller p's
        out[i] = running
    return out


@dataclass(frozen=True)
class Family:
    """How a sweep's statements are controlled, for the report and the JSON."""

    comparisons: int
    alpha: float = ALPHA
    method: str = "holm"
    margins: dict[str, float] = field(default_factory=lambda: dict(MARGINS))

    def text(self) -> str:
        shown = ", ".join(f"{m} {v:g}" for m, v in self.margins.items())
        return (f"better/worse: significant after Holm's adjustment over all {self.comparisons} "
                f"comparisons of this sweep (every point, architecture and metric; family-wise "
                f"error {self.alpha:.0%}) and larger than the metric's margin ({shown}); "
                f"p-values from each difference's bootstrap standard error")

    def to_dict(self) -> dict:
        return {"method": self.method, "alpha": self.alpha, "comparisons": self.comparisons,
                "margins": self.margins}
