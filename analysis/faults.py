"""What each fault of a run did to the calls: ``faults.csv``, one row per (fault, architecture).

Computed from the results folder alone (faults.json, sessions.csv, attempts.csv, gaps.csv,
samples.csv); docs/faults.md defines every column. Times are wall-clock seconds (``*_unix``);
a row's times are relative to the fault (``at``) unless the column says otherwise.

Which sessions a fault hits follows the session's path at the moment of the fault (its latest
attempt started by then):

    port-per-session, cluster-relay   last_mile/C, public/C/K (none if C == K), cluster/K
    global-relay                      last_mile/C, ingress/C, backbone/C/K, cluster/K

(C the client region, K the cluster; link targets are unordered pairs). A target
``cluster/K/N`` hits only the sessions whose transceiver is N (the transceiver column is its
control URL, port 8900 + N - 1); ``cluster/K`` without an id hits all of K.

No kind of fault is named here: what differs between kinds comes with each faults.json record
(its ``effect``, analysis/faulteffect.py): the targets whose sessions it hits, which of the
optional columns its row fills, whether it steers calls.
"""
from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pandas as pd

from analysis import archinfo
from analysis.faulteffect import (EXTRA_RTT, FIRST_CALL_ELSEWHERE, GAP_OVER_DETECTION_RESTART,
                                  GAP_OVER_DETECTION_RTT, GAP_OVER_RESTART, GAP_OVER_RTT,
                                  Effect)
from analysis.jsonout import plain
from analysis.load import Results
from analysis.stats import percentile
from voiceedge.results import GAP_MIN_MS  # the shortest gap the clients record

FAULT_FIELDS = (
    "fault", "kind", "target", "architecture", "applicable", "redis", "at_s", "end_s",
    "window_s", "sessions_live", "sessions_affected", "sessions_lost", "new_calls",
    "new_call_failures", "gap_down_p50_ms", "gap_down_p95_ms", "gap_down_max_ms",
    "gap_up_p50_ms", "gap_up_p95_ms", "gap_up_max_ms", "recovery_s", "recovery_p50_s",
    "reconnections", "renominations", "detection_p50_ms", "renomination_p50_ms",
    "renomination_max_ms", "sessions_moved", "moved_to", "ice_restarts", "ice_restarts_failed",
    "ice_restart_p50_ms", "ice_restart_max_ms",
    "restart_s", "gap_over_restart_ms", "audio_after_ready_ms", "first_new_session_s",
    "extra_rtt_ms", "gap_over_detection_rtt_max_ms", "gap_over_rtt_max_ms",
    "gap_over_detection_restart_max_ms", "setting_up",
    "first_audio_after_s",
    "note")
# The columns a fault budget may bound (analysis/budgets.py).
FAULT_METRICS = tuple(f for f in FAULT_FIELDS if f not in (
    "fault", "kind", "target", "architecture", "applicable", "redis", "moved_to", "note"))
# After the fault has ended (or its service is ready again), gaps and new calls are still
# counted for this long: a client notices a dead path only at its next media timeout.
SETTLE_S = 10.0
TRANSCEIVER_PORT_BASE = 8900  # transceiver N's control port is 8900 + N - 1

Key = tuple[str, str, int]  # (architecture, client_region, session)


@dataclass(frozen=True)
class Target:
    """A fault's target: ``cluster/K[/N]``, ``ingress/C``, ``backbone/A/B``, ``public/A/B``
    or ``last_mile/C``."""

    tier: str
    regions: frozenset[str]
    transceiver: int | None = None

    @classmethod
    def parse(cls, text: str) -> "Target":
        parts = str(text).strip("/").split("/")
        tier, rest = parts[0], parts[1:]
        if tier == "cluster" and len(rest) == 2 and rest[1].isdigit():
            return cls(tier, frozenset(rest[:1]), int(rest[1]))
        return cls(tier, frozenset(rest))

    def on_path(self, arch: "archinfo.ArchInfo", client: str, cluster: str | None,
                transceiver: int | None) -> bool:
        """Whether a session of ``arch`` (its architectures.json facts) from ``client`` on
        ``cluster`` (and transceiver) crosses this target."""
        if self.tier == "last_mile":
            return self.regions == {client}
        if cluster is None:
            return False
        if self.tier == "cluster":
            return self.regions == {cluster} and (
                self.transceiver is None or self.transceiver == transceiver)
        if self.tier == "ingress":
            return arch.ingress and self.regions == {client}
        link = arch.media_link
        return self.tier == link and client != cluster and self.regions == {client, cluster}


def transceiver_id(cell) -> int | None:
    """Transceiver N from its control URL ``http://ADDR:PORT`` (PORT = 8900 + N - 1), or a
    plain number; None when absent."""
    if cell is None or (isinstance(cell, float) and math.isnan(cell)) or cell is pd.NA:
        return None
    text = str(cell).strip()
    if not text:
        return None
    if text.isdigit():
        return int(text)
    try:
        port = urlsplit(text if "//" in text else f"//{text}").port
    except ValueError:
        return None
    return None if port is None else port - TRANSCEIVER_PORT_BASE + 1


def _t(value) -> float | None:
    """A time cell as a float, None when empty."""
    if value is None or value is pd.NA:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def _text(value) -> str | None:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    text = str(value).strip()
    return text or None


@dataclass(frozen=True)
class Fault:
    """One faults.json record: a fault as it happened in one architecture."""

    fault: str
    kind: str
    target: str
    architecture: str
    applicable: bool
    note: str = ""
    at: float | None = None       # the fault happened (kill sent, link cut)
    end: float | None = None      # it ended (restart begun, link restored); None: end of run
    ready: float | None = None    # the restarted service answered ready
    redis: bool | None = None
    clock: float | None = None  # at_s counts from here (when the first call was due)
    effect: Effect = field(default_factory=Effect)  # what its kind says about its effect

    @classmethod
    def of(cls, record: dict) -> "Fault":
        return cls(str(record.get("fault", "")), str(record.get("kind", "")),
                   str(record.get("target", "")), str(record.get("architecture", "")),
                   bool(record.get("applicable", False)), str(record.get("note") or ""),
                   _t(record.get("at_unix")), _t(record.get("end_unix")),
                   _t(record.get("ready_unix")), record.get("redis"),
                   _t(record.get("clock_unix", record.get("clients_started_unix"))),
                   Effect.of(record))

    @property
    def hits(self) -> tuple[Target, ...]:
        """The targets whose sessions this fault hits: its effect's, else its own target."""
        return tuple(Target.parse(t) for t in self.effect.hits or (self.target,))

    def on_path(self, arch: "archinfo.ArchInfo", client: str, cluster: str | None,
                transceiver: int | None) -> bool:
        """Whether one of the targets it hits is on that session's path (``Target.on_path``)."""
        return any(t.on_path(arch, client, cluster, transceiver) for t in self.hits)

    def measures(self, column: str) -> bool:
        """Whether its kind fills this optional column (analysis/faulteffect.py)."""
        return column in self.effect.measures


@dataclass(frozen=True)
class Window:
    """[at, horizon]: horizon = max(end, ready, at) + 10 s, cut at the architecture's next
    fault; a fault that lasted to the end of the run ends with the run's last session."""

    at: float
    end: float | None
    ready: float | None
    horizon: float
    run_end: float

    def rel(self, t: float | None) -> float | None:
        return None if t is None else t - self.at


@dataclass
class SessionAtFault:
    """A session live at the fault, with the path it was on then."""

    key: Key
    cluster: str | None
    transceiver: int | None
    started: float
    ended: float
    ok: bool
    first_rx: float | None = None
    last_rx: float | None = None
    on_path: bool = False                # the fault's target is on its path
    gap_down_ms: float = 0.0             # its longest down gap overlapping the window
    gap_down_start: float | None = None  # when that gap began (the last packet before it)
    gap_down_end: float | None = None    # when it ended (audio back; None: never, in time)
    gap_up_ms: float = 0.0

    @property
    def lost(self) -> bool:
        return not self.ok


@dataclass
class FaultEffect:
    """One row of faults.csv, with what it was computed from (for the plots and tables)."""

    fault: Fault
    row: dict
    window: Window | None = None
    affected: list[SessionAtFault] = field(default_factory=list)


# ------------------------------------------------------------------ the run's frames

def with_keys(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy with integer sessions and a ``key`` column: (architecture, client_region,
    session)."""
    frame = frame.copy()
    frame["session"] = pd.to_numeric(frame["session"], errors="coerce")
    frame = frame.dropna(subset=["session"])
    frame["session"] = frame["session"].astype(int)
    frame["key"] = list(zip(frame.architecture.astype(str), frame.client_region.astype(str),
                            frame.session))
    return frame


def gaps_by_session(gaps: pd.DataFrame) -> dict[tuple[Key, str], list[tuple[float, float]]]:
    """gaps.csv as (session key, direction) -> [(start_unix, ms)]."""
    out: dict = {}
    if gaps.empty:
        return out
    for r in with_keys(gaps).itertuples():
        start, ms = _t(r.start_unix), _t(r.ms)
        if start is not None and ms is not None:
            out.setdefault((r.key, str(r.direction)), []).append((start, ms))
    return out


def _longest(gaps: list[tuple[float, float]], lo: float, hi: float) -> tuple[float, float | None]:
    """(ms, end) of the longest gap overlapping [lo, hi]; (0, None) when none does."""
    best, end = 0.0, None
    for start, ms in gaps:
        stop = start + ms / 1000.0
        if start < hi and stop > lo and ms > best:
            best, end = ms, stop
    return best, end


def _current_path(attempts: pd.DataFrame, at: float, cluster, transceiver
                  ) -> tuple[str | None, int | None]:
    """The cluster and transceiver of the session's latest attempt started by ``at`` that
    reached one (else the session's own columns: its first attempt's)."""
    if not attempts.empty:
        before = attempts[(attempts.started_unix <= at) & attempts.cluster_region.notna()]
        before = before[before.cluster_region.astype(str).str.strip() != ""]
        if not before.empty:
            last = before.sort_values(["started_unix", "attempt"]).iloc[-1]
            return str(last.cluster_region), transceiver_id(last.transceiver)
    return _text(cluster), transceiver_id(transceiver)


def _never_connected(calls: pd.DataFrame) -> pd.Series:
    """A new call failed when it never connected. (An attempt's ``error`` also records why a
    call that did connect ended, e.g. its media timed out: that call was placed.)"""
    return calls.connected_unix.isna()


# ------------------------------------------------------------------ one fault

class _Run:
    """The frames of one architecture, indexed for the fault computations."""

    def __init__(self, results: Results, arch: str) -> None:
        s = results.sessions
        self.arch = arch
        self.info = results.archinfo[arch]
        self.call_s = _t((results.config.get("scenario") or {}).get("call_duration_s"))
        self.connected: dict = {}  # session key -> first connected (unix)
        timed = {"started_unix", "ended_unix"} <= set(s.columns)
        self.sessions = with_keys(s[s.architecture == arch]) if timed else None
        if self.sessions is not None and "connected_unix" in self.sessions:
            self.connected = {k: c for k, c in zip(self.sessions.key,
                                                   map(_t, self.sessions.connected_unix))
                              if c is not None}
        a = results.attempts
        self.attempts = with_keys(a[a.architecture == arch]) if not a.empty else with_keys(a)
        self.by_session = {k: g for k, g in self.attempts.groupby("key")} \
            if not self.attempts.empty else {}
        self.gaps = gaps_by_session(results.gaps[results.gaps.architecture == arch]
                                     if not results.gaps.empty else results.gaps)
        smp = results.samples
        self.samples = smp[smp.architecture == arch]

    @property
    def first_start(self) -> float | None:
        if self.sessions is None or self.sessions.started_unix.isna().all():
            return None
        return float(self.sessions.started_unix.min())

    @property
    def last_end(self) -> float | None:
        if self.sessions is None or self.sessions.ended_unix.isna().all():
            return None
        return float(self.sessions.ended_unix.max())


def _window(f: Fault, run: _Run, next_at: float | None) -> Window:
    run_end = run.last_end if run.last_end is not None else f.at
    end = f.end if f.end is not None else max(run_end, f.at)
    horizon = max(t for t in (end, f.ready, f.at) if t is not None) + SETTLE_S
    if next_at is not None:
        horizon = min(horizon, next_at)
    return Window(f.at, f.end, f.ready, horizon, run_end)


def _live(run: _Run, f: Fault, w: Window) -> list[SessionAtFault]:
    out = []
    s = run.sessions
    live = s[(s.started_unix <= w.at) & (s.ended_unix > w.at)]
    for r in live.itertuples():
        attempts = run.by_session.get(r.key, pd.DataFrame())
        cluster, transceiver = _current_path(attempts, w.at, r.cluster_region,
                                             getattr(r, "transceiver", None))
        out.append(SessionAtFault(
            r.key, cluster, transceiver, float(r.started_unix), float(r.ended_unix), bool(r.ok),
            _t(getattr(r, "first_rx_unix", None)), _t(getattr(r, "last_rx_unix", None)),
            f.on_path(run.info, r.key[1], cluster, transceiver)))
    return out


def _silent_tail(s: SessionAtFault, run: _Run, w: Window) -> tuple[float, float] | None:
    """(last packet, ms to the call's planned end) when the session's audio stopped in the
    window and never came back before its call was due to end (first connected +
    call_duration_s): a silence no packet closed, so gaps.csv cannot hold it."""
    connected = run.connected.get(s.key)
    if s.last_rx is None or connected is None or run.call_s is None:
        return None
    planned_end = connected + run.call_s
    if not w.at <= s.last_rx <= w.horizon or planned_end - s.last_rx < GAP_MIN_MS / 1000.0:
        return None
    return s.last_rx, 1000.0 * (planned_end - s.last_rx)


def _new_calls(run: _Run, w: Window) -> tuple[int, int, pd.DataFrame]:
    """(calls started in [at, horizon], how many failed, those attempts)."""
    a = run.attempts
    if not a.empty:
        new = a[(a.started_unix >= w.at) & (a.started_unix <= w.horizon)]
        return len(new), int(_never_connected(new).sum()), new
    s = run.sessions
    new = s[(s.started_unix >= w.at) & (s.started_unix <= w.horizon)]
    failed = _never_connected(new) if "connected_unix" in new else ~new.ok
    return len(new), int(failed.sum()), pd.DataFrame()


def _first_elsewhere(run: _Run, f: Fault, w: Window) -> float | None:
    """Seconds from the fault to the first call (new or reconnection) started after it that
    connected on a path off the fault's targets (off the failed cluster of an outage, the
    crashed transceiver(s) of a crash)."""
    a = run.attempts
    if a.empty:  # a run without attempts.csv: the sessions' own connections
        s = run.sessions
        if "connected_unix" not in s:
            return None
        a = s.assign(attempt=0)
    new = a[(a.started_unix >= w.at) & (a.connected_unix > w.at)
            & (a.connected_unix <= w.horizon)]
    best = None
    for r in new.itertuples():
        there = _text(r.cluster_region)
        if there is None:
            continue
        hit = f.on_path(run.info, str(r.client_region), there,
                        transceiver_id(getattr(r, "transceiver", None)))
        if not hit and (best is None or r.connected_unix < best):
            best = float(r.connected_unix)
    return None if best is None else best - w.at


def _extra_rtt(run: _Run, affected: list[SessionAtFault], w: Window) -> float | None:
    """Median over the affected sessions that kept their call of (median media RTT after
    their audio was back - median before the fault)."""
    smp = run.samples
    if smp.empty:
        return None
    diffs = []
    for s in affected:
        if s.lost:
            continue
        arch, region, session = s.key
        mine = smp[(smp.client_region == region) & (smp.session == session)].dropna(
            subset=["rtt_ms", "t_ms"])
        t = s.started + mine.t_ms / 1000.0
        back = s.gap_down_end if s.gap_down_end is not None else w.at
        before, after = mine.rtt_ms[t < w.at], mine.rtt_ms[t > back]
        if len(before) and len(after):
            diffs.append(float(after.median() - before.median()))
    return percentile(diffs, 50)


def _round(value, digits: int):
    return None if value is None else round(float(value), digits)


def _effect(f: Fault, run: _Run, next_at: float | None) -> FaultEffect:
    row = {k: None for k in FAULT_FIELDS}
    row.update(fault=f.fault, kind=f.kind, target=f.target, architecture=f.architecture,
               applicable=f.applicable, redis=f.redis, note=f.note)
    if not f.applicable:
        return FaultEffect(f, row)
    # at_s counts as the scenario's faults do: from the clock the clients were given (older
    # folders: from their launch, or from the first session's start)
    first = f.clock if f.clock is not None else run.first_start
    if f.at is None or run.sessions is None or first is None:
        why = ("the fault did not happen" if f.at is None
               else "sessions.csv has no session times (started_unix, ended_unix)")
        row["note"] = "; ".join(x for x in (f.note, f"not measured: {why}") if x)
        return FaultEffect(f, row)
    w = _window(f, run, next_at)
    live = _live(run, f, w)
    on_path = [s for s in live if s.on_path]
    # Calls still setting up at the fault (no audio yet) had no audio to lose: they are not
    # calls in progress. Counted apart, with how long after the fault their first audio came.
    setting_up = [s for s in on_path if s.first_rx is None or s.first_rx > w.at]
    affected = [s for s in on_path if s not in setting_up]
    silent = 0  # affected calls whose audio never came back before their planned end
    for s in affected:
        down_gaps = run.gaps.get((s.key, "down"), [])
        tail = _silent_tail(s, run, w)
        if tail is not None:
            down_gaps = down_gaps + [tail]
            silent += 1
        s.gap_down_ms, s.gap_down_end = _longest(down_gaps, w.at, w.horizon)
        if s.gap_down_end is not None:
            s.gap_down_start = s.gap_down_end - s.gap_down_ms / 1000.0
        if tail is not None and s.gap_down_ms == tail[1]:
            s.gap_down_end = None  # audio was not back: no recovery to time
        s.gap_up_ms, _ = _longest(run.gaps.get((s.key, "up"), []), w.at, w.horizon)
    kept = [s for s in affected if not s.lost]
    down = [s.gap_down_ms for s in affected]
    up = [s.gap_up_ms for s in affected]
    recovery = None
    back = [s.gap_down_end - w.at for s in kept if s.gap_down_end is not None]
    if back:
        recovery = max(back)
    elif kept and not silent:
        recovery = 0.0  # no affected call lost its audio
    # the typical call: each kept call's own time to audio (0 without a gap), their median
    each = [s.gap_down_end - w.at if s.gap_down_end is not None else 0.0
            for s in kept if not (s.gap_down_end is None and s.gap_down_ms)]
    recovery_p50 = percentile(each, 50) if each else None
    new, failed, _ = _new_calls(run, w)
    keys = {s.key for s in affected}
    if not run.attempts.empty:  # reconnections: calls placed again by the affected sessions
        a = run.attempts
        reconnections = int(((a.attempt > 0) & a.key.isin(keys) & (a.started_unix >= w.at)
                             & (a.started_unix <= w.horizon)).sum())
    elif "reconnections" in run.sessions:
        mine = run.sessions[run.sessions.key.isin(keys)]
        reconnections = int(pd.to_numeric(mine.reconnections, errors="coerce").fillna(0).sum())
    else:
        reconnections = None
    renominated = _renominated(run, keys, w)
    renominated.update(_moved(run, keys, w))
    restarts = _ice_restarts(run, keys, w)
    detected = restarts.pop("detection_ms", None)
    if renominated.get("detection_p50_ms") is None and detected:
        # no renomination: the client's detection is its restart's (the fault to its PATCH)
        renominated["detection_p50_ms"] = _round(percentile(detected, 50), 1)
    renominated.update(restarts)
    restart = w.rel(f.ready)
    gap_max = max(down) if down else None
    row.update(
        at_s=_round(w.at - first, 3), end_s=_round(w.rel(f.end), 3),
        window_s=_round(w.horizon - w.at, 3), sessions_live=len(live),
        sessions_affected=len(affected), sessions_lost=len(affected) - len(kept),
        new_calls=new, new_call_failures=failed,
        gap_down_p50_ms=_round(percentile(down, 50), 1),
        gap_down_p95_ms=_round(percentile(down, 95), 1), gap_down_max_ms=_round(gap_max, 1),
        gap_up_p50_ms=_round(percentile(up, 50), 1), gap_up_p95_ms=_round(percentile(up, 95), 1),
        gap_up_max_ms=_round(max(up) if up else None, 1), recovery_s=_round(recovery, 3),
        recovery_p50_s=_round(recovery_p50, 3),
        reconnections=reconnections, restart_s=_round(restart, 3), **renominated)
    if f.measures(GAP_OVER_RESTART) and restart is not None and gap_max is not None:
        row["gap_over_restart_ms"] = _round(gap_max - 1000.0 * restart, 1)
    if restart is not None and recovery is not None:
        row["audio_after_ready_ms"] = _round(1000.0 * (recovery - restart), 1)
    notes = [f.note]
    if f.measures(FIRST_CALL_ELSEWHERE):
        row["first_new_session_s"] = _round(_first_elsewhere(run, f, w), 3)
        if row["first_new_session_s"] is None:
            notes.append("no call connected elsewhere in the window")
    if f.measures(EXTRA_RTT):
        row["extra_rtt_ms"] = _round(_extra_rtt(run, affected, w), 1)
    if f.measures(GAP_OVER_DETECTION_RTT):
        row[GAP_OVER_DETECTION_RTT] = _round(_gap_over_detection_rtt(run, affected, w), 1)
    if f.measures(GAP_OVER_RTT):
        row[GAP_OVER_RTT] = _round(_gap_over_rtt(run, affected, w), 1)
    if f.measures(GAP_OVER_DETECTION_RESTART):
        row[GAP_OVER_DETECTION_RESTART] = _round(
            _gap_over_detection_restart(run, affected, w), 1)
    if setting_up:
        firsts = [s.first_rx - w.at for s in setting_up if s.first_rx is not None]
        row["setting_up"] = len(setting_up)
        row["first_audio_after_s"] = _round(max(firsts), 3) if firsts else None
        lost_setups = sum(1 for s in setting_up if s.lost)
        notes.append(f"{len(setting_up)} call(s) on the target were still setting up (not "
                     f"counted as affected; {lost_setups} of them failed)")
    else:
        row["setting_up"] = 0
    if silent:
        notes.append(f"{silent} affected call(s) reached their planned end before audio came "
                     "back: their gap runs to that end and they have no recovery time")
    if not affected:
        notes.append("no live session was on its target")
    elif not kept:
        notes.append("every affected session was lost")
    row["note"] = "; ".join(x for x in notes if x)
    return FaultEffect(f, row, w, affected)


# ------------------------------------------------------------------ the run

def fault_effects(results: Results) -> list[FaultEffect]:
    """Every faults.json record's row, in the file's order."""
    faults = [Fault.of(r) for r in results.faults]
    runs: dict[str, _Run] = {}
    out = []
    for f in faults:
        run = runs.get(f.architecture) or runs.setdefault(f.architecture,
                                                          _Run(results, f.architecture))
        later = [g.at for g in faults if g.architecture == f.architecture and g.applicable
                 and g.at is not None and f.at is not None and g.at > f.at]
        out.append(_effect(f, run, min(later, default=None)))
    return out


def _renominated(run, keys: set, w) -> dict:
    """The affected sessions' renominations in the fault's window (a client whose media
    stopped renominated its pair and the media came back: docs/mobility.md): how many, the
    client's detection time (its last packet to its renomination: its setting, not the
    edge's) and the renomination's own time (the check to the first packet after it)."""
    sessions = run.sessions
    if sessions is None or "renominated" not in sessions:
        return {}
    detection, renomination = [], []
    for cell in sessions[sessions.key.isin(keys)].renominated:
        for stopped, detected, back in _renominations(cell, w):
            if stopped is not None:
                detection.append(1000.0 * (detected - stopped))
            renomination.append(1000.0 * (back - detected))
    return {"renominations": len(renomination),
            "detection_p50_ms": _round(percentile(detection, 50), 1) if detection else None,
            "renomination_p50_ms": (_round(percentile(renomination, 50), 1)
                                    if renomination else None),
            "renomination_max_ms": _round(max(renomination), 1) if renomination else None}


def _entries(cell) -> list:
    """A sessions.csv cell holding a JSON list (``renominated``, ``moved``); [] when empty
    or unreadable."""
    try:
        return json.loads(cell) if isinstance(cell, str) and cell else []
    except ValueError:
        return []


def _moved(run, keys: set, w) -> dict:
    """The affected sessions whose media the transceiver moved to a new client address in the
    fault's window (sessions.csv's ``moved``, from its ``session_moved`` lines: the same
    session, no new call), and the addresses they moved to (their IPs: the path after)."""
    sessions = run.sessions
    if sessions is None or "moved" not in sessions:
        return {}
    moved, to = 0, set()
    for cell in sessions[sessions.key.isin(keys)].moved:
        here = [e for e in _entries(cell) if e[0] is not None and w.at <= e[0] <= w.horizon]
        moved += bool(here)
        to.update(str(e[2]).rsplit(":", 1)[0] for e in here if e[2])
    return {"sessions_moved": moved, "moved_to": " ".join(sorted(to)) or None}


def _restarts_in(cell, w) -> list[list]:
    """A sessions.csv ``ice_restarts`` cell's entries [sent, ok, patch ms, ms, reason] whose
    PATCH was sent in the window."""
    return [e for e in _entries(cell) if len(e) >= 4 and w.at <= e[0] <= w.horizon]


def _ice_restarts(run, keys: set, w) -> dict:
    """The affected sessions' ICE restarts in the fault's window (a PATCH of the call with new
    credentials, new checks, the same session: docs/mobility.md): how many brought a pair
    nominated under the new credentials, how many failed, and their time (PATCH sent to the
    new pair nominated); ``detection_ms``: each call's fault to its first PATCH."""
    sessions = run.sessions
    if sessions is None or "ice_restarts" not in sessions:
        return {}
    done, failed, detection = [], 0, []
    for cell in sessions[sessions.key.isin(keys)].ice_restarts:
        found = _restarts_in(cell, w)
        if found:
            detection.append(1000.0 * (found[0][0] - w.at))
        for _, ok, _, ms, _ in (e[:5] for e in found):
            if ok and ms is not None:
                done.append(float(ms))
            else:
                failed += 1
    if not done and not failed:
        return {}
    return {"detection_ms": detection, "ice_restarts": len(done), "ice_restarts_failed": failed,
            "ice_restart_p50_ms": _round(percentile(done, 50), 1) if done else None,
            "ice_restart_max_ms": _round(max(done), 1) if done else None}


def _gap_over_rtt(run, affected: list[SessionAtFault], w) -> float | None:
    """The most any call that restarted ICE lost of its downlink beyond one media RTT: its
    longest down gap in the window (0 without one) minus its RTT (issue 30's target for a
    restart on the same path: at most 50 ms)."""
    def excess(s: SessionAtFault, cell, rtt: float) -> float | None:
        return (s.gap_down_ms or 0.0) - rtt if _restarts_in(cell, w) else None
    return _worst_call(run, affected, "ice_restarts", excess)


def _gap_over_detection_restart(run, affected: list[SessionAtFault], w) -> float | None:
    """The most any call that restarted ICE after the fault lost of its downlink beyond its
    detection (the fault to its first restart's PATCH) and that restart (the PATCH to the
    pair nominated under the new credentials): issue 30's target for a call moved to another
    access network, at most 100 ms. A call whose restart failed counts its whole gap."""
    def excess(s: SessionAtFault, cell, rtt: float) -> float | None:
        found = _restarts_in(cell, w)
        if not found:
            return None
        sent, ok, _, ms = found[0][:4]
        took = float(ms) if ok and ms is not None else 0.0
        return (s.gap_down_ms or 0.0) - 1000.0 * (sent - w.at) - took
    return _worst_call(run, affected, "ice_restarts", excess)


def _renominations(cell, w) -> list[tuple[float | None, float, float]]:
    """A sessions.csv ``renominated`` cell's entries (stopped, detected, back) in the window."""
    return [(stopped, detected, back) for stopped, detected, back in _entries(cell)
            if w.at <= detected <= w.horizon]


def _gap_over_detection_rtt(run, affected: list[SessionAtFault], w) -> float | None:
    """The most any renominated call's longest down gap exceeded its own detection time plus
    its media RTT (issue 30's target: at most 100 ms): what the edge and the path added to a
    recovery the client started on its own setting."""
    def excess(s: SessionAtFault, cell, rtt: float) -> float | None:
        found = [e for e in _renominations(cell, w) if e[0] is not None]
        if not found:
            return None
        stopped, detected, _ = found[0]
        return s.gap_down_ms - 1000.0 * (detected - stopped) - rtt
    return _worst_call(run, affected, "renominated", excess)


def _worst_call(run, affected: list[SessionAtFault], column: str, excess) -> float | None:
    """The largest ``excess(session, its sessions.csv column cell, its media RTT)`` over the
    affected calls it is not None for; None when sessions.csv lacks the columns or no call
    counts."""
    sessions = run.sessions
    if sessions is None or column not in sessions or "rtt_ms" not in sessions:
        return None
    rtts = dict(zip(sessions.key, pd.to_numeric(sessions.rtt_ms, errors="coerce")))
    cells = dict(zip(sessions.key, sessions[column]))
    values = []
    for s in affected:
        rtt = rtts.get(s.key)
        if rtt is None or pd.isna(rtt):
            continue
        value = excess(s, cells.get(s.key), float(rtt))
        if value is not None:
            values.append(value)
    return max(values) if values else None


def fault_rows(results: Results) -> list[dict]:
    """faults.csv's rows as plain data (None for what was not measured)."""
    return [plain(e.row) for e in fault_effects(results)]


def write_faults_csv(directory: Path, rows: list[dict]) -> Path:
    path = Path(directory) / "faults.csv"
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FAULT_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows({k: "" if r.get(k) is None else r[k] for k in FAULT_FIELDS} for r in rows)
    os.replace(tmp, path)
    return path


def read_faults_csv(path: Path) -> list[dict]:
    """faults.csv back as rows: numbers as floats, applicable as a bool, empty cells None."""
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    rows = []
    for rec in frame.to_dict("records"):
        row = {}
        for k, v in rec.items():
            v = v.strip() if isinstance(v, str) else v
            if v == "":
                row[k] = None
            elif k in FAULT_METRICS:
                row[k] = float(v)
            elif k in ("applicable", "redis"):
                row[k] = v.lower() in ("true", "1", "yes")
            else:
                row[k] = v
        rows.append(row)
    return rows
