"""What moved between two runs: per architecture and metric, p50 and p95 with their CIs.

A change is flagged when the two 95% intervals do not overlap (a conservative test: disjoint
95% intervals mean a difference well beyond the 5% level) and, for a tail percentile, both
runs have at least 10 sessions beyond it (stats.thin_tail): a tail CI from fewer is too narrow
and would flag noise.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.jsonout import plain
from analysis.load import Results, load_results
from analysis.stats import METRIC_BY_NAME, Bootstrap, Stats, compute_stats, thin_tail
from analysis.tables import Table, fmt, to_markdown

COMPARED = ("setup_ms", "setup_over_floor_ms", "first_ice_rtt_ms", "signaling_ms",
            "first_audio_ms", "rtt_ms", "jitter_ms", "loss_pct", "mos")
_CONFIG_KEYS = (("client regions", ("client_regions",)), ("clusters", ("clusters",)),
                ("backend", ("backend",)), ("scenario", ("scenario", "name")),
                ("sessions per region", ("scenario", "sessions_per_region")),
                ("Chromium sessions per region", ("scenario", "chromium_per_region")),
                ("call duration", ("scenario", "call_duration_s")),
                ("start rate", ("scenario", "start_rate")),
                ("last mile", ("scenario", "last_mile")),
                ("profile overrides", ("scenario", "profiles")),
                ("impairments", ("impairments",)), ("commit", ("commit",)))


def verdict(old_lo: float, old_hi: float, new_lo: float, new_hi: float,
            higher_is_better: bool = False) -> str:
    """'regression', 'improvement', or '' when the intervals overlap (or one is missing)."""
    if any(pd.isna(v) for v in (old_lo, old_hi, new_lo, new_hi)):
        return ""
    if new_lo > old_hi:
        return "improvement" if higher_is_better else "regression"
    if new_hi < old_lo:
        return "regression" if higher_is_better else "improvement"
    return ""


def compare_stats(old: Stats, new: Stats, architectures: list[str]) -> pd.DataFrame:
    """A row per (architecture, metric, statistic): old and new estimates, CIs, delta, verdict."""
    rows = []
    for arch in architectures:
        so, sn = old.success_row(arch), new.success_row(arch)
        if so is not None and sn is not None:
            rows.append({"architecture": arch, "metric": "success_pct", "statistic": "rate",
                         "old": so.success_pct, "old_lo": so.success_lo, "old_hi": so.success_hi,
                         "new": sn.success_pct, "new_lo": sn.success_lo, "new_hi": sn.success_hi,
                         "verdict": verdict(so.success_lo, so.success_hi, sn.success_lo,
                                            sn.success_hi, higher_is_better=True)})
        for metric in COMPARED:
            ro, rn = old.row(arch, metric), new.row(arch, metric)
            if ro is None or rn is None:
                continue
            for q in (50, METRIC_BY_NAME[metric].tail[1]):  # p50 and p95 (MOS: p5)
                lo_o, hi_o, lo_n, hi_n = (ro[f"p{q}_lo"], ro[f"p{q}_hi"], rn[f"p{q}_lo"],
                                          rn[f"p{q}_hi"])
                thin = thin_tail(int(ro.n), q) or thin_tail(int(rn.n), q)
                rows.append({"architecture": arch, "metric": metric, "statistic": f"p{q}",
                             "old": ro[f"p{q}"], "old_lo": lo_o, "old_hi": hi_o,
                             "new": rn[f"p{q}"], "new_lo": lo_n, "new_hi": hi_n,
                             "verdict": "thin tail" if thin else verdict(
                                 lo_o, hi_o, lo_n, hi_n, METRIC_BY_NAME[metric].higher_is_better)})
    frame = pd.DataFrame(rows, columns=["architecture", "metric", "statistic", "old", "old_lo",
                                        "old_hi", "new", "new_lo", "new_hi", "verdict"])
    frame["delta"] = frame["new"] - frame["old"]
    return frame


def _config_value(config: dict, path: tuple[str, ...]):
    for key in path:
        config = config.get(key) if isinstance(config, dict) else None
    return config


def config_differences(old: Results, new: Results) -> list[str]:
    """Settings that differ between the runs: they may explain a change."""
    show = lambda v: ", ".join(map(str, v)) if isinstance(v, list) else str(v)  # noqa: E731
    out = []
    for label, path in _CONFIG_KEYS:
        a, b = _config_value(old.config, path), _config_value(new.config, path)
        if a == b or (path[-1] == "chromium_per_region" and not a and not b):
            continue  # runs from before browsers had none
        out.append("impairments: the emulated paths differ" if label == "impairments"
                   else f"{label}: {show(a)} -> {show(b)}")
    return out


def _label(metric: str) -> str:
    if metric == "success_pct":
        return "success (%)"
    m = METRIC_BY_NAME[metric]
    return f"{m.label} ({m.unit})" if m.unit else m.label


def _estimate(value, lo, hi, metric: str) -> str:
    return f"{fmt(value, metric)} [{fmt(lo, metric)}, {fmt(hi, metric)}]"


def _frame(old: Results, new: Results, boot: Bootstrap) -> pd.DataFrame:
    archs = [a for a in old.architectures if a in new.architectures]
    return compare_stats(compute_stats(old, boot), compute_stats(new, boot), archs)


def compare_data(old: Results, new: Results, boot: Bootstrap = Bootstrap()) -> dict:
    """The comparison of two loaded runs as plain data (``voiceedge report --compare --json``)."""
    frame = _frame(old, new, boot)
    rows = [{k: plain(v) for k, v in r.items()} for r in frame.to_dict("records")]
    return {"old": str(old.path), "new": str(new.path),
            "only_in_one_run": sorted(set(old.architectures) ^ set(new.architectures)),
            "incomplete": {"old": old.missing_text(), "new": new.missing_text()},
            "configuration_differences": config_differences(old, new),
            "bootstrap": {"resamples": boot.resamples, "level": boot.level, "seed": boot.seed},
            "changes": [r for r in rows if r["verdict"] in ("regression", "improvement")],
            "statistics": rows}


def compare_text(old: Results, new: Results, boot: Bootstrap = Bootstrap()) -> str:
    """The comparison of two loaded runs as Markdown."""
    frame = _frame(old, new, boot)
    lines = [f"# {new.name} vs {old.name}", "",
             f"old: `{old.path}` · new: `{new.path}`", ""]
    only = sorted(set(old.architectures) ^ set(new.architectures))
    if only:
        lines += [f"Architectures in one run only (not compared): {', '.join(only)}", ""]
    for label, run in (("old", old), ("new", new)):
        if run.missing_text():
            lines += [f"The {label} run is incomplete: {run.missing_text()}.", ""]
    diffs = config_differences(old, new)
    if diffs:
        lines += ["Configuration differences (may explain changes):", ""]
        lines += [f"- {d}" for d in diffs] + [""]
    flagged = frame[frame.verdict.isin(("regression", "improvement"))]
    if flagged.empty:
        lines += ["**No change**: every compared interval overlaps its counterpart.", ""]
    else:
        lines += [f"**{len(flagged)} change(s)** (95% CIs do not overlap):", ""]
        for _, r in flagged.iterrows():
            lines.append(f"- {r.verdict.upper()}: {r.architecture} {_label(r.metric)} "
                         f"{r.statistic} {fmt(r.old, r.metric)} -> {fmt(r.new, r.metric)} "
                         f"({r.delta:+.3g})")
        lines.append("")
    table = Table(["architecture", "metric", "stat", "old [95% CI]", "new [95% CI]", "Δ",
                   "change"],
                  note="Percentiles: numpy 'linear'; CIs: percentile bootstrap over sessions "
                       f"({boot.resamples} resamples, seed {boot.seed}); success: Wilson.")
    for _, r in frame.iterrows():
        table.rows.append([r.architecture, _label(r.metric), r.statistic,
                           _estimate(r.old, r.old_lo, r.old_hi, r.metric),
                           _estimate(r.new, r.new_lo, r.new_hi, r.metric),
                           "-" if pd.isna(r.delta) else f"{r.delta:+.3g}",
                           r.verdict or "-"])
    if (frame.verdict == "thin tail").any():
        table.note += (" 'thin tail': fewer than 10 sessions beyond the percentile in a run, "
                       "not flagged.")
    lines += ["## All compared statistics", "", to_markdown(table)]
    return "\n".join(lines)


def compare(old_dir: str | Path, new_dir: str | Path, boot: Bootstrap = Bootstrap()) -> str:
    """What moved between two results folders, as Markdown (ResultsError for a bad folder)."""
    return compare_text(load_results(old_dir), load_results(new_dir), boot)


def compare_json(old_dir: str | Path, new_dir: str | Path, boot: Bootstrap = Bootstrap()
                 ) -> dict:
    """What moved between two results folders, as plain data (see ``compare_data``)."""
    return compare_data(load_results(old_dir), load_results(new_dir), boot)
