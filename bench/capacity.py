"""``voiceedge bench capacity``: the one-host edge under growing load, one size at a time.

Each size is one ``voiceedge demo edge --sessions N --duration D --rate R --json`` in a child
process (a fresh edge each time, nothing shared between sizes). From its JSON: sessions ok,
setup and first-ICE-RTT percentiles, the transceiver's and the clients' CPU per session-second;
from the logs of its services: the seconds in which each one's event loop lagged (the rule of
docs/logs.md), so a size whose figures are the host's rather than the edge's says so.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from services.mediapaths import MEDIA_PATHS, PYTHON
from voiceedge.errors import UserError
from voiceedge.stopsignals import run_child

SERVICES = ("transceiver", "relay", "signaling", "agent", "clients")


@dataclass
class SizeResult:
    """One size: the demo's own JSON plus the lag its processes reported."""

    sessions: int
    demo: dict
    lagged_seconds: dict[str, int] = field(default_factory=dict)
    observed_seconds: dict[str, int] = field(default_factory=dict)

    @property
    def saturated(self) -> bool:
        return any(self.lagged_seconds.values())

    def row(self) -> dict:
        d = self.demo
        return {"sessions": self.sessions, "ok": d.get("ok"),
                "media_path": d.get("media_path"), "light_path": d.get("light_path"),
                "setup_ms_p50": d.get("setup_ms_p50"), "setup_ms_p95": d.get("setup_ms_p95"),
                "first_ice_rtt_ms_p50": d.get("first_ice_rtt_ms_p50"),
                "first_ice_rtt_ms_p95": d.get("first_ice_rtt_ms_p95"),
                "transceiver_cpu_ms_per_session_second":
                    d.get("transceiver_cpu_ms_per_session_second"),
                "clients_cpu_ms_per_session_second": d.get("clients_cpu_ms_per_session_second"),
                "services_cpu_ms_per_session_second":
                    d.get("services_cpu_ms_per_session_second", {}),
                "cpu_window": d.get("cpu_window"),
                "lagged_seconds": self.lagged_seconds, "saturated": self.saturated}


def lag_of(logs: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Seconds lagged and observed per service, from the ``loop_lag_summary`` lines its
    processes write when they stop (relay workers each write one: they are summed)."""
    lagged: dict[str, int] = {}
    observed: dict[str, int] = {}
    for path in sorted(logs.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") != "loop_lag_summary":
                continue
            service = record.get("service", path.stem)
            lagged[service] = lagged.get(service, 0) + int(record.get("seconds_lagged", 0))
            observed[service] = observed.get(service, 0) + int(record.get("seconds_observed", 0))
    return lagged, observed


def run_size(sessions: int, duration: float, rate: float, full_clients: int | None,
             workdir: Path, media_path: str = PYTHON, light_path: str = PYTHON) -> SizeResult:
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "voiceedge", "demo", "edge", "--sessions", str(sessions),
           "--duration", str(duration), "--rate", str(rate), "--workdir", str(workdir), "--json",
           "--media-path", media_path, "--light-path", light_path]
    if full_clients is not None:
        cmd += ["--full-clients", str(full_clients)]
    proc = run_child(cmd, capture_output=True, text=True)  # stopped with SIGTERM if we are
    try:
        demo = json.loads(proc.stdout)
    except ValueError:
        raise UserError(f"demo edge --sessions {sessions} failed (exit {proc.returncode}): "
                        f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}") from None
    lagged, observed = lag_of(workdir)
    return SizeResult(sessions, demo, lagged, observed)


def add_parser(sub) -> None:
    p = sub.add_parser("capacity", help="the one-host edge at growing session counts",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", default="10,100,200", metavar="LIST",
                   help="session counts, one demo each (default 10,100,200)")
    p.add_argument("--duration", type=float, default=10.0, help="call seconds (default 10)")
    p.add_argument("--rate", type=float, default=10.0,
                   help="sessions started per second (default 10)")
    p.add_argument("--full-clients", type=int, default=None, metavar="N",
                   help="sessions with the full client (default: the demo's)")
    p.add_argument("--media-path", choices=MEDIA_PATHS, default=PYTHON,
                   help="the transceiver's media path (default python)")
    p.add_argument("--light-path", choices=MEDIA_PATHS, default=PYTHON,
                   help="the light clients' media path (default python)")
    p.add_argument("--workdir", type=Path, default=Path("results/bench-capacity"),
                   help="logs of each size go to WORKDIR/N (default results/bench-capacity)")
    p.add_argument("--json", action="store_true", help="print only JSON")
    p.set_defaults(func=_main)


def _main(args) -> int:
    try:
        sizes = [int(s) for s in args.sessions.split(",")]
    except ValueError:
        raise UserError(f"--sessions {args.sessions!r} is not a list like 10,100,200") from None
    if not sizes or min(sizes) < 1 or args.duration <= 0 or args.rate <= 0:
        raise UserError("--sessions counts, --duration and --rate must be positive")
    rows = []
    for n in sizes:
        if not args.json:
            print(f"… {n} sessions ({n / args.rate + args.duration:.0f} s or more)", flush=True,
                  file=sys.stderr)
        rows.append(run_size(n, args.duration, args.rate, args.full_clients,
                             args.workdir / str(n), args.media_path, args.light_path).row())
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"media path: transceiver {args.media_path}, light clients {args.light_path}")
    print("| sessions | ok | setup p50 / p95 (ms) | first ICE RTT p50 / p95 (ms) | transceiver "
          "CPU ms per session-s | clients CPU ms per session-s | other services (ms per "
          "session-s) | seconds lagged |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        lag = ", ".join(f"{k} {v}" for k, v in r["lagged_seconds"].items() if v) or "none"
        others = ", ".join(f"{k} {v}" for k, v in r["services_cpu_ms_per_session_second"].items()
                           if k != "transceiver") or "-"
        print(f"| {r['sessions']} | {r['ok']} | {r['setup_ms_p50']} / {r['setup_ms_p95']} | "
              f"{r['first_ice_rtt_ms_p50']} / {r['first_ice_rtt_ms_p95']} | "
              f"{r['transceiver_cpu_ms_per_session_second']} | "
              f"{r['clients_cpu_ms_per_session_second']} | {others} | {lag} |")
    return 0
