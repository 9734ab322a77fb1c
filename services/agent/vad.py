"""An energy voice activity detector over 20 ms frames: a level threshold, an onset and a hangover."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from services.agent.pcm import FRAME_MS, frames_for, rms_dbfs


@dataclass(frozen=True)
class VadEvent:
    kind: Literal["speech_started", "speech_stopped"]
    audio_ms: int  # started: start of the first voiced frame; stopped: end of the last voiced frame


@dataclass
class EnergyVad:
    """Speech starts after ``start_ms`` of consecutive frames at or above the threshold and stops
    after ``hangover_ms`` of consecutive frames below it. Time is counted in frames fed, not wall
    clock, so the result does not depend on how fast frames arrive."""

    threshold_dbfs: float = -45.0
    start_ms: int = 40
    hangover_ms: int = 300
    speaking: bool = field(default=False, init=False)
    voiced: bool = field(default=False, init=False)   # the last frame fed
    _frames: int = field(default=0, init=False)
    _voiced_run: int = field(default=0, init=False)
    _silent_run: int = field(default=0, init=False)

    def feed(self, frame: bytes) -> VadEvent | None:
        voiced = self.voiced = rms_dbfs(frame) >= self.threshold_dbfs
        self._frames += 1
        if voiced:
            self._voiced_run += 1
            self._silent_run = 0
        else:
            self._silent_run += 1
            self._voiced_run = 0
        if not self.speaking and self._voiced_run >= frames_for(self.start_ms):
            self.speaking = True
            return VadEvent("speech_started", (self._frames - self._voiced_run) * FRAME_MS)
        if self.speaking and self._silent_run >= frames_for(self.hangover_ms):
            self.speaking = False
            return VadEvent("speech_stopped", (self._frames - self._silent_run) * FRAME_MS)
        return None
