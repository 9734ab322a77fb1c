"""Per architecture and client region: success rate and percentiles with bootstrap CIs.

Percentiles are numpy's ``method="linear"`` (Hyndman & Fan type 7, the same as
``statistics.quantiles(method="inclusive")`` that the runner's summary.json uses). Confidence
intervals are percentile-bootstrap intervals over sessions with a fixed seed; the success rate's
interval is Wilson's score interval.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np
import pandas as pd

from analysis.load import Results
from analysis.mos import EModel, burst_ratio

ALL = "all"  # the client_region of rows pooled over every client region
PERCENTILES = (1, 5, 10, 50, 90, 95, 99)  # computed for every metric


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    unit: str
    higher_is_better: bool = False

    @property
    def tail(self) -> tuple[int, int, int]:
        """The percentiles of the metric's bad tail: high values, or low ones for MOS."""
        return (10, 5, 1) if self.higher_is_better else (90, 95, 99)


METRICS = (
    Metric("setup_ms", "setup", "ms"),
    Metric("first_ice_rtt_ms", "first ICE RTT", "ms"),
    Metric("signaling_ms", "signaling", "ms"),
    Metric("first_audio_ms", "first audio", "ms"),
    Metric("rtt_ms", "media RTT", "ms"),
    Metric("jitter_ms", "jitter", "ms"),
    Metric("loss_pct", "loss", "%"),
    Metric("loss_burst_len", "loss-burst length", "packets"),
    Metric("setup_over_floor_ms", "setup over floor", "ms"),
    Metric("first_ice_rtt_over_floor_ms", "first ICE RTT over floor", "ms"),
    Metric("mos", "MOS (E-model)", "", higher_is_better=True),
)
METRIC_BY_NAME = {m.name: m for m in METRICS}


@dataclass(frozen=True)
class Bootstrap:
    """Percentile bootstrap: resamples, confidence level, fixed seed (same for every group)."""

    resamples: int = 2000
    level: float = 0.95
    seed: int = 20261129


def percentiles(values, qs=PERCENTILES) -> np.ndarray:
    """Percentiles (0-100) of the non-NaN values, numpy 'linear'; NaN when there are none."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return np.full(len(qs), np.nan)
    return np.percentile(v, qs, method="linear")


def bootstrap_ci(values, qs=PERCENTILES, boot: Bootstrap = Bootstrap(), strata=None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds of each percentile's bootstrap confidence interval.

    With ``strata`` (a label per value, e.g. the client region), each resample draws within
    every stratum as many values as it has: a run fixes the sessions per region, so the
    resamples keep the regions' mix.
    """
    v = np.asarray(values, dtype=float)
    labels = np.zeros(v.size, dtype=int) if strata is None else pd.factorize(
        pd.Series(list(strata)))[0]
    keep = ~np.isnan(v)
    v, labels = v[keep], labels[keep]
    if v.size == 0:
        return np.full(len(qs), np.nan), np.full(len(qs), np.nan)
    order = np.argsort(labels, kind="stable")
    v, labels = v[order], labels[order]
    sizes = np.bincount(labels)
    sizes = sizes[sizes > 0]
    offsets = np.r_[0, np.cumsum(sizes)[:-1]]
    rng = np.random.default_rng(boot.seed)
    chunk = max(1, 2_000_000 // v.size)  # bound the resample matrix to ~16 MB
    estimates = []
    for start in range(0, boot.resamples, chunk):
        n = min(chunk, boot.resamples - start)
        idx = np.concatenate([rng.integers(0, size, size=(n, size)) + offset
                              for size, offset in zip(sizes, offsets)], axis=1)
        estimates.append(np.percentile(v[idx], qs, axis=1, method="linear"))
    est = np.concatenate(estimates, axis=1)
    tail = 100 * (1 - boot.level) / 2
    return (np.percentile(est, tail, axis=1, method="linear"),
            np.percentile(est, 100 - tail, axis=1, method="linear"))


def wilson_interval(successes: int, trials: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion, as fractions."""
    if trials == 0:
        return math.nan, math.nan
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z / (1 + z * z / trials) * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials ** 2))
    return max(0.0, centre - half), min(1.0, centre + half)


def with_derived(sessions: pd.DataFrame, model: EModel = EModel()) -> pd.DataFrame:
    """Sessions plus overhead above the network floor, burst ratio, R factor and MOS."""
    out = sessions.copy()
    out["setup_over_floor_ms"] = out["setup_ms"] - out["floor_setup_ms"]
    out["first_ice_rtt_over_floor_ms"] = out["first_ice_rtt_ms"] - out["floor_media_rtt_ms"]
    out["burst_r"] = [
        burst_ratio(int(r), int(l), b) if not (pd.isna(r) or pd.isna(l)) else math.nan
        for r, l, b in zip(out["packets_received"], out["packets_lost"], out["loss_bursts"])]
    usable = out["ok"] & out["rtt_ms"].notna() & out["jitter_ms"].notna() & out["loss_pct"].notna()
    one_way = [model.one_way_delay(r, j) if u else math.nan
               for u, r, j in zip(usable, out["rtt_ms"], out["jitter_ms"])]
    out["one_way_ms"] = one_way
    out["mos"] = [model.mos(r, j, l, b) if u else math.nan for u, r, j, l, b in zip(
        usable, out["rtt_ms"], out["jitter_ms"], out["loss_pct"], out["burst_r"])]
    return out


@dataclass
class Stats:
    """``metrics``: a row per (architecture, client_region, metric) with n, mean, p1 .. p99
    and their ``_lo``/``_hi`` bounds; ``success``: a row per (architecture, client_region)."""

    metrics: pd.DataFrame
    success: pd.DataFrame
    sessions: pd.DataFrame
    bootstrap: Bootstrap = field(default_factory=Bootstrap)

    def row(self, architecture: str, metric: str, region: str = ALL) -> pd.Series | None:
        m = self.metrics
        hit = m[(m.architecture == architecture) & (m.metric == metric)
                & (m.client_region == region)]
        return None if hit.empty else hit.iloc[0]

    def success_row(self, architecture: str, region: str = ALL) -> pd.Series | None:
        s = self.success
        hit = s[(s.architecture == architecture) & (s.client_region == region)]
        return None if hit.empty else hit.iloc[0]


def _metric_row(values, strata, boot: Bootstrap) -> dict:
    v = np.asarray(values, dtype=float)
    lo, hi = bootstrap_ci(v, PERCENTILES, boot, strata)
    v = v[~np.isnan(v)]
    row = {"n": int(v.size), "mean": float(v.mean()) if v.size else math.nan}
    point = percentiles(v)
    for q, p, a, b in zip(PERCENTILES, point, lo, hi):
        row.update({f"p{q}": p, f"p{q}_lo": a, f"p{q}_hi": b})
    return row


def _groups(results: Results, sessions: pd.DataFrame):
    for arch in results.architectures:
        in_arch = sessions[sessions.architecture == arch]
        yield arch, ALL, in_arch
        for region in results.client_regions:
            yield arch, region, in_arch[in_arch.client_region == region]


def compute_stats(results: Results, boot: Bootstrap = Bootstrap(),
                  model: EModel = EModel()) -> Stats:
    """Success and metric percentiles per architecture, pooled (ALL) and per client region.

    Metrics come from successful sessions only; loss-burst lengths are pooled over the bursts
    of the group's sessions. Pooled rows bootstrap within client regions (see bootstrap_ci).
    """
    sessions = with_derived(results.sessions, model)
    metric_rows, success_rows = [], []
    for arch, region, group in _groups(results, sessions):
        ok = group[group.ok]
        lo, hi = wilson_interval(len(ok), len(group), boot.level)
        success_rows.append({"architecture": arch, "client_region": region,
                             "sessions": len(group), "ok": len(ok),
                             "success_pct": 100 * len(ok) / len(group) if len(group) else math.nan,
                             "success_lo": 100 * lo, "success_hi": 100 * hi})
        for metric in METRICS:
            if metric.name == "loss_burst_len":
                pairs = [(b, r) for bursts, r in zip(ok["loss_bursts"], ok["client_region"])
                         for b in bursts]
                values, strata = [p[0] for p in pairs], [p[1] for p in pairs]
            else:
                values, strata = ok[metric.name].to_numpy(dtype=float), ok["client_region"]
            metric_rows.append({"architecture": arch, "client_region": region,
                                "metric": metric.name, **_metric_row(values, strata, boot)})
    return Stats(metrics=pd.DataFrame(metric_rows), success=pd.DataFrame(success_rows),
                 sessions=sessions, bootstrap=boot)


def thin_tail(n: int, q: int, min_beyond: int = 10) -> bool:
    """True when fewer than ``min_beyond`` observations lie beyond percentile q (on its side of
    the median): the bootstrap then reshuffles a few extremes and its CI is too narrow."""
    return q != 50 and n * min(q, 100 - q) / 100 < min_beyond
