"""A scenario's ``conversation:`` block: its calls speak in turns to a reply agent
(docs/conversation.md)."""
from __future__ import annotations

from dataclasses import dataclass

KEYS = ("turns", "barge_in_share", "hangover_ms")


@dataclass(frozen=True)
class ConversationSpec:
    """Every aiortc session of the run is a full client that speaks ``turns`` lines
    (``barge_in_share`` of those after the first into the agent's reply); the agents reply
    with speech after ``hangover_ms`` of the caller's silence."""

    turns: int = 4
    barge_in_share: float = 0.25
    hangover_ms: int = 300

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
        return cls(number("turns", int, 1, 50, d.turns),
                   float(number("barge_in_share", (int, float), 0, 1, d.barge_in_share)),
                   number("hangover_ms", int, 20, 5000, d.hangover_ms))

    def client_args(self, audio_dir) -> list[str]:
        """``voiceedge client`` options of a region's process."""
        return ["--conversation", str(self.turns), "--barge-in-share", f"{self.barge_in_share:g}",
                "--audio-dir", str(audio_dir)]

    def agent_args(self) -> tuple[str, ...]:
        """``voiceedge agent`` options of every cluster's agent."""
        return ("--mode", "reply", "--reply", "speech", "--hangover-ms", str(self.hangover_ms))
