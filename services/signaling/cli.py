"""``voiceedge signaling``: run the signaling API in front of transceivers."""
from __future__ import annotations

import argparse
import asyncio
import signal

from services.config import ConfigError, parse_hostport


def add_parser(sub) -> None:
    p = sub.add_parser("signaling", help="run the signaling API (POST /v1/calls)",
                       description="Take SDP offers on POST /v1/calls and answer them through "
                                   "the transceiver with the most room.")
    p.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT")
    p.add_argument("--transceiver", action="append", required=True, metavar="URL",
                   help="a transceiver's control URL (repeat for several)")
    p.add_argument("--advertise", metavar="HOST:PORT",
                   help="candidate for answers, e.g. the relay VIP (default: the transceiver's)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from services.signaling.server import SignalingConfig, SignalingServer
    from voiceedge.cli import UserError

    try:
        config = SignalingConfig(
            transceivers=tuple(args.transceiver), listen=parse_hostport(args.listen, "--listen"),
            advertise=parse_hostport(args.advertise, "--advertise") if args.advertise else None)
    except ConfigError as exc:
        raise UserError(str(exc)) from None

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with SignalingServer(config):
            await stop.wait()

    try:
        asyncio.run(serve())
    except OSError as exc:
        raise UserError(f"cannot listen on {args.listen}: {exc}") from None
    return 0
