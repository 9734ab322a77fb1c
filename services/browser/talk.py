"""A conversation from a Chromium page (docs/conversation.md, "The Chromium caller").

The page (page/talk.js, added to the call page by ``prepare``) plays the caller's lines into
the call through WebAudio, watches the encoded frames it sends and receives, and hands out
what it hears at the time its audio output plays it; this side runs the aiortc caller's
``Conversation`` on that: the same lines, turns, barge-ins and ear, so the two clients' turns
are the same measurement taken at different places (where each starts and stops its clock:
docs/conversation.md). The page sends its observations in batches through a Playwright
binding (``voiceedgeTalk``); every time in them is the page's wall clock
(``performance.timeOrigin + performance.now()``), the machine's clock.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging

import numpy as np

from services import speech
from services.browser.page import page_file
from services.client.config import ConversationConfig
from services.client.conversation import Conversation, Line, caller_lines

log = logging.getLogger(__name__)
# NetEq works this much ahead of the output (the output's 30 ms, WebAudio's quantum and the
# worklet's 20 ms frame, with room): a reply heard from t was in NetEq's hands from t minus this
NETEQ_AHEAD_S = 0.15
RATE = 48_000


def playout_during(samples: list[tuple[float, int, int, int]], start: float, end: float
                   ) -> tuple[float, float] | None:
    """What NetEq did to audio heard from ``start`` to ``end`` (wall clock): milliseconds
    concealed, and stretched (inserted plus removed), from its counters sampled at
    ``(time, concealed, inserted, removed)``: the last sample before the audio was in its hands
    against the first after it was heard. None if the samples do not bracket it."""
    before = [s for s in samples if s[0] <= start - NETEQ_AHEAD_S]
    after = [s for s in samples if s[0] >= end]
    if not before or not after:
        return None
    a, b = before[-1], after[0]
    concealed = (b[1] - a[1]) * 1000.0 / RATE
    stretched = ((b[2] - a[2]) + (b[3] - a[3])) * 1000.0 / RATE
    return round(concealed, 1), round(stretched, 1)


class PageMouth:
    """The page's microphone as the conversation's track: ``speak`` plays a line on the page;
    its futures complete when the page saw the line's first frame and its last voiced frame
    leave the encoder."""

    def __init__(self, talk: "PageTalk", lines: tuple[Line, ...]) -> None:
        self._talk, self._lines = talk, lines
        self._pending: dict[int, tuple[asyncio.Future, asyncio.Future]] = {}
        self._speaking = False

    @property
    def speaking(self) -> bool:
        return self._speaking

    def speak(self, line: Line) -> tuple[asyncio.Future, asyncio.Future]:
        loop = asyncio.get_running_loop()
        k = self._lines.index(line)
        futures = self._pending[k] = (loop.create_future(), loop.create_future())
        self._speaking = True
        self._talk.evaluate("k => window.talkSession.speak(k)", k, futures)
        return futures

    def started(self, k: int, at: float) -> None:
        started, _ = self._pending.get(k, (None, None))
        if started is not None and not started.done():
            started.set_result(at)

    def spoken(self, k: int, voiced_end: float | None) -> None:
        self._speaking = False
        started, voiced_out = self._pending.pop(k, (None, None))
        if voiced_out is None or voiced_out.done():
            return
        if voiced_end is None:  # nothing voiced left the encoder: the page's audio is broken
            error = RuntimeError(f"line {k}: no voiced frame left the page's encoder")
            for future in (started, voiced_out):
                if not future.done():
                    future.set_exception(error)
        else:
            voiced_out.set_result(voiced_end)


def line_pcm(line: Line) -> bytes:
    """A line's samples as the page plays them (mono s16le, 48 kHz): what the aiortc caller
    encoded into its payloads."""
    return np.asarray(speech.synthesize(line.text), dtype="<i2").tobytes()


class PageTalk:
    """One page's conversation: ``prepare`` once the call page is loaded, ``options`` for its
    ``runTalkSession``, ``converse`` beside the call (returns when the conversation is over,
    having hung up)."""

    def __init__(self, page, config: ConversationConfig, session: int, call_s: float) -> None:
        self.page = page
        self.mouth = PageMouth(self, caller_lines()[0])
        self.conversation = Conversation(config, session, call_s, mouth=self.mouth)
        self.connected = asyncio.Event()
        self.error: str | None = None
        self._calls: set[asyncio.Task] = set()
        self.playout: list[tuple[float, int, int, int]] = []   # NetEq's counters, in time

    async def prepare(self) -> None:
        await self.page.expose_function("voiceedgeTalk", self._batch)
        await self.page.add_script_tag(content=page_file("talk.js").decode())

    def options(self) -> dict:
        return {"lines": [base64.b64encode(line_pcm(line)).decode("ascii")
                          for line in self.conversation.lines]}

    async def converse(self) -> None:
        """Speak every line once the call is connected; hang up after the last reply."""
        await self.connected.wait()
        try:
            await self.conversation.run()
        except Exception as exc:  # the page failed under the conversation
            self.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.debug("talk %d failed", self.conversation.session, exc_info=True)
        await self._evaluate("() => window.talkSession && window.talkSession.hangup()")

    def evaluate(self, script: str, arg, futures: tuple[asyncio.Future, ...]) -> None:
        """Run ``script`` on the page in the background; its failure fails ``futures``."""
        task = asyncio.ensure_future(self._evaluate(script, arg, futures))
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    async def _evaluate(self, script: str, arg=None, futures=()) -> None:
        try:
            await self.page.evaluate(script, arg)
        except Exception as exc:
            for future in futures:
                if not future.done():
                    future.set_exception(RuntimeError(f"the page: {exc}".splitlines()[0]))

    def _batch(self, box: dict) -> None:
        """What the page saw since its last batch (page/talk.js ``flush``)."""
        try:
            self._take(box)
        except Exception:  # the page would only see its binding call rejected
            log.warning("talk %d: a batch from the page was not taken",
                        self.conversation.session, exc_info=True)

    def _take(self, box: dict) -> None:
        conv = self.conversation
        ear = conv.ear
        for at, size in box.get("arrived", ()):
            ear.arrived_at(size, at)
        for at, pts, pcm in box.get("heard", ()):
            ear.hear_pcm(np.frombuffer(base64.b64decode(pcm), dtype="<i2"), pts, at)
        for at, text in box.get("events", ()):
            try:
                event = json.loads(text)
            except ValueError:
                continue
            if isinstance(event, dict):
                conv.on_agent_event(event, at)
        for s in box.get("started", ()):
            self.mouth.started(s["line"], s["first_out"])
        for s in box.get("spoken", ()):
            self.mouth.spoken(s["line"], s["voiced_end"])
        for sample in box.get("playout", ()):
            self.playout.append(tuple(sample))
        if box.get("connected") is not None:
            self.connected.set()

    def turns(self, audio_dir, name: str) -> list[dict]:
        """The conversation's turns, each reply with what NetEq did while it was heard
        (``playout_concealed_ms``, ``playout_stretched_ms``; None where not known)."""
        turns = self.conversation.turns(audio_dir, name)
        samples = sorted(self.playout)
        for t in turns:
            heard, end = t.get("reply_heard_unix"), t.get("reply_end_unix")
            done = (playout_during(samples, heard, end)
                    if heard is not None and end is not None else None)
            t["playout_concealed_ms"], t["playout_stretched_ms"] = done or (None, None)
        return turns
