"""The report's tables as (header, rows) of strings, and their HTML and Markdown renderings."""
from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

import pandas as pd

from analysis.faulteffect import GAP_OVER_DETECTION_RESTART, GAP_OVER_DETECTION_RTT, GAP_OVER_RTT
from analysis.faults import FaultEffect
from analysis.load import Results, as_bool
from analysis.stats import ALL, METRIC_BY_NAME, METRICS, Stats, thin_tail

THIN = "†"  # marks a CI with fewer than 10 observations beyond the percentile


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    note: str = ""


def fmt(value, metric: str = "") -> str:
    """A number with the precision its metric deserves; '-' for a missing one."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if metric in ("mos", "loss_pct"):
        return f"{value:.2f}"
    if metric == "loss_burst_len" or abs(value) < 10:
        return f"{value:.1f}"
    return f"{value:.0f}"


def count(value) -> str:
    """An integer count; '-' when missing."""
    return "-" if value is None or value != value else f"{int(value)}"


def estimate(row, q: int, metric: str) -> str:
    """'p [lo, hi]' for percentile q of a Stats.metrics row, marked when its tail is thin."""
    if row is None or not row.n:
        return "-"
    cell = (f"{fmt(row[f'p{q}'], metric)} [{fmt(row[f'p{q}_lo'], metric)}, "
            f"{fmt(row[f'p{q}_hi'], metric)}]")
    return cell + (THIN if thin_tail(int(row.n), q) else "")


def unit(metric: str) -> str:
    u = METRIC_BY_NAME[metric].unit
    return f" ({u})" if u else ""


def headline(results: Results, stats: Stats) -> Table:
    """One row per architecture, pooled over client regions."""
    table = Table(["architecture", "sessions ok", "success % [CI]", "public UDP ports",
                   "setup p50 (ms)", "setup p95 (ms)", "setup over floor p50 (ms)",
                   "first ICE RTT p50 (ms)", "media RTT p50 (ms)", "jitter p50 (ms)",
                   "loss p50 (%)", "MOS p50", f"Δ setup p50 vs {results.baseline} (ms) [CI]"],
                  note=f"p50/p95 [95% bootstrap CI] over all client regions; {THIN} fewer than 10 "
                       f"sessions beyond the percentile (CI indicative only); success: Wilson 95% "
                       f"interval; Δ: median minus the baseline's within each client region, "
                       f"averaged over the regions.")
    baseline = results.baseline
    base = stats.row(baseline, "setup_ms")
    ports = results.ports.set_index("architecture")["public_udp_ports"].to_dict()
    for arch in results.architectures:
        s = stats.success_row(arch)
        setup = stats.row(arch, "setup_ms")
        delta = "-"
        if arch != baseline and base is not None and base.n and setup.n:
            d = stats.difference(arch, baseline, "setup_ms")
            delta = f"{d.estimate:+.0f} [{d.lo:+.0f}, {d.hi:+.0f}]"
        table.rows.append([
            arch, f"{s.ok}/{s.sessions}",
            f"{fmt(s.success_pct)} [{fmt(s.success_lo)}, {fmt(s.success_hi)}]",
            count(ports.get(arch)), estimate(setup, 50, "setup_ms"),
            estimate(setup, 95, "setup_ms"),
            estimate(stats.row(arch, "setup_over_floor_ms"), 50, "setup_over_floor_ms"),
            estimate(stats.row(arch, "first_ice_rtt_ms"), 50, "first_ice_rtt_ms"),
            estimate(stats.row(arch, "rtt_ms"), 50, "rtt_ms"),
            estimate(stats.row(arch, "jitter_ms"), 50, "jitter_ms"),
            estimate(stats.row(arch, "loss_pct"), 50, "loss_pct"),
            estimate(stats.row(arch, "mos"), 50, "mos"), delta])
    return table


def metric_detail(stats: Stats, arch: str, region: str = ALL) -> Table:
    """Every metric of one architecture: n, mean and each percentile with its CI."""
    table = Table(["metric", "n", "mean", "p50 [CI]", "p90 (MOS: p10) [CI]",
                   "p95 (MOS: p5) [CI]", "p99 (MOS: p1) [CI]"],
                  note="Tail columns show the bad tail: high values, low ones for MOS. "
                       f"{THIN} fewer than 10 observations beyond the percentile: its CI "
                       f"reshuffles a few extremes and is too narrow; read it as indicative.")
    for m in METRICS:
        row = stats.row(arch, m.name, region)
        if row is None:
            continue
        table.rows.append([m.label + unit(m.name), str(int(row.n)), fmt(row["mean"], m.name)]
                          + [estimate(row, q, m.name) for q in (50, *m.tail)])
    return table


def per_region(results: Results, stats: Stats) -> Table:
    """One row per (client region, architecture): the p50 of the main metrics."""
    keys = ("setup_ms", "setup_over_floor_ms", "first_ice_rtt_ms", "rtt_ms", "loss_pct", "mos")
    table = Table(["client region", "architecture", "cluster", "sessions ok"]
                  + [f"{METRIC_BY_NAME[k].label} p50{unit(k)}" for k in keys],
                  note="p50 [95% bootstrap CI].")
    sessions = results.sessions
    for region in results.client_regions:
        for arch in results.architectures:
            s = stats.success_row(arch, region)
            if s is None or not s.sessions:
                continue
            mine = sessions[(sessions.architecture == arch) & (sessions.client_region == region)]
            clusters = ", ".join(sorted(mine.cluster_region.dropna().unique())) or "-"
            table.rows.append([region, arch, clusters, f"{s.ok}/{s.sessions}"]
                              + [estimate(stats.row(arch, k, region), 50, k) for k in keys])
    return table


def failures(results: Results) -> Table:
    """Failed sessions grouped by architecture, stage and error."""
    table = Table(["architecture", "stage", "error", "sessions"])
    failed = results.sessions[~results.sessions.ok]
    if failed.empty:
        return table
    grouped = failed.fillna({"stage": "?", "error": "?"}).groupby(
        ["architecture", "stage", "error"], sort=False).size()
    for (arch, stage, error), count in grouped.items():
        table.rows.append([arch, stage, error, str(count)])
    return table


def ports(results: Results) -> Table:
    extra = "public_udp_ports_max" in results.ports.columns
    table = Table(["architecture", "peak concurrent sessions", "public UDP ports at the peak"]
                  + (["most public UDP ports seen"] if extra else []),
                  note=("A deployment target: the peak is counted from the clients' own "
                        "connect and end times, the ports are the distinct server media "
                        "addresses their selected ICE pairs reached (the deployment's own "
                        "sockets are not visible from here)." if results.target else ""))
    for _, row in results.ports.iterrows():
        table.rows.append([row.architecture, count(row.concurrent_sessions),
                           count(row.public_udp_ports)]
                          + ([count(pd.to_numeric(row.public_udp_ports_max, errors="coerce"))]
                             if extra else []))
    return table


def relays(results: Results) -> Table:
    """Per relay: packets both ways, flows, and every non-zero drop counter."""
    table = Table(["architecture", "relay", "packets to server", "packets to client",
                   "flows created", "flows recovered", "drops"])
    for arch, by_relay in results.relays.items():
        for name, c in (by_relay or {}).items():
            drops = {k.removeprefix("drops_"): v for k, v in c.items()
                     if k.startswith("drops_") and v}
            table.rows.append([arch, name, str(c.get("packets_to_server", "-")),
                               str(c.get("packets_to_client", "-")),
                               str(c.get("flows_created", "-")), str(c.get("flows_recovered", "-")),
                               ", ".join(f"{k} {v}" for k, v in drops.items()) or "none"])
    return table


def steering(results: Results) -> Table:
    """Where each client region's calls were steered: calls per cluster, how many went to a
    cluster other than the nearest, and how often the front's preferred cluster changed."""
    table = Table(["architecture", "client region", "calls per cluster", "not the nearest",
                   "steering changes"],
                  note="From steering.csv (the fronts' call_created and steering_changed log "
                       "lines); nearest: by the RTT the front measured.")
    frame = results.steering
    if frame.empty:
        return table
    for (arch, region), group in frame.groupby(["architecture", "client_region"], sort=False):
        calls = group[group.event == "call_created"]
        per_cluster = calls.cluster.value_counts()
        table.rows.append([
            str(arch), str(region),
            ", ".join(f"{c} {n}" for c, n in per_cluster.items()) or "-",
            str(int((~as_bool(calls.nearest)).sum())),
            str(int((group.event == "steering_changed").sum()))])
    return table


def _ms(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def _n(value, digits: int = 0, signed: bool = False) -> str:
    """A faults.csv value; '-' when not measured."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:{'+' if signed else ''}.{digits}f}"


def _three(row: dict, prefix: str) -> str:
    values = [row.get(f"{prefix}_{q}_ms") for q in ("p50", "p95", "max")]
    return "-" if all(v is None for v in values) else " / ".join(_n(v) for v in values)


def faults_hit(rows: list[dict]) -> Table:
    """Per fault and architecture: when, whom it hit, what was lost, how calls went on."""
    table = Table(["fault", "kind", "target", "architecture", "at (s)", "ended after (s)",
                   "ready after (s)", "live sessions", "affected", "lost",
                   "new calls (failed)", "reconnections", "renominations (detection / "
                   "renomination p50 ms)", "first call elsewhere (s)", "note"],
                  note="From faults.csv (docs/faults.md). at: seconds after the architecture's "
                       "clients were launched (as the scenario's at_s); the other times: "
                       "seconds after the fault. "
                       "Affected: live at the fault with its target on their path; lost: "
                       "affected sessions that ended failed. New calls: first calls and "
                       "reconnections started in the fault's window. First call elsewhere: "
                       "the first call after the fault connected off the failed cluster "
                       "(outage) or transceiver (crash). Renominations: affected calls whose "
                       "media came back when the client renominated its pair (no new call: "
                       "docs/mobility.md); detection: the client's last packet to its "
                       "renomination (its setting), renomination: the check to the first "
                       "packet after it (the edge's part).")
    for r in rows:
        head = [str(r.get("fault")), str(r.get("kind")), str(r.get("target")),
                str(r.get("architecture"))]
        if not r.get("applicable"):
            table.rows.append(head + ["-"] * 3 + ["not applicable"] + ["-"] * 6
                              + [r.get("note") or ""])
            continue
        new = ("-" if r.get("new_calls") is None
               else f"{_n(r['new_calls'])} ({_n(r.get('new_call_failures'))})")
        table.rows.append(head + [
            _n(r.get("at_s"), 1), "run end" if r.get("end_s") is None and r.get("at_s")
            is not None else _n(r.get("end_s"), 2), _n(r.get("restart_s"), 2),
            _n(r.get("sessions_live")), _n(r.get("sessions_affected")),
            _n(r.get("sessions_lost")), new, _n(r.get("reconnections")),
            "-" if not r.get("renominations") else
            f"{_n(r['renominations'])} ({_n(r.get('detection_p50_ms'), 0)} / "
            f"{_n(r.get('renomination_p50_ms'), 0)})",
            _n(r.get("first_new_session_s"), 2), r.get("note") or ""])
    return table


def faults_media(rows: list[dict]) -> Table:
    """Per fault and architecture that measured something: the audio gaps of the affected
    sessions and how soon it came back."""
    table = Table(["fault", "architecture", "down gap p50 / p95 / max (ms)",
                   "up gap p50 / p95 / max (ms)", "recovery (s)", "gap over restart (ms)",
                   "audio after ready (ms)", "extra media RTT (ms)", "window (s)"],
                  note="Per affected session its longest gap in each direction within the "
                       "fault's window (0 without one): down = server to client at the client, "
                       "up = client to server at the transceiver. Recovery: until every "
                       "affected session that was not lost had downstream audio again. Gap "
                       "over restart: the longest down gap minus the time from the kill to "
                       "the relay's ready. Audio after ready: when the last of them had audio "
                       "again, after the restarted service was ready (negative: before). "
                       "Extra media RTT: after the outage minus before, median over sessions.")
    for r in rows:
        if not r.get("applicable") or r.get("sessions_affected") is None:
            continue
        table.rows.append([str(r.get("fault")), str(r.get("architecture")),
                           _three(r, "gap_down"), _three(r, "gap_up"),
                           _n(r.get("recovery_s"), 2), _n(r.get("gap_over_restart_ms"), 0, True),
                           _n(r.get("audio_after_ready_ms"), 0, True),
                           _n(r.get("extra_rtt_ms"), 1, True), _n(r.get("window_s"), 1)])
    return table


MOVED_TARGET_MS = 100  # issue 30: a moved call's gap at most detection + one RTT + 100 ms
RESTART_TARGET_MS = 50  # issue 30: an ICE restart's gap at most one RTT + 50 ms


def calls_moved(effects: list[FaultEffect]) -> Table:
    """Per mobility fault (its kind measures a recovery against issue 30's target: a NAT
    rebinding, a move to another access network, an ICE restart on the same path) and
    architecture: whether the calls were kept, how they recovered and what the recovery cost
    beyond its target."""
    table = Table(["fault", "kind", "architecture", "affected", "lost", "new calls",
                   "ICE restarts ok / failed", "renominations", "moved by the edge (to)",
                   "detection p50 (ms)", "recovery p50 / max (ms)", "down gap p50 / max (ms)",
                   "over target, max (ms)"],
                  note="From faults.csv. ICE restarts: the client's PATCH of the call with new "
                       "ICE credentials, new checks, the same session (recovery: the PATCH to "
                       "the pair nominated under them). Renominations: affected calls whose "
                       "media came back when the client renominated its pair from its new "
                       "address (the same session, no new call or DTLS handshake: "
                       "docs/mobility.md; recovery: the check to the first packet after it). "
                       "Detection: the client's last packet to its renomination (its setting, "
                       "not the edge's), or the fault to its restart's PATCH (a move to another "
                       "access network: the host's network change). Moved by the edge: affected "
                       "calls whose session the transceiver moved to the caller's new address "
                       "(session_moved), and where (the path after). Over target: per call, its "
                       "longest down gap minus its own detection time and media RTT (a "
                       f"rebinding; target at most {MOVED_TARGET_MS} ms), minus its detection "
                       "and its ICE restart (a move to another access network; at most "
                       f"{MOVED_TARGET_MS} ms), or minus its media RTT (an ICE restart on the "
                       f"same path; at most {RESTART_TARGET_MS} ms); the most of them.")
    for x in effects:
        r = x.row
        measure = next((m for m in (GAP_OVER_DETECTION_RTT, GAP_OVER_DETECTION_RESTART,
                                    GAP_OVER_RTT) if x.fault.measures(m)), None)
        if not (r.get("applicable") and measure):
            continue
        recovery = (("renomination_p50_ms", "renomination_max_ms")
                    if measure == GAP_OVER_DETECTION_RTT
                    else ("ice_restart_p50_ms", "ice_restart_max_ms"))
        table.rows.append([
            str(r.get("fault")), str(r.get("kind")), str(r.get("architecture")),
            _n(r.get("sessions_affected")), _n(r.get("sessions_lost")), _n(r.get("new_calls")),
            f"{_n(r.get('ice_restarts'))} / {_n(r.get('ice_restarts_failed'))}",
            _n(r.get("renominations")),
            "-" if r.get("sessions_moved") is None else
            f"{_n(r['sessions_moved'])} ({r.get('moved_to') or '-'})",
            _n(r.get("detection_p50_ms"), 0) if measure != GAP_OVER_RTT else "-",
            f"{_n(r.get(recovery[0]), 0)} / {_n(r.get(recovery[1]), 0)}",
            f"{_n(r.get('gap_down_p50_ms'), 0)} / {_n(r.get('gap_down_max_ms'), 0)}",
            _n(r.get(measure), 0, True)])
    return table


def _calls_per_cluster(calls: pd.DataFrame) -> str:
    return ", ".join(f"{c} {n}" for c, n in calls.cluster.value_counts().items()) or "-"


def steering_around_outages(results: Results, effects: list[FaultEffect]) -> Table:
    """For each fault that steers calls (a cluster outage; its effect's ``steers``) and
    architecture, per client region: where its calls went before, during and after it, and the
    fronts' steering changes in its window. "Outage" below: any such fault."""
    table = Table(["fault", "architecture", "client region", "before", "during", "after",
                   "steering changes (s after the fault: new preferred cluster, why)"],
                  note="Calls per cluster from steering.csv (call_created, by the front's clock):"
                       " before = since the architecture's previous cluster outage ended (or "
                       "the start); during = the outage to its end (or the end of the run); "
                       "after = its end to the next outage. Changes: steering_changed lines "
                       "from the outage to the end of its window (its end + 10 s).")
    frame = results.steering
    if frame.empty or "unix" not in frame:
        return table
    frame = frame.assign(unix=pd.to_numeric(frame.unix, errors="coerce"))
    outages = [e for e in effects if e.window is not None and e.fault.effect.steers]
    for e in outages:
        arch, w = e.fault.architecture, e.window
        mine = [x.window for x in outages if x.fault.architecture == arch]
        since = max([x.end if x.end is not None else x.at for x in mine if x.at < w.at],
                    default=-math.inf)
        until = min([x.at for x in mine if x.at > w.at], default=math.inf)
        end = w.end if w.end is not None else math.inf
        rows = frame[frame.architecture == arch]
        for region, group in rows.groupby("client_region", sort=False):
            calls = group[group.event == "call_created"]
            changes = group[(group.event == "steering_changed") & (group.unix >= w.at)
                            & (group.unix <= w.horizon)]
            table.rows.append([
                e.fault.fault, arch, str(region),
                _calls_per_cluster(calls[(calls.unix >= since) & (calls.unix < w.at)]),
                _calls_per_cluster(calls[(calls.unix >= w.at) & (calls.unix < end)]),
                "-" if w.end is None else _calls_per_cluster(
                    calls[(calls.unix >= end) & (calls.unix < until)]),
                "; ".join(f"{c.unix - w.at:+.1f}: {c.cluster} ({c.reason})"
                          for c in changes.sort_values("unix").itertuples()) or "none"])
    return table


def calibration(results: Results) -> Table:
    cal = results.calibration
    table = Table(["path", "kind", "expected mean / sd (ms)", "measured mean / sd (ms)",
                   "expected loss (%)", "measured loss (%)", "reordered", "ok"],
                  note=f"backend {cal.get('backend', '?')}; unimpaired baseline "
                       f"{cal.get('baseline_ms', '?')} ms; calibration "
                       f"{'passed' if cal.get('ok') else 'FAILED'}.")
    for p in cal.get("paths", []):
        table.rows.append([
            f"{p.get('src')} -> {p.get('dst')} ({p.get('sender')} -> {p.get('receiver')})",
            str(p.get("kind")),
            f"{_ms(p.get('expected_mean_ms'))} / {_ms(p.get('expected_sd_ms'))}",
            f"{_ms(p.get('mean_ms'))} / {_ms(p.get('sd_ms'))}",
            fmt(p.get("expected_loss_pct"), "loss_pct"), fmt(p.get("loss_pct"), "loss_pct"),
            str(p.get("reordered", "-")), "yes" if p.get("ok") else "NO"])
    return table


def calibration_at_load(results: Results) -> Table:
    """Idle calibration next to each architecture's calibration while its calls ran."""
    table = Table(["when", "live sessions mean (min-max)", "paths ok", "worst mean error (ms)",
                   "engine CPU (% of a core)", "engine packets/s", "release lateness p50 / p99 (us)"],
                  note="Calls' paths probed again while the calls ran (the probes' own packets "
                       "included). Engine figures are the userspace impairment engine over each "
                       "probe window; '-' where the backend has no engine.")
    runs = [("idle (before the calls)", results.calibration)]
    runs += [(f"at load: {arch}", cal) for arch, cal in results.calibration_at_load.items()]
    for when, cal in runs:
        paths = cal.get("paths", [])
        if not paths:
            continue
        engine = cal.get("engine") or {}
        live = ("0" if when.startswith("idle") else
                f"{cal.get('live_sessions_mean', 0):g} ({cal.get('live_sessions_min', 0)}-"
                f"{cal.get('live_sessions_max', 0)})")
        errors = [abs(p["mean_ms"] - p["expected_mean_ms"]) for p in paths
                  if p.get("mean_ms") is not None]
        late = (engine.get("lateness_p50_us"), engine.get("lateness_p99_us"))
        table.rows.append([
            when, live, f"{sum(1 for p in paths if p.get('ok'))}/{len(paths)}",
            _ms(max(errors)) if errors else "-",
            "-" if engine.get("cpu_pct") is None else f"{engine['cpu_pct']:.1f}",
            "-" if engine.get("releases_per_s") is None else f"{engine['releases_per_s']:.0f}",
            "-" if late[0] is None else f"{late[0]:.0f} / {late[1]:.0f}"])
    return table


HOST_CPU_GROUPS = ("clients", "engine", "relay", "ingress", "transceiver", "agent", "signaling",
                   "turn", "redis", "external", "runner")


def host_cpu(results: Results) -> Table:
    """Where the host's CPU went while each architecture's calls ran (host_cpu.json)."""
    windows = results.host_cpu
    groups = [g for g in HOST_CPU_GROUPS if any(g in w.get("groups", {}) for w in windows.values())]
    groups += sorted({g for w in windows.values() for g in w.get("groups", {})} - set(groups))
    table = Table(["architecture", "window s", "host busy (% of all cores)",
                   "idle process lagged (s)", "steal", "interrupts"] + groups + ["other"],
                  note="Measured in this run, from the first calls due to the last moment every "
                       "client still ran: the host's busy time (wall time on every core minus "
                       "/proc/stat's idle) and each group's scheduler time (every thread), in % of "
                       "ONE core unless said; steal and interrupts are the kernel's tick samples. "
                       "'runner' includes what the runner started for the world (hosts' shells, "
                       "probes, captures); 'other' is busy time no group claims (kernel threads, "
                       "packet work in interrupts). A host near all its cores busy delays every "
                       "process on it: what the lag watch flags as saturated. 'idle process "
                       "lagged': seconds in which a process with no work at the clients' "
                       "priority (scenarios/idleprobe.py) lagged by the same rule: the host's "
                       "share of the clients' lagged seconds.")
    for arch, w in windows.items():
        g = w.get("groups", {})
        table.rows.append([arch, f"{w.get('seconds', 0):.0f}",
                           f"{w.get('busy_of_host_pct', 0):.0f}% ({w.get('busy_pct', 0):.0f} of "
                           f"{100 * w.get('cpus', 1)})", _idle_probe(w.get("idle_probe")),
                           f"{w.get('steal_pct', 0):.1f}", f"{w.get('irq_pct', 0):.1f}"]
                          + [f"{g[k]:.1f}" if k in g else "-" for k in groups]
                          + [f"{w.get('other_pct', 0):.1f}"])
    return table


def _idle_probe(probe: dict | None) -> str:
    if not probe:
        return "-"
    return f"{probe.get('lagged_seconds', 0)} of {probe.get('seconds', 0)}"


def configuration(results: Results) -> Table:
    """The run's scenario and world, one setting per row."""
    c = results.config
    scenario = c.get("scenario", {})
    table = Table(["setting", "value"])
    items = [("scenario", scenario.get("name")), ("scenario file", scenario.get("source")),
             ("client regions", ", ".join(c.get("client_regions", []))),
             ("clusters", ", ".join(c.get("clusters", []))),
             ("world regions", ", ".join(c.get("world_regions", []))),
             ("deployment target", results.target or "none (an emulated world)"),
             ("architectures", ", ".join(c.get("architectures")
                                         or scenario.get("architectures", []))),
             ("sessions per region", scenario.get("sessions_per_region")),
             ("Chromium sessions per region", scenario.get("chromium_per_region", 0)),
             ("client mix per region", ", ".join(
                 f"{kind} {n}" for kind, n in (scenario.get("clients") or {}).items())),
             ("call duration (s)", scenario.get("call_duration_s")),
             ("start rate (sessions/s)", scenario.get("start_rate")),
             ("last mile", scenario.get("last_mile")),
             ("profile overrides", scenario.get("profiles") or "none"),
             ("impairment backend", c.get("backend")),
             ("idle cores poll before halting", c.get("halt_polling")),
             ("commit", c.get("commit")),
             ("started", c.get("started"))]
    for key, value in items:
        table.rows.append([key, "-" if value in (None, "") else str(value)])
    return table


def impairments(results: Results) -> Table:
    table = Table(["kind", "direction", "delay (ms)", "jitter (ms)", "distribution", "loss",
                   "rate (Mbit/s)"])
    for key, imp in results.config.get("impairments", {}).items():
        kind, _, direction = key.partition(" ")
        loss = imp.get("loss") or {}
        if "pct" in loss:
            loss_text = f"{loss['pct']:g} % random"
        elif loss:
            loss_text = ("Gilbert-Elliott " + ", ".join(
                f"{k} {v:.3g}" for k, v in loss.items()))
        else:
            loss_text = "none"
        table.rows.append([kind, direction, fmt(imp.get("delay_ms")), fmt(imp.get("jitter_ms")),
                           str(imp.get("distribution", "-")), loss_text,
                           fmt(imp.get("rate_mbit")) if imp.get("rate_mbit") else "unlimited"])
    return table


def to_html(table: Table) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in table.header)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>"
                   for row in table.rows)
    note = f'<p class="note">{e(table.note)}</p>' if table.note else ""
    if not table.rows:
        return '<p class="note">none</p>'
    # The wrapper scrolls a wide table inside itself; the page never scrolls sideways.
    return (f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>'
            f"</table></div>{note}")


def to_markdown(table: Table) -> str:
    if not table.rows:
        return "none\n"
    cell = lambda c: str(c).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(cell(h) for h in table.header) + " |",
             "|" + "|".join("---" for _ in table.header) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in table.rows]
    if table.note:
        lines += ["", f"_{table.note}_"]
    return "\n".join(lines) + "\n"
