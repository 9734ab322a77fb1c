"""``voiceedge signaling``: run the signaling API in front of transceivers."""
from __future__ import annotations

import argparse

from services.config import parse_hostport
from voiceedge.errors import ConfigError
from voiceedge.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("signaling", help="run the signaling API (POST /v1/calls)",
                       description="Take SDP offers on POST /v1/calls and answer them through "
                                   "the transceiver with the most room; GET /healthz (503 while "
                                   "no transceiver answers) and /metrics on the same port.")
    p.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT")
    p.add_argument("--transceiver", action="append", default=[], metavar="URL",
                   help="a transceiver's control URL (repeat for several): one local cluster")
    p.add_argument("--advertise", metavar="HOST:PORT",
                   help="candidate for answers, e.g. the relay VIP (default: the transceiver's)")
    p.add_argument("--clusters", metavar="FILE",
                   help="geo steering: JSON list of {name, transceivers: [URL], advertise: "
                        "'HOST:PORT' | null, rtt_ms} (instead of --transceiver)")
    p.add_argument("--warm-connections", type=int, default=None, metavar="N",
                   help="idle keep-alive connections kept open to each transceiver, at least "
                        "(default 8; more after a burst of calls: services/signaling/pool.py)")
    p.set_defaults(func=run, service="signaling")  # JSON logs: services/logs.py


def _load_clusters(path: str):
    import json

    from services.signaling.server import ClusterRoute

    try:
        with open(path) as f:
            raw = json.load(f)
        return tuple(ClusterRoute(
            name=c["name"], transceivers=tuple(c["transceivers"]),
            advertise=parse_hostport(c["advertise"], "advertise") if c.get("advertise") else None,
            rtt_ms=float(c.get("rtt_ms", 0.0))) for c in raw)
    except FileNotFoundError:
        raise ConfigError(f"clusters file {path} does not exist") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"clusters file {path}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    from services.signaling.pool import SPARE
    from services.signaling.server import SignalingConfig, SignalingServer

    try:
        listen = parse_hostport(args.listen, "--listen")
        warm = SPARE if args.warm_connections is None else args.warm_connections
        if warm < 0:
            raise ConfigError("--warm-connections must be 0 or more")
        if args.clusters:
            config = SignalingConfig(clusters=_load_clusters(args.clusters), listen=listen,
                                     warm_connections=warm)
        elif args.transceiver:
            config = SignalingConfig.single(
                tuple(args.transceiver), listen,
                parse_hostport(args.advertise, "--advertise") if args.advertise else None,
                warm_connections=warm)
        else:
            raise ConfigError("give --transceiver URL (repeatable) or --clusters FILE")
    except ConfigError as exc:
        raise UserError(str(exc)) from None

    from services.lifecycle import serve_until_signal

    try:
        serve_until_signal(lambda: SignalingServer(config))
    except OSError as exc:
        raise UserError(f"cannot listen on {args.listen}: {exc}") from None
    return 0
