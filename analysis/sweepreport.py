"""The sweep's report: sweep_stats.csv, sweep_summary.json, plots/sweep_*.png (and the heat
maps of a two-parameter sweep), sweep_report.html and sweep_report.md, from a sweep folder's
analysis (analysis/sweep.py; docs/sweeps.md, "Reading a sweep").
"""
from __future__ import annotations

import csv
import html
import math
import os
from dataclasses import dataclass
from pathlib import Path

from analysis.jsonout import dumps
from analysis.mos import EModel
from analysis.stats import METRIC_BY_NAME, Bootstrap
from analysis.sweep import (SWEEP_METRICS, Sweep, SweepAnalysis, analyse_sweep,
                            calibration_status, measuring_limits, point_sessions,
                            warnings)
from analysis.tables import Table, fmt, to_html, to_markdown


def points_table(analysis: SweepAnalysis) -> Table:
    s = analysis.sweep
    table = Table(["point", *(p.label for p in s.parameters), "status", "calibration",
                   "calibration at load", "architectures in the order run", "seconds", "note"],
                  note="Only measured points (status 'measured' or 'failed') are analysed. "
                       "Calibration: the point's world measured against its configuration "
                       "before any call; at load: again while each architecture's calls ran.")
    for p in s.points:
        at_load = "-"
        if p.analysed and p.results.calibration_at_load:
            failed = [a for a, c in p.results.calibration_at_load.items() if not c.get("ok")]
            at_load = "FAILED: " + ", ".join(failed) if failed else "passed"
        table.rows.append([p.id, *(q.show(p.values[q.name]) for q in s.parameters), p.status,
                           calibration_status(p, s), at_load, ", ".join(p.order) or "-",
                           "-" if p.seconds is None else f"{p.seconds:.0f}",
                           p.problem or p.error or ""])
    return table


def sessions_table(analysis: SweepAnalysis) -> Table:
    """Saturated sessions per point: ok/sessions and how many of the ok ones were left out."""
    s = analysis.sweep
    table = Table(["point", *(p.label for p in s.parameters), *s.architectures],
                  note="ok/sessions; saturated: successful sessions measured while a process "
                       "on their path lagged, left out of every statistic.")
    for p in s.analysed_points:
        counts = point_sessions(p.results)
        cells = []
        for a in s.architectures:
            n = counts.get(a)
            cells.append("-" if n is None else f"{n['ok']}/{n['sessions']}"
                         + (f", {n['saturated']} saturated" if n["saturated"] else ""))
        table.rows.append([p.id, *(q.show(p.values[q.name]) for q in s.parameters), *cells])
    return table


def measuring_table(analysis: SweepAnalysis) -> Table:
    """Per architecture and point: the peak live sessions, saturated sessions and calibration
    at load; and the last point where the testbed still measured the network."""
    s = analysis.sweep
    points = s.analysed_points
    table = Table(["architecture", *(f"{p.id} ({s.where(p)})" for p in points),
                   "measures the network up to"],
                  note="Each cell: live sessions at the peak while the world was probed at "
                       "load (mean); saturated sessions; calibration at load. The testbed "
                       "stops measuring the network at the first point with a saturated "
                       "session or a failed calibration at load.")
    for limit in measuring_limits(s):
        by_point = {st.point: st for st in limit.steps}
        cells = []
        for p in points:
            st = by_point.get(p.id)
            if st is None:
                cells.append("-")
                continue
            live = "-" if st.live_max is None else f"{st.live_max} live ({st.live_mean:g})"
            cal = {None: "no calibration at load", True: "held", False: "FAILED"}[
                st.calibration_ok]
            cells.append(f"{live}; {st.saturated} saturated; {cal}")
        last, off = limit.last_clean, limit.first_off
        if off is None:
            upto = f"every point (to {last.point}, {last.live_max} live)" if last else "-"
        elif last is None:
            upto = f"no point (off from {off.point})"
        else:
            upto = f"{last.point}, {last.live_max} live at the peak (off from {off.point})"
        table.rows.append([limit.architecture, *cells, upto])
    return table


def crossover_table(analysis: SweepAnalysis) -> Table:
    label = analysis.sweep.parameters[0].label
    table = Table(["metric", "architecture", "state at each point", "changes between points",
                   "estimate crosses zero", "CI includes zero"],
                  note=f"Against {analysis.sweep.baseline}, along {label}; "
                       f"{analysis.family.text()}; none: not both. A crossover: significantly "
                       f"better at one value and significantly worse at another; the "
                       f"estimate's zero is interpolated linearly inside it.")
    for c in analysis.crossovers:
        states = ", ".join(f"{c.parameter.show(x)} {s}" for x, s in zip(c.xs, c.states))
        table.rows.append([METRIC_BY_NAME[c.metric].label, c.architecture, states or "-",
                           c.changes(), c.zero_text(), c.span_text()])
    return table


def medians_table(analysis: SweepAnalysis, metric: str) -> Table:
    s = analysis.sweep
    others = [a for a in s.architectures if a != s.baseline]
    table = Table(["point", *(p.label for p in s.parameters),
                   *(f"{a} p50 [CI]" for a in s.architectures),
                   *(f"Δ {a} [CI]" for a in others)],
                  note=f"p50 [95% bootstrap CI]; Δ: the median minus {s.baseline}'s (within "
                       f"each client region, averaged), * where its CI excludes zero.")
    for p in s.analysed_points:
        row = [p.id, *(q.show(p.values[q.name]) for q in s.parameters)]
        for a in s.architectures:
            c = analysis.cell(p.id, a, metric)
            row.append("-" if c is None or not c.n else
                       f"{fmt(c.p50, metric)} [{fmt(c.lo, metric)}, {fmt(c.hi, metric)}]")
        for a in others:
            c = analysis.cell(p.id, a, metric)
            d = c.diff if c is not None else None
            row.append("-" if d is None or math.isnan(d.estimate) else
                       f"{d.estimate:+.{_digits(metric)}f} [{d.lo:+.{_digits(metric)}f}, "
                       f"{d.hi:+.{_digits(metric)}f}]" + ("*" if d.significant else ""))
        table.rows.append(row)
    return table


def _digits(metric: str) -> int:
    return 2 if metric in ("mos", "loss_pct") else 1


def _method(analysis: SweepAnalysis) -> list[str]:
    from analysis.report import _method as run_method

    f = analysis.family
    return run_method(analysis.bootstrap, analysis.model) + [
        "Each point is a run of its own: every architecture in the same world, the world "
        "calibrated again at the point (a point that does not calibrate measures nothing), the "
        "architectures in an order rotated from point to point (sweep.json's order).",
        "A point's figures are the medians over its successful sessions measured while the host "
        "kept up (saturated sessions are counted, never used); better means lower, but higher "
        "for MOS.",
        f"Multiple comparisons: the report makes {f.comparisons} comparisons with the baseline "
        f"(points x architectures x metrics). Each difference's p-value comes from its "
        f"bootstrap standard error; Holm's step-down adjustment over all of them keeps the "
        f"chance of even one false 'significantly better/worse' in this report at "
        f"{f.alpha:.0%}. A difference smaller than its metric's practical margin ("
        + ", ".join(f"{m} {v:g}" for m, v in f.margins.items())
        + ") is 'no significant difference' however small its p-value.",
        "Crossover (a sweep of one numeric parameter): only where the architecture is "
        "significantly better at one value and significantly worse at another (points without "
        "a significant difference between them skipped); the difference's estimate is then "
        "interpolated linearly for where it crosses zero between them. A change between "
        "'no significant difference' and better or worse is an onset, not a crossover; the "
        "table lists every state.",
        "Points whose status is 'measured' or 'failed' (measured, with an architecture below "
        "min_success_pct) are analysed; 'not calibrated' and 'pending' points are listed, "
        "never plotted or used.",
    ]


def _title(s: Sweep) -> str:
    return (f"voiceedge sweep: {s.scenario} — clients in {s.region}, "
            + " x ".join(f"{p.label} {', '.join(p.show(v) for v in p.values)}"
                         for p in s.parameters))


def _meta(s: Sweep) -> str:
    first = next((p.results for p in s.analysed_points), None)
    commit = (first.config.get("commit") if first else None) or "-"
    return (f"{s.name} · baseline {s.baseline} · architectures {', '.join(s.architectures)} · "
            f"{len(s.analysed_points)} of {len(s.points)} points measured · commit {commit}")


def render_html(analysis: SweepAnalysis, plots: dict[str, Path]) -> str:
    from analysis.report import _CSS, _img
    from analysis.sweepplots import caption, intro

    e, s = html.escape, analysis.sweep
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>"
             f"{e(_title(s))}</title><style>{_CSS}</style></head><body>",
             f"<h1>{e(_title(s))}</h1>", f"<p class='meta'>{e(_meta(s))}</p>"]
    found = warnings(analysis)
    if found:
        parts.append("<div class='warn'>" + "".join(f"<p>{e(w)}</p>" for w in found) + "</div>")
    parts.append("<h2 id='crossovers'>Where an advantage stops being significant</h2>")
    if analysis.crossovers:
        parts.append("<ul>" + "".join(f"<li>{e(line)}</li>" for line in _crossings(analysis))
                     + "</ul>")
        parts.append(to_html(crossover_table(analysis)))
    else:
        parts.append(f"<p>{e(_no_crossovers(s))}</p>")
    parts += ["<h2 id='points'>Parameters and points</h2>", to_html(points_table(analysis)),
              "<h2 id='sessions'>Sessions per point</h2>", to_html(sessions_table(analysis)),
              "<h2 id='measuring'>Where the testbed stops measuring</h2>",
              to_html(measuring_table(analysis)),
              "<h2 id='plots'>Plots</h2>", f"<p>{e(intro(analysis))}</p>"]
    for name, path in plots.items():
        parts.append(f"<figure id='{e(name)}'>{_img(path)}<figcaption>"
                     f"{e(caption(name, analysis))}</figcaption></figure>")
    parts.append("<h2 id='conclusions'>At each point</h2>")
    for p in s.analysed_points:
        items = "".join(f"<li>{e(c.sentence())}</li>" for c in analysis.conclusions()
                        if c.point == p.id)
        parts.append(f"<h3>{e(p.id)}: {e(s.where(p))}</h3><ul>{items}</ul>")
    parts.append("<h2 id='medians'>Medians per point</h2>")
    for metric in SWEEP_METRICS:
        info = METRIC_BY_NAME[metric]
        parts += [f"<details><summary>{e(info.label)}"
                  f"{e(f' ({info.unit})' if info.unit else '')}</summary>",
                  to_html(medians_table(analysis, metric)), "</details>"]
    parts.append("<h2 id='method'>Method</h2><ul>")
    parts += [f"<li>{e(line)}</li>" for line in _method(analysis)]
    parts.append("</ul></body></html>")
    return "\n".join(parts)


def _crossings(analysis: SweepAnalysis) -> list[str]:
    """The crossovers that happen, in words (or that none does)."""
    found = [c.sentence() for c in analysis.crossovers if c.crossings]
    return found or [f"No crossover: no architecture is significantly better than "
                     f"{analysis.sweep.baseline} at one value and significantly worse at "
                     f"another, for any metric ({analysis.family.comparisons} comparisons, "
                     f"Holm-adjusted, with practical margins): see the table."]


def _no_crossovers(s: Sweep) -> str:
    if len(s.parameters) == 2:
        return ("Two parameters: see each architecture's MOS heat map and the figure of each "
                "metric below; crossovers are computed along one numeric parameter only.")
    return (f"{s.parameters[0].label}'s values are not numbers: the points have no order to "
            f"cross over in; see each point's conclusions below.")


def render_markdown(analysis: SweepAnalysis, plots: dict[str, Path], base: Path) -> str:
    from analysis.sweepplots import caption, intro

    s = analysis.sweep
    lines = [f"# {_title(s)}", "", f"`{_meta(s)}`", ""]
    for w in warnings(analysis):
        lines += [f"> **Warning:** {w}", ""]
    lines += ["## Where an advantage stops being significant", ""]
    if analysis.crossovers:
        lines += [f"- {line}" for line in _crossings(analysis)] + [""]
        lines += [to_markdown(crossover_table(analysis))]
    else:
        lines += [_no_crossovers(s), ""]
    lines += ["## Parameters and points", "", to_markdown(points_table(analysis)),
              "## Sessions per point", "", to_markdown(sessions_table(analysis)),
              "## Where the testbed stops measuring", "", to_markdown(measuring_table(analysis)), "## Plots", "",
              intro(analysis), ""]
    for name, path in plots.items():
        rel = path.relative_to(base) if path.is_relative_to(base) else path
        lines += [f"![{name}]({rel.as_posix()})", "",
                  f"_{caption(name, analysis)}_", ""]
    lines += ["## At each point", ""]
    for p in s.analysed_points:
        lines += [f"**{p.id}: {s.where(p)}**", ""]
        lines += [f"- {c.sentence()}" for c in analysis.conclusions() if c.point == p.id] + [""]
    lines += ["Medians per point: `sweep_report.html` and `sweep_stats.csv`.", "", "## Method",
              ""]
    lines += [f"- {line}" for line in _method(analysis)]
    return "\n".join(lines) + "\n"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_stats(analysis: SweepAnalysis, out_dir: Path) -> Path:
    names = [p.name for p in analysis.sweep.parameters]
    fields = ["point", *names, "architecture", "metric", "p50", "lo", "hi", "n", "saturated",
              "diff", "diff_lo", "diff_hi"]
    path, tmp = out_dir / "sweep_stats.csv", out_dir / ".sweep_stats.csv.tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows({k: "" if r[k] is None else r[k] for k in fields}
                    for r in analysis.stats_rows())
    os.replace(tmp, path)
    return path


@dataclass
class SweepWritten:
    """A written sweep report and what it was computed from."""

    analysis: SweepAnalysis
    paths: dict[str, Path]  # html, markdown, stats, summary

    def to_dict(self) -> dict:
        return {"sweep": str(self.analysis.sweep.path),
                "report": {k: str(v) for k, v in self.paths.items()},
                "summary": self.analysis.summary()}


def sweep_report(directory: str | Path, out_dir: str | Path | None = None,
                 boot: Bootstrap = Bootstrap(), model: EModel = EModel()) -> SweepWritten:
    """Write sweep_stats.csv, sweep_summary.json, plots/sweep_*.png, sweep_report.html and
    sweep_report.md (into the sweep folder by default)."""
    from analysis.sweepplots import write_sweep_plots

    analysis = analyse_sweep(directory, boot, model)
    out = Path(out_dir) if out_dir is not None else analysis.sweep.path
    out.mkdir(parents=True, exist_ok=True)
    stats_path = write_stats(analysis, out)
    summary_path = out / "sweep_summary.json"
    _write_atomic(summary_path, dumps(analysis.summary()))
    plots = write_sweep_plots(analysis, out / "plots")
    html_path, md_path = out / "sweep_report.html", out / "sweep_report.md"
    _write_atomic(html_path, render_html(analysis, plots))
    _write_atomic(md_path, render_markdown(analysis, plots, out))
    return SweepWritten(analysis, {"html": html_path, "markdown": md_path,
                                   "stats": stats_path, "summary": summary_path})


def write_sweep_report(directory: str | Path, out_dir: str | Path | None = None,
                       boot: Bootstrap = Bootstrap(), model: EModel = EModel()
                       ) -> dict[str, Path]:
    """``sweep_report(...)``'s paths: html, markdown, stats, summary."""
    return sweep_report(directory, out_dir, boot, model).paths
