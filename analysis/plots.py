"""The report's figures (matplotlib, Agg canvas, no pyplot state). Each function writes one PNG
into ``out_dir`` and returns its path; docs/analysis.md says what each shows."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from analysis.faults import FaultEffect, fault_effects, gaps_by_session, with_keys
from analysis.load import Results
from analysis.stats import METRIC_BY_NAME, Stats, compute_stats

# Each architecture's colour is the run's (architectures.json: Results.colour).
REGION_STYLES = ("-", "--", ":", "-.")
DPI = 150


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, out_dir: Path, name: str, results: Results) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    commit = results.config.get("commit")
    fig.get_layout_engine().set(rect=(0, 0.03, 1, 0.97))  # room for the footer below
    fig.text(0.998, 0.003, results.name + (f" @ {commit}" if commit else ""), ha="right",
             va="bottom", fontsize=6, color="0.45")
    path = out_dir / f"{name}.png"
    fig.savefig(path, dpi=DPI, facecolor="white")
    return path


def _subtitle(results: Results) -> str:
    regions = ", ".join(results.client_regions)
    clusters = ", ".join(results.config.get("clusters", []))
    backend = results.config.get("backend", "?")
    return f"clients in {regions} -> clusters {clusters} · {backend} impairment"


def _ok(results: Results, stats: Stats | None) -> pd.DataFrame:
    s = stats.sessions if stats is not None else results.sessions
    return s[s.ok]


# ------------------------------------------------------------------ CDFs

_FLOOR_OF = {"setup_ms": "floor_setup_ms", "first_ice_rtt_ms": "floor_media_rtt_ms"}


def _ecdf(ax, values: np.ndarray, **style) -> None:
    y = np.arange(1, values.size + 1) / values.size
    ax.step(np.r_[values[0], values], np.r_[0, y], where="post", **style)


def _zoom(data: np.ndarray) -> tuple[float, float]:
    """x limits showing every point, unless a few far outliers would squash the body: then
    up to the 99th percentile."""
    lo, hi, top = data.min(), np.percentile(data, 99), data.max()
    right = top if top - hi <= 0.5 * max(hi - lo, 1.0) else hi
    span = max(right - lo, 1.0)
    return lo - 0.04 * span, right + 0.04 * span


def plot_cdf(results: Results, metric: str, out_dir: Path, stats: Stats | None = None) -> Path:
    """Empirical CDF of one per-session metric per architecture, with the network floor the
    topology implies dashed (architectures with the same floor share one dashed line)."""
    info = METRIC_BY_NAME[metric]
    ok = _ok(results, stats)
    fig = _figure(8, 5.2)
    ax = fig.add_subplot()
    floor_col = _FLOOR_OF.get(metric)
    everything, floors = [], {}
    for arch in results.architectures:
        values = np.sort(ok.loc[ok.architecture == arch, metric].dropna().to_numpy())
        if values.size == 0:
            continue
        _ecdf(ax, values, color=results.colour(arch), lw=2,
              label=f"{arch}  (n={values.size}, p50 {np.median(values):.0f} {info.unit})")
        everything.append(values)
        if floor_col:
            floor = np.sort(ok.loc[ok.architecture == arch, floor_col].dropna().to_numpy())
            if floor.size:
                floors.setdefault(tuple(floor), []).append(arch)
    for floor, archs in floors.items():
        colour = results.colour(archs[0]) if len(archs) == 1 else "0.15"
        _ecdf(ax, np.array(floor), color=colour, lw=1.2, ls="--",
              label=f"network floor: {', '.join(archs)}")
        everything.append(np.array(floor))
    if not everything:
        ax.text(0.5, 0.5, "no successful sessions", ha="center", transform=ax.transAxes)
    else:
        left, right = _zoom(np.concatenate(everything))
        ax.set_xlim(left, right)
        beyond = ok[metric].dropna()
        beyond = beyond[beyond > right]
        if len(beyond):
            ax.text(0.99, 0.03, f"{len(beyond)} session(s) beyond the right edge "
                                f"(max {beyond.max():.0f} {info.unit})",
                    ha="right", va="bottom", transform=ax.transAxes, fontsize=8)
    ax.axhline(0.5, color="0.6", lw=0.8, ls=":")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(f"{info.label} per session ({info.unit})")
    ax.set_ylabel("fraction of sessions ≤ x")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    ax.set_title(f"{info.label}: CDF per architecture\n{_subtitle(results)}", fontsize=10)
    return _save(fig, out_dir, f"cdf_{metric}", results)


# ------------------------------------------------------------------ setup timeline

SETUP_PHASES = (
    ("offer ready (pc + ICE gathering)", "#c7c7c7"),
    ("signaling (POST -> answer)", "#E69F00"),
    ("ICE checks", "#56B4E9"),
    ("DTLS handshake", "#CC79A7"),
    ("first audio packet", "#009E73"),
)


def setup_phases(sessions: pd.DataFrame) -> pd.DataFrame:
    """Per session, the duration of each setup phase (ms), from the client's moments
    (docs/client.md): offer_ms, +signaling_ms, ice_connected_ms, setup_ms, first_audio_ms."""
    answer = sessions["offer_ms"] + sessions["signaling_ms"]
    return pd.DataFrame({
        SETUP_PHASES[0][0]: sessions["offer_ms"],
        SETUP_PHASES[1][0]: sessions["signaling_ms"],
        SETUP_PHASES[2][0]: sessions["ice_connected_ms"] - answer,
        SETUP_PHASES[3][0]: sessions["setup_ms"] - sessions["ice_connected_ms"],
        SETUP_PHASES[4][0]: sessions["first_audio_ms"] - sessions["setup_ms"],
    }, index=sessions.index)


def plot_setup_timeline(results: Results, out_dir: Path, stats: Stats | None = None) -> Path:
    """Stacked bar per architecture: the median duration of each setup phase."""
    ok = _ok(results, stats)
    archs = [a for a in results.architectures if (ok.architecture == a).any()]
    fig = _figure(9, 1.4 + 0.75 * max(len(archs), 1))
    ax = fig.add_subplot()
    widest = 0.0
    for i, arch in enumerate(archs):
        group = ok[ok.architecture == arch]
        medians = setup_phases(group).median()
        left = 0.0
        for (name, colour), width in zip(SETUP_PHASES, medians):
            if np.isnan(width):
                continue
            ax.barh(i, width, left=left, color=colour, edgecolor="white", height=0.6)
            if width >= 45:
                ax.text(left + width / 2, i, f"{width:.0f}", ha="center", va="center", fontsize=8)
            left += width
        widest = max(widest, left)
        setup = medians.iloc[:4].sum()
        ax.text(left + 10, i, f"connected {setup:.0f} ms\nfirst audio {left:.0f} ms",
                va="center", fontsize=7.5, linespacing=1.5)
        floor = group["floor_setup_ms"].median()
        if not np.isnan(floor):
            ax.plot([floor, floor], [i - 0.38, i + 0.38], color="k", lw=1.5)
    ax.set_yticks(range(len(archs)), archs)
    for tick, arch in zip(ax.get_yticklabels(), archs):
        tick.set_color(results.colour(arch))
    ax.invert_yaxis()
    ax.set_xlim(0, widest * 1.2 if widest else 1)
    ax.set_xlabel("ms since session start (median of each phase over successful sessions)")
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=c, label=n) for n, c in SETUP_PHASES]
    handles.append(Line2D([], [], color="k", lw=1.5, label="setup floor of the topology (median)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    ax.set_title(f"Where setup time goes (medians of phases; the sum is not the median total)\n"
                 f"{_subtitle(results)}", fontsize=10)
    return _save(fig, out_dir, "setup_timeline", results)


# ------------------------------------------------------------------ media over time

def sample_sessions(results: Results, per_architecture: int = 3) -> list[tuple[str, str, int]]:
    """(architecture, client_region, session): per architecture, in up to ``per_architecture``
    client regions, the session whose media RTT is nearest its group's median."""
    ok = results.sessions[results.sessions.ok & results.sessions.rtt_ms.notna()]
    have = set(zip(results.samples.architecture, results.samples.client_region,
                   results.samples.session))
    picks = []
    for arch in results.architectures:
        for region in results.client_regions[:per_architecture]:
            group = ok[(ok.architecture == arch) & (ok.client_region == region)]
            group = group[[(arch, region, s) in have for s in group.session]]
            if group.empty:
                continue
            nearest = (group.rtt_ms - group.rtt_ms.median()).abs().idxmin()
            picks.append((arch, region, int(group.loc[nearest, "session"])))
    return picks


def plot_media_timeseries(results: Results, out_dir: Path, per_architecture: int = 3) -> Path:
    """RTT and jitter over the call for a few typical sessions (samples.csv, ~1 per second)."""
    picks = sample_sessions(results, per_architecture)
    regions = list(dict.fromkeys(r for _, r, _ in picks))
    fig = _figure(9, 6)
    rtt_ax, jit_ax = fig.subplots(2, 1, sharex=True)
    s = results.samples
    for arch, region, session in picks:
        rows = s[(s.architecture == arch) & (s.client_region == region) & (s.session == session)]
        rows = rows.sort_values("t_ms")
        style = dict(color=results.colour(arch), marker="o", ms=3,
                     ls=REGION_STYLES[regions.index(region) % len(REGION_STYLES)], lw=1.5)
        rtt = rows.dropna(subset=["rtt_ms"])
        rtt_ax.plot(rtt.t_ms / 1000, rtt.rtt_ms, **style)
        jit = rows.dropna(subset=["jitter_ms"])
        jit_ax.plot(jit.t_ms / 1000, jit.jitter_ms, **style)
    if not picks:
        rtt_ax.text(0.5, 0.5, "no media samples", ha="center", transform=rtt_ax.transAxes)
    rtt_ax.set_ylabel("media RTT (ms)\nRTCP RR, EWMA")
    jit_ax.set_ylabel("interarrival jitter (ms)\nRFC 3550")
    jit_ax.set_xlabel("time since session start (s)")
    jit_ax.set_ylim(bottom=0)
    for ax in (rtt_ax, jit_ax):
        ax.grid(alpha=0.3)
    archs = list(dict.fromkeys(a for a, _, _ in picks))
    handles = [Line2D([], [], color=results.colour(a), lw=2, label=a)
               for a in archs]
    handles += [Line2D([], [], color="0.3", ls=REGION_STYLES[i % len(REGION_STYLES)],
                       label=f"client in {r}") for i, r in enumerate(regions)]
    fig.legend(handles=handles, loc="outside right center", fontsize=8, frameon=False)
    rtt_ax.set_title(f"Media RTT and jitter during the call: one typical session (median RTT) "
                     f"per architecture and client region\n{_subtitle(results)}", fontsize=10)
    return _save(fig, out_dir, "media_timeseries", results)


# ------------------------------------------------------------------ loss and MOS

# G.107 Annex B user satisfaction (MOS lower limits), for the MOS panel's bands.
SATISFACTION = ((4.34, "very satisfied"), (4.03, "satisfied"), (3.60, "some dissatisfied"),
                (3.10, "many dissatisfied"), (2.58, "nearly all dissatisfied"),
                (1.0, "not recommended"))


def _strip(ax, groups: list[np.ndarray], colours: list[str], seed: int = 7) -> None:
    rng = np.random.default_rng(seed)
    for i, (values, colour) in enumerate(zip(groups, colours)):
        if values.size == 0:
            continue
        ax.boxplot([values], positions=[i], widths=0.5, showfliers=False,
                   medianprops=dict(color="k", lw=1.5), whiskerprops=dict(color="0.4"),
                   capprops=dict(color="0.4"), boxprops=dict(color="0.4"))
        ax.scatter(i + rng.uniform(-0.18, 0.18, values.size), values, s=14, color=colour,
                   alpha=0.75, zorder=3, edgecolors="none")


def plot_loss_mos(results: Results, out_dir: Path, stats: Stats | None = None) -> Path:
    """Per architecture: packet loss per session, loss-burst lengths, and E-model MOS."""
    stats = stats or compute_stats(results)
    ok = stats.sessions[stats.sessions.ok]
    archs = [a for a in results.architectures if (ok.architecture == a).any()]
    colours = [results.colour(a) for a in archs]
    fig = _figure(12, 4.6)
    loss_ax, burst_ax, mos_ax = fig.subplots(1, 3, width_ratios=(1, 1.1, 1))

    _strip(loss_ax, [ok.loc[ok.architecture == a, "loss_pct"].dropna().to_numpy() for a in archs],
           colours)
    loss_ax.set_ylabel("packet loss per session (%)")
    top = max([ok.loss_pct.max() if ok.loss_pct.notna().any() else 0, 0.1])
    loss_ax.set_ylim(-0.04 * top, top * 1.08)  # zero-loss sessions stay visible
    loss_ax.set_title("loss (each dot a session)", fontsize=10)

    lengths = ("1", "2", "3", "4", "5+")
    width = 0.8 / max(len(archs), 1)
    for i, (arch, colour) in enumerate(zip(archs, colours)):
        bursts = [min(b, 5) for bs in ok.loc[ok.architecture == arch, "loss_bursts"] for b in bs]
        counts = np.bincount(bursts, minlength=6)[1:6]
        ax_x = np.arange(5) + (i - (len(archs) - 1) / 2) * width
        burst_ax.bar(ax_x, counts, width=width, color=colour,
                     label=f"{arch} ({len(bursts)} bursts)")
    burst_ax.set_xticks(range(5), lengths)
    burst_ax.set_xlabel("loss-burst length (consecutive packets lost)")
    burst_ax.set_ylabel("number of bursts (all sessions)")
    burst_ax.legend(fontsize=7, loc="upper right")
    burst_ax.set_title("loss bursts", fontsize=10)

    mos_values = [ok.loc[ok.architecture == a, "mos"].dropna().to_numpy() for a in archs]
    low = min([v.min() for v in mos_values if v.size] + [4.0])
    bottom = max(1.0, np.floor((low - 0.05) * 10) / 10)
    upper = 4.5
    for limit, label in SATISFACTION:
        if limit >= upper or upper <= bottom:
            upper = limit
            continue
        shade = 0.93 if SATISFACTION.index((limit, label)) % 2 else 0.97
        mos_ax.axhspan(max(limit, bottom), upper, color=str(shade), zorder=0)
        mos_ax.text(len(archs) - 0.45, (max(limit, bottom) + upper) / 2, label, fontsize=7,
                    va="center", ha="right", color="0.35", zorder=1)
        upper = limit
    _strip(mos_ax, mos_values, colours)
    mos_ax.set_ylim(bottom, 4.5)
    mos_ax.set_ylabel("MOS-CQE (E-model, G.107)")
    mos_ax.set_title("estimated MOS (each dot a session)", fontsize=10)

    for ax in (loss_ax, mos_ax):
        ax.set_xticks(range(len(archs)), archs, rotation=15)
        ax.set_xlim(-0.6, len(archs) - 0.4)
        for tick, colour in zip(ax.get_xticklabels(), colours):
            tick.set_color(colour)
    for ax in (loss_ax, burst_ax, mos_ax):
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"Packet loss and call quality per architecture\n{_subtitle(results)}",
                 fontsize=10)
    return _save(fig, out_dir, "loss_mos", results)


# ------------------------------------------------------------------ ports

def plot_ports(results: Results, out_dir: Path, extrapolate_to: int = 10_000) -> Path:
    """Public UDP ports exposed vs concurrent sessions: measured points and the lines they
    imply (a port per session for port-per-session, a constant for the relays)."""
    ports = results.ports.dropna(subset=["concurrent_sessions", "public_udp_ports"])
    fig = _figure(8, 4.8)
    ax = fig.add_subplot()
    top = max(extrapolate_to, int(ports.concurrent_sessions.max() * 10) if len(ports) else 10)
    x = np.logspace(0, np.log10(top), 200)
    for _, row in ports.iterrows():
        arch, peak, measured = row.architecture, row.concurrent_sessions, row.public_udp_ports
        colour = results.colour(arch)
        info = results.archinfo[arch]
        if info.per_session_ports and peak > 0:
            # e.g. turn: each client region's TURN server has one listening port besides its
            # relay ports (one per allocation): that part does not grow with the sessions
            fixed = info.fixed_ports_per_client_region * len(results.client_regions)
            y = fixed + x * (measured - fixed) / peak
            rule = f"grows {(measured - fixed) / peak:.2g} per session" + (
                f" + {fixed} fixed" if fixed else "")
        else:
            y = np.full_like(x, max(measured, 1))
            rule = "fixed"
        inside = x <= peak
        ax.plot(x[inside], y[inside], color=colour, lw=2.2)
        ax.plot(x[~inside], y[~inside], color=colour, lw=1.6, ls=":")
        ax.scatter([peak], [max(measured, 1)], color=colour, s=60, zorder=4, edgecolors="k",
                   label=f"{arch}: {measured:.0f} at {peak:.0f} sessions, {rule}")
        ax.annotate(f"{y[-1]:,.0f} ports", (x[-1], y[-1]), textcoords="offset points",
                    xytext=(4, 0), va="center", fontsize=8, color=colour)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(1, top * 2.5)
    ax.set_ylim(0.7, top * 3)
    ax.set_xlabel("concurrent sessions (log scale)")
    ax.set_ylabel("public UDP ports exposed (log scale)")
    ax.grid(alpha=0.3, which="both")
    handles, labels = ax.get_legend_handles_labels()
    handles += [Line2D([], [], color="0.3", lw=2.2), Line2D([], [], color="0.3", ls=":")]
    labels += ["within the measured range", "extrapolated"]
    ax.legend(handles, labels, loc="upper left", fontsize=8, framealpha=0.9)
    ax.set_title(f"Public UDP ports exposed vs concurrent sessions (dots: measured peak)\n"
                 f"{_subtitle(results)}", fontsize=10)
    return _save(fig, out_dir, "ports", results)


# ------------------------------------------------------------------ region matrix

def _heatmap(ax, table: pd.DataFrame, text: pd.DataFrame, title: str, unit: str,
             labels: dict[str, str]) -> None:
    values = table.to_numpy(dtype=float)
    finite = values[np.isfinite(values)]
    norm = Normalize(finite.min(), finite.max()) if finite.size else Normalize(0, 1)
    image = ax.imshow(values, cmap="YlOrRd", norm=norm, aspect="auto")
    for (i, j), v in np.ndenumerate(values):
        if np.isfinite(v):
            dark = norm(v) > 0.6
            ax.text(j, i, text.iat[i, j], ha="center", va="center", fontsize=8,
                    color="white" if dark else "black")
        else:
            ax.text(j, i, "no successful\nsessions", ha="center", va="center", fontsize=8,
                    color="0.5")
    ax.set_xticks(range(table.shape[1]), table.columns, rotation=15)
    ax.set_yticks(range(table.shape[0]), [labels.get(r, r) for r in table.index])
    ax.set_xlabel("architecture")
    ax.set_ylabel("client region -> cluster")
    ax.set_title(title, fontsize=10)
    ax.figure.colorbar(image, ax=ax, label=unit, shrink=0.85)


def _served_by(results: Results) -> dict[str, str]:
    """'region -> cluster' labels: the cluster most of the region's sessions reached."""
    s = results.sessions.dropna(subset=["cluster_region"])
    out = {}
    for region, group in s.groupby("client_region"):
        out[region] = f"{region} -> {group.cluster_region.mode().iloc[0]}"
    return out


def plot_region_matrix(results: Results, out_dir: Path, stats: Stats | None = None) -> Path:
    """Client region x architecture heatmaps of setup p50 and first-ICE-RTT p50 (with CIs)."""
    stats = stats or compute_stats(results)
    archs, regions = results.architectures, results.client_regions
    fig = _figure(max(9, 4.2 * 2 + 0.9 * len(archs)), 1.8 + 0.6 * len(regions))
    axes = fig.subplots(1, 2)
    for ax, metric in zip(axes, ("setup_ms", "first_ice_rtt_ms")):
        values = pd.DataFrame(np.nan, index=regions, columns=archs)
        text = pd.DataFrame("", index=regions, columns=archs)
        for region in regions:
            for arch in archs:
                row = stats.row(arch, metric, region)
                if row is not None and row.n:
                    values.loc[region, arch] = row.p50
                    text.loc[region, arch] = (f"{row.p50:.0f}\n[{row.p50_lo:.0f}, {row.p50_hi:.0f}]"
                                              f"\nn={row.n}")
        info = METRIC_BY_NAME[metric]
        _heatmap(ax, values, text, f"{info.label} p50, ms [95% CI]", f"{info.label} p50 (ms)",
                 _served_by(results))
    fig.suptitle(f"Per client region\n{_subtitle(results)}", fontsize=10)
    return _save(fig, out_dir, "region_matrix", results)


# ------------------------------------------------------------------ faults

FAULT_PANEL_SESSIONS = 30  # affected sessions drawn per architecture (the rest are counted)
_UP_GAP = "#D55E00"
_LOST = "#cc0000"


def fault_plot_name(fault: str) -> str:
    """The figure's name (and PNG stem) of a fault: ``fault-<id>``, safe as a file name."""
    return "fault-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", fault)


def _present(first: float | None, last: float | None,
             gaps: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Intervals (start, width) of [first, last] outside the gaps."""
    if first is None or last is None or last <= first:
        return []
    out, t = [], first
    for start, ms in sorted(gaps):
        stop = start + ms / 1000.0
        if stop <= t or start >= last:
            continue
        if start > t:
            out.append((t, start - t))
        t = max(t, stop)
    if last > t:
        out.append((t, last - t))
    return out


def _fault_panel(ax, results: Results, effect: FaultEffect, gaps: dict, attempts: pd.DataFrame
                 ) -> None:
    w = effect.window
    colour = results.colour(effect.fault.architecture)
    shown = sorted(effect.affected, key=lambda s: (s.key[1], s.key[2]))[:FAULT_PANEL_SESSIONS]
    # to the end of the window, or sooner when every session drawn has ended
    marks = [s.ended - w.at for s in shown] + [w.rel(t) for t in (w.end, w.ready) if t]
    left, right = -3.0, min(w.horizon - w.at, max(marks + [1.0]) + 0.5)
    for i, s in enumerate(shown):
        down = gaps.get((s.key, "down"), [])
        bars = [(a - w.at, b) for a, b in _present(s.first_rx, s.last_rx, down)]
        ax.broken_barh(bars, (i - 0.3, 0.6), color=colour, alpha=0.85)
        up = [(a - w.at, ms / 1000.0) for a, ms in gaps.get((s.key, "up"), [])]
        ax.broken_barh(up, (i + 0.32, 0.14), color=_UP_GAP)
        if s.gap_down_ms and s.gap_down_start is not None:  # its longest gap, named above
            middle = s.gap_down_start - w.at + s.gap_down_ms / 2000.0
            label = f"{s.gap_down_ms:.0f} ms" + ("" if s.gap_down_end else " to the call's end")
            ax.text(middle, i - 0.32, label, ha="center", va="bottom", fontsize=6.5,
                    color="0.2")
        mine = attempts[attempts.key == s.key] if not attempts.empty else attempts
        for r in mine[mine.attempt > 0].itertuples() if not mine.empty else ():
            ax.plot(r.started_unix - w.at, i, marker="v", color="k", ms=5, ls="none")
            if not pd.isna(r.connected_unix):
                ax.plot(r.connected_unix - w.at, i, marker="o", color="k", ms=3.5, ls="none")
        if s.lost:
            ax.plot(s.ended - w.at, i, marker="x", color=_LOST, ms=7, mew=2, ls="none")
    ax.axvline(0, color=_LOST, lw=1.5)
    if w.end is not None:
        ax.axvline(w.end - w.at, color="0.2", lw=1.2, ls="--")
    if w.ready is not None:
        ax.axvline(w.ready - w.at, color="k", lw=1.4, ls=":")
    labels = [f"{s.key[1]} #{s.key[2]}" + (" (lost)" if s.lost else "") for s in shown]
    ax.set_yticks(range(len(shown)), labels, fontsize=7)
    for tick, s in zip(ax.get_yticklabels(), shown):
        if s.lost:
            tick.set_color(_LOST)
    ax.set_ylim(len(shown) - 0.4, -0.6)
    ax.set_xlim(left, right)
    ax.grid(axis="x", alpha=0.3)
    row = effect.row
    more = len(effect.affected) - len(shown)
    ax.set_title(f"{effect.fault.architecture}: {row['sessions_affected']} of "
                 f"{row['sessions_live']} live sessions on {effect.fault.target}, "
                 f"{row['sessions_lost']} lost" + (f" ({more} more not drawn)" if more else ""),
                 fontsize=9, loc="left")
    if not shown:
        ax.text(0.5, 0.5, "no live session on the target", ha="center", va="center",
                transform=ax.transAxes, fontsize=9, color="0.4")


def plot_fault_timeline(results: Results, fault: str, out_dir: Path,
                        effects: list[FaultEffect] | None = None) -> Path | None:
    """One panel per architecture where the fault happened: a bar per affected session while
    downstream audio arrived (first to last packet, minus its gaps), its upstream gaps as thin
    orange bars, reconnections (triangle: called again; dot: connected), a cross where a lost
    session ended; x in seconds from the fault. None when the fault happened nowhere."""
    effects = [e for e in (effects if effects is not None else fault_effects(results))
               if e.fault.fault == fault and e.window is not None]
    if not effects:
        return None
    gaps = gaps_by_session(results.gaps)
    attempts = with_keys(results.attempts)
    heights = [max(len(e.affected[:FAULT_PANEL_SESSIONS]), 1) for e in effects]
    fig = _figure(10, 1.6 + sum(0.9 + 0.24 * h for h in heights))
    axes = fig.subplots(len(effects), 1, height_ratios=[2.5 + h for h in heights], squeeze=False)
    for ax, effect in zip(axes[:, 0], effects):
        _fault_panel(ax, results, effect, gaps, attempts)
    axes[-1, 0].set_xlabel("seconds from the fault")
    first = effects[0].fault
    handles = [Patch(color="0.45", label="downstream audio arriving at the client (colour: "
                                         "architecture)"),
               Patch(color=_UP_GAP, label="upstream gap (at the transceiver)"),
               Line2D([], [], color=_LOST, lw=1.5, label="fault"),
               Line2D([], [], color="0.2", lw=1.2, ls="--", label="fault ended"),
               Line2D([], [], color="k", lw=1.4, ls=":", label="service ready"),
               Line2D([], [], color="k", marker="v", ls="none", label="called again"),
               Line2D([], [], color="k", marker="o", ms=3.5, ls="none", label="reconnected"),
               Line2D([], [], color=_LOST, marker="x", mew=2, ls="none", label="lost: ended")]
    fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=7.5, frameon=False)
    fig.suptitle(f"Fault {first.fault}: {first.kind} of {first.target}, the sessions it hit\n"
                 f"{_subtitle(results)}", fontsize=10)
    return _save(fig, out_dir, fault_plot_name(fault), results)


def write_fault_plots(results: Results, out_dir: Path) -> dict[str, Path]:
    """A timeline per fault that happened in some architecture, named ``fault-<id>``."""
    effects = fault_effects(results)
    out = {}
    for fault in dict.fromkeys(e.fault.fault for e in effects):
        path = plot_fault_timeline(results, fault, out_dir, effects)
        if path is not None:
            out[fault_plot_name(fault)] = path
    return out


def write_plots(results: Results, out_dir: Path, stats: Stats | None = None) -> dict[str, Path]:
    """Every figure of the report; the region matrix only when the run had several regions;
    a timeline per fault (``fault-<id>``) in a run with faults."""
    stats = stats or compute_stats(results)
    out = {"cdf_setup_ms": plot_cdf(results, "setup_ms", out_dir, stats),
           "cdf_first_ice_rtt_ms": plot_cdf(results, "first_ice_rtt_ms", out_dir, stats),
           "setup_timeline": plot_setup_timeline(results, out_dir, stats),
           "media_timeseries": plot_media_timeseries(results, out_dir),
           "loss_mos": plot_loss_mos(results, out_dir, stats),
           "ports": plot_ports(results, out_dir)}
    if len(results.client_regions) > 1:
        out["region_matrix"] = plot_region_matrix(results, out_dir, stats)
    if results.faults:
        out.update(write_fault_plots(results, out_dir))
    return out
