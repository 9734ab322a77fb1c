"""``voiceedge scenario``: run a scenario file for the clients of a region."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path

from scenarios.spec import DEFAULT_SCENARIO
from services.clienttypes import AIORTC
from services.mediapaths import MEDIA_PATHS, NATIVE
from voiceedge.errors import UserError

EXIT_CODES = """\
exit status:
  0    every architecture reached the scenario's min_success_pct (default 100)
  1    an architecture fell below min_success_pct, or the world did not calibrate
       (the results folder still holds what was measured and why)
  2    nothing was run: bad input, not root, a missing package, no netem for --backend netem,
       a --target whose signaling front does not answer
  130  interrupted (Ctrl-C): the architectures that finished are in the results folder
       (143 on SIGTERM, 129 on SIGHUP: the same)
"""


def add_parser(sub) -> None:
    p = sub.add_parser("scenario", help="run a scenario: every architecture, one emulated world",
                       description="Build the emulated world, calibrate it (refusing to go on "
                                   "if it is off), run the scenario's clients under every "
                                   "architecture, and write results/<scenario>-<region>-<time>/. "
                                   "With --target URL: run the clients from this host against "
                                   "a deployed edge instead (results/<scenario>-target-<time>/).",
                       epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", nargs="?", default=str(DEFAULT_SCENARIO),
                   help="scenario file (default: the shipped scenarios/default.yaml)")
    p.add_argument("--region", default=None,
                   help="client region: a group (apac, na, eu, ...), a region, or a comma list "
                        "(default apac)")
    p.add_argument("--target", metavar="URL",
                   help="run the scenario's clients from this host against a deployed edge's "
                        "signaling front (e.g. http://127.0.0.1:8080) instead of an emulated "
                        "world: no world, no calibration, one architecture 'deployment' "
                        "(docs/deployment.md, 'Scenarios against a deployment')")
    p.add_argument("--api-key-file", metavar="FILE",
                   help="with --target: a file holding the deployment's API key; the run "
                        "trades it at the front for a call token its clients carry "
                        "(docs/auth.md)")
    p.add_argument("--verify", metavar="CHECKS",
                   help="with --target: what the clients count as verified, comma-separated "
                        "from audio, datachannel, envelope (default all three: the project's "
                        "edge; an edge that echoes data-channel events raw: audio,datachannel; "
                        "docs/client.md, Verification)")
    p.add_argument("--results", default="results", type=Path,
                   help="where the results folder goes (default ./results)")
    p.add_argument("--backend", choices=("auto", "netem", "userspace"), default="auto",
                   help="impairment backend (default: netem where the kernel has it)")
    p.add_argument("--capture", action="store_true",
                   help="write a pcap per host on the calls' paths (results/<run>/pcap/) and "
                        "break each datagram's path into hops (docs/captures.md)")
    p.add_argument("--capture-cap-mb", type=float, default=64.0, metavar="MB",
                   help="size cap of each capture file (default 64 MB)")
    p.add_argument("--keep-world", action="store_true",
                   help="after the last architecture, keep the world and its services up (for "
                        "voiceedge world exec) until Ctrl-C; the results and the report are "
                        "written first")
    p.add_argument("--media-path", choices=MEDIA_PATHS,
                   help="the transceivers' media path, instead of the file's media_path "
                        "(python, the reference, or native: docs/transceiver.md)")
    p.add_argument("--light-path", choices=MEDIA_PATHS,
                   help="the light aiortc clients' media path, instead of the file's light_path "
                        "(python, or native: one pump per client process)")
    p.add_argument("--json", action="store_true", help="print only the summary as JSON")
    p.add_argument("--state-dir", type=Path, help=argparse.SUPPRESS)  # --keep-world: tests
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from scenarios.processes import ServiceError
    from scenarios.progress import ProgressBars
    from scenarios.runner import CalibrationFailed, CaptureOptions, ScenarioRunner
    from scenarios.spec import Scenario
    from topology.cli import print_report
    from topology.preflight import check_world_prerequisites

    console = Console(stderr=True)
    scenario = Scenario.load(args.file)  # ConfigError: one line, exit 2
    for key in ("media_path", "light_path"):
        if getattr(args, key, None):
            scenario = dataclasses.replace(scenario, **{key: getattr(args, key)})
    if args.light_path and scenario.conversation is not None:   # who speaks: the pump or aiortc
        scenario = dataclasses.replace(scenario, full_clients_per_region=0 if args.light_path
                                       == NATIVE else scenario.clients.get(AIORTC, 0))
    if args.target is not None:
        return _run_target(args, scenario, console)
    if args.verify is not None:
        raise UserError("--verify is for --target: in the emulated world each architecture "
                        "declares what its clients verify")
    if args.api_key_file is not None:
        raise UserError("--api-key-file is for --target: an emulated run generates its own "
                        "key")
    args.region = args.region or "apac"
    if args.capture_cap_mb <= 0:
        raise UserError("--capture-cap-mb must be positive")
    backend = None if args.backend == "auto" else args.backend
    check_world_prerequisites(backend, services=True,  # EnvironmentProblem: one line, exit 2
                              capture=args.capture, extra=scenario.requirements,
                              browsers=scenario.needs_browser)
    bars = ProgressBars(console, enabled=not args.json)
    say = bars.say

    try:
        runner = ScenarioRunner(scenario, args.region, args.results, backend, say, bars.update,
                                capture=CaptureOptions(args.capture_cap_mb)
                                if args.capture else None)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    say(f"scenario {scenario.name} for clients in {', '.join(runner.client_regions)}; "
        f"results in {runner.directory}")
    written: list = []  # the report, when --keep-world wrote it before holding the world
    with (_held_world(runner, args, bars, written) if args.keep_world else nullcontext()):
        try:
            result = runner.run()
        except CalibrationFailed as exc:
            bars.stop()
            if not args.json:
                print_report(exc.report)
            console.print(f"voiceedge scenario: {exc}; nothing was measured "
                          f"(see {runner.directory}/calibration.json)")
            if args.json:
                print(json.dumps({"directory": str(runner.directory), "calibration_ok": False,
                                  "error": str(exc)}, indent=2))
            return 1
        except ServiceError as exc:
            raise UserError(f"a service did not start: {exc} (results so far: "
                            f"{runner.directory})") from None
    return _finish(args, scenario, console, say, result, written[0] if written else None)


def _run_target(args: argparse.Namespace, scenario, console) -> int:
    """``--target URL``: the scenario's clients against a deployment (scenarios/target.py)."""

    from scenarios.processes import ServiceError
    from scenarios.progress import ProgressBars
    from scenarios.spec import ScenarioError
    from scenarios.target import Target, TargetRunner, TargetUnreachable
    from topology.preflight import check_client_prerequisites

    for flag, used in (("--region", args.region is not None), ("--capture", args.capture),
                       ("--keep-world", args.keep_world), ("--backend", args.backend != "auto")):
        if used:
            raise UserError(f"{flag} is about the emulated world; --target runs the clients "
                            f"from this host against a deployment")
    try:
        target = Target.parse(args.target)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    verifies = None
    if args.verify is not None:
        from services.client.verify import parse_verifies

        try:
            verifies = parse_verifies(args.verify)
        except ValueError as exc:
            raise UserError(f"--verify: {exc}") from None
    check_client_prerequisites(browsers=scenario.needs_browser)
    bars = ProgressBars(console, enabled=not args.json)
    say = bars.say

    api_key = None
    if args.api_key_file:
        from services.client.credential import read_credential

        api_key = read_credential(args.api_key_file, "--api-key-file")
    try:
        runner = TargetRunner(scenario, target, args.results, say, bars.update,
                              verifies=verifies, api_key=api_key)
    except ScenarioError as exc:
        raise UserError(str(exc)) from None
    say(f"scenario {scenario.name} against the deployment at {target.url} (no emulated "
        f"world, no calibration); results in {runner.directory}")
    try:
        result = runner.run()
    except TargetUnreachable as exc:
        raise UserError(f"the target did not answer: {exc}; nothing was run") from None
    except ServiceError as exc:
        raise UserError(f"{exc} (results so far: {runner.directory})") from None
    return _finish(args, scenario, console, say, result)


def _finish(args: argparse.Namespace, scenario, console, say, result, written=None) -> int:
    """Write the report (unless ``written`` is its (html, md) already), print the summary and
    return the exit status."""
    from analysis.report import write_report  # matplotlib: only once there is a run to plot
    from scenarios.report import print_summary

    summary = dict(result.summary)
    if written:
        html, md = written
    else:
        say("writing the report")
        html, md = write_report(result.directory)
    summary["report"] = {"html": str(html), "markdown": str(md)}
    failed = result.failed_architectures
    summary["exit_status"] = 1 if failed else 0
    summary["below_min_success"] = failed
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary)
        console.print(f"results: {result.directory}\nreport:  {html}\nsummary: {md}")
    if failed:
        console.print(f"voiceedge scenario: {', '.join(failed)} below the scenario's "
                      f"min_success_pct ({scenario.min_success_pct:g}%)")
        return 1
    return 0


@contextmanager
def _held_world(runner, args, bars, written: list):
    """The world lock for --keep-world, taken before anything is built (a `voiceedge world up`
    meanwhile is refused, and this run refused if one is up), and the runner's ``keep_world``:
    write the report, then hold the world with the last architecture's services until
    Ctrl-C."""
    from analysis.report import write_report
    from topology.worldstate import WorldHold

    with WorldHold(spec=runner.spec, say=bars.print, file=sys.stderr if args.json else None,
                   **({"state_dir": args.state_dir} if args.state_dir else {})) as hold:
        def keep(world, edge) -> None:
            written.append(write_report(runner.directory))
            bars.stop()
            services = list(edge.services.values())
            hold.add_pids(*(s.process.pid for s in services if s.process.pid))
            lines = [f"results: {runner.directory} (report.html written)",
                     f"{edge.plan.architecture}'s services still up: "
                     + ", ".join(f"{s.name}@{s.host.name}" for s in services)]
            for f in edge.plan.fronts:
                token = edge.token_file(f"by-hand-{f.region}")
                lines.append(f"a call from {f.region}: voiceedge world exec "
                             f"client{world.index[f.region]} -- {sys.executable} -m voiceedge "
                             f"client --url {edge.signaling_url(f)} -n 1"
                             + (f" --credential-file {token}" if token else ""))
            hold.publish(world, lines)
            hold.wait()
            runner.say("tearing the world down")

        runner.keep_world = keep
        yield hold
