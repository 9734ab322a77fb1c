"""``voiceedge agent``: run the backend voice agent."""
from __future__ import annotations

import argparse

from services.agent.config import MODES, REPLIES, REPLY_CODECS, AgentConfig
from voiceedge.errors import ConfigError
from voiceedge.errors import UserError


def add_parser(sub) -> None:
    defaults = AgentConfig()
    p = sub.add_parser("agent", help="run the backend voice agent (WebSocket, behind transceivers)",
                       description="Run the backend voice agent: one WebSocket per call session "
                                   "(docs/agent-protocol.md), /healthz and /metrics on the same port.")
    p.add_argument("--listen", default="0.0.0.0", metavar="HOST", help="address (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=defaults.port,
                   help=f"TCP port (default {defaults.port}; 0 for any free port)")
    p.add_argument("--mode", choices=MODES, default=defaults.mode,
                   help="echo: every frame straight back; reply: a tone when the caller stops "
                        f"speaking (default {defaults.mode})")
    p.add_argument("--vad-threshold", type=float, default=defaults.vad_threshold_dbfs,
                   metavar="DBFS", help=f"speech level (default {defaults.vad_threshold_dbfs})")
    p.add_argument("--vad-start-ms", type=int, default=defaults.vad_start_ms,
                   help=f"voiced audio before speech starts (default {defaults.vad_start_ms})")
    p.add_argument("--hangover-ms", type=int, default=defaults.hangover_ms,
                   help=f"silence before speech stops (default {defaults.hangover_ms})")
    p.add_argument("--reply-ms", type=int, default=defaults.reply_ms,
                   help=f"length of the reply tone (default {defaults.reply_ms})")
    p.add_argument("--reply", choices=REPLIES, default=defaults.reply,
                   help="what a reply says: a tone, or a spoken sentence (espeak-ng; "
                        f"default {defaults.reply})")
    p.add_argument("--reply-codec", choices=REPLY_CODECS, default=defaults.reply_codec,
                   help="how a reply is sent: pcm16 frames the transceiver encodes, or Opus "
                        "encoded once here and passed through, as a TTS that streams Opus "
                        f"(default {defaults.reply_codec})")
    p.add_argument("--reply-lead-frames", type=int, default=defaults.reply_lead_frames,
                   metavar="N", help="reply frames sent ahead of real time, queued by the "
                   "transceiver so a late one still makes its tick; a barge-in clears them "
                   f"(0-4, default {defaults.reply_lead_frames})")
    p.add_argument("--reply-jitter-ms", type=float, default=defaults.reply_jitter_ms,
                   metavar="MS", help="each reply frame leaves up to this much late (uniform): "
                   f"an agent or TTS that delivers unevenly (default {defaults.reply_jitter_ms:g})")
    p.add_argument("--reply-freq", type=float, default=defaults.reply_freq_hz, metavar="HZ",
                   help=f"frequency of the reply tone (default {defaults.reply_freq_hz:g})")
    p.set_defaults(func=run, service="agent")  # JSON logs: services/logs.py


def config_from_args(args: argparse.Namespace) -> AgentConfig:

    try:
        return AgentConfig(host=args.listen, port=args.port, mode=args.mode,
                           vad_threshold_dbfs=args.vad_threshold, vad_start_ms=args.vad_start_ms,
                           hangover_ms=args.hangover_ms, reply_ms=args.reply_ms,
                           reply_freq_hz=args.reply_freq, reply=args.reply,
                           reply_codec=args.reply_codec,
                           reply_lead_frames=args.reply_lead_frames,
                           reply_jitter_ms=args.reply_jitter_ms)
    except ConfigError as exc:
        raise UserError(str(exc)) from None


def run(args: argparse.Namespace) -> int:

    from services.agent.server import AgentServer, reply_frames
    from services.lifecycle import serve_until_signal
    from services.speech import SpeechError

    config = config_from_args(args)
    try:
        reply_frames(config)  # espeak-ng's speech, checked (and cached) before serving
    except SpeechError as exc:
        raise UserError(str(exc)) from None
    try:
        serve_until_signal(lambda: AgentServer(config))
    except OSError as exc:
        raise UserError(f"cannot listen on {config.host}:{config.port}: {exc}") from None
    return 0
