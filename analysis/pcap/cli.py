"""``voiceedge pcap RESULTS_DIR``: per-hop delays and wire facts from a run's captures."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from voiceedge.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("pcap", help="per-hop one-way delays from a run's packet captures",
                       description="Read the pcaps a `voiceedge scenario --capture` run wrote "
                                   "(RESULTS_DIR/pcap/), find each datagram at every capture "
                                   "point, and print each hop's one-way delay next to what "
                                   "the configured world implies, and what else the wire "
                                   "shows (ports, ICE retransmissions, DTLS flights, relay "
                                   "forwards). Writes RESULTS_DIR/pcap/analysis.json. Exit "
                                   "status 1 when a hop is off.")
    p.add_argument("results", metavar="RESULTS_DIR", type=Path,
                   help="a results folder of `voiceedge scenario --capture`")
    p.add_argument("--json", action="store_true", help="print only analysis.json")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from analysis.pcap.hops import analyse, to_dict
    from analysis.pcap.reader import PcapError

    root = args.results
    if not (root / "config.json").exists():
        raise UserError(f"{root} is not a results folder (no config.json)")
    if not (root / "pcap").is_dir():
        raise UserError(f"{root} has no captures: run the scenario with --capture")
    try:
        archs = analyse(root)
    except (PcapError, OSError, ValueError, KeyError) as exc:
        raise UserError(f"cannot read the captures in {root / 'pcap'}: {exc}") from None
    if not archs:
        raise UserError(f"{root / 'pcap'} holds no finished architecture's captures")
    data = [to_dict(a) for a in archs]
    if args.json:
        print(json.dumps({"architectures": data}, indent=2))
    else:
        print_tables(data)
    return 1 if any(a.off for a in archs) else 0


def print_tables(archs: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table as RichTable

    from analysis.pcap import tables

    console = Console(width=max(Console().width, 140))

    def show(t, title: str) -> None:
        r = RichTable(title=title, title_justify="left")
        for i, h in enumerate(t.header):
            r.add_column(h, justify="left" if i < 2 else "right", no_wrap=i < 2)
        for row in t.rows:
            r.add_row(*[f"[red]{c}[/red]" if c == "OFF" else c for c in row])
        console.print(r)

    for a in archs:
        show(tables.hops(a), f"{a['architecture']}: one-way delay per hop")
    console.print(f"[dim]{tables.HIDDEN_NOTE}[/dim]")
    show(tables.wire(archs), "what the wire shows")
    control = tables.turn(archs)
    if control.rows:
        show(control, "TURN control transactions at the clients")
    show(tables.cost(archs), "what the captures cost")
    for line in tables.off_hops(archs):
        console.print(f"[red]off:[/red] {line}")
