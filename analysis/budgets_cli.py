"""``voiceedge budgets``: run the compact CI scenario and the fault scenario (or take results
folders) and gate them: the latency budgets on the first, the fault budgets on the second."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from voiceedge.errors import UserError
from voiceedge.reaper import temp_dir
from voiceedge.stopsignals import run_child

# analysis.budgets's BUDGETS_FILE, without importing numpy and pandas for every command.
BUDGETS_FILE = Path(__file__).with_name("budgets.yaml")
SETS = ("latency", "faults", "conversation", "mobility")


def add_parser(sub) -> None:
    p = sub.add_parser("budgets", help="check latency and fault budgets (CI gate)",
                       description="Check results folders against the latency budgets and the "
                                   "fault budgets; without a folder, run the budgets file's "
                                   "scenarios first (the compact CI scenario, the fault "
                                   "scenario, the conversation scenario, the mobility "
                                   "scenario). A folder with faults.json or faults.csv is "
                                   "checked against the fault budgets (the mobility budgets "
                                   "when it is a run of the mobility scenario), one with "
                                   "turns.csv against the conversation budgets, any other "
                                   "against the latency budgets. Exit status 1 when a budget "
                                   "is exceeded. "
                                   "--sweep DIR checks a sweep folder against the file's "
                                   "sweep_budgets instead.")
    p.add_argument("results", nargs="*", type=Path,
                   help="results folder(s) (default: run the scenarios)")
    p.add_argument("--only", choices=SETS,
                   help="only this set of budgets (and only its scenario); with folders, "
                        "check them all against this set")
    p.add_argument("--budgets", type=Path, default=BUDGETS_FILE, help="budgets file")
    p.add_argument("--sweep", type=Path, metavar="DIR",
                   help="check the sweep folder DIR (voiceedge sweep's) against the budgets "
                        "file's sweep_budgets: each must hold at every point in its range "
                        "(docs/budgets.md, 'Budgets over a sweep'); runs nothing")
    p.add_argument("--json", action="store_true", help="print only JSON")
    p.add_argument("--sessions", type=int, metavar="N",
                   help="estimate the detectable regressions of the latency budgets for runs "
                        "of N sessions per client region (drawn from this run's sessions) "
                        "instead of the run's own size")
    p.set_defaults(func=run)


def folder_set(folder: Path, mobility: str | None = None) -> str:
    """Which budgets a results folder is checked against: 'faults' for a run with faults
    ('mobility' when it ran the scenario named ``mobility``), 'conversation' for one with
    turns."""
    if any((folder / f).is_file() for f in ("faults.json", "faults.csv")):
        return "mobility" if mobility and _scenario_name(folder) == mobility else "faults"
    return "conversation" if (folder / "turns.csv").is_file() else "latency"


def _scenario_name(folder: Path) -> str | None:
    """The name of the scenario a results folder ran (its config.json), if it says."""
    try:
        scenario = json.loads((folder / "config.json").read_text()).get("scenario")
    except (OSError, ValueError, AttributeError):
        return None
    return scenario.get("name") if isinstance(scenario, dict) else None


def _name_of(scenario: Path) -> str | None:
    """A scenario file's ``name``."""
    import yaml
    try:
        doc = yaml.safe_load(scenario.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return doc.get("name") if isinstance(doc, dict) else None


def run_scenario(scenario: Path, region: str, quiet: bool) -> tuple[Path, int]:
    """``voiceedge scenario`` into a fresh folder: (the results folder, its exit status). A run
    that measured but missed its success target (exit 1) is still gated; a run that measured
    nothing is an error."""
    root = temp_dir("voiceedge-budgets-")
    cmd = [sys.executable, "-m", "voiceedge", "scenario", str(scenario), "--region", region,
           "--results", str(root)]
    if quiet:
        cmd.append("--json")
    proc = run_child(cmd, stdout=subprocess.DEVNULL if quiet else None)
    folders = [p for p in root.iterdir() if (p / "sessions.csv").is_file()]
    if proc.returncode not in (0, 1) or len(folders) != 1:
        raise UserError(f"the budget scenario {scenario.name} did not run (exit "
                        f"{proc.returncode})")
    if proc.returncode:
        print(f"{scenario.name}: an architecture missed the scenario's success target (exit "
              f"1); gating what it measured", file=sys.stderr)
    return folders[0], proc.returncode


def _scenario(name: str, path: Path, budgets_file: Path) -> Path:
    if not path.is_file():
        raise UserError(f"{budgets_file}: {name} scenario not found (looked for {path})")
    return path


def run_sweep(args: argparse.Namespace) -> int:
    """``voiceedge budgets --sweep DIR``: the sweep budgets against one sweep folder."""
    from analysis.budgets import BudgetError
    from analysis.sweepbudgets import check_sweep, load_sweep_budgets, print_sweep_table, \
        to_json

    if args.results or args.only or args.sessions is not None:
        raise UserError("--sweep checks one sweep folder against the sweep budgets; it takes "
                        "no results folders, --only or --sessions")
    try:
        budgets = load_sweep_budgets(args.budgets)
        verdicts = check_sweep(args.sweep, budgets)
    except BudgetError as exc:
        raise UserError(str(exc)) from None
    if args.json:
        print(to_json(verdicts))
    else:
        print_sweep_table(verdicts, f"sweep budgets ({args.budgets.name}) on {args.sweep}")
    return 0 if all(v.ok for v in verdicts) else 1


def run(args: argparse.Namespace) -> int:
    if getattr(args, "sweep", None) is not None:
        return run_sweep(args)
    from analysis.budgets import BudgetError, BudgetFile, check, check_conversation, \
        check_faults, print_fault_table, print_table, to_json

    try:
        budgets = BudgetFile.load(args.budgets)
    except BudgetError as exc:
        raise UserError(str(exc)) from None
    if args.sessions is not None and args.sessions < 2:
        raise UserError(f"--sessions {args.sessions}: use at least 2")
    if args.only == "faults" and budgets.faults is None:
        raise UserError(f"{args.budgets} has no fault budgets (a 'faults' section)")
    if args.only == "conversation" and budgets.conversation is None:
        raise UserError(f"{args.budgets} has no conversation budgets (a 'conversation' "
                        "section)")
    if args.only == "mobility" and budgets.mobility is None:
        raise UserError(f"{args.budgets} has no mobility budgets (a 'mobility' section)")
    failed_runs = 0
    if args.results:
        mobility = (_name_of(budgets.mobility.scenario_path())
                    if budgets.mobility is not None else None)
        jobs = [(args.only or folder_set(folder, mobility), folder) for folder in args.results]
        if any(s == "faults" for s, _ in jobs) and budgets.faults is None:
            raise UserError(f"{args.budgets} has no fault budgets (a 'faults' section)")
        if any(s == "conversation" for s, _ in jobs) and budgets.conversation is None:
            raise UserError(f"{args.budgets} has no conversation budgets")
    else:
        plan = [("latency", budgets.scenario_path(), budgets.region)]
        if budgets.faults is not None:
            plan.append(("faults", budgets.faults.scenario_path(), budgets.faults.region))
        if budgets.conversation is not None:
            plan.append(("conversation", budgets.conversation.scenario_path(),
                         budgets.conversation.region))
        if budgets.mobility is not None:
            plan.append(("mobility", budgets.mobility.scenario_path(),
                         budgets.mobility.region))
        plan = [p for p in plan if args.only in (None, p[0])]
        for which, path, _ in plan:
            _scenario(which, path, args.budgets)
        jobs = []
        for which, path, region in plan:
            folder, status = run_scenario(path, region, args.json)
            failed_runs += status != 0
            jobs.append((which, folder))
    verdicts = []
    try:
        for which, folder in jobs:
            if which in ("faults", "mobility"):
                found = check_faults(folder, budgets.faults if which == "faults"
                                     else budgets.mobility)
                if not args.json:
                    print_fault_table(found, f"{'fault' if which == 'faults' else which} "
                                             f"budgets ({args.budgets.name}) on {folder}")
            elif which == "conversation":
                found = check_conversation(folder, budgets.conversation)
                if not args.json:
                    print_table(found, f"conversation budgets ({args.budgets.name}) on "
                                       f"{folder}")
            else:
                found = check(folder, budgets, sessions=args.sessions)
                if not args.json:
                    print_table(found, f"latency budgets ({args.budgets.name}) on {folder}")
            verdicts += found
    except BudgetError as exc:
        raise UserError(str(exc)) from None
    if args.json:
        print(to_json(verdicts))
    return 0 if all(v.ok for v in verdicts) and not failed_runs else 1
