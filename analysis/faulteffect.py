"""What a fault kind says about its own effect, as each faults.json record carries it under
``effect`` (docs/faults.md, "Adding a fault kind").

The run writes it (each kind's module under scenarios/faultkinds/ builds one with ``Effect``);
the analysis reads it, so analysis/faults.py, tables.py and report.py treat every kind alike
and never name one. This module is a leaf (it imports nothing of the project) because both
sides use it: it is where the names they must agree on, the optional columns in ``MEASURES``,
are defined once.

What stays pure analysis is how each optional column is computed from the measured files
(analysis/faults.py): a kind only names the columns that mean something for it.
"""
from __future__ import annotations

from dataclasses import dataclass

# The faults.csv columns that only some kinds fill; every other column is every kind's.
GAP_OVER_RESTART = "gap_over_restart_ms"   # the longest down gap minus the service's restart
FIRST_CALL_ELSEWHERE = "first_new_session_s"  # the first call that connected off the target
EXTRA_RTT = "extra_rtt_ms"                 # media RTT after the audio was back minus before
# a call's address changed (mobility): its longest down gap minus its client's detection time
# and its media RTT, the most over the renominated calls (the report's mobility table)
GAP_OVER_DETECTION_RTT = "gap_over_detection_rtt_max_ms"
# the calls restarted ICE on the same path: their longest down gap (0 without one) minus their
# media RTT, the most over the calls that restarted
GAP_OVER_RTT = "gap_over_rtt_max_ms"
# the calls moved to another access network: their longest down gap minus their client's
# detection (the fault to its restart's PATCH) and that ICE restart (the PATCH to the new
# pair), the most over the calls that restarted
GAP_OVER_DETECTION_RESTART = "gap_over_detection_restart_max_ms"
MEASURES = (GAP_OVER_RESTART, FIRST_CALL_ELSEWHERE, EXTRA_RTT, GAP_OVER_DETECTION_RTT,
            GAP_OVER_RTT, GAP_OVER_DETECTION_RESTART)


@dataclass(frozen=True)
class Effect:
    """``hits``: the targets whose sessions the fault hits (a session is affected when one of
    them is on its path at the fault; empty: the fault's own target). ``measures``: which of
    ``MEASURES`` its row fills. ``steers``: it moves calls between clusters, so the report
    shows where each client region was steered around it."""

    hits: tuple[str, ...] = ()
    measures: tuple[str, ...] = ()
    steers: bool = False

    def __post_init__(self) -> None:
        unknown = [m for m in self.measures if m not in MEASURES]
        if unknown:
            raise ValueError(f"unknown fault measure(s) {', '.join(unknown)} "
                             f"(one of {', '.join(MEASURES)})")

    def to_dict(self) -> dict:
        return {"hits": list(self.hits), "measures": list(self.measures),
                "steers": self.steers}

    @classmethod
    def of(cls, record: dict) -> "Effect":
        """A faults.json record's effect; a record written before records carried one gets
        its kind's from ``LEGACY`` (nothing for a kind it does not know)."""
        raw = record.get("effect")
        if not isinstance(raw, dict) or not raw:
            return LEGACY.get(str(record.get("kind", "")), cls())
        measures = tuple(str(m) for m in raw.get("measures") or () if m in MEASURES)
        return cls(tuple(str(h) for h in raw.get("hits") or ()), measures,
                   bool(raw.get("steers", False)))


# Results folders written before faults.json carried ``effect`` (issue 26) still read as they
# were measured then. Frozen: a new kind writes its effect and never goes here (a test checks
# that each of these is what its kind's module writes today).
LEGACY = {
    "relay_kill": Effect(measures=(GAP_OVER_RESTART,)),
    "redis_down": Effect(),
    "transceiver_crash": Effect(measures=(FIRST_CALL_ELSEWHERE,)),
    "cluster_outage": Effect(measures=(FIRST_CALL_ELSEWHERE, EXTRA_RTT), steers=True),
    "link_down": Effect(),
    "loss_burst": Effect(),
}
