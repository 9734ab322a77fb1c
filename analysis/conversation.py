"""What the caller heard (docs/conversation.md): each turn's gap and its split into uplink, the
agent's own time and downlink; barge-in reaction and talk-over; PESQ of the replies heard.

turns.csv (scenarios/runner.py) holds wall-clock times taken at three places on one clock:
the client (its last voiced payload out, the reply's first audible frame out of its decoder),
the agent (the line's last voiced frame in, the reply's first frame out). ``derive`` turns
them into durations; ``score`` adds each completed reply's PESQ (ITU-T P.862 wideband, PyPI's
``pesq``) to turns.csv; ``table`` and ``summary`` are the report's and summary.json's view.
"""
from __future__ import annotations

import math
import os
import wave
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.stats import Bootstrap, bootstrap_ci, bootstrap_diff_ci, percentile

TURNS_FILE = "turns.csv"
SCORE_RATE = 16_000
LEAD_S = 0.2   # silence around the reference, as the client kept around the reply it heard
# Durations per turn, ms: name -> (later, earlier) column of turns.csv
SPANS = {"gap_ms": ("reply_heard_unix", "speech_end_unix"),
         "uplink_ms": ("agent_voice_end_unix", "speech_end_unix"),
         "agent_ms": ("agent_first_frame_unix", "agent_voice_end_unix"),
         "downlink_ms": ("reply_arrived_unix", "agent_first_frame_unix"),
         "playout_ms": ("reply_heard_unix", "reply_arrived_unix"),
         "barge_reaction_ms": ("cut_reply_end_unix", "speech_start_unix"),
         "barge_detect_ms": ("agent_barge_detected_unix", "speech_start_unix")}
# What the budgets (analysis/budgets.py, "conversation") can bound
METRICS = ("gap_ms", "turn_gap_over_agent_ms", "network_ms", "uplink_ms", "agent_ms",
           "downlink_ms", "playout_ms", "barge_reaction_ms", "pesq")


# What needs the agent's clock to be the caller's (an emulated world, not a --target run)
AGENT_CLOCK = ("uplink_ms", "agent_ms", "downlink_ms", "network_ms", "turn_gap_over_agent_ms",
               "split_error_ms", "barge_detect_ms")


def _target(directory: Path) -> bool:
    """Whether the run called a deployment target (another host) instead of a world."""
    import json
    try:
        config = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(config.get("target"))


def load(directory: str | Path) -> pd.DataFrame | None:
    """turns.csv with the derived columns, or None for a run without conversations. Turns of
    sessions the host's lag flagged (sessions.csv ``saturated``) are left out, as every
    figure of the report leaves them out."""
    directory = Path(directory)
    path = directory / TURNS_FILE
    if not path.is_file():
        return None
    turns = pd.read_csv(path)
    sessions_path = directory / "sessions.csv"
    if sessions_path.is_file() and not turns.empty:
        sessions = pd.read_csv(sessions_path, usecols=lambda c: c in (
            "architecture", "client_region", "session", "saturated"))
        if "saturated" in sessions:
            flagged = sessions[sessions.saturated.astype(str).str.lower() == "true"]
            key = ["architecture", "client_region", "session"]
            drop = turns.set_index(key).index.isin(flagged.set_index(key).index)
            turns = turns[~drop]
    return derive(turns)


def derive(turns: pd.DataFrame) -> pd.DataFrame:
    """The turns with each SPANS duration, the network's share of the gap (``network_ms``:
    uplink + downlink), the gap less the agent's own time (``turn_gap_over_agent_ms``) and how
    far the four shares miss the gap."""
    out = turns.copy()
    for name, (later, earlier) in SPANS.items():
        out[name] = (pd.to_numeric(out.get(later), errors="coerce")
                     - pd.to_numeric(out.get(earlier), errors="coerce")) * 1000.0
    out["network_ms"] = out["uplink_ms"] + out["downlink_ms"]
    out["turn_gap_over_agent_ms"] = out["gap_ms"] - out["agent_ms"]
    out["split_error_ms"] = (out["uplink_ms"] + out["agent_ms"] + out["downlink_ms"]
                             + out["playout_ms"] - out["gap_ms"])
    if "pesq" not in out:
        out["pesq"] = math.nan
    out["barge_in"] = out["barge_in"].astype(str).str.lower() == "true"
    return out


def reference(rate: int = SCORE_RATE) -> np.ndarray:
    """What the agent said, as the client kept what it heard: ``LEAD_S`` of silence either
    side, at ``rate``."""
    from services import speech
    line = speech.resample(speech.synthesize(speech.AGENT_LINE), speech.SAMPLE_RATE, rate)
    lead = np.zeros(int(LEAD_S * rate), dtype="<i2")
    return np.concatenate([lead, line, lead])


def score(directory: str | Path) -> int:
    """PESQ (P.862 wideband) of every completed reply the clients heard and kept, written to
    turns.csv's ``pesq`` column; returns how many were scored. P.862 aligns the two signals
    itself (its time alignment handles the 200 ms margin and the codec's delay)."""
    from pesq import NoUtterancesError, PesqError, pesq

    directory = Path(directory)
    path = directory / TURNS_FILE
    if not path.is_file():
        return 0
    turns = pd.read_csv(path)
    if "audio" not in turns or turns.empty:
        return 0
    ref = reference().astype(np.float64)
    done = turns["pesq"] if "pesq" in turns else pd.Series([math.nan] * len(turns))
    scores = []
    for audio, before in zip(turns["audio"], done):
        value = before
        if pd.isna(before) and isinstance(audio, str) and audio and (directory / audio).is_file():
            with wave.open(str(directory / audio)) as w:
                heard = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
            if w.getframerate() == SCORE_RATE and heard.size:
                try:
                    value = round(float(pesq(SCORE_RATE, ref, heard.astype(np.float64), "wb")), 3)
                except (NoUtterancesError, PesqError):
                    value = math.nan   # nothing P.862 can score: left out, counted as unscored
        scores.append(value)
    turns["pesq"] = scores
    tmp = path.with_suffix(".tmp")
    turns.to_csv(tmp, index=False)
    os.replace(tmp, path)
    return int(np.isfinite(np.array(scores, dtype=float)).sum())


def _p(values, q: float) -> float | None:
    v = pd.to_numeric(pd.Series(values), errors="coerce").dropna().to_numpy(dtype=float)
    return percentile(v, q) if v.size else None


def _ci(values, q: float, strata, boot: Bootstrap) -> tuple[float | None, float | None]:
    v = pd.to_numeric(pd.Series(values), errors="coerce")
    keep = v.notna().to_numpy()
    if not keep.any():
        return None, None
    lo, hi = bootstrap_ci(v.to_numpy(dtype=float)[keep], (q,), boot,
                          np.asarray(strata)[keep])
    return float(lo[0]), float(hi[0])


def architecture_summary(turns: pd.DataFrame, boot: Bootstrap = Bootstrap()) -> dict:
    """One architecture's figures: counts, percentiles with 95% bootstrap CIs (strata: the
    client regions), the split's worst miss, talk-over per call."""
    answered = turns[turns.gap_ms.notna()]
    split = answered[answered.split_error_ms.notna()]
    barges = turns[turns.barge_in & turns.barge_reaction_ms.notna()]
    out: dict = {"turns": int(len(turns)), "answered": int(len(answered)),
                 "split": int(len(split)), "barge_ins": int(turns.barge_in.sum()),
                 "barge_ins_heard": int(len(barges)),
                 "split_error_max_ms": (None if split.empty else
                                        round(float(split.split_error_ms.abs().max()), 3))}
    for name in ("gap_ms", "uplink_ms", "agent_ms", "downlink_ms", "playout_ms", "network_ms",
                 "turn_gap_over_agent_ms", "barge_reaction_ms", "barge_detect_ms", "pesq"):
        rows = barges if name.startswith("barge") else answered
        values = rows[name].dropna()
        entry = {"n": int(len(values))}
        for q in (50, 95):
            p = _p(values, q)
            entry[f"p{q}"] = None if p is None else round(p, 3)
        lo, hi = _ci(rows[name], 50, rows.client_region.astype(str), boot)
        entry["p50_ci"] = None if lo is None else [round(lo, 3), round(hi, 3)]
        out[name] = entry
    per_call = barges.groupby(["client_region", "session"]).barge_reaction_ms.sum()
    talk = turns.groupby(["client_region", "session"]).size() * 0.0
    talk = talk.add(per_call, fill_value=0.0)
    out["talk_over_per_call_ms"] = {"p50": _p(talk, 50), "p95": _p(talk, 95), "n": len(talk)}
    return out


CALLER_FIGURES = ("gap_ms", "uplink_ms", "agent_ms", "downlink_ms", "playout_ms",
                  "barge_reaction_ms", "pesq")


def caller_summary(turns: pd.DataFrame) -> dict:
    """One kind of caller's turns of one architecture: answered, and the medians."""
    answered = turns[turns.gap_ms.notna()]
    barges = turns[turns.barge_in & turns.barge_reaction_ms.notna()]
    out: dict = {"turns": int(len(turns)), "answered": int(len(answered))}
    for name in CALLER_FIGURES:
        values = (barges if name.startswith("barge") else answered)[name].dropna()
        p = _p(values, 50)
        out[name] = {"p50": None if p is None else round(p, 3), "n": int(len(values))}
    # replies the caller's jitter buffer concealed or stretched while they were heard (only a
    # Chromium caller measures it: NetEq's counters)
    concealed, stretched = (pd.to_numeric(turns.get(c, pd.Series(dtype=float)), errors="coerce")
                            for c in ("playout_concealed_ms", "playout_stretched_ms"))
    measured = concealed.notna() & stretched.notna()
    out["playout_altered"] = {"replies": int(measured.sum()),
                              "altered": int((measured & ((concealed > 0) | (stretched > 0)))
                                             .sum())}
    # completed replies the agent sent a frame of later than its lead covers: silence it put
    # into the reply itself (the testbed's load on the agent's host, not the network)
    late = pd.to_numeric(turns.get("agent_late_frames", pd.Series(dtype=float)),
                         errors="coerce")
    sent = late.notna() & (turns.get("agent_status", pd.Series(dtype=object)) == "completed")
    out["agent_late"] = {"replies": int(sent.sum()), "late": int((sent & (late > 0)).sum())}
    return out


def summary(directory: str | Path, baseline: str | None = None,
            boot: Bootstrap = Bootstrap()) -> dict | None:
    """summary.json's ``conversation``: per architecture (``architecture_summary``) and, beside
    the baseline, the difference of the network share's median with its CI."""
    turns = load(directory)
    if turns is None or turns.empty:
        return None
    out: dict = {"architectures": {}, "one_clock": not _target(directory)}
    if not out["one_clock"]:   # another host's agent: its times are not on the caller's clock
        turns = turns.assign(**{c: math.nan for c in AGENT_CLOCK})
    for arch, rows in turns.groupby("architecture", sort=False):
        out["architectures"][arch] = architecture_summary(rows, boot)
    kinds = turns.client_type.dropna().unique() if "client_type" in turns else ()
    if len(kinds) > 1:  # callers of more than one kind: each kind's own figures too
        out["callers"] = {
            arch: {str(kind): caller_summary(mine)
                   for kind, mine in rows.groupby("client_type", sort=False)}
            for arch, rows in turns.groupby("architecture", sort=False)}
    if baseline in out["architectures"]:
        base = turns[(turns.architecture == baseline) & turns.network_ms.notna()]
        for arch, rows in turns.groupby("architecture", sort=False):
            rows = rows[rows.network_ms.notna()]
            if arch == baseline or rows.empty or base.empty:
                continue
            d = bootstrap_diff_ci(rows.network_ms.to_numpy(dtype=float),
                                  base.network_ms.to_numpy(dtype=float), 50, boot,
                                  rows.client_region.astype(str).to_numpy(),
                                  base.client_region.astype(str).to_numpy())
            out["architectures"][arch]["network_vs_baseline_ms"] = {
                "p50": round(d.estimate, 3), "ci": [round(d.lo, 3), round(d.hi, 3)]}
    return out


def table(results, stats, data: dict | None):
    """The report's "Turns" table from ``summary``'s ``data``: one row per architecture
    (analysis/tables.py Table)."""
    from analysis.tables import Table, fmt

    table = Table(["architecture", "turns answered", "turn gap p50 (ms) [CI]", "turn gap p95 (ms)",
                   "uplink p50 (ms)", "agent p50 (ms)", "downlink p50 (ms)",
                   "jitter buffer p50 (ms)",
                   "network share p50 (ms) [CI]",
                   f"Δ network share vs {results.baseline} (ms) [CI]",
                   f"Δ media RTT p50 vs {results.baseline} (ms)",
                   "barge-in reaction p50 / p95 (ms)", "talk-over per call p50 (ms)",
                   "PESQ p50 [CI] (n)", "E-model MOS p50"],
                  note="Turn gap: the caller's last voiced frame out -> the reply's first "
                       "audible frame out of its decoder; uplink: -> the agent has that frame; "
                       "agent: -> the reply's first frame leaves the agent (VAD hangover, "
                       "configuration); downlink: -> the reply's first voiced packet arrives "
                       "at the caller (the edge's tick and encode, the network); jitter buffer: "
                       "-> out of the caller's decoder. Network share = uplink + downlink. "
                       "Barge-in reaction: the caller starts speaking into the reply -> the "
                       "reply's last audible frame out of the caller's decoder. PESQ: ITU-T "
                       "P.862 wideband of each completed reply heard against what the agent "
                       "sent. Medians per turn, [95% bootstrap CI] by client region; sessions "
                       "the host's lag flagged are left out.")
    if data is None:
        return table

    def ci(entry, digits=0):
        if not entry or entry.get("p50") is None:
            return "-"
        cell = f"{entry['p50']:.{digits}f}"
        if entry.get("p50_ci"):
            lo, hi = entry["p50_ci"]
            cell += f" [{lo:.{digits}f}, {hi:.{digits}f}]"
        return cell

    base_rtt = stats.row(results.baseline, "rtt_ms")
    for arch, a in data["architectures"].items():
        rtt, mos = stats.row(arch, "rtt_ms"), stats.row(arch, "mos")
        d_rtt = ("-" if arch == results.baseline or rtt is None or base_rtt is None
                 else fmt(rtt.p50 - base_rtt.p50))
        net = a.get("network_vs_baseline_ms")
        d_net = "-" if not net else f"{net['p50']:.0f} [{net['ci'][0]:.0f}, {net['ci'][1]:.0f}]"
        barge = a["barge_reaction_ms"]
        table.rows.append([
            arch, f"{a['answered']}/{a['turns']}", ci(a["gap_ms"]), fmt(a["gap_ms"]["p95"]),
            fmt(a["uplink_ms"]["p50"]), fmt(a["agent_ms"]["p50"]), fmt(a["downlink_ms"]["p50"]),
            fmt(a["playout_ms"]["p50"]), ci(a["network_ms"]), d_net, d_rtt,
            "-" if not barge["n"] else f"{fmt(barge['p50'])} / {fmt(barge['p95'])} "
                                        f"(n={barge['n']})",
            fmt(a["talk_over_per_call_ms"]["p50"]),
            f"{ci(a['pesq'], 2)} (n={a['pesq']['n']})",
            "-" if mos is None else f"{mos.p50:.2f}"])
    return table


def caller_table(data: dict | None):
    """The report's "Turns by caller" table (runs with more than one kind of caller), or
    None."""
    from analysis.tables import Table, fmt

    if not data or not data.get("callers"):
        return None
    table = Table(["architecture", "caller", "turns answered", "turn gap p50 (ms)",
                   "uplink p50 (ms)", "agent p50 (ms)", "downlink p50 (ms)",
                   "jitter buffer p50 (ms)", "barge-in reaction p50 (ms)", "PESQ p50 (n)",
                   "replies the jitter buffer altered", "replies the agent sent late"],
                  note="The same turns by the kind of caller that spoke them: an aiortc caller "
                       "times its audio at its decoder, a Chromium one at its audio output "
                       "device, whose latency is part of its jitter buffer share "
                       "(docs/conversation.md: the Chromium caller). Medians per turn. A "
                       "Chromium caller's NetEq conceals and stretches audio, which P.862 "
                       "charges: the replies it did so to while they were heard (its counters; "
                       "'-': not measured, as for aiortc callers, whose buffer does neither). "
                       "A reply the agent sent a frame of later than its lead covers "
                       "(reply_lead_frames) may hold 20 ms of silence from the agent itself: the "
                       "testbed's own load on the agent's host.")
    for arch, kinds in data["callers"].items():
        for kind, c in kinds.items():
            altered = c.get("playout_altered") or {"replies": 0}
            late = c.get("agent_late") or {"replies": 0}
            table.rows.append([arch, kind, f"{c['answered']}/{c['turns']}",
                               *(fmt(c[name]["p50"]) for name in CALLER_FIGURES[:-1]),
                               "-" if c["pesq"]["p50"] is None
                               else f"{c['pesq']['p50']:.2f} (n={c['pesq']['n']})",
                               f"{altered['altered']}/{altered['replies']}"
                               if altered["replies"] else "-",
                               f"{late['late']}/{late['replies']}" if late["replies"] else "-"])
    return table


def disagreements(data: dict | None, stats) -> list[str]:
    """Where PESQ and the E-model rank the architectures differently (one sentence each), from
    ``summary``'s ``data``."""
    if data is None:
        return []
    pairs = []
    for arch, a in data["architectures"].items():
        mos = stats.row(arch, "mos")
        if a["pesq"]["p50"] is not None and mos is not None and not math.isnan(mos.p50):
            pairs.append((arch, a["pesq"]["p50"], float(mos.p50)))
    out = []
    for i, (a1, p1, m1) in enumerate(pairs):
        for a2, p2, m2 in pairs[i + 1:]:
            if (p1 - p2) * (m1 - m2) < 0 and abs(p1 - p2) >= 0.1 and abs(m1 - m2) >= 0.05:
                out.append(f"PESQ ranks {a1} ({p1:.2f}) and {a2} ({p2:.2f}) the other way "
                           f"round from the E-model ({m1:.2f} vs {m2:.2f}): the E-model "
                           "counts delay and loss, PESQ only what the audio lost.")
    return out
