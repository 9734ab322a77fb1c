"""The wire's tables (analysis.json of a run's captures), for the report and `voiceedge pcap`."""
from __future__ import annotations

import json
from pathlib import Path

from analysis.pcap.hops import ANALYSIS_FILE
from analysis.tables import Table

HIDDEN_NOTE = ("Each hop is timed between two capture points: a router's capture of what it "
               "sends comes after the impairment of the link it arrived by and, towards a "
               "client, after the last mile down (held on the router's egress, so that the "
               "client's kernel receive times come after it): the hop into that capture holds "
               "both ('last mile down R + ...'). 'client app': the client's own receive path, "
               "judged on its median. Links: configured mean / jitter (0 inside a data "
               "centre), ok when the mean is within max(1 ms, 5%) + 0.5 ms and the robust "
               "spread (IQR/1.349) within 25% + 0.5 ms, calibration's rule. Relays: ok when "
               "the median is at most 1 ms (nothing configures their cost). The transceiver's "
               "check turnaround is reported, not judged.")


def load(results_dir: str | Path) -> list[dict] | None:
    """The architectures of a run's ``pcap/analysis.json``, or None when it has none."""
    path = Path(results_dir) / "pcap" / ANALYSIS_FILE
    if not path.exists():
        return None
    return json.loads(path.read_text())["architectures"]


def _ms(v) -> str:
    return "-" if v is None else (f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}")


def hops(arch: dict) -> Table:
    # runs before 2026-12-07 held the last mile down after the client's capture: their
    # analysis.json says how much of a hop's configured delay the wire could not see
    hidden = any(h["hidden_ms"] for h in arch["hops"])
    t = Table(["dir", "hop", "datagrams", "mean ms", "p50 ms", "p95 ms", "spread ms",
               "configured ms", *(["not on the wire ms"] if hidden else []), "ok"],
              note=HIDDEN_NOTE)
    for h in arch["hops"]:
        rule = h.get("rule", "link")
        configured = {"processing": f"p50 <= {h['tolerance_ms']:g}", "reported": "-"}.get(
            rule, f"{h['expected_mean_ms']:g} / {h['expected_sd_ms']:g}"
            + (" (p50)" if rule == "median" else ""))
        t.rows.append([h["direction"], h["hop"], str(h["datagrams"]), _ms(h["mean_ms"]),
                       _ms(h["p50_ms"]), _ms(h["p95_ms"]), _ms(h["sd_robust_ms"]), configured,
                       *([f"{h['hidden_ms']:g}" if h["hidden_ms"] else ""] if hidden else []),
                       "-" if rule == "reported" else "yes" if h["ok"] else "OFF"])
    return t


def wire(archs: list[dict]) -> Table:
    t = Table(["architecture", "sessions", "server ports seen", "first checks resent",
               "first check RTT p50 ms", "checks resent", "DTLS handshake p50 ms",
               "DTLS flights p50", "relay forwards", "forwards for no opened flow"],
              note="At the clients' capture points. A forward for no opened "
                   "flow: a datagram a relay passed on for a client address no STUN check had "
                   "opened through that relay first.")
    for a in archs:
        w = a["wire"]
        t.rows.append([a["architecture"], str(w["sessions"]), str(w["public_ports"]),
                       f"{w['first_checks_retransmitted']} of {w['first_checks']}",
                       _ms(w["first_check_rtt_ms_p50"]),
                       f"{w['checks_retransmitted']} of {w['checks']}", _ms(w["dtls_ms_p50"]),
                       "-" if w["dtls_flights_p50"] is None else f"{w['dtls_flights_p50']:g}",
                       str(w["relay_forwards"]), str(w["relay_forwards_unexpected"])])
    return t


def turn(archs: list[dict]) -> Table:
    """TURN's own transactions seen at the clients (architectures that had any)."""
    t = Table(["architecture", "sessions", "TURN request", "answer", "count", "per session p50",
               "resent", "wire RTT p50 ms"],
              note="At the clients' capture points: each TURN request (RFC 8656) by its "
                   "answer. An Allocate is first refused 401 (the long-term credential "
                   "challenge: realm and nonce), then sent again with the credential. RTT "
                   "from the first request to the first answer, over requests sent once.")
    for a in archs:
        facts = a["wire"].get("turn") or {}
        for x in facts.get("transactions", ()):
            t.rows.append([a["architecture"], str(facts["sessions"]), x["method"], x["outcome"],
                           str(x["count"]),
                           "-" if x["per_session_p50"] is None else f"{x['per_session_p50']:g}",
                           str(x["retransmitted"]), _ms(x["rtt_ms_p50"])])
    return t


def cost(archs: list[dict]) -> Table:
    t = Table(["architecture", "capture points", "captured MB", "KB per session",
               "tcpdump CPU ms per session", "kernel drops", "capped at", "analysis ms per "
               "session"],
              note="tcpdump's own CPU time, from /proc, while the calls ran; analysis: reading "
                   "every pcap and matching every datagram, in this process.")
    for a in archs:
        c = a["cost"]
        t.rows.append([a["architecture"], str(c["capture_points"]),
                       f"{c['capture_bytes'] / 1e6:.1f}", f"{c['bytes_per_session'] / 1e3:.0f}",
                       f"{c['tcpdump_cpu_ms_per_session']:g}", str(c["kernel_dropped"]),
                       ", ".join(c["capped"]) or "-", f"{c['analysis_ms_per_session']:g}"])
    return t


def off_hops(archs: list[dict]) -> list[str]:
    """One line per hop that is not what the configured world implies."""
    return [f"{a['architecture']}: {h['direction']} {h['hop']} measured {_ms(h['mean_ms'])} ms "
            f"mean, {_ms(h['p50_ms'])} median (spread {_ms(h['sd_robust_ms'])}); "
            + (f"a relay's median should be at most {h['tolerance_ms']:g} ms"
               if h.get("rule") == "processing" else
               f"configured {h['expected_mean_ms']:g} / {h['expected_sd_ms']:g} ms")
            for a in archs for h in a["hops"] if not h["ok"]]
