"""Which cluster a front sends a call to: measured RTT, health and load, with hysteresis.

A pure policy, fed once per probe round with what the front measured of each cluster
(``ClusterProbe``: the round's RTT sample, health, sessions and capacity) and asked, per call,
for the clusters in the order to try them (``rank``). No I/O, no clock: tests drive it with
constructed probe sequences.

- RTT: the median of each cluster's last ``window`` samples. A cluster not measured yet
  stands at its configured RTT (the seed), so seeds decide only until measurements exist.
- The **preferred** cluster is tried first. It starts as the nearest by RTT and changes
  (``SteeringChange``) at the end of a probe round:
  - at once when it is down (no transceiver answered its probe): to the nearest healthy one;
  - to a nearer healthy cluster only when that one has been nearer by more than
    ``max(switch_ms, switch_pct % of the preferred's RTT)`` for ``switch_probes`` rounds in a
    row (hysteresis: one noisy probe does not move calls).
- Per call, after the preferred, the others by RTT. A cluster is skipped when it is down or
  its load (sessions / capacity) is at or over ``load_threshold``; a cluster that is nearer
  than the one chosen but not preferred yet is marked ``hysteresis``.
"""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

# Why a cluster was not chosen for a call (the call_created log's ``outcome`` per candidate).
DOWN = "down"
OVER_LOAD = "over_load_threshold"
FULL = "full"                   # every transceiver there refused (503) on this call
UNREACHABLE = "unreachable"     # its transceivers could not be reached on this call
HYSTERESIS = "hysteresis"       # nearer by measurement, not preferred yet
NOT_TRIED = "not_tried"         # farther than the chosen one
CHOSEN = "chosen"


@dataclass(frozen=True)
class SteeringConfig:
    load_threshold: float = 0.9   # skip a cluster whose sessions / capacity is at least this
    switch_ms: float = 10.0       # a nearer cluster must beat the preferred by more than
    switch_pct: float = 20.0      #   max(switch_ms, switch_pct % of the preferred's RTT)
    switch_probes: int = 3        #   in this many probe rounds in a row
    window: int = 5               # RTT samples per cluster, smoothed by their median

    def __post_init__(self) -> None:
        if not 0.0 < self.load_threshold <= 1.0:
            raise ValueError("load threshold must be in (0, 1]")
        if self.switch_ms < 0 or self.switch_pct < 0:
            raise ValueError("switch margins must be 0 or more")
        if self.switch_probes < 1:
            raise ValueError("switch probes must be 1 or more")
        if self.window < 1:
            raise ValueError("RTT window must be 1 or more")


@dataclass(frozen=True)
class ClusterProbe:
    """One probe round's view of a cluster."""

    rtt_ms: float | None          # None: no usable sample this round
    healthy: bool                 # at least one transceiver answered
    sessions: int = 0             # over its healthy transceivers
    capacity: int = 0


@dataclass(frozen=True)
class Candidate:
    """A cluster as ranked for one call."""

    cluster: str
    rtt_ms: float
    measured: bool                # False: rtt_ms is the configured seed
    healthy: bool
    sessions: int
    capacity: int
    skip: str | None              # DOWN or OVER_LOAD, else None (worth trying)

    @property
    def load(self) -> float | None:
        return round(self.sessions / self.capacity, 3) if self.capacity else None


@dataclass(frozen=True)
class SteeringChange:
    """The preferred cluster changed (logged as ``steering_changed``)."""

    from_cluster: str | None
    to_cluster: str
    why: str


@dataclass(frozen=True)
class Decision:
    """Where one call went and why (the ``call_created`` log's steering fields)."""

    region: str
    cluster: str | None           # None: refused, no cluster could take it
    transceiver: str | None
    preferred: str
    nearest: bool                 # the chosen cluster has the lowest RTT of all
    reason: str                   # "nearest", or why each nearer cluster was not chosen
    candidates: tuple[dict, ...]  # in the order tried, each with its outcome

    @classmethod
    def of(cls, region: str, preferred: str, ranking: list[Candidate],
           outcomes: dict[str, str], chosen: str | None,
           transceiver: str | None) -> "Decision":
        """``outcomes``: cluster -> FULL or UNREACHABLE for clusters that failed on the call."""
        nearest_rtt = min(c.rtt_ms for c in ranking)
        by_name = {c.cluster: c for c in ranking}
        rows, seen_chosen = [], False
        for c in ranking:
            if c.cluster == chosen:
                outcome, seen_chosen = CHOSEN, True
            elif seen_chosen and c.rtt_ms >= by_name[chosen].rtt_ms:
                outcome = NOT_TRIED  # farther than the chosen one: its state did not matter
            elif c.skip or c.cluster in outcomes:
                outcome = c.skip or outcomes[c.cluster]
            else:  # after the chosen one yet nearer: not preferred yet
                outcome = HYSTERESIS if seen_chosen else NOT_TRIED
            rows.append({"cluster": c.cluster, "rtt_ms": round(c.rtt_ms, 3),
                         "measured": c.measured, "healthy": c.healthy,
                         "sessions": c.sessions, "capacity": c.capacity, "load": c.load,
                         "outcome": outcome})
        nearest = chosen is not None and by_name[chosen].rtt_ms <= nearest_rtt
        if nearest:
            reason = "nearest"
        else:
            limit = by_name[chosen].rtt_ms if chosen is not None else float("inf")
            reason = "; ".join(f"{r['cluster']} {r['outcome']}" for r in
                               sorted(rows, key=lambda r: r["rtt_ms"])
                               if r["rtt_ms"] < limit and r["outcome"] != CHOSEN)
        return cls(region, chosen, transceiver, preferred, nearest, reason, tuple(rows))


@dataclass
class _Cluster:
    seed_ms: float
    samples: deque = field(default_factory=deque)
    healthy: bool = False
    sessions: int = 0
    capacity: int = 0

    @property
    def rtt_ms(self) -> float:
        return statistics.median(self.samples) if self.samples else self.seed_ms


class Steering:
    """The policy for one front. ``seeds``: cluster -> configured RTT (ms), in config order."""

    def __init__(self, seeds: dict[str, float], config: SteeringConfig = SteeringConfig()) -> None:
        if not seeds:
            raise ValueError("steering needs at least one cluster")
        self.config = config
        self._clusters = {name: _Cluster(float(ms), deque(maxlen=config.window))
                          for name, ms in seeds.items()}
        self._order = list(seeds)
        self.preferred = self._nearest(self._order)
        self._challenger: str | None = None
        self._streak = 0

    def rtt_ms(self, cluster: str) -> float:
        return self._clusters[cluster].rtt_ms

    def measured(self, cluster: str) -> bool:
        return bool(self._clusters[cluster].samples)

    def _nearest(self, names) -> str:
        return min(names, key=lambda n: (self._clusters[n].rtt_ms, self._order.index(n)))

    def observe(self, probes: dict[str, ClusterProbe]) -> SteeringChange | None:
        """One probe round (clusters absent from ``probes`` keep their last state)."""
        for name, p in probes.items():
            c = self._clusters[name]
            if p.rtt_ms is not None:
                c.samples.append(float(p.rtt_ms))
            c.healthy, c.sessions, c.capacity = p.healthy, p.sessions, p.capacity
        healthy = [n for n in self._order if self._clusters[n].healthy]
        current = self.preferred
        if not self._clusters[current].healthy:
            self._challenger, self._streak = None, 0
            if not healthy:
                return None
            return self._switch(self._nearest(healthy), f"{current} down")
        others = [n for n in healthy if n != current]
        if not others:
            self._challenger, self._streak = None, 0
            return None
        best = self._nearest(others)
        mine, theirs = self.rtt_ms(current), self.rtt_ms(best)
        margin = max(self.config.switch_ms, mine * self.config.switch_pct / 100.0)
        if theirs >= mine - margin:
            self._challenger, self._streak = None, 0
            return None
        self._streak = self._streak + 1 if best == self._challenger else 1
        self._challenger = best
        if self._streak < self.config.switch_probes:
            return None
        return self._switch(best, f"{best} measured {theirs:.1f} ms vs {current} {mine:.1f} ms "
                                  f"for {self._streak} probes (margin {margin:.1f} ms)")

    def _switch(self, to: str, why: str) -> SteeringChange:
        change = SteeringChange(self.preferred, to, why)
        self.preferred, self._challenger, self._streak = to, None, 0
        return change

    def rank(self, load: dict[str, tuple[int, int]] | None = None) -> list[Candidate]:
        """The clusters in the order to try them for a call: the preferred, then by RTT.
        ``load``: cluster -> (sessions, capacity) now, if fresher than the last probe."""
        rest = sorted((n for n in self._order if n != self.preferred),
                      key=lambda n: (self.rtt_ms(n), self._order.index(n)))
        out = []
        for name in [self.preferred] + rest:
            c = self._clusters[name]
            sessions, capacity = (load or {}).get(name, (c.sessions, c.capacity))
            if not c.healthy:
                skip = DOWN
            elif capacity <= 0 or sessions >= self.config.load_threshold * capacity:
                skip = OVER_LOAD
            else:
                skip = None
            out.append(Candidate(name, c.rtt_ms, bool(c.samples), c.healthy, sessions,
                                 capacity, skip))
        return out
