"""``voiceedge client``: run measured WebRTC sessions against an SDP-over-HTTP endpoint."""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys

from services.client.config import ClientConfig, IceServer
from services.client.results import SessionResult
from voiceedge.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("client", help="run measured WebRTC client sessions",
                       description="Start aiortc sessions against a signaling URL (POST of an SDP "
                                   "offer, 201 + answer), echo a tone and a data-channel event, "
                                   "and record setup timings and media quality per session.")
    p.add_argument("--url", required=True, help="signaling URL, e.g. http://203.0.113.10/v1/calls")
    p.add_argument("-n", "--sessions", type=int, default=1, help="number of sessions (default 1)")
    p.add_argument("--rate", type=float, default=10.0,
                   help="sessions started per second (default 10)")
    p.add_argument("--concurrency", type=int,
                   help="at most this many sessions at once (default: no limit)")
    p.add_argument("--duration", type=float, default=5.0,
                   help="call seconds after setup (default 5)")
    p.add_argument("--setup-timeout", type=float, default=10.0,
                   help="seconds from session start to DTLS connected (default 10)")
    p.add_argument("--signaling-timeout", type=float, default=5.0,
                   help="seconds for the offer POST (default 5)")
    p.add_argument("--ice-server", action="append", default=[], metavar="URL",
                   help="STUN/TURN server, e.g. turn:10.0.0.1:3478 (repeatable; default none)")
    p.add_argument("--ice-username", help="username for the TURN servers")
    p.add_argument("--ice-credential", help="credential for the TURN servers")
    p.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                   help="extra HTTP header for POST and DELETE (repeatable)")
    p.add_argument("--results", metavar="FILE", help="append one JSON line per session")
    p.add_argument("--samples", metavar="FILE", help="append per-second media samples (JSON lines)")
    p.add_argument("-q", "--quiet", action="store_true", help="no line per session on stderr")
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> ClientConfig:

    if args.sessions < 1:
        raise UserError("--sessions must be at least 1")
    headers = {}
    for h in args.header:
        name, sep, value = h.partition(":")
        if not sep or not name.strip():
            raise UserError(f"--header {h!r} is not 'NAME: VALUE'")
        headers[name.strip()] = value.strip()
    servers = tuple(IceServer(u, args.ice_username, args.ice_credential) for u in args.ice_server)
    try:
        return ClientConfig(url=args.url, duration_s=args.duration, start_rate=args.rate,
                            concurrency=args.concurrency, ice_servers=servers,
                            setup_timeout_s=args.setup_timeout,
                            signaling_timeout_s=args.signaling_timeout, headers=headers)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _line(r: SessionResult) -> str:
    if not r.ok:
        return f"session {r.index}: FAILED at {r.stage}: {r.error}"
    return (f"session {r.index}: ok  setup {r.setup_ms:.0f} ms  "
            f"first audio {_ms(r.first_audio_ms)}  ICE RTT {_ms(r.first_ice_rtt_ms, 2)}  "
            f"loss {r.loss_pct}%  echo {'yes' if r.echo_verified else 'NO'}  "
            f"events {'yes' if r.datachannel_verified else 'NO'}")


def _ms(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:.{digits}f} ms"


def summary(results: list[SessionResult]) -> str:
    ok = [r for r in results if r.ok]
    lines = [f"{len(ok)}/{len(results)} sessions ok"]
    for name in ("signaling_ms", "first_ice_rtt_ms", "ice_connected_ms", "setup_ms",
                 "first_audio_ms", "rtt_ms", "jitter_ms", "loss_pct"):
        values = sorted(v for r in ok if (v := getattr(r, name)) is not None)
        if values:
            p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
            lines.append(f"  {name:<17} median {statistics.median(values):9.2f}  p95 {p95:9.2f}  "
                         f"max {values[-1]:9.2f}  (n={len(values)})")
    unverified = sum(1 for r in ok if not (r.echo_verified and r.datachannel_verified))
    if unverified:
        lines.append(f"  {unverified} ok sessions without a verified audio echo or event echo")
    failures: dict[str, int] = {}
    for r in results:
        if not r.ok:
            failures[r.error] = failures.get(r.error, 0) + 1
    lines += [f"  failed x{n}: {reason}"
              for reason, n in sorted(failures.items(), key=lambda x: -x[1])]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from services.client.runner import run_sessions

    config = config_from_args(args)
    report = None if args.quiet else (lambda r: print(_line(r), file=sys.stderr, flush=True))
    try:
        results = asyncio.run(run_sessions(config, args.sessions, results_path=args.results,
                                           samples_path=args.samples, on_result=report))
    except OSError as exc:  # the output files
        raise UserError(f"cannot write results: {exc}") from None
    print(summary(results))
    return 0 if all(r.ok for r in results) else 1
