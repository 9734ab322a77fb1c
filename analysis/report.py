"""The report of one results folder: a self-contained HTML page and a Markdown summary.

``write_report(dir)`` writes ``report.html`` (plots embedded as base64 PNG, no external
resources), ``report.md`` and the PNGs under ``plots/``; ``compare(old, new)`` says what moved
between two runs (analysis/compare.py).
"""
from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path

from analysis import clients, conversation, tables, turn, verification
from analysis.pcap import tables as pcap_tables
from analysis.compare import compare  # noqa: F401  (part of this module's API)
from analysis.faults import FaultEffect, fault_effects
from analysis.findings import findings, lead, saturation
from analysis.load import Results, load_results
from analysis.mos import EModel
from analysis.plots import fault_plot_name, write_plots
from analysis.stats import ALL, Bootstrap, Stats, compute_stats
from analysis.summary import summary_of

CAPTIONS = {
    "cdf_setup_ms": "Setup time (session start -> DTLS connected) per session. Dashed: the "
                    "network floor the runner recorded for the same sessions (floor_setup_ms: "
                    "what the emulated paths' delays alone allow); the gap is the stack's and "
                    "the architecture's overhead.",
    "cdf_first_ice_rtt_ms": "RTT of the first successful ICE check on the selected pair, per "
                            "session. Dashed: the media-path RTT of the topology; a relay adds "
                            "its forwarding time on top.",
    "setup_timeline": "Where the time to first audio goes: the median of each phase over "
                      "successful sessions (medians do not add up to the median total). Black "
                      "tick: median setup floor.",
    "media_timeseries": "RTT (RTCP receiver reports, smoothed by the stack) and RFC 3550 jitter "
                        "about once a second during the call, for the session nearest the "
                        "median RTT of each architecture and client region.",
    "loss_mos": "Packet loss per session, the lengths of loss runs, and the E-model MOS per "
                "session (bands: G.107 user satisfaction).",
    "ports": "Public UDP ports the edge exposes at the measured peak of concurrent sessions, and "
             "the growth each architecture implies (dotted: extrapolated).",
    "region_matrix": "Median setup and first ICE RTT per client region and architecture, with "
                     "95% bootstrap CIs and the number of successful sessions.",
}
FAULT_CAPTION = ("The sessions the fault hit, per architecture: a bar while downstream audio "
                 "arrived at the client (first to last packet, minus its gaps of 60 ms or more), "
                 "upstream gaps at the transceiver as thin orange bars, calls placed again "
                 "(triangle) and reconnected (dot), a cross where a lost session ended. Red "
                 "line: the fault; dashed: it ended; dotted black: the restarted service was "
                 "ready. x: seconds from the fault.")
FAULTS_INTRO = ("What each injected fault did to the calls, per architecture (faults.csv; "
                "docs/faults.md defines every column). A session is affected when it was live "
                "at the fault and the fault's target was on its path then.")

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;
max-width:1200px;padding:0 1em;color:#222;line-height:1.4}
h1{font-size:1.6em;margin-bottom:.2em}h2{margin-top:2em;border-bottom:1px solid #ddd}
h1,h2,h3,p,li,figcaption{overflow-wrap:anywhere}
.scroll{overflow-x:auto;max-width:100%;margin:.6em 0}
table{border-collapse:collapse;font-size:.85em}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right;white-space:nowrap}
th{background:#f2f2f2}td:first-child,th:first-child{text-align:left}
.note{font-size:.8em;color:#555;margin:.2em 0 1em}.meta{color:#555}
figure{margin:1.5em 0}figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:.85em;color:#444;max-width:900px}
details summary{cursor:pointer;font-weight:600;margin:.5em 0}
.warn{background:#fff4e5;border-left:4px solid #e69f00;padding:.5em 1em}
"""


def _method(boot: Bootstrap, model: EModel) -> list[str]:
    c = model.codec
    return [
        "Percentiles: numpy 'linear' (Hyndman & Fan type 7, as summary.json). Metrics from "
        "successful sessions only.",
        f"CIs: {int(boot.level * 100)}% percentile bootstrap over sessions, {boot.resamples} "
        f"resamples, seed {boot.seed}; success rate: Wilson score interval.",
        "Differences from the baseline: difference of medians (within each client region, "
        "averaged by sessions), its CI by the same bootstrap; stated only when the CI excludes "
        "zero.",
        f"MOS: E-model (G.107, simplified): R = {model.r0_minus_is} - Id - Ie_eff + "
        f"{model.advantage:g}; one-way delay = RTT/2 + {model.jitter_factor:g} x jitter + "
        f"{c.frame_ms:g} ms; codec {c.name}: Ie {c.ie:g}, Bpl {c.bpl:g} (assumption); BurstR "
        f"per session from its loss runs. See docs/analysis.md.",
    ]


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def _warnings(results: Results, stats: Stats) -> list[str]:
    """Things a reader must know before trusting the numbers."""
    out = [text] if (text := saturation(stats)) else []
    if results.faults:
        out.append("This run injected faults (see Faults): its latency statistics include the "
                   "calls the faults hit and the calls placed again after them.")
    if results.missing_text():
        out.append(f"Incomplete run: {results.missing_text()}. The rest of the report covers "
                   f"what was measured.")
    if results.target:
        out.append(f"Deployment target {results.target}: no emulated world. These are the "
                   f"deployment's figures as this host's clients saw them, over whatever network "
                   f"lies between; there is no configured floor (the over-floor metrics are "
                   f"empty), and only the clients' own lag can mark a session saturated.")
    elif not results.calibration:
        out.append("No calibration.json: the emulated world was not proven.")
    elif not results.calibration.get("ok", False):
        out.append("Calibration FAILED: the emulated world is not the configured one.")
    for arch, cal in results.calibration_at_load.items():
        if not cal.get("ok", False):
            bad = [p for p in cal.get("paths", []) if not p.get("ok")]
            names = ", ".join(f"{p.get('kind')} {p.get('src')}->{p.get('dst')}" for p in bad[:3])
            out.append(f"{arch}: calibration at load FAILED on {len(bad)} of "
                       f"{len(cal.get('paths', []))} paths ({names}): while its calls ran, the "
                       f"world was not the configured one, and its figures include that.")
    for _, s in stats.success[stats.success.client_region == ALL].iterrows():
        if s.sessions and s.ok < s.sessions:
            out.append(f"{s.architecture}: {s.sessions - s.ok} of {s.sessions} sessions failed "
                       f"(see Failures).")
    over = stats.metrics[(stats.metrics.metric == "setup_over_floor_ms")
                         & (stats.metrics.client_region == ALL)]
    for _, r in over.iterrows():
        if r.n and r.p50 < 0:
            out.append(f"{r.architecture}: median setup is {-r.p50:.0f} ms below the recorded "
                       f"network floor: the floor_setup_ms in sessions.csv is not a lower bound "
                       f"for this run (check how the runner that wrote it computed floors).")
    return out


def _fault_plots(effects: list[FaultEffect], plots: dict[str, Path]) -> list[tuple[str, Path]]:
    names = [fault_plot_name(f) for f in dict.fromkeys(e.fault.fault for e in effects)]
    return [(n, plots[n]) for n in names if n in plots]


_NO_STEERING = ("No steering times: steering.csv has no `unix` column (the run's fronts did not "
                "record when they placed each call).")


def _faults_html(results: Results, effects: list[FaultEffect], plots: dict[str, Path]
                 ) -> list[str]:
    e = html.escape
    rows = [x.row for x in effects]
    parts = ["<h2 id='faults'>Faults</h2>", f"<p>{e(FAULTS_INTRO)}</p>",
             "<h3>What each fault hit</h3>", tables.to_html(tables.faults_hit(rows)),
             "<h3>Audio around each fault</h3>", tables.to_html(tables.faults_media(rows))]
    moved = tables.calls_moved(effects)
    if moved.rows:
        parts += ["<h3 id='calls-moved'>Calls that moved</h3>", tables.to_html(moved)]
    for name, path in _fault_plots(effects, plots):
        parts.append(f"<figure id='{e(name)}'>{_img(path)}<figcaption>{e(FAULT_CAPTION)}"
                     f"</figcaption></figure>")
    if any(x.fault.effect.steers and x.window is not None for x in effects):
        steered = tables.steering_around_outages(results, effects)
        parts += ["<h3 id='outage-steering'>Steering around the outage</h3>",
                  tables.to_html(steered) if steered.rows else f"<p class='note'>"
                  f"{e(_NO_STEERING if 'unix' not in results.steering else 'none')}</p>"]
    return parts


def _faults_markdown(results: Results, effects: list[FaultEffect], plots: dict[str, Path],
                     base: Path) -> list[str]:
    rows = [x.row for x in effects]
    lines = ["## Faults", "", FAULTS_INTRO, "", "### What each fault hit", "",
             tables.to_markdown(tables.faults_hit(rows)), "### Audio around each fault", "",
             tables.to_markdown(tables.faults_media(rows))]
    moved = tables.calls_moved(effects)
    if moved.rows:
        lines += ["### Calls that moved", "", tables.to_markdown(moved)]
    for name, path in _fault_plots(effects, plots):
        rel = path.relative_to(base) if path.is_relative_to(base) else path
        lines += [f"![{name}]({rel.as_posix()})", "", f"_{FAULT_CAPTION}_", ""]
    if any(x.fault.effect.steers and x.window is not None for x in effects):
        steered = tables.steering_around_outages(results, effects)
        lines += ["### Steering around the outage", "",
                  tables.to_markdown(steered) if steered.rows else
                  (_NO_STEERING if "unix" not in results.steering else "none") + "\n"]
    return lines


def _where(results: Results) -> str:
    """Where the clients were: their emulated regions, or the deployment they ran against."""
    if results.target:
        return f"deployment target {results.target}"
    return f"clients in {', '.join(results.client_regions)}"


def render_html(results: Results, stats: Stats, plots: dict[str, Path], model: EModel) -> str:
    e = html.escape
    c = results.config
    title = f"voiceedge report: {c.get('scenario', {}).get('name', '?')} — {_where(results)}"
    world = (f"<b>deployment target</b> {e(results.target)} (no emulated world, no calibration)"
             if results.target else
             f"clusters {e(', '.join(c.get('clusters', [])))} · impairment backend "
             f"<b>{e(str(c.get('backend', '?')))}</b> · calibration "
             f"<b>{'passed' if results.calibration.get('ok') else 'FAILED'}</b>")
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{e(title)}"
             f"</title><style>{_CSS}</style></head><body>",
             f"<h1>{e(title)}</h1>",
             f"<p class='meta'>{e(results.name)} · {world} · commit "
             f"{e(str(c.get('commit') or '-'))} · started {e(str(c.get('started', '-')))}</p>"]
    warnings = _warnings(results, stats)
    if warnings:
        parts.append("<div class='warn'>" + "".join(f"<p>{e(w)}</p>" for w in warnings) + "</div>")
    parts += ["<h2 id='findings'>What this run says</h2>", f"<p>{e(lead(results, stats))}</p>"]
    found = findings(results, stats)
    for arch in dict.fromkeys(f.architecture for f in found):
        items = "".join(f"<li>{e(f.sentence())}</li>" for f in found if f.architecture == arch)
        parts.append(f"<h3>{e(arch)}</h3><ul class='findings'>{items}</ul>")
    parts += ["<h2 id='summary'>Summary per architecture</h2>",
              tables.to_html(tables.headline(results, stats))]
    parts += ["<h2 id='verified'>What the clients verified</h2>",
              tables.to_html(verification.table(results))]
    if clients.mixed(results):
        parts += ["<h2 id='clients'>Setup timeline by client type and offer style</h2>",
                  tables.to_html(clients.timeline(results))]
    if turn.applies(results):
        parts += ["<h2 id='turn'>TURN's setup overhead</h2>",
                  tables.to_html(turn.overhead(results))]
    if (results.path / conversation.TURNS_FILE).is_file():
        heard = conversation.summary(results.path, results.baseline, stats.bootstrap)
        parts += ["<h2 id='turns'>Turns</h2>",
                  tables.to_html(conversation.table(results, stats, heard))]
        by_caller = conversation.caller_table(heard)
        if by_caller is not None:
            parts += ["<h3>Turns by caller</h3>", tables.to_html(by_caller)]
        parts += [f"<p>{e(line)}</p>" for line in conversation.disagreements(heard, stats)]
    if results.faults:
        parts += _faults_html(results, fault_effects(results), plots)
    parts.append("<h2 id='plots'>Plots</h2>")
    for name, path in plots.items():
        if name.startswith("fault-"):
            continue
        parts.append(f"<figure id='{e(name)}'>{_img(path)}<figcaption>"
                     f"{e(CAPTIONS.get(name, ''))}</figcaption></figure>")
    parts.append("<h2 id='stats'>Statistics per architecture</h2>")
    for arch in results.architectures:
        parts += [f"<h3>{e(arch)}</h3>", tables.to_html(tables.metric_detail(stats, arch))]
    if len(results.client_regions) > 1:
        parts += ["<h2 id='regions'>Per client region</h2>",
                  tables.to_html(tables.per_region(results, stats))]
        parts.append("<details><summary>every metric per client region</summary>")
        for region in results.client_regions:
            for arch in results.architectures:
                parts += [f"<h3>{e(region)} · {e(arch)}</h3>",
                          tables.to_html(tables.metric_detail(stats, arch, region))]
        parts.append("</details>")
    steered = tables.steering(results)
    if steered.rows:
        parts += ["<h2 id='steering'>Where each client region was steered</h2>",
                  tables.to_html(steered)]
    wire = pcap_tables.load(results.path)
    if wire:
        parts += ["<h2 id='wire'>On the wire (packet captures)</h2>"]
        parts += [f"<p class='warn'>{e(line)}</p>" for line in pcap_tables.off_hops(wire)]
        for a in wire:
            parts += [f"<h3>{e(a['architecture'])}: one-way delay per hop</h3>",
                      tables.to_html(pcap_tables.hops(a))]
        parts += [tables.to_html(pcap_tables.wire(wire))]
        if pcap_tables.turn(wire).rows:
            parts.append(tables.to_html(pcap_tables.turn(wire)))
        parts.append(tables.to_html(pcap_tables.cost(wire)))
    parts += ["<h2 id='failures'>Failures</h2>", tables.to_html(tables.failures(results)),
              "<h2 id='ports'>Ports and relays</h2>", tables.to_html(tables.ports(results)),
              tables.to_html(tables.relays(results))]
    if not results.target:
        parts += ["<h2 id='calibration'>Calibration</h2>",
                  tables.to_html(tables.calibration_at_load(results)),
                  tables.to_html(tables.calibration(results))]
        if results.host_cpu:
            parts += ["<h3 id='host-cpu'>Host CPU while the calls ran</h3>",
                      tables.to_html(tables.host_cpu(results))]
    parts += ["<h2 id='config'>Configuration</h2>", tables.to_html(tables.configuration(results))]
    if not results.target:
        parts += ["<details><summary>emulated paths (impairments)</summary>",
                  tables.to_html(tables.impairments(results)), "</details>"]
    parts += ["<h2 id='method'>Method</h2><ul>"]
    parts += [f"<li>{e(line)}</li>" for line in _method(stats.bootstrap, model)]
    parts.append("</ul></body></html>")
    return "\n".join(parts)


def render_markdown(results: Results, stats: Stats, plots: dict[str, Path], model: EModel,
                    base: Path) -> str:
    c = results.config
    world = (f"**deployment target** {results.target} (no emulated world, no calibration)"
             if results.target else
             f"clusters {', '.join(c.get('clusters', []))} · impairment backend "
             f"**{c.get('backend', '?')}** · calibration "
             f"**{'passed' if results.calibration.get('ok') else 'FAILED'}**")
    lines = [f"# {c.get('scenario', {}).get('name', '?')}: {_where(results)}", "",
             f"`{results.name}` · {world} · commit {c.get('commit') or '-'}", ""]
    for warning in _warnings(results, stats):
        lines += [f"> **Warning:** {warning}", ""]
    lines += ["## What this run says", "", lead(results, stats), ""]
    found = findings(results, stats)
    for arch in dict.fromkeys(f.architecture for f in found):
        lines += [f"**{arch}**", ""]
        lines += [f"- {f.sentence()}" for f in found if f.architecture == arch] + [""]
    lines += ["", "## Summary per architecture", "",
              tables.to_markdown(tables.headline(results, stats))]
    lines += ["## What the clients verified", "",
              tables.to_markdown(verification.table(results))]
    if clients.mixed(results):
        lines += ["## Setup timeline by client type and offer style", "",
                  tables.to_markdown(clients.timeline(results))]
    if turn.applies(results):
        lines += ["## TURN's setup overhead", "", tables.to_markdown(turn.overhead(results))]
    if (results.path / conversation.TURNS_FILE).is_file():
        heard = conversation.summary(results.path, results.baseline, stats.bootstrap)
        lines += ["## Turns", "", tables.to_markdown(conversation.table(results, stats, heard))]
        by_caller = conversation.caller_table(heard)
        if by_caller is not None:
            lines += ["", "### Turns by caller", "", tables.to_markdown(by_caller)]
        lines += [f"> {line}" for line in conversation.disagreements(heard, stats)]
    if results.faults:
        lines += _faults_markdown(results, fault_effects(results), plots, base)
    if len(results.client_regions) > 1:
        lines += ["## Per client region", "", tables.to_markdown(tables.per_region(results, stats))]
    steered = tables.steering(results)
    if steered.rows:
        lines += ["## Where each client region was steered", "", tables.to_markdown(steered)]
    fails = tables.failures(results)
    if fails.rows:
        lines += ["## Failures", "", tables.to_markdown(fails)]
    wire = pcap_tables.load(results.path)
    if wire:
        lines += ["## On the wire (packet captures)", ""]
        for line in pcap_tables.off_hops(wire):
            lines += [f"> **Off:** {line}", ""]
        for a in wire:
            lines += [f"**{a['architecture']}**: one-way delay per hop", "",
                      tables.to_markdown(pcap_tables.hops(a))]
        lines += [tables.to_markdown(pcap_tables.wire(wire))]
        if pcap_tables.turn(wire).rows:
            lines.append(tables.to_markdown(pcap_tables.turn(wire)))
        lines.append(tables.to_markdown(pcap_tables.cost(wire)))
    lines += ["## Plots", ""]
    for name, path in plots.items():
        if name.startswith("fault-"):
            continue
        rel = path.relative_to(base) if path.is_relative_to(base) else path
        lines += [f"![{name}]({rel.as_posix()})", "", f"_{CAPTIONS.get(name, '')}_", ""]
    if not results.target:
        lines += ["## Calibration", "", tables.to_markdown(tables.calibration_at_load(results))]
        if results.host_cpu:
            lines += ["### Host CPU while the calls ran", "",
                      tables.to_markdown(tables.host_cpu(results))]
    lines += ["Full tables, calibration and configuration: `report.html`.", "", "## Method", ""]
    lines += [f"- {line}" for line in _method(stats.bootstrap, model)]
    return "\n".join(lines) + "\n"


@dataclass
class Written:
    """A written report and what it was computed from."""

    html: Path
    markdown: Path
    results: Results
    stats: Stats

    def to_dict(self) -> dict:
        """The run's summary, the findings and the report's paths, as plain data."""
        return {"results": str(self.results.path),
                "report": {"html": str(self.html), "markdown": str(self.markdown)},
                "complete": self.results.complete,
                "missing": {"architectures": self.results.missing_architectures,
                            "files": self.results.missing_files},
                "findings": [{"architecture": f.architecture, "baseline": f.baseline,
                              "metric": f.metric, "difference_p50": f.difference.estimate,
                              "ci": [f.difference.lo, f.difference.hi],
                              "significant": f.significant, "direction": f.direction,
                              "sentence": f.sentence()}
                             for f in findings(self.results, self.stats)],
                "summary": summary_of(self.results, self.stats)}


def report(results_dir: str | Path, out_dir: str | Path | None = None,
           boot: Bootstrap = Bootstrap(), model: EModel = EModel()) -> Written:
    """Write report.html, report.md and plots/*.png (into the results folder by default).
    A partial folder (an interrupted run) is reported too; its warnings say what is missing."""
    results = load_results(results_dir)
    out = Path(out_dir) if out_dir is not None else results.path
    out.mkdir(parents=True, exist_ok=True)
    stats = compute_stats(results, boot, model)
    plots = write_plots(results, out / "plots", stats)
    html_path, md_path = out / "report.html", out / "report.md"
    html_path.write_text(render_html(results, stats, plots, model), encoding="utf-8")
    md_path.write_text(render_markdown(results, stats, plots, model, out), encoding="utf-8")
    return Written(html_path, md_path, results, stats)


def write_report(results_dir: str | Path, out_dir: str | Path | None = None,
                 boot: Bootstrap = Bootstrap(), model: EModel = EModel()) -> tuple[Path, Path]:
    """``report(...)``'s two paths: (report.html, report.md)."""
    written = report(results_dir, out_dir, boot, model)
    return written.html, written.markdown
