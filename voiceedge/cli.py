"""The one command line: ``voiceedge <command> ...``.

Each command lives next to what it drives; this module only assembles them and turns expected
failures (bad input, a busy port, a missing file) into one clear line and a non-zero exit.
"""
from __future__ import annotations

import argparse
import logging
import sys

from voiceedge import __version__
from voiceedge.errors import UserError


# The services, each parsed without importing the rest of the testbed: a restarted relay or
# transceiver is back ~0.8 s sooner (the fault scenarios measure that restart).
_SERVICES = {"relay": "services.relay.cli", "transceiver": "services.transceiver.cli",
             "signaling": "services.signaling.cli", "agent": "services.agent.cli"}


def _base_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    parser = argparse.ArgumentParser(
        prog="voiceedge",
        description="Testbed for a geo-steered WebRTC edge for voice AI.")
    parser.add_argument("--version", action="version", version=f"voiceedge {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    return parser, sub


def service_parser(command: str) -> argparse.ArgumentParser:
    """The parser of one service command alone (``voiceedge relay ...``)."""
    import importlib

    parser, sub = _base_parser()
    importlib.import_module(_SERVICES[command]).add_parser(sub)
    return parser


def build_parser() -> argparse.ArgumentParser:
    from analysis import budgets_cli
    from analysis import cli as report_cli
    from analysis.pcap import cli as pcap_cli
    from bench import capacity as capacity_bench
    from bench.hostile import cli as hostile_bench
    from bench import relay as relay_bench
    from bench import srtp_floor as srtp_bench
    from topology.impairment import bench as impairment_bench
    from scenarios import cli as scenario_cli
    from scenarios import sweepcli
    from scenarios import demo_edge
    from services.agent import cli as agent_cli
    from services.browser import cli as browser_cli
    from services.client import cli as client_cli
    from services.relay import cli as relay_cli
    from services.signaling import cli as signaling_cli
    from services.transceiver import cli as transceiver_cli
    from topology import cli as topology_cli
    from topology import worldcli

    parser, sub = _base_parser()
    relay_cli.add_parser(sub)
    transceiver_cli.add_parser(sub)
    signaling_cli.add_parser(sub)
    agent_cli.add_parser(sub)
    client_cli.add_parser(sub)
    browser_cli.add_parser(sub)
    demo_edge.add_parser(sub)
    topology_cli.add_parser(sub)
    worldcli.add_parser(sub)
    budgets_cli.add_parser(sub)
    report_cli.add_parser(sub)
    pcap_cli.add_parser(sub)

    bench = sub.add_parser("bench", help="benchmarks of the testbed's own parts")
    bench_sub = bench.add_subparsers(dest="target", metavar="TARGET", required=True)
    relay_bench.add_parser(bench_sub)
    capacity_bench.add_parser(bench_sub)
    impairment_bench.add_parser(bench_sub)
    hostile_bench.add_parser(bench_sub)
    srtp_bench.add_parser(bench_sub)

    scenario_cli.add_parser(sub)
    sweepcli.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    parser = service_parser(words[0]) if words and words[0] in _SERVICES else build_parser()
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.INFO
    if getattr(args, "service", None):  # a service: one JSON object per line on stderr
        from services.logs import configure_service_logging
        configure_service_logging(args.service, level)
    else:
        logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr)
        if not args.verbose:  # the WebRTC stack logs every ICE check at INFO
            for name in ("aioice", "aiortc"):
                logging.getLogger(name).setLevel(logging.WARNING)
    if args.command in _SERVICES:  # they stop on SIGTERM by themselves (services/lifecycle.py)
        return _run(args)
    from topology.impairment.seed import seed_from_env
    try:  # read where a world is built, deep inside a run: a bad value is refused up front
        seed_from_env()
    except ValueError as exc:
        print(f"voiceedge {args.command}: {exc}", file=sys.stderr)
        return 2
    # Every other command: SIGTERM and SIGHUP unwind as Ctrl-C does, and what the command
    # started is reaped even if it is killed (docs/logs.md, "Stopping a command").
    from voiceedge.reaper import reaping
    from voiceedge.stopsignals import stop_signals

    with stop_signals() as stops, reaping() as reaper:
        return _run(args, stops, reaper)


def _run(args: argparse.Namespace, stops=None, reaper=None) -> int:
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        _fatal(args, "error", f"voiceedge {args.command}: {exc}")
        return 2
    except KeyboardInterrupt:
        if reaper is not None:
            reaper.close(clean=False)  # an interrupted run's temporary folders go
        received = stops.received if stops is not None else None
        how = f"stopped by {received.name}" if received and received.name != "SIGINT" \
            else "interrupted"
        _fatal(args, "interrupted", f"voiceedge {args.command}: {how}")
        return stops.status() if stops is not None else 130


def _fatal(args: argparse.Namespace, event: str, line: str) -> None:
    """The last word of a command: one plain line, or one JSON log line from a service."""
    service = getattr(args, "service", None)
    if service:
        from services.logs import log_event
        log_event(logging.getLogger(f"voiceedge.{service}"), event, level=logging.ERROR,
                  error=line)
    else:
        try:
            print(line, file=sys.stderr)
        except OSError:  # the terminal is gone (SIGHUP)
            pass
