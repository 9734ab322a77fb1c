"""``voiceedge client``: run measured WebRTC sessions against an SDP-over-HTTP endpoint."""
from __future__ import annotations

import argparse
import asyncio
import logging
import json

from services.client.config import (JITTER_BUFFERS, KINDS, ClientConfig, ConversationConfig,
                                    IceServer)
from services.client.results import SessionResult
from services.client.verify import CHECKS, DEFAULT_VERIFIES, parse_verifies
from services.lag import LoopLagMonitor
from services.priority import step_down
from services.logs import log_event
from services.client.credential import bearer, read_credential
from voiceedge.errors import UserError

log = logging.getLogger("voiceedge.client")


def add_parser(sub) -> None:
    p = sub.add_parser("client", help="run measured WebRTC client sessions",
                       description="Start aiortc sessions against a signaling URL (POST of an SDP "
                                   "offer, 201 + answer), echo a tone and a data-channel event, "
                                   "and record setup timings and media quality per session.")
    p.add_argument("--url", required=True, help="signaling URL, e.g. http://203.0.113.10/v1/calls")
    p.add_argument("-n", "--sessions", type=int, default=1, help="number of sessions (default 1)")
    p.add_argument("--rate", type=float, default=10.0,
                   help="sessions started per second (default 10)")
    p.add_argument("--start-at", type=float, metavar="UNIX",
                   help="wall-clock time (Unix seconds) the first session is due, the others "
                        "following at --rate from there; a client up later starts at once and "
                        "logs calls_late (default: as soon as it is up)")
    p.add_argument("--start-file", metavar="PATH",
                   help="after warming up, wait (10 minutes at most) for PATH to hold "
                        "--start-at's time (a run starts every client process, then writes it, "
                        "so that no call runs beside another process's start-up)")
    p.add_argument("--concurrency", type=int,
                   help="at most this many sessions at once (default: no limit)")
    p.add_argument("--duration", type=float, default=5.0,
                   help="call seconds after setup (default 5)")
    p.add_argument("--setup-timeout", type=float, default=10.0,
                   help="seconds from session start to DTLS connected (default 10)")
    p.add_argument("--full-clients", type=int, metavar="N",
                   help="N of the sessions (spread over the run) decode what they receive and "
                        "check the echo's level; the others are light: RTP headers and payload "
                        "sizes only (default: all full)")
    p.add_argument("--phase", type=float, default=0.0, metavar="F",
                   help="this process's place (0 to 1) among several calling at one rate: every "
                        "session starts F of the spacing 1/--rate later, and the full ones fall "
                        "F of their spacing later, so that the client processes of several "
                        "regions neither set up nor run their full sessions at once (default 0)")
    p.add_argument("--signaling-timeout", type=float, default=5.0,
                   help="seconds for the offer POST (default 5)")
    p.add_argument("--media-timeout", type=float, default=1.5, metavar="S",
                   help="no RTP received for S seconds during the call is a failed connection, "
                        "as are ICE or DTLS failing: the session calls again (default 1.5)")
    p.add_argument("--reconnect-attempts", type=int, default=3, metavar="N",
                   help="calls again at most N times in all during a call, after 0, 0.5, then "
                        "1 s; a session whose connection is not back is failed, 'lost after N "
                        "reconnection attempts' (0: never call again; default 3)")
    p.add_argument("--retry-setup", action="store_true",
                   help="also call again when the first setup was answered but its media never "
                        "connected (the server died under it); by default that session fails")
    p.add_argument("--ice-server", action="append", default=[], metavar="URL",
                   help="STUN/TURN server, e.g. turn:10.0.0.1:3478 (repeatable; default none)")
    p.add_argument("--ice-username", help="username for the TURN servers")
    p.add_argument("--ice-credential", help="credential for the TURN servers")
    p.add_argument("--ice-relay-only", action="store_true",
                   help="relay candidates only (RTCIceTransportPolicy relay): every datagram "
                        "through the TURN server")
    p.add_argument("--ice-from-signaling", action="store_true",
                   help="before each session, GET the ICE servers and policy from the front "
                        "(/v1/ice-servers on --url's origin: TURN credentials under the turn "
                        "architecture) instead of --ice-server")
    p.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                   help="extra HTTP header for POST and DELETE (repeatable)")
    p.add_argument("--credential-file", metavar="FILE",
                   help="a file whose first line is the API key or call token every request "
                        "to the front carries (Authorization: Bearer; docs/auth.md)")
    p.add_argument("--index-base", type=int, default=0, metavar="K",
                   help="session i is recorded as index K + i (default 0)")
    add_verify_arg(p)
    p.add_argument("--rx-log", metavar="FILE",
                   help="append each session's received RTP packets (SSRC, sequence number, "
                        "arrival time), one JSON line per session")
    add_conversation_args(p, "full ones through aiortc, light ones on the native pump")
    conv = ConversationConfig()
    p.add_argument("--jitter-buffer", choices=JITTER_BUFFERS, default=conv.jitter_buffer,
                   help="a conversation's audio jitter buffer: playout (gives a lost packet up "
                        "after 4 frames) or aiortc's own (its delay grows at the first loss); "
                        f"default {conv.jitter_buffer}")
    add_output_args(p)
    p.set_defaults(func=run, service="client")  # JSON logs: services/logs.py


def add_conversation_args(p, how: str) -> None:
    """--conversation, --barge-in-share and --audio-dir (docs/conversation.md)."""
    conv = ConversationConfig()
    p.add_argument("--conversation", type=int, metavar="TURNS",
                   help="sessions speak TURNS lines in turns to a reply agent instead of "
                        f"sending the tone, and time what they hear: {how} "
                        "(docs/conversation.md)")
    p.add_argument("--barge-in-share", type=float, default=conv.barge_in_share, metavar="F",
                   help="share of the lines after the first spoken into the reply "
                        f"(default {conv.barge_in_share:g})")
    p.add_argument("--audio-dir", metavar="DIR",
                   help="write the completed replies each conversation heard here (16 kHz WAV)")


def conversation_from_args(args: argparse.Namespace, **more) -> ConversationConfig | None:
    """The conversation the flags ask for, or None; UserError for bad ones."""
    if args.conversation is None:
        if args.audio_dir:
            raise UserError("--audio-dir needs --conversation")
        return None
    try:
        return ConversationConfig(turns=args.conversation, barge_in_share=args.barge_in_share,
                                  **more)
    except ValueError as exc:
        raise UserError(f"--conversation: {exc}") from None


def add_verify_arg(p) -> None:
    """--verify: what a session checks came back (services/client/verify.py)."""
    p.add_argument("--verify", default=",".join(DEFAULT_VERIFIES), metavar="CHECKS",
                   help="what counts as verified, comma-separated from "
                        f"{', '.join(CHECKS)}: the audio echo, the data-channel event coming "
                        "back (raw or wrapped), wrapped in the agent's agent.echo envelope "
                        "(implies datachannel); an edge that echoes events raw: "
                        "audio,datachannel (default all three)")


def verifies_from_args(args: argparse.Namespace) -> tuple[str, ...]:
    try:
        return parse_verifies(args.verify)
    except ValueError as exc:
        raise UserError(f"--verify: {exc}") from None


def add_output_args(p) -> None:
    """--results, --samples, -q and --json: what every client command writes and prints."""
    p.add_argument("--light-path", choices=("python", "native"), default="python",
                   help="who carries a light session's RTP once connected: aiortc (python, "
                        "the reference) or one native pump for the process (native; docs/client.md)")
    p.add_argument("--results", metavar="FILE", help="append one JSON line per session")
    p.add_argument("--samples", metavar="FILE", help="append per-second media samples (JSON lines)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no log line per session on stderr (start and end are still logged)")
    p.add_argument("--json", action="store_true",
                   help="print the summary as JSON on stdout (logs stay on stderr)")


def config_from_args(args: argparse.Namespace) -> ClientConfig:

    if args.sessions < 1:
        raise UserError("--sessions must be at least 1")
    if args.full_clients is not None and args.full_clients < 0:
        raise UserError("--full-clients must be at least 0")
    if not 0.0 <= args.phase < 1.0:
        raise UserError("--phase must be at least 0 and below 1")
    if args.index_base < 0:
        raise UserError("--index-base must be at least 0")
    verifies = verifies_from_args(args)
    conversation = conversation_from_args(args, jitter_buffer=args.jitter_buffer)
    if (conversation is not None and args.light_path == "python"
            and args.full_clients is not None and args.full_clients < args.sessions):
        raise UserError("--conversation: a light session speaks only on the native pump: "
                        "--light-path native, or every session full (no --full-clients)")
    headers = {}
    for h in args.header:
        name, sep, value = h.partition(":")
        if not sep or not name.strip():
            raise UserError(f"--header {h!r} is not 'NAME: VALUE'")
        headers[name.strip()] = value.strip()
    if args.credential_file:
        headers.update(bearer(read_credential(args.credential_file)))
    servers = tuple(IceServer(u, args.ice_username, args.ice_credential) for u in args.ice_server)
    if args.ice_relay_only and not (servers or args.ice_from_signaling):
        raise UserError("--ice-relay-only needs a TURN server: --ice-server or "
                        "--ice-from-signaling")
    if args.ice_from_signaling and servers:
        raise UserError("give --ice-server or --ice-from-signaling, not both")
    try:
        return ClientConfig(url=args.url, duration_s=args.duration, start_rate=args.rate,
                            start_at_unix=args.start_at, start_file=args.start_file,
                            concurrency=args.concurrency, ice_servers=servers,
                            ice_transport_policy="relay" if args.ice_relay_only else "all",
                            ice_from_signaling=args.ice_from_signaling,
                            setup_timeout_s=args.setup_timeout,
                            signaling_timeout_s=args.signaling_timeout, headers=headers,
                            full_sessions=args.full_clients, phase=args.phase,
                            media_timeout_s=args.media_timeout,
                            reconnect_attempts=args.reconnect_attempts,
                            retry_setup=args.retry_setup,
                            record_arrivals=bool(args.rx_log), verifies=verifies,
                            light_path=args.light_path, conversation=conversation,
                            audio_dir=args.audio_dir)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def log_result(r: SessionResult) -> None:
    """One ``session_finished`` log line (WARNING if it failed); the full result is in
    ``--results``."""
    log_event(log, "session_finished", level=logging.INFO if r.ok else logging.WARNING,
              session=r.index, client=r.client, ok=r.ok, stage=r.stage, error=r.error,
              session_url=r.session_url, setup_ms=r.setup_ms, first_audio_ms=r.first_audio_ms,
              first_ice_rtt_ms=r.first_ice_rtt_ms, loss_pct=r.loss_pct,
              echo_verified=r.echo_verified, datachannel_verified=r.datachannel_verified,
              verified=r.verified,
              reconnections=r.reconnections, renominations=r.renominations,
              rx_gaps=len(r.rx_gaps) + r.rx_gaps_unlisted)


SUMMARY_METRICS = ("gathered_ms", "signaling_ms", "first_ice_rtt_ms", "ice_connected_ms", "setup_ms",
                   "first_audio_ms", "rtt_ms", "consent_rtt_ms", "jitter_ms", "loss_pct")


def summary_of(results: list[SessionResult]) -> dict:
    """Counts, failures by reason, and p50/p95/max of each metric over the ok sessions
    (percentiles: analysis.stats, the project's one definition)."""
    from analysis.stats import percentile

    ok = [r for r in results if r.ok]
    failures: dict[str, int] = {}
    for r in results:
        if not r.ok:
            failures[r.error or "unknown"] = failures.get(r.error or "unknown", 0) + 1
    metrics = {}
    for name in SUMMARY_METRICS:
        values = [v for r in ok if (v := getattr(r, name)) is not None]
        if values:
            metrics[name] = {"p50": percentile(values, 50, 2), "p95": percentile(values, 95, 2),
                             "max": round(max(values), 2), "n": len(values)}
    clients = {kind: sum(1 for r in results if r.client == kind) for kind in KINDS}
    return {"sessions": len(results), "ok": len(ok), "clients": clients, "failures": failures,
            "unverified": sum(1 for r in ok if not r.fully_verified),
            "reconnected": sum(1 for r in results if r.reconnections),
            "reconnections": sum(r.reconnections for r in results),
            "renominations": sum(r.renominations for r in results),
            "metrics": metrics}


def summary(results: list[SessionResult]) -> str:
    s = summary_of(results)
    lines = [f"{s['ok']}/{s['sessions']} sessions ok "
             f"({', '.join(f'{n} {kind}' for kind, n in s['clients'].items())})"]
    for name, m in s["metrics"].items():
        lines.append(f"  {name:<17} p50 {m['p50']:9.2f}  p95 {m['p95']:9.2f}  "
                     f"max {m['max']:9.2f}  (n={m['n']})")
    if s["reconnections"]:
        lines.append(f"  {s['reconnections']} reconnection attempts in {s['reconnected']} sessions")
    if s["renominations"]:
        lines.append(f"  {s['renominations']} renominations brought the media back")
    if s["unverified"]:
        lines.append(f"  {s['unverified']} ok sessions not verified: "
                     f"{', '.join(results[0].verifies) or 'nothing'} asked for")
    lines += [f"  failed x{n}: {reason}"
              for reason, n in sorted(s["failures"].items(), key=lambda x: -x[1])]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from services.client.runner import StartFileError, run_sessions

    config = config_from_args(args)
    full = args.sessions if config.full_sessions is None else config.full_sessions
    log_event(log, "client_started", url=config.url, sessions=args.sessions,
              full_clients=min(full, args.sessions),
              rate=config.start_rate, concurrency=config.concurrency,
              duration_s=config.duration_s)
    async def measured() -> list[SessionResult]:
        async with LoopLagMonitor(log):  # a lagging client measures itself: say when
            results = await run_sessions(config, args.sessions, results_path=args.results,
                                         samples_path=args.samples, arrivals_path=args.rx_log,
                                         on_result=None if args.quiet else log_result,
                                         index_base=args.index_base)
        # Its calls are over (and the lag watch's last second logged): the teardown runs
        # ordinary, behind the other clients' calls (services/priority.py).
        if lowered := step_down():
            log_event(log, "stepped_down", threads=lowered)
        return results

    try:
        results = asyncio.run(measured())
    except StartFileError as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:  # the output files
        raise UserError(f"cannot write results: {exc}") from None
    log_event(log, "client_finished", sessions=len(results),
              ok=sum(1 for r in results if r.ok))
    print(json.dumps(summary_of(results), indent=2) if args.json else summary(results))
    return 0 if all(r.ok for r in results) else 1
