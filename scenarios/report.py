"""The terminal summary of a scenario run."""
from __future__ import annotations

from scenarios.spec import BASELINE

_COLUMNS = (("setup_ms", "setup ms"), ("first_ice_rtt_ms", "first ICE RTT ms"),
            ("rtt_ms", "RTT ms"), ("jitter_ms", "jitter ms"), ("loss_pct", "loss %"))


def print_summary(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    fmt = lambda v: "-" if v is None else f"{v:g}"  # noqa: E731
    table = Table(title=f"clients in {', '.join(summary['client_regions'])} -> clusters "
                        f"{', '.join(summary['clusters'])} ({summary['backend']} impairment)",
                  caption="p50 / p95; Δ: p50 minus the port-per-session baseline's; floor: "
                          "setup above the topology's signaling RTT + 2 media RTTs")
    table.add_column("architecture")
    table.add_column("ok", justify="right")
    table.add_column("UDP ports", justify="right")
    for _, label in _COLUMNS:
        table.add_column(label, justify="right")
    table.add_column("setup over floor", justify="right")
    for name, a in summary["architectures"].items():
        cells = []
        for key, _ in _COLUMNS:
            cell = f"{fmt(a[key]['p50'])} / {fmt(a[key]['p95'])}"
            delta = a.get("vs_baseline_p50", {}).get(key)
            if name != BASELINE and delta is not None:
                cell += f" (Δ {delta:+g})"
            cells.append(cell)
        over = a["setup_over_floor_ms"]
        table.add_row(name, f"{a['ok']}/{a['sessions']}", str(a["public_udp_ports"]), *cells,
                      f"{fmt(over['p50'])} / {fmt(over['p95'])}")
    Console(width=max(Console().width, 160)).print(table)
