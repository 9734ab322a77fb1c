"""``voiceedge world up / exec / down``: keep an emulated world up and look inside it, as
Mininet's ``mn`` does.

``up`` builds and calibrates a world, prints its hosts and stays up until Ctrl-C (or SIGTERM,
which ``down`` sends); ``exec HOST -- CMD`` runs a command inside a host's network namespace;
``down`` stops the world, or reaps what a killed ``up`` left. The lock, the state file and the
reap are in topology/worldstate.py.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from topology.preflight import check_programs
from topology.worldstate import STATE_DIR
from voiceedge.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("world", help="keep an emulated world up to look inside it (up, exec, "
                                     "down)",
                       description="Build an emulated world and keep it up (world up), run "
                                   "commands inside its hosts (world exec), stop it (world "
                                   "down). One world at a time; needs root.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    up = actions.add_parser(
        "up", help="build, calibrate and keep a world up until Ctrl-C",
        description="Build the emulated world of --regions, calibrate it (exit status 1, with "
                    "the calibration table, when a path is off), print its hosts with their "
                    "roles and addresses, and keep it up until Ctrl-C, SIGTERM (voiceedge "
                    "world down) or SIGHUP; then tear it down and exit 0. A world left by a "
                    "killed `world up` is reaped first.")
    up.add_argument("--regions", default="apac-se,na-east,eu-west",
                    help="region group, region, or comma list (default apac-se,na-east,eu-west)")
    up.add_argument("--clusters", help="cluster regions (default: the catalogue's among them)")
    up.add_argument("--backend", choices=("auto", "netem", "userspace"), default="auto",
                    help="impairment backend (default auto: netem where the kernel has it, "
                         "else userspace)")
    up.add_argument("--count", type=int, default=200,
                    help="calibration datagrams per path (default 200)")
    up.add_argument("--rate", type=float, default=100.0,
                    help="calibration datagrams/s (default 100)")
    up.set_defaults(func=run_up)

    ex = actions.add_parser(
        "exec", help="run a command inside a host of the world that is up",
        usage="voiceedge world exec HOST -- CMD [ARG ...]",
        description="Run CMD inside the network namespace of HOST (client1, pub1, bb1, edge1, "
                    "cluster1, ...) of the world that `voiceedge world up` keeps up, with this "
                    "terminal's stdin, stdout and stderr; exit with CMD's exit status. E.g. "
                    "voiceedge world exec client1 -- ping -c 3 203.0.113.10")
    ex.add_argument("host", help="host name, as `world up` lists them")
    ex.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD",
                    help="the command and its arguments")
    ex.set_defaults(func=run_exec)

    down = actions.add_parser(
        "down", help="tear down the world that is up (or reap a killed one's)",
        description="Ask the `world up` process to tear its world down (SIGTERM) and wait for "
                    "it; if that process is gone (killed), kill what it recorded (host shells, "
                    "impairment engine, services), so the namespaces vanish, and delete its "
                    "leftover interfaces. Exit status 2 when no world is up, 1 when the "
                    "teardown does not finish in --timeout seconds.")
    down.add_argument("--timeout", type=float, default=30.0,
                      help="seconds to wait for the teardown (default 30)")
    down.set_defaults(func=run_down)

    for parser in (up, ex, down):  # tests keep their worlds apart from the machine's
        parser.add_argument("--state-dir", type=Path, default=STATE_DIR, help=argparse.SUPPRESS)


# ------------------------------------------------------------------ up


def run_up(args: argparse.Namespace) -> int:
    if args.count < 20 or args.rate <= 0:
        raise UserError("--count must be at least 20 and --rate positive")
    from topology.cli import paths_progress, print_report, world_spec_of
    from topology.preflight import check_world_prerequisites

    backend_name = None if args.backend == "auto" else args.backend
    check_world_prerequisites(backend_name)
    from rich.console import Console
    from rich.markup import escape

    from topology.calibrate import calibrate
    from topology.impairment.factory import make_backend
    from topology.world import World
    from topology.worldstate import WorldHold

    console = Console(stderr=True)

    def say(msg: str) -> None:
        console.print(f"[dim]… {escape(msg)}[/dim]")

    try:
        spec = world_spec_of(args.regions, args.clusters)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    names = spec.regions
    # The lock first: a second `world up` is refused before it builds anything.
    with WorldHold(spec=spec, say=lambda msg: console.print(escape(msg)),
                   state_dir=args.state_dir) as hold:
        backend = make_backend(backend_name)
        say(f"impairment backend: {backend.name}; building {len(names)} region"
            f"{'s' if len(names) != 1 else ''} ({', '.join(names)}), clusters "
            f"{', '.join(spec.clusters) or 'none'}")
        world = World(spec, backend)
        with world:
            say(f"built in {world.build_seconds:.2f} s; calibrating {len(world.links) + 1} "
                f"paths")
            with paths_progress(console, "calibrating") as progress:
                report = calibrate(world, count=args.count, rate=args.rate, progress=progress)
            if not report.ok:
                print_report(report)
                console.print("voiceedge world: calibration failed: the world is not the "
                              "configured one; tearing it down", markup=False)
                return 1
            say(f"calibration passed ({len(report.paths)} paths)")
            hold.publish(world)
            stop = hold.wait()
            say(f"{stop}: tearing the world down")
        try:
            console.print(f"world down: torn down in {world.teardown_seconds:.1f} s",
                          markup=False)
        except OSError:  # the terminal is gone (SIGHUP)
            pass
    return 0


# ------------------------------------------------------------------ exec


def run_exec(args: argparse.Namespace) -> int:
    from topology.worldstate import describe, holder_alive, read_state, same_process

    argv = list(args.argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        raise UserError("no command: voiceedge world exec HOST -- CMD [ARG ...]")
    check_programs("nsenter")
    state = read_state(args.state_dir)
    if state is None:
        raise UserError("no world is up: start one with voiceedge world up")
    if not holder_alive(state):
        raise UserError(f"the world of {describe(state)} is stale (its holder is gone): "
                        f"voiceedge world down reaps it")
    if state.get("phase") != "up":
        raise UserError(f"the world of {describe(state)} is still being built: try again when "
                        f"world up prints its hosts")
    host = state["hosts"].get(args.host)
    if host is None:
        raise UserError(f"no host {args.host!r} in the world; its hosts: "
                        f"{', '.join(state['hosts'])}")
    if not same_process(host["pid"], host["start_ticks"]):
        raise UserError(f"host {args.host} of the world of {describe(state)} is gone (stale "
                        f"world): voiceedge world down")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp("nsenter", ["nsenter", f"--net={host['ns_path']}", "--", *argv])
    return 127  # not reached


# ------------------------------------------------------------------ down


def run_down(args: argparse.Namespace) -> int:
    from topology.worldstate import stop_world

    check_programs("ip")
    try:
        line = stop_world(args.state_dir, args.timeout)
    except TimeoutError as exc:
        print(f"voiceedge world: {exc}", file=sys.stderr)
        return 1
    print(f"world down: {line}")
    return 0
