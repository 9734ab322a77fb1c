"""TURN's setup overhead: what relaying through a TURN server costs a call's set-up, next to the
other architectures of the same run.

Per architecture, over the successful sessions the headline statistics use (not saturated):
the median ICE gathering time (under TURN it holds the allocation: an Allocate refused 401 for
the credential challenge, then the Allocate that succeeds), the offer -> answer round trip, the
first ICE check's RTT (aioice binds a TURN channel before the first check leaves, so under TURN
it holds the ChannelBind too), the setup; for TURN, the client's TURN requests per session and
the median RTT of each kind (sessions.csv ``turn_transactions``); and the public UDP ports at
the peak (ports.csv), the TURN servers' split out from the transceivers'.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict

import pandas as pd

from analysis.clients import measured, tagged
from analysis.load import Results
from analysis.stats import percentile
from analysis.tables import Table, count, fmt

TIMELINE = (("gathered_ms", "gathered p50 (ms)"), ("signaling_ms", "offer → answer p50 (ms)"),
            ("first_ice_rtt_ms", "first ICE RTT p50 (ms)"), ("setup_ms", "setup p50 (ms)"))


def applies(results: Results) -> bool:
    """Whether the run has TURN sessions (architectures.json's ``turn``)."""
    return any(results.archinfo[a].turn for a in results.architectures)


def transactions(cell) -> list[list]:
    """A sessions.csv ``turn_transactions`` cell: [method, sent_ms, rtt_ms, outcome, sends]
    each (older runs: no sends)."""
    if isinstance(cell, list):
        return cell
    if cell is None or (isinstance(cell, float) and pd.isna(cell)) or not str(cell).strip():
        return []
    try:
        value = json.loads(cell)
    except ValueError:
        return []
    return value if isinstance(value, list) else []


def request_label(row: list) -> str:
    """'Allocate', or 'Allocate 401' for a request answered with an error."""
    outcome = row[3] if len(row) > 3 else "ok"
    return row[0] if outcome in ("ok", None) else f"{row[0]} {outcome}"


def _turn_cells(group: pd.DataFrame) -> tuple[str, str]:
    """(requests per session p50, 'kind RTT p50; ...') over a group's sessions."""
    if "turn_transactions" not in group:
        return "-", "-"
    per_session, rtts = [], defaultdict(list)
    order: Counter = Counter()
    for cell in group["turn_transactions"]:
        rows = [r for r in transactions(cell) if isinstance(r, list) and len(r) >= 3]
        if not rows:
            continue
        per_session.append(len(rows))
        for i, r in enumerate(rows):
            label = request_label(r)
            order.setdefault(label, i)
            if r[2] is not None:
                rtts[label].append(float(r[2]))
    if not per_session:
        return "-", "-"
    kinds = sorted(rtts, key=lambda k: order[k])
    return (f"{percentile(per_session, 50):g}",
            "; ".join(f"{k} {fmt(percentile(rtts[k], 50))}" for k in kinds))


def _ports(results: Results, arch: str) -> str:
    rows = results.ports[results.ports.architecture == arch]
    if rows.empty:
        return "-"
    row = rows.iloc[0]
    text = f"{count(row.public_udp_ports)} at {count(row.concurrent_sessions)} sessions"
    bindings = str(row.get("bindings", "") or "")
    if results.archinfo[arch].turn and bindings and bindings != "nan":
        # "service@host address:port" each, once per socket (a TURN server's threads share
        # its listening port): count distinct ones; a TURN server holds one listening port
        distinct = set(bindings.split("; "))
        turn = [b for b in distinct if b.startswith("turn-")]
        servers = len({b.split(" ", 1)[0] for b in turn})
        others = len(distinct) - len(turn)
        text += (f" (TURN: {servers} listening + {len(turn) - servers} relay; "
                 f"transceivers: {others})")
    return text


def overhead(results: Results) -> Table:
    """One row per architecture: the setup timeline, TURN's requests, the public ports."""
    table = Table(["architecture", "sessions"] + [label for _, label in TIMELINE]
                  + ["TURN requests per session p50", "TURN request RTT p50 (ms)",
                     "public UDP ports at the peak"],
                  note="Medians over the successful sessions that were not saturated. Gathered: "
                       "ms from the session's start to ICE gathering complete; under TURN it "
                       "holds the allocation (Allocate 401: the credential challenge, then "
                       "Allocate). The first ICE RTT under TURN holds the ChannelBind aioice "
                       "sends before its first check to a peer. TURN requests are the client's "
                       "own timings (first transmission to the answer's arrival, a retransmission "
                       "after a loss included; Refresh: the "
                       "allocation's deletion at the end of the call). Ports: turn = the TURN "
                       "servers' listening port and a relay port per allocation, plus the "
                       "transceivers' port per session.")
    frame = tagged(results.sessions)
    for arch in results.architectures:
        group = measured(frame[frame.architecture == arch])
        row = [arch, str(len(group))]
        row += [fmt(percentile(group[column], 50)) for column, _ in TIMELINE]
        row += list(_turn_cells(group)) if results.archinfo[arch].turn else ["-", "-"]
        row.append(_ports(results, arch))
        table.rows.append(row)
    return table
