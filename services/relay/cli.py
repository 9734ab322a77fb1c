"""``voiceedge relay``: run a relay."""
from __future__ import annotations

import argparse
import os

from services.config import parse_hostport
from voiceedge.errors import ConfigError
from services.relay.config import ADMISSIONS, FORWARDINGS, RelayConfig, RouteTable
from services.relay.scheduling import check_realtime, online_cpus
from services.wire.ufrag import secret_from_env
from voiceedge.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("relay", help="run a single-port relay (ingress or cluster tier)",
                       description="Run a relay: one public UDP port, first-packet routing by "
                                   "the server ufrag in the STUN USERNAME, opaque forwarding.")
    p.add_argument("--tier", choices=("ingress", "cluster"), required=True,
                   help="ingress: route by cluster id to cluster relays; cluster: by transceiver id")
    p.add_argument("--routes", required=True, metavar="FILE", help="routes file (TOML)")
    p.add_argument("--listen", default="0.0.0.0", metavar="HOST", help="public address (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=3478, help="public UDP port (default 3478)")
    p.add_argument("--internal", metavar="HOST:PORT",
                   help="cluster tier: where ingress relays send (default LISTEN:PORT+1)")
    p.add_argument("--hop-bind", default="0.0.0.0", metavar="HOST",
                   help="local address of the sockets towards next hops (default 0.0.0.0)")
    p.add_argument("--hop-port", type=int, default=0, metavar="PORT",
                   help="worker i's socket towards next hops binds PORT+i, so a restarted "
                        "relay keeps its address towards the next tier (default: any port)")
    p.add_argument("--relay-id", default="", help="name in logs and Redis keys (default tier-listen-port)")
    p.add_argument("--redis", metavar="URL", help="Redis flow cache, e.g. redis://127.0.0.1:6379/0")
    p.add_argument("--workers", type=int, default=1, help="worker processes on the port (SO_REUSEPORT)")
    p.add_argument("--cpus", metavar="LIST",
                   help="CPUs to pin workers to, e.g. 0,1 (default: worker i on CPU i; 'none' to not pin)")
    p.add_argument("--realtime", type=int, metavar="PRIO",
                   help="run each worker at real-time priority PRIO (SCHED_FIFO, 1-99), so no "
                        "ordinary process on its CPU delays a datagram; needs root or "
                        "CAP_SYS_NICE (default: ordinary scheduling)")
    p.add_argument("--idle-timeout", type=float, default=30.0, help="seconds before an idle flow expires")
    p.add_argument("--max-flows", type=int, default=100_000, help="flow table cap per worker")
    d = RelayConfig.__dataclass_fields__
    first = p.add_argument_group(
        "first packets", "a flow opened by a first packet stays pending (only STUN passes) "
        "until its next hop answers; see docs/relay.md")
    first.add_argument("--pending-ttl", type=float, default=d["pending_ttl"].default,
                       metavar="S", help="seconds a pending flow waits for its answer (default %(default)s)")
    first.add_argument("--max-pending", type=int, default=d["max_pending"].default, metavar="N",
                       help="pending flows per worker; a full table evicts the oldest (default %(default)s)")
    first.add_argument("--pending-per-ip", type=int, default=d["pending_per_ip"].default,
                       metavar="N", help="pending flows per source IP (default %(default)s)")
    first.add_argument("--pending-per-prefix", type=int,
                       default=d["pending_per_prefix"].default, metavar="N",
                       help="pending flows per source /24 or /64 (default %(default)s)")
    first.add_argument("--first-packet-rate", type=float,
                       default=d["first_packet_rate"].default, metavar="PPS",
                       help="datagrams per second per source IP without an established flow; "
                            "0: no limit (default %(default)s)")
    first.add_argument("--first-packet-burst", type=float,
                       default=d["first_packet_burst"].default, metavar="N",
                       help="the token bucket's size (default %(default)s)")
    first.add_argument("--max-lookups", type=int, default=d["max_lookups"].default, metavar="N",
                       help="Redis lookups in flight per worker (default %(default)s)")
    first.add_argument("--backlog", type=int, default=d["backlog"].default, metavar="N",
                       help="first packets waiting for the slow path per worker; beyond it "
                            "they are dropped unparsed (default %(default)s)")
    first.add_argument("--admission", choices=ADMISSIONS, default=d["admission"].default,
                       help="who admits IPv4 first packets: native (the Python rules in C, "
                            "services/relay/_admission.c) or python (the reference; default "
                            "%(default)s)")
    p.add_argument("--forwarding", choices=FORWARDINGS, default=d["forwarding"].default,
                   help="who forwards established IPv4 flows' datagrams: native (the C fast "
                        "path, services/relay/_fastpath.c) or python (every datagram through "
                        "the worker's Python handlers: the reference; default %(default)s)")
    first.add_argument("--no-pending-flows", dest="pending_flows", action="store_false",
                       help="the unhardened behaviour: a routable first packet opens an "
                            "established flow (for the hostile benchmark's comparison)")
    p.add_argument("--metrics", default="127.0.0.1:9478", metavar="HOST:PORT",
                   help="Prometheus metrics address ('none' to disable)")
    # Test-only regression switch (see RelayConfig.test_processing_delay_ms); not in --help.
    p.add_argument("--test-processing-delay-ms", type=float, help=argparse.SUPPRESS,
                   default=float(os.environ.get("VOICEEDGE_TEST_RELAY_DELAY_MS", "0") or 0))
    p.set_defaults(func=run, service="relay")  # JSON logs: services/logs.py


def config_from_args(args: argparse.Namespace) -> RelayConfig:

    try:
        routes = RouteTable.load(args.routes, args.tier)
        if not 0 < args.port < 65536:
            raise ConfigError(f"--port {args.port} is not a UDP port")
        if args.workers < 1:
            raise ConfigError("--workers must be at least 1")
        if args.hop_port and not 0 < args.hop_port + args.workers - 1 < 65536:
            raise ConfigError(f"--hop-port {args.hop_port} (+ worker index) is not a UDP port")
        if args.idle_timeout <= 0 or args.max_flows < 1:
            raise ConfigError("--idle-timeout and --max-flows must be positive")
        if args.pending_ttl <= 0 or min(args.max_pending, args.pending_per_ip,
                                        args.pending_per_prefix, args.max_lookups,
                                        args.backlog) < 1:
            raise ConfigError("--pending-ttl, --max-pending, --pending-per-ip, "
                              "--pending-per-prefix, --max-lookups and --backlog must be "
                              "positive")
        if args.first_packet_rate < 0 or args.first_packet_burst < 1:
            raise ConfigError("--first-packet-rate must be >= 0 and --first-packet-burst >= 1")
        internal = None
        if args.tier == "cluster":
            internal = (parse_hostport(args.internal, "--internal") if args.internal
                        else (args.listen, args.port + 1))
        if args.cpus is None:
            cpus = None
        elif args.cpus == "none":
            cpus = ()
        else:
            try:
                cpus = tuple(int(c) for c in args.cpus.split(","))
            except ValueError:
                raise ConfigError(f"--cpus {args.cpus!r} is not a list like 0,1") from None
            # the host's CPUs, not this process's affinity: a launcher that keeps itself off
            # the relay's CPU starts the relay with its own narrower mask
            if not set(cpus) <= online_cpus():
                raise ConfigError(f"--cpus {args.cpus} names CPUs this host does not have online")
        if args.realtime is not None:
            check_realtime(args.realtime)
        metrics = None if args.metrics == "none" else parse_hostport(args.metrics, "--metrics")
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    return RelayConfig(
        routes=routes, listen=(args.listen, args.port), internal=internal,
        hop_bind=args.hop_bind, hop_port=args.hop_port, relay_id=args.relay_id,
        secret=secret_from_env(os.environ.get("VOICEEDGE_UFRAG_SECRET")),
        redis_url=args.redis, workers=args.workers, cpus=cpus, realtime=args.realtime,
        idle_timeout=args.idle_timeout, max_flows=args.max_flows, metrics=metrics,
        pending_flows=args.pending_flows, pending_ttl=args.pending_ttl,
        max_pending=args.max_pending, pending_per_ip=args.pending_per_ip,
        pending_per_prefix=args.pending_per_prefix, first_packet_rate=args.first_packet_rate,
        first_packet_burst=args.first_packet_burst, max_lookups=args.max_lookups,
        backlog=args.backlog, admission=args.admission, forwarding=args.forwarding,
        test_processing_delay_ms=max(0.0, args.test_processing_delay_ms))


def run(args: argparse.Namespace) -> int:
    from services.relay.lifeline import PortTaken
    from services.relay.server import RelayServer

    config = config_from_args(args)
    server = RelayServer(config)
    try:
        server.run()
    except PortTaken as exc:
        raise UserError(f"cannot start the relay: {exc}") from None
    except OSError as exc:
        raise UserError(f"cannot open the relay's sockets: {exc}") from None
    return 0
