"""The project's one statistics path: percentiles, bootstrap CIs, success intervals, derived
columns, and the per-group statistics of a run.

Percentiles are numpy's ``method="linear"`` (Hyndman & Fan type 7, the same as
``statistics.quantiles(method="inclusive")``); everything that reports a percentile (the
runner's summary, the demo, the report, the budgets) calls ``percentiles`` or the functions
below. Confidence intervals are percentile-bootstrap intervals over sessions with one fixed seed
(``Bootstrap``); the success rate's interval is Wilson's score interval.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import TYPE_CHECKING

import numpy as np

from analysis.mos import EModel, burst_ratio

if TYPE_CHECKING:  # pandas only where frames are built: percentiles() stays a light import
    import pandas as pd

    from analysis.load import Results

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
# Overhead above the network floor: measured minus the floor the topology implies (the
# runner's per-session floor columns).
OVER_FLOOR = {"setup_over_floor_ms": ("setup_ms", "floor_setup_ms"),
              "first_ice_rtt_over_floor_ms": ("first_ice_rtt_ms", "floor_media_rtt_ms")}


@dataclass(frozen=True)
class Bootstrap:
    """Percentile bootstrap: resamples, confidence level, fixed seed (same for every group)."""

    resamples: int = 2000
    level: float = 0.95
    seed: int = 20261129


def _floats(values) -> np.ndarray:
    """The values as a float array, None and pd.NA as NaN."""
    try:
        return np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        import pandas as pd

        return np.asarray([math.nan if x is None or x is pd.NA else x for x in values],
                          dtype=float)


def _finite(values) -> np.ndarray:
    """The values as floats, without None and NaN."""
    v = _floats(values)
    return v[~np.isnan(v)]


def _percentiles(v: np.ndarray, qs) -> np.ndarray:
    """The one percentile definition (numpy 'linear'), on a finite array; NaN when empty."""
    if v.size == 0:
        return np.full(len(qs), np.nan)
    return np.percentile(v, qs, method="linear")


def percentiles(values, qs, ndigits: int | None = None) -> list[float | None]:
    """Percentiles ``qs`` (0-100) of a plain list; None and NaN entries are ignored.

    Returns plain floats (rounded to ``ndigits`` if given), or None for each q when no value
    is left: ``p50, p95 = percentiles(values, (50, 95))``.
    """
    out = _percentiles(_finite(values), list(qs))
    return [None if math.isnan(x) else (float(x) if ndigits is None else round(float(x), ndigits))
            for x in out]


def percentile(values, q: float, ndigits: int | None = None) -> float | None:
    """One percentile of a plain list (see ``percentiles``)."""
    return percentiles(values, (q,), ndigits)[0]


def _strata(values, strata) -> tuple[np.ndarray, np.ndarray]:
    """Finite values and integer stratum labels, sorted by stratum."""
    v = _floats(values)
    labels = (np.zeros(v.size, dtype=int) if strata is None
              else np.unique(np.asarray(strata, dtype=str), return_inverse=True)[1])
    keep = ~np.isnan(v)
    v, labels = v[keep], labels[keep]
    order = np.argsort(labels, kind="stable")
    return v[order], labels[order]


def _resampled(v: np.ndarray, labels: np.ndarray, qs, resamples: int,
               rng: np.random.Generator) -> np.ndarray:
    """Percentiles ``qs`` of ``resamples`` stratified resamples: shape (len(qs), resamples).

    Each resample draws, within every stratum, as many values as the stratum has.
    """
    sizes = np.bincount(labels)
    sizes = sizes[sizes > 0]
    offsets = np.r_[0, np.cumsum(sizes)[:-1]]
    chunk = max(1, 2_000_000 // v.size)  # bound the resample matrix to ~16 MB
    estimates = []
    for start in range(0, resamples, chunk):
        n = min(chunk, resamples - start)
        idx = np.concatenate([rng.integers(0, size, size=(n, size)) + offset
                              for size, offset in zip(sizes, offsets)], axis=1)
        estimates.append(_row_percentiles(v[idx], qs))
    return np.concatenate(estimates, axis=1)


def _row_percentiles(x: np.ndarray, qs) -> np.ndarray:
    """``np.percentile(x, qs, axis=1, method="linear")`` of a finite 2-D ``x``, bit for bit
    (numpy's virtual index (n - 1) q and its lerp), from one sort of the rows: the resample
    matrices are thousands of short rows, where numpy's partition per percentile costs ~5
    times a sort."""
    x = np.sort(x, axis=1)
    n = x.shape[1]
    out = np.empty((len(qs), x.shape[0]))
    for i, q in enumerate(np.true_divide(np.asarray(qs, dtype=float), 100)):
        virtual = (n - 1) * q
        below = math.floor(virtual)
        if virtual >= n - 1:
            out[i] = x[:, -1]
            continue
        gamma = virtual - below
        a, b = x[:, below], x[:, below + 1]
        diff = b - a
        out[i] = b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma
    return out


def bootstrap_ci(values, qs=PERCENTILES, boot: Bootstrap = Bootstrap(), strata=None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds of each percentile's bootstrap confidence interval.

    With ``strata`` (a label per value, e.g. the client region), each resample draws within
    every stratum as many values as it has: a run fixes the sessions per region, so the
    resamples keep the regions' mix.
    """
    v, labels = _strata(values, strata)
    if v.size == 0:
        return np.full(len(qs), np.nan), np.full(len(qs), np.nan)
    est = _resampled(v, labels, qs, boot.resamples, np.random.default_rng(boot.seed))
    tail = 100 * (1 - boot.level) / 2
    return (np.percentile(est, tail, axis=1, method="linear"),
            np.percentile(est, 100 - tail, axis=1, method="linear"))


@dataclass(frozen=True)
class Difference:
    """A percentile of group a minus the same percentile of group b, with its bootstrap CI."""

    estimate: float
    lo: float
    hi: float
    n_a: int
    n_b: int
    se: float = math.nan  # the bootstrap's standard deviation of the difference

    @property
    def significant(self) -> bool:
        """True when the interval excludes zero."""
        return self.lo > 0 or self.hi < 0

    @property
    def p_value(self) -> float:
        """Two-sided p-value of 'no difference', from the estimate over its bootstrap standard
        error (normal approximation: unlike counting resamples, it resolves the small values
        a family of many comparisons needs). NaN without a standard error."""
        if math.isnan(self.estimate) or math.isnan(self.se):
            return math.nan
        if self.se == 0:
            return 1.0 if self.estimate == 0 else 0.0
        return 2 * NormalDist().cdf(-abs(self.estimate) / self.se)


def _by_stratum(values, strata) -> dict[str, np.ndarray]:
    """The finite values of each stratum (one stratum, '', without strata)."""
    v = _floats(values)
    names = np.full(v.size, "") if strata is None else np.asarray(strata, dtype=str)
    keep = ~np.isnan(v)
    v, names = v[keep], names[keep]
    return {name: v[names == name] for name in np.unique(names)}


def bootstrap_diff_ci(a, b, q: float = 50, boot: Bootstrap = Bootstrap(), strata_a=None,
                      strata_b=None) -> Difference:
    """pq(a) - pq(b) and its percentile-bootstrap interval (a and b resampled independently,
    with the one seed).

    With strata (client regions), the difference is taken within each stratum both groups
    have and averaged, weighted by the stratum's sessions: a pooled median of several regions
    sits in the gap between the regions' modes, decided by a few extreme sessions, so its
    bootstrap is unreliable; like is compared with like instead. With one stratum this is
    the plain difference of the percentiles.
    """
    ga, gb = _by_stratum(a, strata_a), _by_stratum(b, strata_b)
    common = [name for name in ga if name in gb]
    n_a, n_b = sum(x.size for x in ga.values()), sum(x.size for x in gb.values())
    if not common:
        return Difference(math.nan, math.nan, math.nan, n_a, n_b)
    weights = np.array([ga[s].size + gb[s].size for s in common], dtype=float)
    weights /= weights.sum()
    rng = np.random.default_rng(boot.seed)
    point, diffs = 0.0, np.zeros(boot.resamples)
    for w, name in zip(weights, common):
        va, vb = ga[name], gb[name]
        point += w * (_percentiles(va, [q])[0] - _percentiles(vb, [q])[0])
        diffs += w * (_resampled(va, np.zeros(va.size, dtype=int), [q], boot.resamples, rng)[0]
                      - _resampled(vb, np.zeros(vb.size, dtype=int), [q], boot.resamples,
                                   rng)[0])
    tail = 100 * (1 - boot.level) / 2
    lo, hi = np.percentile(diffs, [tail, 100 - tail], method="linear")
    se = float(diffs.std(ddof=1)) if diffs.size > 1 else math.nan
    return Difference(float(point), float(lo), float(hi), n_a, n_b, se)


def wilson_interval(successes: int, trials: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion, as fractions."""
    if trials == 0:
        return math.nan, math.nan
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z / (1 + z * z / trials) * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials ** 2))
    return max(0.0, centre - half), min(1.0, centre + half)


def with_over_floor(sessions: pd.DataFrame) -> pd.DataFrame:
    """A copy of the sessions with the OVER_FLOOR columns."""
    out = sessions.copy()
    for name, (measured, floor) in OVER_FLOOR.items():
        out[name] = out[measured] - out[floor]
    return out


def with_derived(sessions: pd.DataFrame, model: EModel = EModel()) -> pd.DataFrame:
    """Sessions plus overhead above the network floor, burst ratio, R factor and MOS."""
    import pandas as pd

    out = with_over_floor(sessions)
    out["burst_r"] = [
        burst_ratio(int(r), int(l), b) if not (pd.isna(r) or pd.isna(l)) else math.nan
        for r, l, b in zip(out["packets_received"], out["packets_lost"], out["loss_bursts"])]
    # What the statistics describe: successful sessions measured while the host kept up.
    out["measured"] = out["ok"] & ~out["saturated"].astype(bool)
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

    def difference(self, architecture: str, baseline: str, metric: str,
                   q: float = 50) -> Difference:
        """pq of ``architecture`` minus pq of ``baseline`` over successful sessions, within
        each client region and averaged over them (see bootstrap_diff_ci), with its CI."""
        ok = self.sessions[self.sessions.measured]
        a, b = ok[ok.architecture == architecture], ok[ok.architecture == baseline]
        return bootstrap_diff_ci(a[metric], b[metric], q, self.bootstrap, a.client_region,
                                 b.client_region)


_METRIC_COLUMNS = ["architecture", "client_region", "metric", "n", "mean"] + [
    f"p{q}{s}" for q in PERCENTILES for s in ("", "_lo", "_hi")]
_SUCCESS_COLUMNS = ["architecture", "client_region", "sessions", "ok", "success_pct",
                    "success_lo", "success_hi", "saturated"]


def _metric_row(values, strata, boot: Bootstrap) -> dict:
    lo, hi = bootstrap_ci(values, PERCENTILES, boot, strata)
    v = _finite(values)
    row = {"n": int(v.size), "mean": float(v.mean()) if v.size else math.nan}
    point = _percentiles(v, PERCENTILES)
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

    Metrics come from successful sessions measured while the host kept up (not
    ``saturated``: scenarios/saturation.py); success counts every session; loss-burst lengths are pooled over the bursts
    of the group's sessions. Pooled rows bootstrap within client regions (see bootstrap_ci).
    """
    import pandas as pd

    sessions = with_derived(results.sessions, model)
    metric_rows, success_rows = [], []
    for arch, region, group in _groups(results, sessions):
        succeeded = int(group.ok.sum())
        lo, hi = wilson_interval(succeeded, len(group), boot.level)
        success_rows.append({"architecture": arch, "client_region": region,
                             "sessions": len(group), "ok": succeeded,
                             "success_pct": 100 * succeeded / len(group) if len(group) else math.nan,
                             "success_lo": 100 * lo, "success_hi": 100 * hi,
                             "saturated": int((group.ok & group.saturated).sum())})
        ok = group[group.measured]
        for metric in METRICS:
            if metric.name == "loss_burst_len":
                pairs = [(b, r) for bursts, r in zip(ok["loss_bursts"], ok["client_region"])
                         for b in bursts]
                values, strata = [p[0] for p in pairs], [p[1] for p in pairs]
            else:
                values, strata = ok[metric.name].to_numpy(dtype=float), ok["client_region"]
            metric_rows.append({"architecture": arch, "client_region": region,
                                "metric": metric.name, **_metric_row(values, strata, boot)})
    return Stats(metrics=pd.DataFrame(metric_rows, columns=_METRIC_COLUMNS),
                 success=pd.DataFrame(success_rows, columns=_SUCCESS_COLUMNS),
                 sessions=sessions, bootstrap=boot)


def thin_tail(n: int, q: int, min_beyond: int = 10) -> bool:
    """True when fewer than ``min_beyond`` observations lie beyond percentile q (on its side of
    the median): the bootstrap then reshuffles a few extremes and its CI is too narrow."""
    return q != 50 and n * min(q, 100 - q) / 100 < min_beyond
