"""``voiceedge browser``: measured calls from headless Chromium pages (docs/browser.md)."""
from __future__ import annotations

import argparse
import asyncio
import json
import logging

from services.browser.config import DEFAULT_CHROMIUM, OFFER_CHOICES, OFFER_STYLES, BrowserConfig
from services.client.cli import (add_conversation_args, add_output_args, add_verify_arg,
                                 conversation_from_args, verifies_from_args)
from services.client.credential import read_credential
from services.logs import log_event
from voiceedge.errors import UserError

log = logging.getLogger("voiceedge.browser")


def add_parser(sub) -> None:
    p = sub.add_parser("browser", help="run measured calls from headless Chromium",
                       description="Open the signaling front's call page (/call) in headless "
                                   "Chromium, once per session: a fake microphone plays a tone, "
                                   "the page POSTs its offer to /v1/calls, plays the agent's "
                                   "echo and reports its own view of the call from getStats().")
    p.add_argument("--url", required=True, help="signaling URL, e.g. http://203.0.113.10:8080/v1/calls")
    p.add_argument("-n", "--sessions", type=int, default=1, help="number of sessions (default 1)")
    p.add_argument("--rate", type=float, default=2.0, help="sessions started per second (default 2)")
    p.add_argument("--duration", type=float, default=5.0,
                   help="call seconds after setup (default 5)")
    p.add_argument("--offer", choices=OFFER_CHOICES, default="alternate",
                   help="POST the offer once ICE gathering is complete (gathered), at once "
                        "without candidates (immediate), or alternate per session starting "
                        "gathered (default alternate)")
    p.add_argument("--start-delay", type=float, default=0.0, metavar="S",
                   help="seconds from the browser being ready (pages loaded) to the first "
                        "session (default 0)")
    p.add_argument("--index-base", type=int, default=0, metavar="K",
                   help="session i is recorded as index K + i (default 0)")
    p.add_argument("--setup-timeout", type=float, default=10.0,
                   help="seconds from peer connection to DTLS connected (default 10)")
    p.add_argument("--signaling-timeout", type=float, default=5.0,
                   help="seconds for the offer POST (default 5)")
    p.add_argument("--media-timeout", type=float, default=1.5, metavar="S",
                   help="no RTP received for S seconds during the call fails it (default 1.5)")
    p.add_argument("--credential-file", metavar="FILE",
                   help="a file whose first line is the API key or call token the pages carry "
                        "to the front (in the page URL's fragment; docs/auth.md)")
    p.add_argument("--ice-from-signaling", action="store_true",
                   help="before each session the page GETs /v1/ice-servers from the front and "
                        "uses its ICE servers and policy")
    p.add_argument("--tone-hz", type=float, default=440.0,
                   help="the fake microphone's tone (default 440; 0: silence, so no echo)")
    p.add_argument("--chromium", default=DEFAULT_CHROMIUM, metavar="PATH",
                   help=f"the Chromium executable (default {DEFAULT_CHROMIUM}: make browsers)")
    add_conversation_args(p, "each page plays them through WebAudio and times what its "
                             "audio output plays")
    add_verify_arg(p)
    add_output_args(p)
    p.set_defaults(func=run, service="browser")  # JSON logs: services/logs.py


def config_from_args(args: argparse.Namespace) -> BrowserConfig:
    if args.sessions < 1:
        raise UserError("--sessions must be at least 1")
    try:
        return BrowserConfig(url=args.url, duration_s=args.duration, start_rate=args.rate,
                             offer=args.offer, index_base=args.index_base,
                             start_delay_s=args.start_delay,
                             chromium=args.chromium, setup_timeout_s=args.setup_timeout,
                             signaling_timeout_s=args.signaling_timeout,
                             media_timeout_s=args.media_timeout,
                             ice_from_signaling=args.ice_from_signaling, tone_hz=args.tone_hz,
                             verifies=verifies_from_args(args),
                             conversation=conversation_from_args(args),
                             audio_dir=args.audio_dir,
                             credential=(read_credential(args.credential_file)
                                         if args.credential_file else None))
    except ValueError as exc:  # name the flag, not the field
        text = str(exc)
        for name, flag in _FLAGS.items():
            if text.startswith(name + " "):
                text = flag + text[len(name):]
        raise UserError(text) from None


_FLAGS = {"url": "--url", "duration_s": "--duration", "start_rate": "--rate",
          "index_base": "--index-base", "start_delay_s": "--start-delay",
          "setup_timeout_s": "--setup-timeout",
          "signaling_timeout_s": "--signaling-timeout", "media_timeout_s": "--media-timeout",
          "tone_hz": "--tone-hz"}


def offer_styles(results) -> dict:
    """Per offer style: sessions, ok, and p50 of the setup timeline over the ok ones."""
    from analysis.stats import percentile

    out = {}
    for style in OFFER_STYLES:
        mine = [r for r in results if r.offer_style == style]
        if not mine:
            continue
        ok = [r for r in mine if r.ok]
        entry = {"sessions": len(mine), "ok": len(ok)}
        for name in ("gathered_ms", "offer_ms", "signaling_ms", "ice_connected_ms", "setup_ms",
                     "first_audio_ms"):
            values = [v for r in ok if (v := getattr(r, name)) is not None]
            entry[f"{name}_p50"] = percentile(values, 50, 2) if values else None
        out[style] = entry
    a, b = out.get("gathered", {}), out.get("immediate", {})
    if a.get("setup_ms_p50") is not None and b.get("setup_ms_p50") is not None:
        out["setup_ms_p50_gathered_minus_immediate"] = round(
            a["setup_ms_p50"] - b["setup_ms_p50"], 2)
    return out


def summary_json(run) -> dict:
    from services.client.cli import summary_of

    return {**summary_of(run.results), "offer_styles": offer_styles(run.results),
            "browser": {"version": run.version, "launch_ms": run.launch_ms, **run.usage}}


def summary_text(run) -> str:
    from services.client.cli import summary

    lines = [summary(run.results)]
    styles = offer_styles(run.results)
    for style in OFFER_STYLES:
        s = styles.get(style)
        if s:
            lines.append(f"  {style:<9} {s['ok']}/{s['sessions']} ok, setup p50 "
                         f"{_ms(s['setup_ms_p50'])} (offer sent at {_ms(s['offer_ms_p50'])})")
    if "setup_ms_p50_gathered_minus_immediate" in styles:
        lines.append(f"  setup p50 gathered - immediate: "
                     f"{styles['setup_ms_p50_gathered_minus_immediate']:.2f} ms")
    u = run.usage
    lines.append(f"  Chromium {run.version}: launched in {run.launch_ms} ms"
                 + (f"; {u['cpu_ms_per_session']} ms CPU per session, peak {u['peak_pss_mib']} "
                    f"MiB PSS" if u.get("cpu_ms_per_session") is not None else ""))
    return "\n".join(lines)


def _ms(x) -> str:
    return "-" if x is None else f"{x:.2f} ms"


def log_result(r, extras) -> None:
    log_event(log, "session_finished", level=logging.INFO if r.ok else logging.WARNING,
              session=r.index, client_type=r.client_type, offer_style=r.offer_style, ok=r.ok,
              stage=r.stage, error=r.error, session_url=r.session_url, setup_ms=r.setup_ms,
              first_audio_ms=r.first_audio_ms, first_ice_rtt_ms=r.first_ice_rtt_ms,
              ice_pair=r.ice_pair, offer_candidates=extras.offer_candidates,
              loss_pct=r.loss_pct, echo_rms=r.echo_rms, echo_verified=r.echo_verified,
              datachannel_verified=r.datachannel_verified, verified=r.verified)


READY_EVENT = "browser_ready"  # logged once every page is loaded, before the first call


def run(args: argparse.Namespace) -> int:
    from services.browser.chromium import check_executable
    from services.browser.runner import run_browser

    config = config_from_args(args)
    check_executable(config.chromium)  # before anything starts: one line, exit 2

    def launched(browser) -> None:
        log_event(log, "browser_started", url=config.url, sessions=args.sessions,
                  rate=config.start_rate, offer=config.offer, index_base=config.index_base,
                  chromium=config.chromium, version=browser.version, launch_ms=browser.launch_ms)

    async def main():  # SIGTERM (a runner stopping it) cancels it as Ctrl-C does: cli.py
        return await run_browser(config, args.sessions, results_path=args.results,
                                 samples_path=args.samples, on_launch=launched,
                                 on_ready=lambda: log_event(log, READY_EVENT,
                                                            pages=args.sessions),
                                 on_result=None if args.quiet else log_result)

    try:
        browser_run = asyncio.run(main())
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None
    except OSError as exc:  # the output files
        raise UserError(f"cannot write results: {exc}") from None
    log_event(log, "browser_finished", sessions=len(browser_run.results),
              ok=sum(1 for r in browser_run.results if r.ok), usage=browser_run.usage)
    print(json.dumps(summary_json(browser_run), indent=2) if args.json
          else summary_text(browser_run))
    return 0 if all(r.ok for r in browser_run.results) else 1
