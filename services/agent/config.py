"""The agent's configuration."""
from __future__ import annotations

from dataclasses import dataclass

from voiceedge.errors import ConfigError

MODES = ("echo", "reply")
REPLIES = ("tone", "speech")   # what a reply says: a tone, or services/speech.py's AGENT_LINE
REPLY_CODECS = ("pcm16", "opus")  # how a reply is sent: PCM the edge encodes, or Opus


@dataclass(frozen=True)
class AgentConfig:
    host: str = "127.0.0.1"
    port: int = 8790                 # 0: any free port (AgentServer.port tells which)
    mode: str = "echo"               # echo: frames straight back; reply: VAD + a tone reply
    vad_threshold_dbfs: float = -45.0
    vad_start_ms: int = 40           # voiced audio needed before speech_started
    hangover_ms: int = 300           # silence needed before speech_stopped
    reply_ms: int = 1000             # the tone's length (a spoken reply is as long as its line)
    reply: str = "tone"
    # pcm16: 20 ms PCM frames, encoded by the transceiver; opus: the reply encoded once by the
    # agent (libopus's voip default: complexity 10, automatic bitrate), sent as Opus payloads
    # that the transceiver passes through, as a TTS that streams Opus
    reply_codec: str = "pcm16"
    # frames of a reply sent ahead of real time: the transceiver queues them (its queue holds
    # five), so a frame the agent's loop sends up to this many periods late still makes the
    # transceiver's 20 ms tick instead of leaving 20 ms of silence in the reply (seen under
    # load with none: a frame a few ms late, the caller hearing a gap); a barge-in clears them
    reply_lead_frames: int = 2
    # each reply frame leaves up to this much after its time (uniform): an agent or a TTS that
    # delivers unevenly (0: on time, as the event loop allows)
    reply_jitter_ms: float = 0.0
    reply_freq_hz: float = 440.0
    reply_peak_dbfs: float = -12.0
    heartbeat_s: float | None = 20.0  # WebSocket ping interval; a peer that never pongs is dropped
    max_event_bytes: int = 1 << 20   # larger messages close the WebSocket (1009)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.reply not in REPLIES:
            raise ConfigError(f"reply {self.reply!r} is not one of {', '.join(REPLIES)}")
        if self.reply_codec not in REPLY_CODECS:
            raise ConfigError(f"reply_codec {self.reply_codec!r} is not one of "
                              f"{', '.join(REPLY_CODECS)}")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port {self.port} is not a TCP port")
        if self.vad_threshold_dbfs >= 0:
            raise ConfigError("vad_threshold_dbfs must be below 0 dBFS")
        for name in ("hangover_ms", "reply_ms"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, not {getattr(self, name)}")
        if self.vad_start_ms < 0:
            raise ConfigError(f"vad_start_ms must be at least 0, not {self.vad_start_ms}")
        if not 0 <= self.reply_lead_frames <= 4:
            raise ConfigError("reply_lead_frames must be 0-4 (the transceiver queues five frames)")
        if not 0 <= self.reply_jitter_ms < 100:
            raise ConfigError("reply_jitter_ms must be at least 0 and under 100")
        if not 0 < self.reply_freq_hz < 24_000:
            raise ConfigError("reply_freq_hz must be between 0 and 24000 (Nyquist at 48 kHz)")
        if self.reply_peak_dbfs > 0:
            raise ConfigError("reply_peak_dbfs must be at most 0 dBFS")
        if self.heartbeat_s is not None and self.heartbeat_s <= 0:
            raise ConfigError("heartbeat_s must be positive (or None to disable)")
        if self.max_event_bytes < 4096:
            raise ConfigError("max_event_bytes must be at least 4096")
