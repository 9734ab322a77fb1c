"""The one command line: ``voiceedge <command> ...``.

Each command lives next to what it drives; this module only assembles them and turns expected
failures (bad input, a busy port, a missing file) into one clear line and a non-zero exit.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from voiceedge import __version__
from voiceedge.errors import UserError


# Each command is parsed with its own module alone: the testbed's other modules (the benches,
# the analysis, pandas, aiortc) cost ~0.9 s to import. A restarted relay or transceiver is
# back that much sooner (the fault scenarios measure that restart), and a client, a report or
# a bad argument answers at once. The order is --help's.
_COMMANDS = {"relay": "services.relay.cli", "transceiver": "services.transceiver.cli",
             "signaling": "services.signaling.cli", "agent": "services.agent.cli",
             "client": "services.client.cli", "browser": "services.browser.cli",
             "demo": "scenarios.demo_edge", "calibrate": "topology.cli",
             "world": "topology.worldcli", "budgets": "analysis.budgets_cli",
             "report": "analysis.cli", "pcap": "analysis.pcap.cli", "bench": None,
             "scenario": "scenarios.cli", "sweep": "scenarios.sweepcli",
             "token": "services.signaling.tokencli"}
_BENCHES = ("bench.relay", "bench.capacity", "topology.impairment.bench", "bench.hostile.cli",
            "bench.srtp_floor", "bench.tokencheck")
# The long-running services: they stop on SIGTERM by themselves (services/lifecycle.py).
_SERVICES = ("relay", "transceiver", "signaling", "agent")


def _base_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    parser = argparse.ArgumentParser(
        prog="voiceedge",
        description="Testbed for a geo-steered WebRTC edge for voice AI.")
    parser.add_argument("--version", action="version", version=f"voiceedge {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    return parser, sub


def _add_command(sub: argparse._SubParsersAction, command: str) -> None:
    if command != "bench":
        importlib.import_module(_COMMANDS[command]).add_parser(sub)
        return
    bench = sub.add_parser("bench", help="benchmarks of the testbed's own parts")
    bench_sub = bench.add_subparsers(dest="target", metavar="TARGET", required=True)
    for module in _BENCHES:
        importlib.import_module(module).add_parser(bench_sub)


def command_parser(command: str) -> argparse.ArgumentParser:
    """The parser of one command alone (``voiceedge relay ...``)."""
    parser, sub = _base_parser()
    _add_command(sub, command)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command (``voiceedge --help``)."""
    parser, sub = _base_parser()
    for command in _COMMANDS:
        _add_command(sub, command)
    return parser


def main(argv: list[str] | None = None) -> int:
    words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    parser = command_parser(words[0]) if words and words[0] in _COMMANDS else build_parser()
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
    if args.command in _SERVICES:
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
