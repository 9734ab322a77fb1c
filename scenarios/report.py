"""The terminal summary of a scenario run (the dict analysis.summary.summarise returns)."""
from __future__ import annotations

_COLUMNS = (("setup_ms", "setup ms"), ("first_ice_rtt_ms", "first ICE RTT ms"),
            ("rtt_ms", "RTT ms"), ("jitter_ms", "jitter ms"), ("loss_pct", "loss %"))


def _fmt(value, sign: str = "") -> str:
    """Three significant digits, whole milliseconds from 100 up; '-' when missing."""
    if value is None:
        return "-"
    return f"{value:{sign}.0f}" if abs(value) >= 100 else f"{value:{sign}.3g}"


def _delta(entry: dict, key: str) -> str:
    """' (Δ -41 [-45, -38])': the median difference from the baseline (within client regions,
    averaged over them) and its 95% CI."""
    delta = (entry.get("vs_baseline_p50") or {}).get(key)
    if delta is None:
        return ""
    ci = (entry.get("vs_baseline_p50_ci") or {}).get(key)
    return f" (Δ {_fmt(delta, '+')}" + (f" [{_fmt(ci[0], '+')}, {_fmt(ci[1], '+')}])"
                                          if ci else ")")


def missing_lines(summary: dict) -> list[str]:
    """What an incomplete run lacks, one line each (none for a complete run)."""
    missing = summary.get("missing") or {}
    lines = []
    if missing.get("architectures"):
        lines.append("incomplete run: no sessions for planned architecture(s) "
                     + ", ".join(missing["architectures"]))
    if missing.get("files"):
        lines.append("incomplete run: missing file(s) " + ", ".join(missing["files"]))
    return lines


def print_summary(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    baseline = summary.get("baseline")  # analysis/summary.py writes it (architectures.json)
    title = (f"this host -> the deployment at {summary['target']} (no emulated world)"
             if summary.get("target") else
             f"clients in {', '.join(summary['client_regions'])} -> clusters "
             f"{', '.join(summary['clusters'])} ({summary['backend']} impairment)")
    caption = ("p50 / p95; UDP ports: the server media addresses the clients reached; no "
               "baseline and no floor against a deployment"
               if summary.get("target") else
               f"p50 / p95 over all client regions; Δ: median minus {baseline}'s within each "
               "client region, averaged over the regions [95% bootstrap CI]; floor: setup above "
               "the topology's signaling RTT + 2 media RTTs")
    table = Table(title=title, caption=caption)
    table.add_column("architecture")
    table.add_column("ok", justify="right")
    table.add_column("saturated", justify="right")
    table.add_column("UDP ports", justify="right")
    for _, label in _COLUMNS:
        table.add_column(label, justify="right")
    table.add_column("setup over floor", justify="right")
    for name, a in summary["architectures"].items():
        cells = []
        for key, _ in _COLUMNS:
            cell = f"{_fmt(a[key]['p50'])} / {_fmt(a[key]['p95'])}"
            if name != baseline:
                cell += _delta(a, key)
            cells.append(cell)
        over = a["setup_over_floor_ms"]
        table.add_row(name, f"{a['ok']}/{a['sessions']}", _fmt(a.get("saturated")),
                      _fmt(a.get("public_udp_ports")),
                      *cells, f"{_fmt(over['p50'])} / {_fmt(over['p95'])}")
    console = Console(width=max(Console().width, 160))
    console.print(table)
    for line in missing_lines(summary):
        console.print(f"[yellow]{line}[/yellow]")
    saturated = {n: a["saturated"] for n, a in summary["architectures"].items()
                 if a.get("saturated")}
    if saturated:
        console.print(f"[yellow]host saturated: {', '.join(f'{n} {c}' for n, c in saturated.items())}"
                      " successful sessions were measured while a process on their path lagged; "
                      "they are left out of every figure above (sessions.csv: saturated_by)[/yellow]")
