"""What regression a CI gate detects: its decision rule re-run on simulated runs.

A simulated run draws, in every client region, as many sessions as the clean run had, with
replacement from the clean run's own sessions (its spread, not a model of it). A regression is
a shift ``delta`` of every session's value in the bad direction. The detectable regression is
the smallest delta at which at least ``power`` of the simulated runs fail the gate.

No search over delta is needed: a percentile-bootstrap bound is shift-equivariant (adding delta
to every value adds delta to every resample's percentile, so to the bound). A simulated run r
therefore fails exactly when delta exceeds ``needed_r`` (limit - lower bound for an upper
limit, upper bound - limit for a lower one), and the detectable regression is the ``power``
quantile of the needed_r. The share of runs with needed_r < 0 is the false-alarm rate: clean
re-runs that fail.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Power:
    """How the detectable regression is estimated: simulated runs and the power wanted."""

    runs: int = 400
    power: float = 0.8


@dataclass(frozen=True)
class Detectable:
    """The smallest regression detected with ``power``, and the clean false-alarm rate."""

    regression: float
    false_alarm: float
    power: float
    runs: int


def simulated_run(values: np.ndarray, strata, rng: np.random.Generator,
                  sessions: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One simulated run: per stratum, ``sessions`` (default: as many as it has) draws with
    replacement from its values. Returns the values and their strata."""
    values = np.asarray(values, dtype=float)
    names = np.full(values.size, "") if strata is None else np.asarray(strata, dtype=str)
    out_v, out_s = [], []
    for name in np.unique(names):
        group = values[names == name]
        n = group.size if sessions is None else sessions
        out_v.append(group[rng.integers(0, group.size, size=n)])
        out_s.append(np.full(n, name))
    return np.concatenate(out_v), np.concatenate(out_s)


def detectable(needed, power: float = 0.8) -> Detectable:
    """From each simulated run's needed shift (see the module docstring): the smallest shift
    that fails at least ``power`` of the runs (0 when that many fail already)."""
    needed = np.sort(np.asarray(needed, dtype=float))
    k = max(0, math.ceil(power * needed.size) - 1)
    return Detectable(regression=max(0.0, float(needed[k])),
                      false_alarm=float(np.mean(needed < 0)), power=power, runs=int(needed.size))


def binomial_tail(n: int, k: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    return float(sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1)))


def detectable_failure_rate(sessions: int, min_success_pct: float, power: float = 0.8) -> float:
    """The per-session failure probability (%) at which a success-rate gate (fails when fewer
    than ``min_success_pct`` % of ``sessions`` succeed) fails with probability ``power``."""
    failures_to_fail = math.floor(sessions * (1 - min_success_pct / 100) + 1e-9) + 1
    if failures_to_fail > sessions:
        return math.inf
    lo, hi = 0.0, 1.0
    for _ in range(60):  # bisection: the tail probability grows with p
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if binomial_tail(sessions, failures_to_fail, mid) < power else (lo, mid)
    return 100 * hi
