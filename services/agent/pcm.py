"""The agent's audio format (20 ms frames of 48 kHz mono s16le) and small helpers on it."""
from __future__ import annotations

import math

import numpy as np

SAMPLE_RATE = 48_000
FRAME_MS = 20
FRAME_SECONDS = FRAME_MS / 1000
FRAME_SAMPLES = SAMPLE_RATE * FRAME_MS // 1000  # 960
FRAME_BYTES = FRAME_SAMPLES * 2                 # 1920
FULL_SCALE = 32768.0                            # 0 dBFS: RMS of a full-scale square wave
SILENCE = bytes(FRAME_BYTES)


def frames_for(ms: float) -> int:
    """Whole frames needed to cover ``ms`` milliseconds (at least one)."""
    return max(1, math.ceil(ms / FRAME_MS))


def rms_dbfs(frame: bytes) -> float:
    """RMS level of s16le samples in dBFS; ``-inf`` for digital silence."""
    samples = np.frombuffer(frame, dtype="<i2")
    if samples.size == 0:
        raise ValueError("empty frame")
    power = float(np.mean(np.square(samples, dtype=np.float64)))
    return 10 * math.log10(power / FULL_SCALE**2) if power > 0 else -math.inf


def to_frames(samples: np.ndarray) -> list[bytes]:
    """Split int16 samples into frames; the last one is padded with silence."""
    samples = np.asarray(samples, dtype="<i2")
    padded = np.zeros(frames_for(samples.size * 1000 / SAMPLE_RATE) * FRAME_SAMPLES, dtype="<i2")
    padded[:samples.size] = samples
    return [padded[i:i + FRAME_SAMPLES].tobytes() for i in range(0, padded.size, FRAME_SAMPLES)]


def tone(freq_hz: float, ms: float, peak_dbfs: float = -12.0, fade_ms: float = 5.0) -> list[bytes]:
    """A sine of ``ms`` milliseconds as frames, phase-continuous across frames.

    The ends are faded in and out over ``fade_ms`` so the reply does not start or stop with a click.
    """
    n = round(ms * SAMPLE_RATE / 1000)
    t = np.arange(n) / SAMPLE_RATE
    wave = np.sin(2 * np.pi * freq_hz * t) * (32767 * 10 ** (peak_dbfs / 20))
    fade = min(round(fade_ms * SAMPLE_RATE / 1000), n // 2)
    if fade:
        ramp = np.linspace(0.0, 1.0, fade, endpoint=False)
        wave[:fade] *= ramp
        wave[n - fade:] *= ramp[::-1]
    return to_frames(np.round(wave).astype("<i2"))


def silence(ms: float) -> list[bytes]:
    """Digital silence of ``ms`` milliseconds as frames."""
    return [SILENCE] * frames_for(ms)
