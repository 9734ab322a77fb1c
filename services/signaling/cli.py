"""``voiceedge signaling``: run the signaling API in front of transceivers."""
from __future__ import annotations

import argparse
import os

from services.config import parse_hostport
from services.signaling.auth import API_KEYS_ENV
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
                        "'HOST:PORT' | null, rtt_ms} (instead of --transceiver); an external "
                        "edge's cluster has whip: [URL] and capacity: N instead of "
                        "transceivers")
    p.add_argument("--warm-connections", type=int, default=None, metavar="N",
                   help="idle keep-alive connections kept open to each transceiver, at least "
                        "(default 8; more after a burst of calls: services/signaling/pool.py)")
    p.add_argument("--region", default="", metavar="NAME",
                   help="this front's region, recorded in its steering logs")
    g = p.add_argument_group("steering (services/signaling/steering.py)")
    g.add_argument("--steer-load-threshold", type=float, default=0.9, metavar="FRACTION",
                   help="skip a cluster whose sessions / capacity is at least this "
                        "(default 0.9)")
    g.add_argument("--steer-switch-ms", type=float, default=10.0, metavar="MS",
                   help="a nearer cluster becomes preferred only when nearer by more than "
                        "max(MS, --steer-switch-pct) (default 10)")
    g.add_argument("--steer-switch-pct", type=float, default=20.0, metavar="PCT",
                   help="... or this percentage of the preferred's RTT (default 20)")
    g.add_argument("--steer-switch-probes", type=int, default=3, metavar="N",
                   help="... in N probe rounds in a row (default 3)")
    g.add_argument("--steer-window", type=int, default=5, metavar="N",
                   help="RTT samples per cluster, smoothed by their median (default 5)")
    p.add_argument("--api-keys", metavar="FILE", default=os.environ.get(API_KEYS_ENV) or None,
                   help="API keys (one vek_<id>_<secret> a line; docs/auth.md): calls, ICE "
                        "servers and tokens then need Authorization: Bearer <key or token>; "
                        f"default ${API_KEYS_ENV}; without either the front is open to anyone "
                        "who reaches it")
    g = p.add_argument_group("TURN credentials on GET /v1/ice-servers "
                             "(services/signaling/iceservers.py)")
    g.add_argument("--turn-url", action="append", default=[], metavar="URL",
                   help="a TURN server clients must relay through, e.g. "
                        "turn:10.1.2.2:3478?transport=udp (repeatable); without it the "
                        "endpoint answers no ICE servers and policy all")
    g.add_argument("--turn-secret-file", metavar="FILE",
                   help="the secret shared with the TURN servers (TURN REST API scheme)")
    g.add_argument("--turn-ttl", type=int, default=None, metavar="S",
                   help="seconds each credential is valid (default 3600)")
    g = p.add_argument_group("request limits (services/signaling/limits.py): 4xx beyond")
    g.add_argument("--max-body", type=int, default=64 * 1024, metavar="BYTES",
                   help="largest offer, 1024-65536 (default 65536; 413)")
    g.add_argument("--read-timeout", type=float, default=5.0, metavar="S",
                   help="the body must arrive within S seconds of the headers (default 5; 408)")
    g.add_argument("--idle-timeout", type=float, default=5.0, metavar="S",
                   help="a connection without complete request headers S seconds after it "
                        "opened or was last answered is closed (default 5)")
    g.add_argument("--max-sdp-lines", type=int, default=512, metavar="N",
                   help="lines in an offer (default 512; 400)")
    g.add_argument("--max-sdp-line", type=int, default=1024, metavar="BYTES",
                   help="longest line of an offer (default 1024; 400)")
    g.add_argument("--max-media", type=int, default=8, metavar="N",
                   help="m= sections in an offer (default 8; 400)")
    g.add_argument("--max-candidates", type=int, default=64, metavar="N",
                   help="a=candidate lines in an offer (default 64; 400)")
    p.set_defaults(func=run, service="signaling")  # JSON logs: services/logs.py


def _load_clusters(path: str):
    import json

    from services.signaling.server import ClusterRoute

    try:
        with open(path) as f:
            raw = json.load(f)
        return tuple(ClusterRoute(
            name=c["name"], transceivers=tuple(c.get("transceivers", ())),
            advertise=parse_hostport(c["advertise"], "advertise") if c.get("advertise") else None,
            rtt_ms=float(c.get("rtt_ms", 0.0)), whip=tuple(c.get("whip", ())),
            capacity=int(c.get("capacity", 500))) for c in raw)
    except FileNotFoundError:
        raise ConfigError(f"clusters file {path} does not exist") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"clusters file {path}: {exc}") from None


def _steering(args: argparse.Namespace):
    from services.signaling.steering import SteeringConfig

    checks = (("--steer-load-threshold", 0.0 < args.steer_load_threshold <= 1.0,
               "must be more than 0 and at most 1"),
              ("--steer-switch-ms", args.steer_switch_ms >= 0, "must be 0 or more"),
              ("--steer-switch-pct", args.steer_switch_pct >= 0, "must be 0 or more"),
              ("--steer-switch-probes", args.steer_switch_probes >= 1, "must be 1 or more"),
              ("--steer-window", args.steer_window >= 1, "must be 1 or more"))
    for flag, ok, what in checks:
        if not ok:
            raise ConfigError(f"{flag} {what}")
    return SteeringConfig(load_threshold=args.steer_load_threshold,
                          switch_ms=args.steer_switch_ms, switch_pct=args.steer_switch_pct,
                          switch_probes=args.steer_switch_probes, window=args.steer_window)


def _limits(args: argparse.Namespace):
    from services.signaling.limits import RequestLimits

    try:
        return RequestLimits(max_body_bytes=args.max_body, read_timeout_s=args.read_timeout,
                             idle_timeout_s=args.idle_timeout, max_lines=args.max_sdp_lines,
                             max_line_bytes=args.max_sdp_line, max_media=args.max_media,
                             max_candidates=args.max_candidates)
    except ValueError as exc:
        flags = {"max_body_bytes": "--max-body", "read_timeout_s": "--read-timeout",
                 "idle_timeout_s": "--idle-timeout", "max_lines": "--max-sdp-lines",
                 "max_line_bytes": "--max-sdp-line", "max_media": "--max-media",
                 "max_candidates": "--max-candidates"}
        text = str(exc)
        name = text.split()[0]
        raise ConfigError(text.replace(name, flags.get(name, name), 1)) from None


def _turn(args: argparse.Namespace):
    from services.signaling.iceservers import TurnHandout
    from services.turn.credentials import DEFAULT_TTL_S, read_secret

    if not args.turn_url:
        if args.turn_secret_file or args.turn_ttl is not None:
            raise ConfigError("--turn-secret-file and --turn-ttl go with --turn-url")
        return None
    if not args.turn_secret_file:
        raise ConfigError("--turn-url needs --turn-secret-file")
    try:
        read_secret(args.turn_secret_file)
        return TurnHandout(tuple(args.turn_url), args.turn_secret_file,
                           DEFAULT_TTL_S if args.turn_ttl is None else args.turn_ttl)
    except OSError as exc:
        raise ConfigError(f"--turn-secret-file: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"--turn-*: {exc}") from None


def run(args: argparse.Namespace) -> int:
    from services.signaling.pool import SPARE
    from services.signaling.server import SignalingConfig, SignalingServer

    try:
        listen = parse_hostport(args.listen, "--listen")
        warm = SPARE if args.warm_connections is None else args.warm_connections
        if warm < 0:
            raise ConfigError("--warm-connections must be 0 or more")
        steering = _steering(args)
        limits = _limits(args)
        turn = _turn(args)
        auth = None
        if args.api_keys:
            from services.signaling.auth import KeyRing
            try:
                auth = KeyRing.load(args.api_keys)
            except ValueError as exc:
                raise ConfigError(f"--api-keys: {exc}") from None
        if args.clusters:
            clusters = _load_clusters(args.clusters)
        elif args.transceiver:
            clusters = SignalingConfig.single(
                tuple(args.transceiver),
                advertise=parse_hostport(args.advertise, "--advertise") if args.advertise
                else None).clusters
        else:
            raise ConfigError("give --transceiver URL (repeatable) or --clusters FILE")
        config = SignalingConfig(clusters=clusters, listen=listen, warm_connections=warm,
                                 region=args.region, steering=steering, limits=limits,
                                 turn=turn, auth=auth)
    except ConfigError as exc:
        raise UserError(str(exc)) from None

    from services.lifecycle import serve_until_signal

    try:
        serve_until_signal(lambda: SignalingServer(config))
    except OSError as exc:
        raise UserError(f"cannot listen on {args.listen}: {exc}") from None
    return 0
