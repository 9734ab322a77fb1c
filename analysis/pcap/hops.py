"""Per-hop one-way delays from a scenario's captures, and what else only the wire shows.

Every datagram of a call (analysis/pcap/classify.py) is found at each capture point it passed
(topology/capture.py: end hosts see what they send and receive, routers what they send); in
time order those sightings are its path, and each pair of consecutive sightings is a hop:

- two hosts: the link between them. A router's sighting comes after the impairment of the
  link it arrived by (impairment happens on a router's ingress, after any capture on that
  interface), so ``client -> pub`` is the last mile up, ``pub -> pub`` the public internet,
  ``bb -> bb`` the backbone. The last mile down is held on the public router's egress
  (topology/world.py: so the client's kernel receive stamps come after it), before the
  router's capture of what it sends: the hop that ends at that sighting holds the link it
  arrived by *and* the last mile down (``edge1 -> pub1`` is the last mile down alone,
  ``pub -> pub`` the public internet plus it), ``pub -> client`` is the bare veth, and the
  client's own receive time is its receive path (SRTP, its event loop);
- one host: a relay's processing (received on one side, sent on the other); under the turn
  architecture, the TURN server's on the edge host (named ``TURN server R``, judged like a
  relay: it unwraps ChannelData, which classify.py looks through, and sends the datagram on);
- a STUN check's last sighting before the transceiver and its answer's first: the
  transceiver's turnaround.

Each link is compared with what the configured world implies, with calibration's rule
(voiceedge/delayrule.py): mean within max(1 ms, 5%) + 0.5 ms, robust spread within 25% +
0.5 ms of the configured jitter (links inside a data centre are configured as 0). A relay's
processing is configured nowhere: it is flagged when its median exceeds 1 ms. The
transceiver's turnaround is an endpoint's processing time: reported, not judged.

Under TURN the wire also shows the TURN control transactions at the clients (Allocate with its
401 challenge, CreatePermission, ChannelBind, Refresh): ``WireFacts.turn``.
"""
from __future__ import annotations

import csv
import json
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from analysis import archinfo
from analysis.pcap.classify import (BINDING_REQUEST, BINDING_SUCCESS, DTLS, REQUEST, RTP, STUN,
                                    SUCCESS, classify, stun_type, turn_control)
from analysis.pcap.reader import read_udp
from voiceedge.delayrule import DelayExpectation as Expectation, judge_delays, mean_tolerance_ms
from voiceedge.results import CAPTURES_FILE, RX_LOG_SUFFIX

ANALYSIS_FILE = "analysis.json"
# A relay's processing: the world configures no cost for it, and the host's scheduling (other
# processes of the run on the same 2 cores) sets its mean and spread. Its median is what a slow
# relay moves: measured 0.04-0.27 ms on the CI and apac scenarios, 28-48 ms with a 30 ms sleep
# injected at each wake-up.
PROCESSING_P50_MS = 1.0
UP, DOWN = "up", "down"
_LINK_KINDS = {("client", "pub"): "last_mile_up", ("pub", "client"): "last_mile_down",
               ("pub", "pub"): "public", ("bb", "bb"): "backbone"}
_DTLS_HANDSHAKE = (20, 22)  # ChangeCipherSpec, Handshake
# Requests that open a client's flow at a relay: an ICE check; at a TURN server, the
# client's Allocate, CreatePermission and ChannelBind requests
_OPENING = (BINDING_REQUEST, 0x0003, 0x0008, 0x0009)


class Point(NamedTuple):
    host: str
    role: str
    region: str
    interface: str
    sent: bool      # a frame this host sent
    peer: str | None


class Sighting(NamedTuple):
    ts: float
    point: int                      # index in the architecture's points
    src: tuple[str, int]
    dst: tuple[str, int]
    client: tuple[str, int] | None  # from a hop header


@dataclass
class HopStat:
    """One hop of one direction of one architecture, over every datagram that crossed it."""

    direction: str
    hop: str                  # e.g. "backbone apac-se->na-east", "cluster relay na-east"
    kind: str                 # last_mile_up, public, backbone, last_mile_down (with what the
    #                           router got it by), client_app, link, relay, transceiver
    frm: str                  # hosts at both ends
    to: str
    position: float           # median place in the path (for ordering)
    datagrams: int
    mean_ms: float | None
    p50_ms: float | None
    p95_ms: float | None
    sd_robust_ms: float | None
    expected_mean_ms: float
    expected_sd_ms: float
    tolerance_ms: float
    mean_ok: bool
    sd_ok: bool
    hidden_ms: float = 0.0    # configured delay the wire cannot see here (none since the last
    #                           mile down is held before the router's capture; old runs had it)
    rule: str = "link"        # how it is judged: link, median (link rule on the median),
    #                           processing, or reported (not judged)

    @property
    def ok(self) -> bool:
        return self.mean_ok and self.sd_ok


@dataclass
class WireFacts:
    """What only the wire shows about one architecture's calls."""

    sessions: int = 0                    # client flows that sent a STUN check
    public_ports: int = 0                # distinct server ports the clients received from
    public_addresses: int = 0
    first_checks: int = 0
    first_checks_retransmitted: int = 0
    first_check_rtt_ms_p50: float | None = None  # wire, at the client
    checks: int = 0                      # every STUN request of the clients
    checks_retransmitted: int = 0
    dtls_ms_p50: float | None = None     # first to last handshake datagram at the client
    dtls_flights_p50: float | None = None
    relay_forwards: int = 0
    relay_forwards_unexpected: int = 0   # for a flow no STUN check had opened at that relay
    unmatched: int = 0                   # datagrams whose repeats could not be paired
    other: int = 0                       # UDP frames that are not a call's
    # TURN control transactions at the clients (_turn_facts): {"sessions": n,
    # "transactions": [{method, outcome, count, per_session_p50, retransmitted, rtt_ms_p50}]}
    turn: dict = field(default_factory=dict)


@dataclass
class ArchitectureWire:
    architecture: str
    hops: list[HopStat]
    wire: WireFacts
    cost: dict
    points: list[dict] = field(default_factory=list)

    @property
    def off(self) -> list[HopStat]:
        return [h for h in self.hops if not h.ok]


def analyse(results_dir: str | Path) -> list[ArchitectureWire]:
    """Every architecture with captures in ``results_dir/pcap``; writes ``analysis.json``."""
    results_dir = Path(results_dir)
    root = results_dir / "pcap"
    config = json.loads((results_dir / "config.json").read_text())
    impairments = config.get("impairments", {})
    archs = [a for a in config.get("architectures", [])
             if (root / a / CAPTURES_FILE).exists()]
    sessions = _sessions_per_architecture(results_dir)
    facts = archinfo.read(results_dir, config)
    out = [analyse_architecture(root / a, a, impairments, sessions.get(a), turn=facts[a].turn)
           for a in archs]
    (root / ANALYSIS_FILE).write_text(json.dumps(
        {"architectures": [to_dict(a) for a in out]}, indent=2))
    return out


def to_dict(a: ArchitectureWire) -> dict:
    return {"architecture": a.architecture,
            "hops": [asdict(h) | {"ok": h.ok} for h in a.hops],
            "wire": asdict(a.wire), "cost": a.cost, "points": a.points}


def analyse_architecture(directory: Path, arch: str, impairments: dict,
                         sessions: int | None = None, turn: bool = False) -> ArchitectureWire:
    """``turn``: the architecture relays through TURN servers on the edge hosts
    (architectures.json), whose processing the wire shows where an ingress relay's would be."""
    started = time.monotonic()
    captures = json.loads((directory / CAPTURES_FILE).read_text())
    points: list[Point] = []
    index: dict[tuple, int] = {}
    seen: dict[tuple, list[Sighting]] = defaultdict(list)
    facts = WireFacts()
    cutoff = None  # the last frame of a capture stopped at its size cap
    turn_messages: list[tuple] = []  # TURN control at the clients (_turn_facts)
    for cap in captures["points"]:
        path = directory / cap["file"]
        if not path.exists():
            continue
        names = cap["interfaces"]
        last = None
        for d in read_udp(path):
            last = d.timestamp_s
            c = classify(d.payload, d.length)
            if c.key is None:
                facts.other += 1
                continue
            iface = names.get(str(d.ifindex)) or {"name": "?", "peer": None}
            sent = bool(cap["sent_only"] or d.outgoing)
            where = (cap["host"], iface["name"], sent)
            p = index.get(where)
            if p is None:
                p = index[where] = len(points)
                points.append(Point(cap["host"], cap["role"], cap["region"], iface["name"],
                                    sent, iface["peer"]))
            seen[c.key].append(Sighting(d.timestamp_s, p, (d.src_ip, d.src_port),
                                        (d.dst_ip, d.dst_port), c.client))
            if c.kind == STUN and cap["role"] == "client":
                control = turn_control(d.payload)
                if control is not None:
                    local = (d.src_ip, d.src_port) if sent else (d.dst_ip, d.dst_port)
                    turn_messages.append((d.timestamp_s, cap["host"], local, sent, c.key[2],
                                          *control))
        if cap.get("capped_after_s") and last is not None:
            cutoff = last if cutoff is None else min(cutoff, last)
    for path in sorted(directory.glob(f"*{RX_LOG_SUFFIX}")):
        _read_arrivals(path, captures["points"], points, seen)
    if cutoff is not None:
        # After a capture stopped, paths would skip its point and pair the points around it
        # into one hop: every point is read only up to that capture's last frame.
        seen = {k: kept for k, v in seen.items() if (kept := [s for s in v if s.ts <= cutoff])}
    paths = _paths(seen, points, facts)
    hops = _hop_stats(seen, paths, points, impairments, turn)
    _client_facts(seen, points, facts)
    _relay_facts(seen, paths, points, facts)
    _turn_facts(turn_messages, facts, cutoff)
    total_bytes = sum(p.get("bytes", 0) for p in captures["points"])
    cpu = sum(p.get("cpu_s") or 0.0 for p in captures["points"])
    n = sessions or facts.sessions or 1
    elapsed = time.monotonic() - started
    cost = {"capture_bytes": total_bytes, "capture_points": len(captures["points"]),
            "capture_seconds": captures.get("seconds"), "tcpdump_cpu_s": round(cpu, 2),
            "kernel_dropped": sum(p.get("dropped_by_kernel") or 0 for p in captures["points"]),
            "capped": [p["host"] for p in captures["points"] if p.get("capped_after_s")],
            "sessions": n, "bytes_per_session": int(total_bytes / n),
            "tcpdump_cpu_ms_per_session": round(1000 * cpu / n, 1),
            "analysis_s": round(elapsed, 2),
            "analysis_ms_per_session": round(1000 * elapsed / n, 1)}
    return ArchitectureWire(arch, hops, facts, cost, [p._asdict() for p in points])


def _read_arrivals(path: Path, captured: list[dict], points: list[Point],
                   seen: dict[tuple, list[Sighting]]) -> None:
    """A client host's RTP arrivals in user space (``voiceedge client --rx-log``): one more
    point, ``app``, after the impairment on the host's own ingress."""
    host = path.name[:-len(RX_LOG_SUFFIX)]
    cap = next((c for c in captured if c["host"] == host), None)
    if cap is None:
        return
    p = len(points)
    points.append(Point(host, "app", cap["region"], "app", False, None))
    nowhere = ("", 0)
    with open(path) as f:
        for line in f:
            for ssrc, seq, at in json.loads(line)["arrivals"]:
                key = (RTP, ssrc.to_bytes(4, "big"), seq.to_bytes(2, "big"))
                seen[key].append(Sighting(at, p, nowhere, nowhere, None))


# ------------------------------------------------------------------------------ paths


def _paths(seen: dict[tuple, list[Sighting]], points: list[Point],
           facts: WireFacts) -> list[tuple[tuple, list[Sighting]]]:
    """(key, sightings in time order) for each trip of a datagram: a key seen more than once
    at a point (a retransmitted check, a repeated datagram) is split into its trips when every
    point saw it equally often, else left out (counted ``unmatched``)."""
    out = []
    for key, sightings in seen.items():
        sightings.sort()
        per_point = Counter(s.point for s in sightings)
        repeats = set(per_point.values())
        if repeats == {1}:
            out.append((key, _link_order(sightings, points)))
        elif len(repeats) == 1:
            trips: dict[int, list[Sighting]] = defaultdict(list)
            count: Counter = Counter()
            for s in sightings:
                trips[count[s.point]].append(s)
                count[s.point] += 1
            out.extend((key, _link_order(trip, points)) for trip in trips.values())
        else:
            facts.unmatched += len(sightings)
    return out


def _link_order(trip: list[Sighting], points: list[Point]) -> list[Sighting]:
    """``trip`` (in time order) with each frame received over a link after its sending on
    that link. A veth delivers within the capture's microsecond, so both ends often carry
    the same timestamp and the sort alone may put the receiving end first (a hop of the
    other direction at 0 ms)."""
    trip = list(trip)
    moved = True
    while moved:
        moved = False
        for i in range(len(trip) - 1):
            got, sent = points[trip[i].point], points[trip[i + 1].point]
            if (not got.sent and sent.sent and got.peer == sent.host
                    and sent.peer == got.host and trip[i + 1].ts - trip[i].ts < 1e-5):
                trip[i], trip[i + 1] = trip[i + 1], trip[i]
                moved = True
    return trip


def _direction(trip: list[Sighting], points: list[Point]) -> str | None:
    first = points[trip[0].point]
    if first.role == "client" and first.sent:
        return UP
    if first.role == "cluster":
        return DOWN
    return None


# ------------------------------------------------------------------------------ hops


def _turnarounds(seen: dict[tuple, list[Sighting]], points: list[Point]
                 ) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Per cluster region, ms from a client's STUN check (first sent by a client) reaching the
    cluster host (its last
    sighting there before the answer: behind the cluster relay, if any) to the answer's first
    sighting there; and the host. Taken from all sightings, so a check sent again still
    counts (its last copy before the answer)."""
    out: dict[str, list[float]] = defaultdict(list)
    host_of: dict[str, str] = {}
    for key, sightings in seen.items():
        if key[0] != STUN or stun_type(key) != BINDING_SUCCESS:
            continue
        at_cluster = [s for s in sightings if points[s.point].role == "cluster"]
        asked = seen.get((STUN, BINDING_REQUEST.to_bytes(2, "big"), key[2]), ())
        # a client's check (the transceiver's own checks, answered by the client, are not)
        if not at_cluster or not asked or points[min(asked).point].role != "client":
            continue
        answer = min(at_cluster)
        host = points[answer.point].host
        before = [s.ts for s in asked if points[s.point].host == host and s.ts <= answer.ts]
        if before:
            region = points[answer.point].region
            out[region].append((answer.ts - max(before)) * 1000.0)
            host_of[region] = host
    return out, host_of


def _hop_stats(seen, paths, points: list[Point], impairments: dict,
               turn: bool = False) -> list[HopStat]:
    delays: dict[tuple, list[float]] = defaultdict(list)
    places: dict[tuple, list[int]] = defaultdict(list)
    for key, trip in paths:
        direction = _direction(trip, points)
        if direction is None:
            continue
        for place, (a, b) in enumerate(zip(trip, trip[1:])):
            hop = (direction, a.point, b.point)
            delays[hop].append((b.ts - a.ts) * 1000.0)
            places[hop].append(place)
    stats = []
    merged: dict[tuple, dict] = {}
    for (direction, a, b), values in delays.items():
        label, kind, frm, to, exp, hidden = _name_hop(points[a], points[b], impairments, turn)
        m = merged.setdefault((direction, label), {
            "kind": kind, "frm": frm, "to": to, "exp": exp, "hidden": hidden,
            "delays": [], "places": []})
        m["delays"] += values
        m["places"] += places[(direction, a, b)]
    turnaround, host_of = _turnarounds(seen, points)
    last_up = max((max(m["places"]) for (d, _), m in merged.items() if d == UP), default=0)
    for region, values in turnaround.items():
        merged[(UP, f"transceiver {region} (check -> answer)")] = {
            "kind": "transceiver", "frm": host_of[region], "to": host_of[region],
            "exp": Expectation(0.0, 0.0), "hidden": 0.0, "delays": values,
            "places": [last_up + 1]}
    for (direction, label), m in merged.items():
        values = m["delays"]
        exp = m["exp"]
        mean, _sd, robust, mean_ok, sd_ok = judge_delays(exp, values)
        sd_ok = sd_ok or len(values) < 8  # a spread needs a few datagrams to mean anything
        tolerance, rule = mean_tolerance_ms(exp), "link"
        p50, p95 = (float(v) for v in np.percentile(values, [50, 95]))
        if m["kind"] == "relay":
            tolerance, rule = PROCESSING_P50_MS, "processing"
            mean_ok, sd_ok = p50 <= PROCESSING_P50_MS, True
        elif m["kind"] == "transceiver":
            rule, mean_ok, sd_ok = "reported", True, True
        elif m["kind"] == "client_app":
            # the client's own receive path (SRTP, its event loop): its stalls move the mean,
            # not the median
            rule, mean_ok = "median", abs(p50 - exp.mean_ms) <= tolerance
        stats.append(HopStat(direction, label, m["kind"], m["frm"], m["to"],
                             float(np.median(m["places"])), len(values), _r(mean), _r(p50),
                             _r(p95), _r(robust), exp.mean_ms, exp.sd_ms, round(tolerance, 3),
                             mean_ok, sd_ok, m["hidden"], rule))
    stats.sort(key=lambda h: (h.direction != UP, h.position, h.hop))
    return stats


def _configured(impairments: dict, link: str | None, src: str, dst: str) -> Expectation:
    """What config.json's ``impairments`` give the ``link`` direction from ``src`` to ``dst``
    (nothing configured: 0)."""
    configured = impairments.get(f"{link} {src}->{dst}") if link else None
    if not configured:
        return Expectation(0.0, 0.0)
    return Expectation(configured["delay_ms"], configured["jitter_ms"],
                       distribution=configured.get("distribution", "normal"))


def _name_hop(a: Point, b: Point, impairments: dict, turn: bool = False):
    """(label, kind, from host, to host, Expectation on the wire, configured ms hidden)."""
    if b.role == "app":  # the client's receive time: its own receive path after the wire
        return (f"client app {b.region} (receive path)", "client_app", a.host, b.host,
                Expectation(0.0, 0.0), 0.0)
    if a.host == b.host:
        tier = ("cluster relay" if a.role != "edge" else
                "TURN server" if turn else "ingress relay")
        return f"{tier} {a.region}", "relay", a.host, b.host, Expectation(0.0, 0.0), 0.0
    link = _LINK_KINDS.get((a.role, b.role))
    exp = _configured(impairments, link, a.region, b.region)
    arrow = f"{a.region}->{b.region}"
    if link == "last_mile_up" and a.region != b.region:  # a client handed over to b's access
        exp = _configured(impairments, link, b.region, b.region)
        label = f"last mile up {b.region} ({a.host}, handed over)"
    elif link == "last_mile_up":
        label = f"last mile up {a.region}"
    elif link == "last_mile_down":  # the veth after the router's egress queue
        return f"{a.host}->{b.host} (wire)", "link", a.host, b.host, Expectation(0.0, 0.0), 0.0
    elif link == "public":
        label = f"public internet {arrow}"
    elif link == "backbone":
        label = f"backbone {arrow}"
    else:
        link, label = "link", f"{a.host}->{b.host} (in region)"
    if (b.role == "pub" and b.sent and (b.peer or "").startswith("client")
            and a.role not in ("client", "app")):
        # sent to the client, after the last mile down's hold on this interface (from the
        # client itself: a key seen again, or a tie in time, not a path)
        mile = _configured(impairments, "last_mile_down", b.region, b.region)
        label = f"last mile down {b.region}" + ("" if link == "link" else f" + {label}")
        return label, "last_mile_down", a.host, b.host, _plus(exp, mile), 0.0
    return label, link, a.host, b.host, exp, 0.0


def _plus(a: Expectation, b: Expectation) -> Expectation:
    """Two links crossed one after the other: means add, independent jitters in quadrature."""
    if not a.mean_ms and not a.sd_ms:
        return b
    shape = a.distribution if a.distribution == b.distribution else "normal"
    return Expectation(a.mean_ms + b.mean_ms, (a.sd_ms ** 2 + b.sd_ms ** 2) ** 0.5,
                       a.hops + b.hops, shape)


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


# ------------------------------------------------------------------------------ wire facts


def _client_facts(seen: dict[tuple, list[Sighting]], points: list[Point],
                  facts: WireFacts) -> None:
    """Ports the clients saw, their first checks (retransmissions, wire RTT) and DTLS."""
    remote: set[tuple[str, int]] = set()
    requests: dict[tuple, list[tuple[float, bytes]]] = defaultdict(list)  # flow -> checks
    sends: Counter = Counter()       # txid -> times a client sent it
    answered: dict[bytes, float] = {}
    dtls: dict[tuple, list[tuple[float, bool]]] = defaultdict(list)
    for key, sightings in seen.items():
        for s in sightings:
            p = points[s.point]
            if p.role != "client":
                continue
            flow = (p.host, s.src if p.sent else s.dst)
            if not p.sent:
                remote.add(s.src)
            if key[0] == STUN:
                kind = stun_type(key)
                if kind == BINDING_REQUEST and p.sent:
                    requests[flow].append((s.ts, key[2]))
                    sends[key[2]] += 1
                elif kind == BINDING_SUCCESS and not p.sent:
                    answered[key[2]] = min(answered.get(key[2], s.ts), s.ts)
            elif key[0] == DTLS and key[1][0] in _DTLS_HANDSHAKE:
                dtls[flow].append((s.ts, p.sent))
    facts.public_addresses = len({ip for ip, _ in remote})
    facts.public_ports = len({port for _, port in remote})
    facts.sessions = len(requests)
    facts.checks = sum(sends.values())
    facts.checks_retransmitted = sum(n - 1 for n in sends.values())
    rtts = []
    for flow, checks in requests.items():
        first_ts, txid = min(checks)
        facts.first_checks += 1
        facts.first_checks_retransmitted += sends[txid] > 1
        if txid in answered and sends[txid] == 1:
            rtts.append((answered[txid] - first_ts) * 1000.0)
    facts.first_check_rtt_ms_p50 = _median(rtts)
    spans, flights = [], []
    for records in dtls.values():
        records.sort()
        spans.append((records[-1][0] - records[0][0]) * 1000.0)
        flights.append(1 + sum(a[1] != b[1] for a, b in zip(records, records[1:])))
    facts.dtls_ms_p50 = _median(spans)
    facts.dtls_flights_p50 = _median(flights)


def _relay_facts(seen: dict[tuple, list[Sighting]], paths, points: list[Point],
                 facts: WireFacts) -> None:
    """Datagrams a relay forwarded (seen entering and leaving its host), and those of a flow
    no STUN check had opened there first (a check that reached the relay's host, whether or
    not every copy of it could be followed; at a TURN server, also the client's Allocate,
    CreatePermission or ChannelBind request)."""
    relays = ("edge", "cluster")
    opened: dict[tuple, float] = {}  # (relay host, client) -> first check received there
    for key, sightings in seen.items():
        if key[0] != STUN or stun_type(key) not in _OPENING:
            continue
        for s in sightings:
            p = points[s.point]
            if p.role in relays and not p.sent:
                flow = (p.host, s.client or s.src)
                opened[flow] = min(opened.get(flow, s.ts), s.ts)
    for key, trip in paths:
        direction = _direction(trip, points)
        for a, b in zip(trip, trip[1:]):
            relay = points[a.point]
            if relay.host != points[b.point].host or relay.role not in relays:
                continue
            facts.relay_forwards += 1
            # the client: from a hop header, else the public side's address
            client = a.client or b.client or (a.src if direction == UP else b.dst)
            since = opened.get((relay.host, client))
            if since is None or since > a.ts:
                facts.relay_forwards_unexpected += 1


def _turn_facts(messages: list[tuple], facts: WireFacts, cutoff: float | None) -> None:
    """TURN's own transactions as the clients' capture points saw them: per method and
    outcome (``success``, the error code, ``no answer``), how many, per session (a client
    flow that sent an Allocate), resent, and the wire round trip of those sent once (first
    request to first answer)."""
    if cutoff is not None:
        messages = [m for m in messages if m[0] <= cutoff]
    if not messages:
        return
    asked: dict[bytes, list] = {}    # txid -> [first sent, sends, method, flow]
    answered: dict[bytes, tuple[float, str]] = {}
    for ts, host, local, sent, txid, method, klass, code in sorted(messages):
        if sent and klass == REQUEST:
            entry = asked.setdefault(txid, [ts, 0, method, (host, local)])
            entry[1] += 1
        elif not sent and klass != REQUEST and txid not in answered:
            answered[txid] = (ts, "success" if klass == SUCCESS else str(code or "error"))
    groups: dict[tuple[str, str], list] = {}
    flows = {e[3] for e in asked.values() if e[2] == "Allocate"}
    for txid, (first, sends, method, flow) in sorted(asked.items(), key=lambda i: i[1][0]):
        at, outcome = answered.get(txid, (None, "no answer"))
        g = groups.setdefault((method, outcome), {"count": 0, "resent": 0, "rtts": [],
                                                  "per_flow": Counter()})
        g["count"] += 1
        g["resent"] += sends > 1
        g["per_flow"][flow] += 1
        if at is not None and sends == 1:
            g["rtts"].append((at - first) * 1000.0)
    facts.turn = {"sessions": len(flows), "transactions": [
        {"method": method, "outcome": outcome, "count": g["count"],
         "per_session_p50": _median([g["per_flow"][f] for f in flows]) if flows else None,
         "retransmitted": g["resent"], "rtt_ms_p50": _median(g["rtts"])}
        for (method, outcome), g in groups.items()]}


def _median(values: list[float]) -> float | None:
    return round(float(np.median(values)), 3) if values else None


def _sessions_per_architecture(results_dir: Path) -> dict[str, int]:
    path = results_dir / "sessions.csv"
    if not path.exists():
        return {}
    with open(path, newline="") as f:
        return dict(Counter(row["architecture"] for row in csv.DictReader(f)))
