"""``voiceedge transceiver``: run a transceiver."""
from __future__ import annotations

import argparse
import os

from services.config import parse_hostport
from services.eventloops import EVENT_LOOPS, UVLOOP, loop_factory
from voiceedge.errors import ConfigError
from services.transceiver import ice
from services.mediapaths import MEDIA_PATHS, OPENSSL, PYTHON, SRTP_IMPLEMENTATIONS
from services.transceiver.opus import APPLICATIONS, OpusSettings
from services.wire.ufrag import MAX_CLUSTER_ID, MAX_TRANSCEIVER_ID, secret_from_env
from voiceedge.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("transceiver", help="run a transceiver (WebRTC sessions, agent bridge)",
                       description="Terminate ICE, DTLS and SRTP for many sessions on one UDP "
                                   "socket (or one per session) and bridge them to the agent.")
    p.add_argument("--cluster", type=int, required=True, help=f"cluster id (0..{MAX_CLUSTER_ID})")
    p.add_argument("--id", type=int, required=True, dest="transceiver_id",
                   help=f"transceiver id (0..{MAX_TRANSCEIVER_ID})")
    p.add_argument("--mode", choices=ice.MODES, default=ice.SHARED,
                   help="shared: one UDP socket; port-per-session: the traditional design")
    p.add_argument("--media", default="0.0.0.0:3480", metavar="HOST:PORT",
                   help="shared socket address; in port-per-session mode only HOST is used")
    p.add_argument("--advertise", metavar="HOST:PORT",
                   help="default candidate in answers (e.g. a relay VIP); signaling may pass "
                        "another per session")
    p.add_argument("--control", default="127.0.0.1:8900", metavar="HOST:PORT",
                   help="control API for signaling (default 127.0.0.1:8900)")
    p.add_argument("--agent", metavar="URL", help="agent base URL, e.g. ws://127.0.0.1:8800")
    p.add_argument("--max-sessions", type=int, default=200, help="sessions before 503")
    p.add_argument("--setup-timeout", type=float, default=10.0,
                   help="seconds for a session to connect before it is closed")
    opus = OpusSettings()
    p.add_argument("--opus-application", choices=APPLICATIONS, default=opus.application,
                   help="libopus application of the outbound encoder (default "
                        f"{opus.application}: CELT only, the least CPU; docs/transceiver.md)")
    p.add_argument("--opus-complexity", type=int, default=opus.complexity, metavar="0-10",
                   help=f"libopus complexity of the outbound encoder (default {opus.complexity})")
    p.add_argument("--media-path", choices=MEDIA_PATHS, default=PYTHON,
                   help="who carries an established session's RTP: aiortc in Python (the "
                        "reference), or the native media plane in C (on the shared socket or "
                        "on every session's own; docs/transceiver.md)")
    p.add_argument("--srtp", choices=SRTP_IMPLEMENTATIONS, default=OPENSSL,
                   help="the native path's SRTP: openssl (its own AES-GCM for the GCM "
                        "profiles; default) or libsrtp (libsrtp2 for all, the reference)")
    p.add_argument("--event-loop", choices=EVENT_LOOPS, default=UVLOOP,
                   help="the event loop: uvloop (default) or asyncio's own (the reference)")
    p.add_argument("--agent-codec", choices=("opus", "pcm16", "any"), default="any",
                   help="the frames the native path offers the agent: opus (payloads as they "
                        "came), pcm16 (decoded), or any (the agent chooses; default)")
    # Test-only (TransceiverConfig.test_consent_interval_s); not in --help.
    p.add_argument("--test-consent-interval", type=float, default=0.0, help=argparse.SUPPRESS)
    p.set_defaults(func=run, service="transceiver")  # JSON logs: services/logs.py


def config_from_args(args: argparse.Namespace):
    from services.transceiver.server import TransceiverConfig

    try:
        if not 0 <= args.cluster <= MAX_CLUSTER_ID or not 0 <= args.transceiver_id <= MAX_TRANSCEIVER_ID:
            raise ConfigError("--cluster or --id out of range")
        if args.max_sessions < 1 or args.setup_timeout <= 0:
            raise ConfigError("--max-sessions and --setup-timeout must be positive")
        if not 0 <= args.opus_complexity <= 10:
            raise ConfigError("--opus-complexity must be 0..10")
        media = parse_hostport(args.media, "--media", allow_zero=True)
        if args.agent and not args.agent.startswith(("ws://", "wss://")):
            raise ConfigError("--agent takes a ws:// or wss:// URL")
        if args.media_path != PYTHON and ":" in media[0]:
            raise ConfigError("--media-path native takes an IPv4 --media address")
        return TransceiverConfig(
            cluster_id=args.cluster, transceiver_id=args.transceiver_id, mode=args.mode,
            media_host=media[0], media_port=media[1],
            advertise=parse_hostport(args.advertise, "--advertise") if args.advertise else None,
            control=parse_hostport(args.control, "--control"), agent_url=args.agent,
            secret=secret_from_env(os.environ.get("VOICEEDGE_UFRAG_SECRET")),
            max_sessions=args.max_sessions, setup_timeout=args.setup_timeout,
            opus=OpusSettings(application=args.opus_application,
                              complexity=args.opus_complexity),
            media_path=args.media_path, srtp=args.srtp,
            agent_codecs=("opus", "pcm16") if args.agent_codec == "any" else (args.agent_codec,),
            test_consent_interval_s=max(0.0, args.test_consent_interval))
    except ConfigError as exc:
        raise UserError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    from services.transceiver.server import TransceiverServer

    config = config_from_args(args)

    from services.lifecycle import serve_until_signal

    try:
        serve_until_signal(lambda: TransceiverServer(config),
                           loop_factory=loop_factory(args.event_loop))
    except OSError as exc:
        raise UserError(f"cannot open the transceiver's sockets: {exc}") from None
    return 0
