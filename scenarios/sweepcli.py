"""``voiceedge sweep``: a scenario's sweep, every architecture at every point."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from voiceedge.errors import UserError

DEFAULT_SWEEP = Path(__file__).with_name("sweep.yaml")
EXIT_CODES = """\
exit status:
  0    every point measured, every architecture at or above min_success_pct
  1    a point did not calibrate, or an architecture fell below min_success_pct at a point
  2    nothing was run: bad input, not root, a missing package
  3    stopped after the first point: the rest would take longer than the time limit
       (resume with --resume DIR, and a larger --max-minutes)
  130  interrupted (Ctrl-C; 143 on SIGTERM, 129 on SIGHUP): resume with --resume DIR
"""


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="run a scenario's sweep: the comparison at every point",
                       description="Run every architecture of a scenario at every point of its "
                                   "sweep (docs/sweeps.md): one world per topology, its "
                                   "impairments changed and calibrated at each point; write "
                                   "results/<scenario>-sweep-<region>-<time>/ and its report.",
                       epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", nargs="?", default=str(DEFAULT_SWEEP),
                   help="scenario file with a sweep: section (default: the shipped "
                        "scenarios/sweep.yaml, the public internet's rtt_scale)")
    p.add_argument("--region", default="apac",
                   help="client region: a group (apac, na, eu, ...), a region, or a comma list")
    p.add_argument("--results", default="results", type=Path,
                   help="where the sweep's folder goes (default ./results)")
    p.add_argument("--backend", choices=("auto", "netem", "userspace"), default="auto",
                   help="impairment backend (default: netem where the kernel has it)")
    p.add_argument("--max-minutes", type=float, metavar="MIN",
                   help="stop after the first point if the rest would take longer (default: "
                        "the file's sweep.max_minutes, else no limit)")
    p.add_argument("--resume", type=Path, metavar="DIR",
                   help="go on with the sweep in DIR: the points measured there are not run "
                        "again")
    p.add_argument("--json", action="store_true", help="print only the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from scenarios.processes import ServiceError
    from scenarios.progress import ProgressBars
    from scenarios.spec import Scenario, ScenarioError
    from scenarios.sweep import DONE, MEASURED, SweepRunner, SweepStopped
    from topology.preflight import check_world_prerequisites

    console = Console(stderr=True)
    scenario = Scenario.load(args.file)  # ConfigError: one line, exit 2
    if args.max_minutes is not None and args.max_minutes <= 0:
        raise UserError("--max-minutes must be positive")
    backend = None if args.backend == "auto" else args.backend
    check_world_prerequisites(backend, services=True, extra=scenario.requirements,
                              browsers=scenario.needs_browser)
    bars = ProgressBars(console, enabled=not args.json)
    say = bars.say

    try:
        runner = SweepRunner(scenario, args.region, args.results, backend, say, bars.update,
                             max_minutes=args.max_minutes, resume=args.resume)
    except (ScenarioError, ValueError) as exc:
        raise UserError(str(exc)) from None
    points = runner.points
    say(f"sweep of {scenario.name} for clients in {args.region}: "
        f"{' x '.join(f'{p.name} ({len(p.values)})' for p in runner.spec.parameters)} = "
        f"{len(points)} points x {len(scenario.architectures)} architectures; results in "
        f"{runner.directory}")
    stopped = None
    try:
        records = runner.run()
    except SweepStopped as exc:
        stopped, records = str(exc), runner.records
    except ServiceError as exc:
        raise UserError(f"a service did not start: {exc} (resume with --resume "
                        f"{runner.directory})") from None
    finally:
        bars.stop()
    summary = {"directory": str(runner.directory),
               "points": {r.id: {"values": r.values, "status": r.status, "seconds": r.seconds,
                                 "error": r.error} for r in records.values()}}
    if any(r.status == MEASURED for r in records.values()):
        from analysis.sweepreport import write_sweep_report  # matplotlib: only once there is data

        say("writing the sweep report")
        summary["report"] = {k: str(v) for k, v in write_sweep_report(runner.directory).items()}
    status = 3 if stopped else (0 if all(r.status == MEASURED for r in records.values())
                                else 1)
    summary["exit_status"] = status
    if stopped:
        summary["stopped"] = stopped
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for r in records.values():
            console.print(f"  {r.id} {', '.join(f'{k}={v}' for k, v in r.values.items())}: "
                          f"{r.status}" + (f" ({r.error})" if r.error else "")
                          + (f", {r.seconds:.0f} s" if r.seconds else ""))
        console.print(f"results: {runner.directory}")
        for name, path in summary.get("report", {}).items():
            console.print(f"{name}: {path}")
        if stopped:
            console.print(f"voiceedge sweep: stopped: {stopped}")
        elif status:
            left = [r.id for r in records.values() if r.status not in DONE]
            console.print("voiceedge sweep: not every point measured"
                          + (f" ({', '.join(left)} left)" if left else ""))
    return status
