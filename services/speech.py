"""Spoken sentences as 48 kHz mono PCM: Debian's espeak-ng, resampled once and cached.

The conversation client speaks them (services/client/conversation.py) and the reply agent
answers with them (services/agent/), so a turn carries speech, with its pauses and its
spectrum, not a tone; the analysis scores what the caller heard against the same samples
(analysis/hearing.py). espeak-ng's output for a text, voice and rate is the same on every run
of one espeak-ng version, so the reference is rebuilt rather than shipped.
"""
from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
import wave
from pathlib import Path

import av
import numpy as np

SAMPLE_RATE = 48_000
VOICE = "en-us"
WORDS_PER_MINUTE = 165
LEVEL_DBFS = -20.0   # RMS of the voiced part; the agent's VAD starts at -45

# What the caller says, turn after turn (a conversation cycles through them).
CALLER_LINES = (
    "I would like to move my appointment to Thursday.",
    "Is anything free in the afternoon?",
    "Three o'clock works for me.",
    "Can you send me a reminder?",
    "Great, thank you very much.",
    "Is there parking near the clinic?",
)
# What the agent answers every time.
AGENT_LINE = "Sure, let me check that for you right now."


class SpeechError(RuntimeError):
    """espeak-ng is missing or failed."""


def synthesize(text: str, voice: str = VOICE, rate_wpm: int = WORDS_PER_MINUTE) -> np.ndarray:
    """``text`` spoken by espeak-ng: int16 samples at 48 kHz, leading and trailing silence
    trimmed, scaled so that its voiced part has an RMS of ``LEVEL_DBFS``."""
    return _synthesize(text, voice, rate_wpm).copy()


@functools.cache
def _synthesize(text: str, voice: str, rate_wpm: int) -> np.ndarray:
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise SpeechError("espeak-ng is not installed (Debian package espeak-ng; `make deps`)")
    with tempfile.TemporaryDirectory(prefix="voiceedge-speech-") as tmp:
        path = Path(tmp) / "speech.wav"
        done = subprocess.run([exe, "-v", voice, "-s", str(rate_wpm), "-w", str(path), text],
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0 or not path.exists():
            raise SpeechError(f"espeak-ng failed: {done.stderr.strip() or done.returncode}")
        with wave.open(str(path)) as w:
            if w.getsampwidth() != 2 or w.getnchannels() != 1:
                raise SpeechError("espeak-ng wrote something other than 16-bit mono")
            rate = w.getframerate()
            samples = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    out = trim(resample(samples, rate, SAMPLE_RATE))
    voiced = out[np.abs(out) > 64].astype(np.float64)
    rms = float(np.sqrt(np.mean(voiced ** 2))) if voiced.size else 0.0
    if rms == 0.0:
        raise SpeechError(f"espeak-ng produced silence for {text!r}")
    gain = 32768.0 * 10 ** (LEVEL_DBFS / 20) / rms
    out = np.clip(np.round(out * gain), -32768, 32767).astype("<i2")
    out.setflags(write=False)
    return out


def resample(samples: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """Mono int16 ``samples`` from ``rate_in`` to ``rate_out`` Hz (libswresample, via PyAV)."""
    samples = np.ascontiguousarray(samples, dtype="<i2")
    if rate_in == rate_out or samples.size == 0:
        return samples.copy()
    frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = rate_in
    resampler = av.AudioResampler(format="s16", layout="mono", rate=rate_out)
    chunks = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    chunks += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(chunks).astype("<i2") if chunks else np.zeros(0, "<i2")


def trim(samples: np.ndarray, floor: int = 64) -> np.ndarray:
    """``samples`` without the near-silence before the first and after the last loud sample."""
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > floor)
    return samples[loud[0]:loud[-1] + 1] if loud.size else samples[:0]
