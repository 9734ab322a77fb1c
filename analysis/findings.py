"""What a run says, in words: each architecture against the baseline, per headline metric.

A finding is the difference of medians (architecture minus baseline, within each client region
and averaged over the regions by their sessions: analysis.stats.bootstrap_diff_ci) with its
bootstrap 95% CI, the report's seed. It is called a
difference only when the interval excludes zero; otherwise "no significant difference".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from analysis.load import Results
from analysis.stats import METRIC_BY_NAME, Difference, Stats

HEADLINE = ("setup_ms", "first_ice_rtt_ms", "rtt_ms", "jitter_ms", "loss_pct", "mos")
# Words for a lower and a higher value of each headline metric.
_WORDS = {"setup_ms": ("faster", "slower"), "first_ice_rtt_ms": ("faster", "slower"),
          "rtt_ms": ("faster", "slower"), "jitter_ms": ("lower", "higher"),
          "loss_pct": ("lower", "higher"), "mos": ("lower", "higher")}
_UNITS = {"loss_pct": " percentage points", "mos": ""}


def _num(value: float, metric: str) -> str:
    if metric in ("mos", "loss_pct"):
        return f"{value:.2g}"
    return f"{value:.1f}" if abs(value) < 10 else f"{value:.0f}"


def _signed(value: float, metric: str) -> str:
    return ("+" if value >= 0 else "-") + _num(abs(value), metric)


@dataclass(frozen=True)
class Finding:
    architecture: str
    baseline: str
    metric: str
    difference: Difference

    @property
    def significant(self) -> bool:
        return self.difference.significant

    @property
    def direction(self) -> str:
        """'faster', 'slower', 'lower', 'higher', or '' when not significant."""
        if not self.significant:
            return ""
        lower, higher = _WORDS.get(self.metric, ("lower", "higher"))
        return lower if self.difference.estimate < 0 else higher

    def sentence(self) -> str:
        d, m = self.difference, self.metric
        label = METRIC_BY_NAME[m].label
        label = label[0].upper() + label[1:]
        unit = _UNITS.get(m, f" {METRIC_BY_NAME[m].unit}")
        if math.isnan(d.estimate):
            return f"{label}: no successful session measured while the host kept up to compare."
        if not self.significant:
            return (f"{label}: no significant difference from {self.baseline} "
                    f"({_signed(d.estimate, m)}{unit}, 95% CI {_signed(d.lo, m)} to "
                    f"{_signed(d.hi, m)}{unit}).")
        # The interval on the side of the difference, as magnitudes: "40 to 60 ms faster".
        near, far = sorted((abs(d.lo), abs(d.hi)))
        return (f"{label} is {_num(abs(d.estimate), m)}{unit} {self.direction} than with "
                f"{self.baseline} (difference of medians; 95% CI {_num(near, m)} to "
                f"{_num(far, m)}{unit} {self.direction}).")


def _all_saturated(stats: Stats) -> bool:
    """Every successful session of the run was measured on a saturated host (and there were
    some)."""
    rows = stats.success[stats.success.client_region == "all"]
    ok = int(rows.ok.sum()) if len(rows) else 0
    return ok > 0 and int(rows.saturated.sum()) >= ok


def findings(results: Results, stats: Stats, metrics=HEADLINE) -> list[Finding]:
    """Every architecture but the baseline, each headline metric, in the run's order; none
    when the host saturated for every session (there is nothing of the architectures')."""
    baseline = results.baseline
    if baseline not in results.architectures or _all_saturated(stats):
        return []
    return [Finding(arch, baseline, m, stats.difference(arch, baseline, m))
            for arch in results.architectures if arch != baseline for m in metrics]


def saturation(stats: Stats) -> str:
    """'' when every successful session was measured while the host kept up; else the
    warning that opens the report."""
    rows = stats.success[stats.success.client_region == "all"]
    hit = [(r.architecture, int(r.saturated), int(r.ok)) for r in rows.itertuples()
           if r.saturated]
    if not hit:
        return ""
    parts = ", ".join(f"{a}: {n} of {ok}" for a, n, ok in hit)
    return (f"Host saturated: some sessions were measured while a process on their path lagged "
            f"(a second in which a tenth of its 20 ms ticks came 5 ms late or more, or one came "
            f"100 ms late; the impairment engine: a tenth of its releases 2 ms late, or one "
            f"100 ms late) ({parts}). Their figures are the testbed's, not the architecture's: "
            f"they are left out of every statistic and comparison below; sessions.csv names "
            f"what lagged (saturated_by), and the Calibration section where the host's CPU went "
            f"while the calls ran.")


def lead(results: Results, stats: Stats) -> str:
    """The sentence that frames the findings (or says why there are none)."""
    baseline = results.baseline
    if results.target:
        return (f"This run measured the deployment at {results.target} from this host's "
                f"clients: one edge, nothing to compare it with; the statistics below describe "
                f"it alone, as that network path delivers it.")
    if baseline not in results.architectures:
        return (f"This run has no sessions of the baseline ({baseline}), so it compares "
                f"nothing; the statistics below describe each architecture alone.")
    others = [a for a in results.architectures if a != baseline]
    if not others:
        return f"This run has only the baseline ({baseline}): nothing to compare it with."
    if _all_saturated(stats):
        return ("Host saturated: every successful session of this run was measured while a "
                "process on its path lagged, so its figures are the testbed's and this report "
                "compares nothing. Run fewer sessions per region or a lower start rate "
                "(docs/benchmarks.md: what this machine carries).")
    b = stats.bootstrap
    regions = (" (within each client region, averaged over them)"
               if len(results.client_regions) > 1 else "")
    return (f"Each architecture against {baseline}: the difference of the medians over "
            f"successful sessions measured while the host kept up{regions}, with its {b.level:.0%} bootstrap CI "
            f"({b.resamples} resamples, seed {b.seed}). A difference is stated only when its "
            f"CI excludes zero; with {len(HEADLINE)} metrics per architecture, about one in "
            f"twenty such statements can be chance.")
