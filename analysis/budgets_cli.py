"""``voiceedge budgets``: run the compact CI scenario (or take a results folder) and gate it."""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from voiceedge.errors import UserError

# analysis.budgets's BUDGETS_FILE, without importing numpy and pandas for every command.
BUDGETS_FILE = Path(__file__).with_name("budgets.yaml")


def add_parser(sub) -> None:
    p = sub.add_parser("budgets", help="check latency budgets (CI gate)",
                       description="Check a results folder against the latency budgets; "
                                   "without one, run the budgets file's scenario first. Exit "
                                   "status 1 when a budget is exceeded.")
    p.add_argument("results", nargs="?", type=Path, help="results folder (default: run one)")
    p.add_argument("--budgets", type=Path, default=BUDGETS_FILE, help="budgets file")
    p.add_argument("--json", action="store_true", help="print only JSON")
    p.add_argument("--sessions", type=int, metavar="N",
                   help="estimate the detectable regressions for runs of N sessions per client "
                        "region (drawn from this run's sessions) instead of the run's own size")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from analysis.budgets import BudgetError, BudgetFile, check, print_table, to_json

    try:
        budgets = BudgetFile.load(args.budgets)
    except BudgetError as exc:
        raise UserError(str(exc)) from None
    if args.sessions is not None and args.sessions < 2:
        raise UserError(f"--sessions {args.sessions}: use at least 2")
    results = args.results
    if results is None:
        scenario = budgets.scenario_path()
        if not scenario.is_file():
            raise UserError(f"{args.budgets}: scenario {budgets.scenario} not found (looked "
                            f"for {scenario})")
        root = Path(tempfile.mkdtemp(prefix="voiceedge-budgets-"))
        cmd = [sys.executable, "-m", "voiceedge", "scenario", str(scenario), "--region",
               budgets.region, "--results", str(root)]
        if args.json:
            cmd.append("--json")
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL if args.json else None)
        if proc.returncode != 0:
            raise UserError(f"the budget scenario did not run (exit {proc.returncode})")
        [results] = list(root.iterdir())
    try:
        verdicts = check(results, budgets, sessions=args.sessions)
    except BudgetError as exc:
        raise UserError(str(exc)) from None
    if args.json:
        print(to_json(verdicts))
    else:
        print_table(verdicts, f"latency budgets ({args.budgets.name}) on {results}")
    return 0 if all(v.ok for v in verdicts) else 1
