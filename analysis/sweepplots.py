"""The sweep report's figures (matplotlib, Agg canvas, no pyplot state; analysis/plots.py's
style and colours). Each ``plot_*`` writes one PNG and returns its path; each ``*_figure``
builds the figure alone (the tests read its artists)."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from analysis.plots import DPI, _figure
from analysis.stats import METRIC_BY_NAME
from analysis.sweep import SWEEP_METRICS, SweepAnalysis
from analysis.tables import fmt

_SKIPPED = "0.45"  # the colour of points that were not analysed


def intro(analysis: SweepAnalysis) -> str:
    """What every metric figure shows (the report says it once, above them)."""
    return (f"Per metric, top: the median per architecture at each measured point, band its 95% "
            f"bootstrap CI. Bottom: the difference from {analysis.sweep.baseline}'s median, band "
            f"its CI; filled dots where the CI excludes zero. Shaded spans: between the measured "
            f"points where an architecture's state against the baseline (better, no significant "
            f"difference, worse) changes; dashed: where the difference's estimate crosses zero "
            f"(interpolated). Points not measured are named in grey at the bottom, with no "
            f"value.")


def caption(name: str, analysis: SweepAnalysis) -> str:
    """The report's caption of a figure, by its name."""
    if name.startswith("heatmap_"):
        return (f"Each cell a point: {name.rsplit('_', 1)[-1]}'s median MOS minus "
                f"{analysis.sweep.baseline}'s (within each client region, averaged), with its "
                f"95% CI. Hatched, 'n.s.': the CI includes zero. Blank: the point was not "
                f"analysed (its status in the cell).")
    info = METRIC_BY_NAME[name.removeprefix("sweep_")]
    return f"{info.label}" + (f" ({info.unit})" if info.unit else "") + \
        f" along {analysis.sweep.parameters[0].label}."


def _subtitle(analysis: SweepAnalysis) -> str:
    s = analysis.sweep
    first = next((p.results for p in s.analysed_points), None)
    regions = ", ".join(first.client_regions) if first else s.region
    return (f"clients in {regions} · {len(s.analysed_points)} of {len(s.points)} points "
            f"measured · baseline {s.baseline}")


def _save(fig: Figure, out_dir: Path, name: str, analysis: SweepAnalysis) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    s = analysis.sweep
    first = next((p.results for p in s.analysed_points), None)
    commit = first.config.get("commit") if first else None
    fig.get_layout_engine().set(rect=(0, 0.03, 1, 0.97))
    fig.text(0.998, 0.003, s.name + (f" @ {commit}" if commit else ""), ha="right",
             va="bottom", fontsize=6, color="0.45")
    path = out_dir / f"{name}.png"
    fig.savefig(path, dpi=DPI, facecolor="white")
    return path


# ------------------------------------------------------------------ a metric along the sweep

def _panel(analysis: SweepAnalysis, metric: str, top, bottom, fixed) -> None:
    s = analysis.sweep
    archs, x_param = s.architectures, s.parameters[0]
    for arch in archs:
        pts = analysis.series(arch, metric, fixed)
        if not pts:
            continue
        colour = s.archinfo.colour(arch, archs)
        xs = [x for x, _ in pts]
        top.plot(xs, [c.p50 for _, c in pts], color=colour, lw=2, marker="o", ms=4, label=arch)
        top.fill_between(xs, [c.lo for _, c in pts], [c.hi for _, c in pts], color=colour,
                         alpha=0.18, lw=0, label=arch)
        diffs = [(x, c.diff) for x, c in pts
                 if c.diff is not None and not math.isnan(c.diff.estimate)]
        if arch == s.baseline or not diffs:
            continue
        dx = [x for x, _ in diffs]
        bottom.plot(dx, [d.estimate for _, d in diffs], color=colour, lw=2, label=arch)
        bottom.fill_between(dx, [d.lo for _, d in diffs], [d.hi for _, d in diffs],
                            color=colour, alpha=0.18, lw=0, label=arch)
        bottom.scatter(dx, [d.estimate for _, d in diffs], s=30, zorder=3, edgecolors=colour,
                       facecolors=[colour if d.significant else "white" for _, d in diffs],
                       label=arch)
    bottom.axhline(0, color="k", lw=1)
    for arch in archs:
        c = analysis.crossover_of(arch, metric)
        if c is None:
            continue
        colour = s.archinfo.colour(arch, archs)
        for t in c.crossings:
            for ax in (top, bottom):
                ax.axvspan(t.start, t.end, color=colour, alpha=0.1, lw=0,
                           gid=f"crossover-{arch}")
        for z in c.zeros:
            bottom.axvline(z, color=colour, lw=1.2, ls="--", gid=f"zero-{arch}")
    for p in s.points:
        if p.analysed or (fixed is not None and p.values[s.parameters[1].name] != fixed):
            continue
        x = x_param.position(p.values[x_param.name])
        for ax in (top, bottom):
            ax.annotate(f"{p.id} {p.problem and 'unreadable' or p.status}", (x, 0.02),
                        xycoords=("data", "axes fraction"), rotation=90, fontsize=7,
                        ha="center", va="bottom", color=_SKIPPED)
    positions = [x_param.position(v) for v in x_param.values]
    bottom.set_xticks(positions, [x_param.show(v) for v in x_param.values])
    span = (max(positions) - min(positions)) or 1.0
    bottom.set_xlim(min(positions) - 0.06 * span, max(positions) + 0.06 * span)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)


def metric_figure(analysis: SweepAnalysis, metric: str) -> Figure:
    """The metric's median per architecture against the first parameter (top) and each
    architecture's difference from the baseline (bottom), CI bands, crossovers marked; a
    column per value of a second parameter."""
    s = analysis.sweep
    info = METRIC_BY_NAME[metric]
    fixed_values = s.parameters[1].values if len(s.parameters) == 2 else (None,)
    fig = _figure(max(8.0, 3.6 * len(fixed_values)), 7.2)
    axes = fig.subplots(2, len(fixed_values), sharex="col", sharey="row", squeeze=False,
                        height_ratios=(1.2, 1))
    for col, fixed in enumerate(fixed_values):
        _panel(analysis, metric, axes[0, col], axes[1, col], fixed)
        axes[1, col].set_xlabel(s.parameters[0].label)
        if fixed is not None:
            y = s.parameters[1]
            axes[0, col].set_title(f"{y.label} {y.show(fixed)}", fontsize=9)
    unit = f" ({info.unit})" if info.unit else ""
    axes[0, 0].set_ylabel(f"{info.label} p50{unit}")
    axes[1, 0].set_ylabel(f"difference from\n{s.baseline}{unit}")
    handles = [Line2D([], [], color=s.archinfo.colour(a, s.architectures), lw=2, label=a)
               for a in s.architectures]
    handles += [Patch(color="0.6", alpha=0.35, label="95% CI"),
                Patch(color="0.6", alpha=0.15, label="crossover: between these points"),
                Line2D([], [], color="0.3", ls="--", lw=1.2, label="estimate crosses zero"),
                Line2D([], [], color="0.3", marker="o", mfc="white", ls="none",
                       label="difference not significant")]
    fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(f"{info.label}: median per architecture along {s.parameters[0].label}\n"
                 f"{_subtitle(analysis)}", fontsize=10)
    return fig


def plot_metric(analysis: SweepAnalysis, metric: str, out_dir: Path) -> Path:
    return _save(metric_figure(analysis, metric), out_dir, f"sweep_{metric}", analysis)


# ------------------------------------------------------------------ a heat map of two parameters

def heatmap_figure(analysis: SweepAnalysis, architecture: str, metric: str = "mos") -> Figure:
    """A two-parameter sweep's grid of the architecture's difference from the baseline:
    colour the estimate, text it with its CI; hatched where the CI includes zero; blank (its
    status written) where the point was not analysed."""
    s = analysis.sweep
    grid = analysis.grid(architecture, metric)
    info = METRIC_BY_NAME[metric]
    fig = _figure(max(6.5, 1.5 * len(grid.x.values) + 3), 1.9 + 1.0 * len(grid.y.values))
    ax = fig.add_subplot()
    finite = grid.estimate[np.isfinite(grid.estimate)]
    reach = float(np.abs(finite).max()) if finite.size and np.abs(finite).max() > 0 else 1.0
    cmap = matplotlib.colormaps["RdBu" if info.higher_is_better else "RdBu_r"].with_extremes(
        bad="white")
    image = ax.imshow(np.ma.masked_invalid(grid.estimate), cmap=cmap, aspect="auto",
                      norm=TwoSlopeNorm(0.0, -reach, reach))
    for (i, j), v in np.ndenumerate(grid.estimate):
        if not np.isfinite(v):
            ax.text(j, i, grid.labels[i][j], ha="center", va="center", fontsize=8,
                    color=_SKIPPED, style="italic")
            continue
        text = f"{v:+.{2 if metric in ('mos', 'loss_pct') else 0}f}\n" \
               f"[{fmt(grid.lo[i, j], metric)}, {fmt(grid.hi[i, j], metric)}]"
        if not grid.significant[i, j]:
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///",
                                   edgecolor="0.55", lw=0, gid="not-significant"))
            text += "\nn.s."
        ax.text(j, i, text, ha="center", va="center", fontsize=8,
                color="white" if abs(v) > 0.6 * reach else "black")
    ax.set_xticks(range(len(grid.x.values)), [grid.x.show(v) for v in grid.x.values])
    ax.set_yticks(range(len(grid.y.values)), [grid.y.show(v) for v in grid.y.values])
    ax.set_xlabel(grid.x.label)
    ax.set_ylabel(grid.y.label)
    better = "higher" if info.higher_is_better else "lower"
    unit = f" ({info.unit})" if info.unit else ""
    fig.colorbar(image, ax=ax, shrink=0.85,
                 label=f"{architecture} minus {s.baseline}{unit}; {better} is better")
    ax.set_title(f"{architecture}'s {info.label} p50 minus {s.baseline}'s, per point "
                 f"[95% CI]\n{_subtitle(analysis)}", fontsize=10)
    return fig


def plot_heatmap(analysis: SweepAnalysis, architecture: str, out_dir: Path,
                 metric: str = "mos") -> Path:
    return _save(heatmap_figure(analysis, architecture, metric), out_dir,
                 f"heatmap_{metric}_{architecture}", analysis)


def write_sweep_plots(analysis: SweepAnalysis, out_dir: Path) -> dict[str, Path]:
    """A figure per metric; with two parameters, a MOS heat map per architecture but the
    baseline, in the run's order."""
    out = {f"sweep_{m}": plot_metric(analysis, m, out_dir) for m in SWEEP_METRICS}
    s = analysis.sweep
    if len(s.parameters) == 2 and s.analysed_points:
        others = [a for a in s.architectures if a != s.baseline]
        for arch in others:
            out[f"heatmap_mos_{arch}"] = plot_heatmap(analysis, arch, out_dir)
    return out
