"""``voiceedge scenario``: run a scenario file for the clients of a region."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from scenarios.spec import DEFAULT_SCENARIO
from voiceedge.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("scenario", help="run a scenario: every architecture, one emulated world",
                       description="Build the emulated world, calibrate it (refusing to go on "
                                   "if it is off), run the scenario's clients under every "
                                   "architecture, and write results/<scenario>-<region>-<time>/.")
    p.add_argument("file", nargs="?", default=str(DEFAULT_SCENARIO),
                   help="scenario file (default: the shipped scenarios/default.yaml)")
    p.add_argument("--region", default="apac",
                   help="client region: a group (apac, na, eu, ...), a region, or a comma list")
    p.add_argument("--results", default="results", type=Path,
                   help="where the results folder goes (default ./results)")
    p.add_argument("--backend", choices=("auto", "netem", "userspace"), default="auto",
                   help="impairment backend (default: netem where the kernel has it)")
    p.add_argument("--json", action="store_true", help="print only the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from scenarios.processes import ServiceError
    from scenarios.report import print_summary
    from scenarios.runner import CalibrationFailed, ScenarioRunner, summarise
    from scenarios.spec import Scenario, ScenarioError
    from topology.cli import print_report

    from rich.markup import escape

    console = Console(stderr=True)
    last_transient = [0.0]

    def say(msg: str, transient: bool = False) -> None:
        """Progress on stderr; transient lines redraw in a terminal, else every 5 s."""
        if args.json:
            return
        if transient:
            now = time.monotonic()
            if not console.is_terminal and now - last_transient[0] < 5:
                return
            last_transient[0] = now
        console.print(f"[dim]… {escape(msg)}[/dim]",
                      end="\r" if transient and console.is_terminal else "\n")

    try:
        scenario = Scenario.load(args.file)
        runner = ScenarioRunner(scenario, args.region, args.results,
                                None if args.backend == "auto" else args.backend, say)
    except (ScenarioError, ValueError) as exc:
        raise UserError(str(exc)) from None
    say(f"scenario {scenario.name} for clients in {', '.join(runner.client_regions)}; "
        f"results in {runner.directory}")
    try:
        result = runner.run()
    except CalibrationFailed as exc:
        if not args.json:
            print_report(exc.report)
        raise UserError(f"{exc}; nothing was measured (see {runner.directory})") from None
    except ServiceError as exc:
        raise UserError(f"a service did not start: {exc}") from None
    summary = summarise(result)
    from analysis.report import write_report

    say("writing the report")
    html, md = write_report(result.directory)
    summary["report"] = {"html": str(html), "markdown": str(md)}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary)
        console.print(f"results: {result.directory}\nreport:  {html}\nsummary: {md}")
    return 0
