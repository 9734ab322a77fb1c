"""The run summary and the derived files of a results folder, from the folder's files alone.

``finalize(dir)`` is what the runner calls after each architecture and at the end: it writes
``stats.csv`` and ``stats.json`` (every percentile with its CI, per architecture and client
region, the pooled ``all`` rows, success with its Wilson interval, the differences from the
baseline), ``summary.json``, a per-session ``mos`` column in ``sessions.csv``, and, for a run
with faults, ``faults.csv`` (analysis/faults.py); it returns the summary. ``summarise(dir)``
only computes the summary. Both work on a partial folder (an interrupted or failed run): the
summary's ``missing`` says what is absent.
"""
from __future__ import annotations

import csv
import math
import os
from pathlib import Path

import pandas as pd

from analysis import verification
from analysis.clients import TIMELINE, groups
from analysis.faults import fault_rows, write_faults_csv
from analysis.jsonout import dumps, plain
from analysis.load import Results, load_results
from analysis.mos import EModel
from analysis.stats import ALL, METRIC_BY_NAME, OVER_FLOOR, PERCENTILES, Bootstrap, Stats, \
    compute_stats, percentile, thin_tail

# The metrics of the summary (p50 and p95 each) and of its differences from the baseline.
SUMMARY_METRICS = ("setup_ms", "first_ice_rtt_ms", "signaling_ms", "first_audio_ms", "rtt_ms",
                   "jitter_ms", "loss_pct")
STATS_FIELDS = ("architecture", "client_region", "metric", "statistic", "value", "ci_lo",
                "ci_hi", "n", "thin_tail")
_DIGITS = 2


def _r(value, ndigits: int = _DIGITS):
    return plain(value, ndigits)


def _percentile_entry(stats: Stats, arch: str, metric: str, qs=(50, 95)) -> dict:
    row = stats.row(arch, metric)
    entry: dict = {"n": 0 if row is None else int(row.n)}
    for q in qs:
        have = row is not None and row.n
        entry[f"p{q}"] = _r(row[f"p{q}"]) if have else None
        entry[f"p{q}_ci"] = [_r(row[f"p{q}_lo"]), _r(row[f"p{q}_hi"])] if have else None
    return entry


def _count(value) -> int | None:
    return None if value is None or pd.isna(value) else int(value)


def _ports(results: Results) -> dict[str, dict]:
    """Per architecture, ports.csv's counts (public_udp_ports_max when the run recorded it)."""
    out = {}
    for _, row in results.ports.iterrows():
        entry = {"public_udp_ports": _count(row.get("public_udp_ports")),
                 "peak_sessions": _count(row.get("concurrent_sessions"))}
        if "public_udp_ports_max" in row:
            entry["public_udp_ports_max"] = _count(pd.to_numeric(row["public_udp_ports_max"],
                                                                 errors="coerce"))
        out[str(row.architecture)] = entry
    return out


def _architecture(stats: Stats, arch: str, ports: dict, timings: dict) -> dict:
    s = stats.success_row(arch)
    ok = stats.sessions[(stats.sessions.architecture == arch) & stats.sessions.measured]
    seconds = (timings.get("architectures") or {}).get(arch)
    entry = {"sessions": int(s.sessions), "ok": int(s.ok),
             "saturated": int(s.saturated),  # ok sessions left out: the host lagged
             "success_pct": _r(s.success_pct, 1),
             "success_ci": [_r(s.success_lo, 1), _r(s.success_hi, 1)],
             "public_udp_ports": None, "peak_sessions": None,
             "seconds": seconds.get("seconds") if isinstance(seconds, dict) else seconds}
    entry.update(ports.get(arch, {}))
    for metric in SUMMARY_METRICS + tuple(OVER_FLOOR):
        entry[metric] = _percentile_entry(stats, arch, metric)
    entry["mos"] = _percentile_entry(stats, arch, "mos", (50, 5))
    entry["floor_setup_ms_p50"] = percentile(ok["floor_setup_ms"], 50, _DIGITS)
    return entry


def _vs_baseline(stats: Stats, arch: str, baseline: str) -> tuple[dict, dict]:
    """p50 minus the baseline's p50 per metric, and its bootstrap CI (0 for the baseline)."""
    diffs, cis = {}, {}
    for metric in SUMMARY_METRICS:
        if arch == baseline:
            diffs[metric], cis[metric] = 0.0, [0.0, 0.0]
            continue
        d = stats.difference(arch, baseline, metric)
        diffs[metric] = _r(d.estimate)
        cis[metric] = None if math.isnan(d.lo) else [_r(d.lo), _r(d.hi)]
    return diffs, cis


def summary_of(results: Results, stats: Stats) -> dict:
    """The summary of a loaded run whose statistics are computed (see ``summarise``)."""
    baseline = results.baseline
    timings = results.timings
    ports = _ports(results)
    out = {"directory": str(results.path), "backend": results.config.get("backend"),
           "target": results.target,
           "client_regions": results.config.get("client_regions") or results.client_regions,
           "clusters": results.config.get("clusters", []),
           "calibration_ok": bool(results.calibration.get("ok", False)),
           "calibration_at_load_ok": {arch: bool(c.get("ok")) for arch, c
                                      in results.calibration_at_load.items()},
           "timings": timings, "baseline": baseline,
           "planned_architectures": results.planned_architectures,
           "complete": results.complete,
           "missing": {"architectures": results.missing_architectures,
                       "files": results.missing_files},
           "bootstrap": {"resamples": stats.bootstrap.resamples, "level": stats.bootstrap.level,
                         "seed": stats.bootstrap.seed},
           "architectures": {}}
    has_baseline = baseline in results.architectures
    for arch in results.architectures:
        entry = _architecture(stats, arch, ports, timings)
        if has_baseline:
            entry["vs_baseline_p50"], entry["vs_baseline_p50_ci"] = _vs_baseline(
                stats, arch, baseline)
        out["architectures"][arch] = entry
    out["clients"] = client_types(results)
    out["verification"] = verification.summary(results)
    if results.faults:
        out["faults"] = fault_rows(results)
    return out


def client_types(results: Results) -> dict:
    """Per architecture, client type and offer style: sessions, ok, saturated (of the ok) and
    the setup timeline's medians over the ok, unsaturated sessions (analysis/clients.py)."""
    out: dict = {}
    for arch, client, offer, group, ok, used in groups(results):
        entry = {"sessions": len(group), "ok": len(ok), "saturated": len(ok) - len(used)}
        entry.update({f"{column}_p50": percentile(used[column], 50, _DIGITS)
                      for column, _ in TIMELINE})
        out.setdefault(arch, {}).setdefault(client, {})[offer] = entry
    return out


def summarise(directory: str | Path, boot: Bootstrap = Bootstrap(),
              model: EModel = EModel()) -> dict:
    """Per architecture: sessions, ok, success_pct (Wilson CI), public_udp_ports,
    peak_sessions, seconds; p50/p95 (with CIs) of each metric and of the overhead above the
    floor; floor_setup_ms_p50; vs_baseline_p50 (with CIs). Reads only the results folder."""
    results = load_results(directory, require_sessions=False)
    return summary_of(results, compute_stats(results, boot, model))


def stats_rows(results: Results, stats: Stats) -> list[dict]:
    """The rows of stats.csv: every percentile of every metric per (architecture, client
    region), success per group, and the pooled p50 differences from the baseline."""
    rows = []
    for _, s in stats.success.iterrows():
        rows.append({"architecture": s.architecture, "client_region": s.client_region,
                     "metric": "success_pct", "statistic": "rate", "value": s.success_pct,
                     "ci_lo": s.success_lo, "ci_hi": s.success_hi, "n": s.sessions,
                     "thin_tail": False})
    for _, m in stats.metrics.iterrows():
        for q in PERCENTILES:
            rows.append({"architecture": m.architecture, "client_region": m.client_region,
                         "metric": m.metric, "statistic": f"p{q}", "value": m[f"p{q}"],
                         "ci_lo": m[f"p{q}_lo"], "ci_hi": m[f"p{q}_hi"], "n": m.n,
                         "thin_tail": bool(m.n) and thin_tail(int(m.n), q)})
    baseline = results.baseline
    if baseline in results.architectures:
        for arch in results.architectures:
            if arch == baseline:
                continue
            for metric in SUMMARY_METRICS + tuple(OVER_FLOOR) + ("mos",):
                d = stats.difference(arch, baseline, metric)
                rows.append({"architecture": arch, "client_region": ALL, "metric": metric,
                             "statistic": f"p50 - {baseline} p50", "value": d.estimate,
                             "ci_lo": d.lo, "ci_hi": d.hi, "n": d.n_a, "thin_tail": False})
    return [plain(r, 4) for r in rows]


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _write_stats(directory: Path, results: Results, stats: Stats, rows: list[dict]) -> None:
    tmp = directory / ".stats.csv.tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=STATS_FIELDS)
        w.writeheader()
        w.writerows({k: "" if r[k] is None else r[k] for k in STATS_FIELDS} for r in rows)
    os.replace(tmp, directory / "stats.csv")
    b = stats.bootstrap
    _write_atomic(directory / "stats.json", dumps({
        "percentiles": "numpy 'linear' (Hyndman & Fan type 7); metrics over successful sessions",
        "ci": f"{b.level:.0%} percentile bootstrap over sessions, stratified by client region",
        "success_ci": "Wilson score interval",
        "bootstrap": {"resamples": b.resamples, "level": b.level, "seed": b.seed},
        "baseline": results.baseline, "units": {m: METRIC_BY_NAME[m].unit for m in METRIC_BY_NAME},
        "rows": rows}))


def _add_mos_column(path: Path, stats: Stats) -> None:
    """Rewrite sessions.csv with a ``mos`` column (last), keeping every other column as is."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        fields = [c for c in (reader.fieldnames or []) if c != "mos"]
        rows = list(reader)
    mos = stats.sessions["mos"].tolist()
    if len(rows) != len(mos):
        raise ValueError(f"{path}: {len(rows)} rows read, {len(mos)} analysed")
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields + ["mos"], extrasaction="ignore")
        w.writeheader()
        for row, value in zip(rows, mos):
            row["mos"] = "" if value is None or math.isnan(value) else f"{value:.3f}"
            w.writerow(row)
    os.replace(tmp, path)


def finalize(directory: str | Path, boot: Bootstrap = Bootstrap(),
             model: EModel = EModel()) -> dict:
    """Write stats.csv, stats.json, summary.json, sessions.csv's ``mos`` column and (when
    faults.json exists) faults.csv; return the summary. Safe to call again as the run goes on
    (each call rewrites the derived files)."""
    directory = Path(directory)
    results = load_results(directory, require_sessions=False)
    stats = compute_stats(results, boot, model)
    _write_stats(directory, results, stats, stats_rows(results, stats))
    summary = summary_of(results, stats)
    if (directory / "turns.csv").is_file():  # conversations: what the callers heard
        from analysis import conversation
        conversation.score(directory)
        summary["conversation"] = conversation.summary(directory, results.baseline, boot)
    _write_atomic(directory / "summary.json", dumps(summary))
    if (directory / "sessions.csv").is_file():
        _add_mos_column(directory / "sessions.csv", stats)
    if (directory / "faults.json").is_file():
        write_faults_csv(directory, summary.get("faults", []))
    return summary
