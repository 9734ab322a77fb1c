"""One headless Chromium for a run: its flags, its fake microphone, its start and its end.

Debian's ``chromium`` (``make browsers``), driven through Playwright's ``executable_path``
(Playwright downloads no browser here). Playwright adds its usual switches (headless, no
first run, no background networking, no component updates, no sync, a fresh temporary
``--user-data-dir``, ...); ``chromium_args`` adds what a call needs:

- ``--no-sandbox``: the testbed runs as root, where Chromium's sandbox refuses to start;
- ``--disable-gpu``, ``--disable-quic``: no GPU process work, no QUIC probing;
- ``--use-fake-device-for-media-stream --use-fake-ui-for-media-stream``: a fake microphone,
  granted without a prompt; ``--use-file-for-fake-audio-capture``: it plays a WAV tone
  (``write_tone``), looped, so that the agent's echo can be measured by its energy;
- ``--autoplay-policy=no-user-gesture-required``: the agent's audio plays without a click;
- ``--unsafely-treat-insecure-origin-as-secure=ORIGIN``: the page is plain HTTP on the
  front's address, not a secure context, where ``getUserMedia`` does not exist;
- ``--disable-features=WebRtcHideLocalIpsWithMdns,...``: host candidates as addresses, not
  ``.local`` names the server cannot resolve; the other features listed are ones that make
  Chromium call Google at start-up (refused inside a namespace, but work all the same).

Lifecycle: ``async with Chromium(path, origin, workdir) as browser``: started (``launch_ms``
says how long that took) and, whatever happens, closed on the way out: Playwright ends the
browser's whole process tree and removes its profile.
"""
from __future__ import annotations

import asyncio
import os
import time
import wave
from pathlib import Path

import numpy as np

from voiceedge.errors import UserError

SAMPLE_RATE = 48_000
TONE_AMPLITUDE = 0.3   # peak, full scale 1.0: the aiortc client's tone (services/client/tone.py)
DISABLED_FEATURES = ("WebRtcHideLocalIpsWithMdns", "OptimizationHints",
                     "NetworkTimeServiceQuerying", "PreconnectToSearch", "MediaRouter")
CLOSE_TIMEOUT_S = 10.0


class MissingChromium(UserError):
    """No Chromium where the run was told to look."""


def write_tone(path: Path, tone_hz: float, seconds: float = 1.0) -> Path:
    """A mono 16-bit 48 kHz WAV of a sine tone (silence for 0 Hz) that loops without a seam
    (a whole number of periods per second): Chromium's fake microphone plays it in a loop."""
    t = np.arange(int(SAMPLE_RATE * seconds)) / SAMPLE_RATE
    samples = (TONE_AMPLITUDE * 32767 * np.sin(2 * np.pi * tone_hz * t)).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(SAMPLE_RATE)
        out.writeframes(samples.tobytes())
    return path


def chromium_args(origin: str, tone: Path) -> list[str]:
    """The switches added to Playwright's for a call page served at ``origin``."""
    return ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream",
            f"--use-file-for-fake-audio-capture={tone}",
            "--autoplay-policy=no-user-gesture-required",
            f"--unsafely-treat-insecure-origin-as-secure={origin}",
            f"--disable-features={','.join(DISABLED_FEATURES)}"]


def check_executable(path: str) -> str:
    """``path`` if it is an executable file; MissingChromium with the fix otherwise."""
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise MissingChromium(f"no Chromium at {path}: run `make browsers` (Debian's chromium "
                              f"package) or give --chromium PATH")
    return path


class Chromium:
    """The run's one browser; ``new_context`` gives each session a context of its own."""

    def __init__(self, executable: str, origin: str, workdir: Path, tone_hz: float) -> None:
        self.executable = check_executable(executable)
        self.origin = origin
        self.workdir = workdir
        self.tone_hz = tone_hz
        self.launch_ms: float | None = None  # Playwright's driver up + browser ready
        self.version: str | None = None
        self._playwright = None
        self._manager = None
        self.browser = None

    async def __aenter__(self) -> "Chromium":
        try:
            from playwright.async_api import async_playwright
        except ImportError:
            raise UserError("the Python package playwright is missing: run `make venv`") from None
        tone = write_tone(self.workdir / "tone.wav", self.tone_hz)
        started = time.monotonic()
        self._manager = async_playwright()
        self._playwright = await self._manager.__aenter__()
        try:
            self.browser = await self._playwright.chromium.launch(
                executable_path=self.executable, headless=True,
                args=chromium_args(self.origin, tone))
        except Exception as exc:
            await self._stop_playwright()
            lines = str(exc).strip().splitlines()
            raise UserError(f"Chromium did not start ({self.executable}): "
                            f"{lines[0] if lines else type(exc).__name__}") from None
        except BaseException:
            await self._stop_playwright()
            raise
        self.launch_ms = round((time.monotonic() - started) * 1000.0, 1)
        self.version = self.browser.version
        return self

    async def __aexit__(self, *exc) -> None:
        try:
            if self.browser is not None:
                await asyncio.wait_for(asyncio.shield(self.browser.close()), CLOSE_TIMEOUT_S)
        except Exception:  # the browser or the driver died first: the driver still reaps it
            pass
        finally:
            await self._stop_playwright()

    async def _stop_playwright(self) -> None:
        if self._manager is not None:
            manager, self._manager = self._manager, None
            try:
                await manager.__aexit__(None, None, None)
            except Exception:
                pass

    async def new_context(self):
        """A fresh browser context (its own cookies, cache and socket pool)."""
        return await self.browser.new_context()
