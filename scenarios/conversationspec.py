"""A scenario's ``conversation:`` block: its calls speak in turns to a reply agent
(docs/conversation.md)."""
from __future__ import annotations

from dataclasses import dataclass

KEYS = ("turns", "barge_in_share", "hangover_ms", "reply_codec")
REPLY_CODECS = ("opus", "pcm16")


@dataclass(frozen=True)
class ConversationSpec:
    """Every aiortc session of the run speaks ``turns`` lines (``barge_in_share`` of those
    after the first into the agent's reply); the agents reply with speech after
    ``hangover_ms`` of the caller's silence, sent as Opus they encoded once (``opus``: a TTS
    that streams Opus, passed through by the transceivers) or as PCM the transceivers encode
    (``pcm16``: their OpusSettings)."""

    turns: int = 4
    barge_in_share: float = 0.25
    hangover_ms: int = 300
    reply_codec: str = "opus"

    @classmethod
    def parse(cls, raw, path) -> "ConversationSpec":
        if raw is True or raw == {}:
            return cls()
        if not isinstance(raw, dict) or set(raw) - set(KEYS):
            raise ValueError(f"{path}: conversation: a mapping of {', '.join(KEYS)} ({raw!r})")

        def number(key, kind, low, high, default):
            value = raw.get(key, default)
            if not isinstance(value, kind) or isinstance(value, bool) or not low <= value <= high:
                raise ValueError(f"{path}: conversation: {key}: {low}..{high} ({value!r})")
            return value

        d = cls()
        codec = raw.get("reply_codec", d.reply_codec)
        if codec not in REPLY_CODECS:
            raise ValueError(f"{path}: conversation: reply_codec: {' or '.join(REPLY_CODECS)} "
                             f"({codec!r})")
        return cls(number("turns", int, 1, 50, d.turns),
                   float(number("barge_in_share", (int, float), 0, 1, d.barge_in_share)),
                   number("hangover_ms", int, 20, 5000, d.hangover_ms), codec)

    def client_args(self, audio_dir) -> list[str]:
        """``voiceedge client`` options of a region's process."""
        return ["--conversation", str(self.turns), "--barge-in-share", f"{self.barge_in_share:g}",
                "--audio-dir", str(audio_dir)]

    def agent_args(self) -> tuple[str, ...]:
        """``voiceedge agent`` options of every cluster's agent."""
        return ("--mode", "reply", "--reply", "speech", "--hangover-ms", str(self.hangover_ms),
                "--reply-codec", self.reply_codec)
