"""The sessions by client type (aiortc, chromium) and offer style: the setup timeline of each.

A run whose scenario mixes clients (``clients: {aiortc: 20, chromium: 2}``) tags every session
with its ``client_type`` and ``offer_style`` (sessions.csv). The headline statistics pool them
(the same mix runs in every architecture); this table shows each client type's own view.
Older runs have no such columns: every session was an aiortc one, its offer gathered.
"""
from __future__ import annotations

import pandas as pd

from analysis.load import Results
from analysis.stats import percentile
from analysis.tables import Table, fmt

# Moments on the session's timeline (ms since its peer connection was created), then durations.
TIMELINE = (("gathered_ms", "gathered"), ("offer_ms", "offer sent"),
            ("signaling_ms", "offer → answer"), ("ice_checking_ms", "ICE checking"),
            ("ice_connected_ms", "ICE connected"), ("setup_ms", "DTLS connected"),
            ("first_audio_ms", "first audio"), ("first_ice_rtt_ms", "first ICE RTT"))


def tagged(sessions: pd.DataFrame) -> pd.DataFrame:
    """``sessions`` with ``client_type`` and ``offer_style`` filled (older runs lack them)."""
    frame = sessions.copy()
    for column, default in (("client_type", "aiortc"), ("offer_style", "gathered")):
        values = frame[column] if column in frame else pd.Series(index=frame.index, dtype=object)
        frame[column] = values.where(values.notna(), default).astype(str)
    for column, _ in TIMELINE:
        frame[column] = pd.to_numeric(frame[column], errors="coerce") if column in frame \
            else float("nan")
    return frame


def mixed(results: Results) -> bool:
    """Whether the run had more than one client type or offer style."""
    frame = tagged(results.sessions)
    return frame.client_type.nunique() > 1 or frame.offer_style.nunique() > 1


def measured(group: pd.DataFrame) -> pd.DataFrame:
    """The group's successful sessions that the headline statistics use: not saturated."""
    saturated = group["saturated"] if "saturated" in group else False
    return group[group.ok & ~saturated]


def groups(results: Results):
    """(architecture, client type, offer style, sessions, ok ones, measured ones) per group,
    in the run's architecture order: what the table and summary.json both report."""
    frame = tagged(results.sessions)
    order = {a: i for i, a in enumerate(results.architectures)}
    grouped = frame.groupby(["architecture", "client_type", "offer_style"], sort=False)
    for (arch, client, offer), group in sorted(
            grouped, key=lambda g: (order.get(g[0][0], len(order)), g[0][1], g[0][2])):
        yield str(arch), client, offer, group, group[group.ok], measured(group)


def timeline(results: Results) -> Table:
    """Per architecture, client type and offer style: sessions ok (saturated among them) and
    the median of every moment of the setup timeline over the ok, unsaturated sessions."""
    table = Table(["architecture", "client", "offer", "sessions ok (saturated)"]
                  + [f"{label} p50 (ms)" for _, label in TIMELINE],
                  note="Medians over each group's successful sessions that were not measured "
                       "while a process on their path lagged, like the headline's; moments are "
                       "ms from the session's peer connection being created (the browser's from "
                       "performance.now(), aiortc's from its monotonic clock). An immediate "
                       "offer carries no candidates: the server learns the client from its "
                       "first check (a peer-reflexive candidate). The browser's own process "
                       "is not watched for lag: its figures include what the machine's load "
                       "does to it (docs/browser.md).")
    for arch, client, offer, group, ok, used in groups(results):
        table.rows.append([arch, client, offer,
                           f"{len(ok)}/{len(group)} ({len(ok) - len(used)})"]
                          + [fmt(percentile(used[column].dropna(), 50))
                             for column, _ in TIMELINE])
    return table
