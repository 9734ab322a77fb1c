"""One browser session: a fresh context, the call page, ``runSession``, the result.

Each session has a browser context of its own (its own socket pool: its offer's POST opens
its own connection, page.py) and loads ``/call?offer=STYLE`` from the signaling front before
the run's calls start (``PreparedSession.prepare``); at its start time it awaits the page's
``window.runSession(options)`` (page/call.js), which runs the whole call and returns its view;
``view.py`` turns that into the session's result. The page bounds every stage itself;
``session_budget_s`` bounds the whole in case the page or the browser hangs.

Lifecycle: whoever prepares a session closes it (``close``: the context, and with it the
page, its peer connection and its renderer's work), also when it fails or is cancelled;
failures become the result's one-line ``error``, never an exception.
"""
from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from yarl import URL

from services.browser.chromium import Chromium
from services.browser.config import BrowserConfig
from services.browser.page import PAGE_PATH
from services.browser.talk import PageTalk
from services.browser.view import BrowserExtras, failed, to_result
from services.client.results import SessionResult
from services.client.verify import verified

log = logging.getLogger(__name__)
PAGE_LOAD_TIMEOUT_S = 10.0
CONTEXT_CLOSE_TIMEOUT_S = 5.0


def page_url(signaling_url: str, offer_style: str, credential: str | None = None) -> str:
    """The call page on the signaling URL's origin, with the session's offer style, and the
    credential in its fragment (``#token=...``: a browser never sends a fragment to a server,
    so it is in no request line or access log; the page reads it and sends it as a bearer)."""
    url = URL(signaling_url).with_path(PAGE_PATH).with_query({"offer": offer_style})
    return str(url if credential is None else url.with_fragment(f"token={credential}"))


def session_budget_s(config: BrowserConfig) -> float:
    """The longest a page may take with every one of its own timeouts running out, plus a
    margin: the ICE servers and the POST (signaling timeout each), the setup, the call and
    its media timeout, the DELETE."""
    return (2 * config.signaling_timeout_s + config.setup_timeout_s + config.duration_s
            + config.media_timeout_s + config.teardown_timeout_s + 10.0)


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


class PreparedSession:
    """Session ``i``'s page, loaded before its call starts, as a user opens a page before
    pressing "call": creating its context and renderer (a second or more of CPU on the 2-core
    machine, docs/browser.md) happens before the run's calls, not beside them. The session's
    timeline starts in the page when ``runSession`` builds the peer connection."""

    def __init__(self, browser: Chromium, config: BrowserConfig, i: int) -> None:
        self.browser, self.config, self.i = browser, config, i
        self.index, self.style = config.index_base + i, config.offer_style(i)
        self.context = None
        self.page = None
        self.error: str | None = None   # the page could not be loaded
        self.talk: PageTalk | None = None  # the conversation it holds (config.conversation)

    async def prepare(self) -> None:
        """Open the context and load the call page; a failure is kept as the session's."""
        from playwright.async_api import Error as PlaywrightError

        url = page_url(self.config.url, self.style, self.config.credential)
        try:
            self.context = await self.browser.new_context()
            self.page = await self.context.new_page()
            await self.page.goto(url, timeout=PAGE_LOAD_TIMEOUT_S * 1000)
            if self.config.conversation is not None:
                self.talk = PageTalk(self.page, self.config.conversation, self.index,
                                     self.config.duration_s)
                await self.talk.prepare()
        except PlaywrightError as exc:
            shown, reason = page_url(self.config.url, self.style), _line(exc)
            if self.config.credential:   # the result file must not carry it
                reason = reason.replace(self.config.credential, "***")
            self.error = f"cannot load the call page {shown}: {reason}"

    async def run(self) -> tuple[SessionResult, BrowserExtras]:
        """The call; never raises but for cancellation."""
        from playwright.async_api import Error as PlaywrightError

        started = time.time()
        if self.error is not None or self.page is None:
            return failed(self.index, self.style, started, time.time(),
                          self.error or "the call page was not loaded",
                          verifies=self.config.verifies), BrowserExtras()
        budget = session_budget_s(self.config)
        try:
            view = await asyncio.wait_for(self._call(), budget)
        except asyncio.TimeoutError:
            return failed(self.index, self.style, started, time.time(),
                          f"browser: the page gave no result within {budget:g} s",
                          "browser", self.config.verifies), BrowserExtras()
        except PlaywrightError as exc:  # the page or the browser went away under the session
            log.debug("browser session %d failed", self.index, exc_info=True)
            return failed(self.index, self.style, started, time.time(),
                          f"browser: {_line(exc)}", "browser", self.config.verifies), BrowserExtras()
        result, extras = to_result(view, self.index, self.config.echo_min_rms,
                                   self.config.verifies)
        if self.talk is not None:  # the audio check of a conversation: a reply was heard
            audio_dir = self.config.audio_dir
            result.turns = self.talk.turns(
                None if audio_dir is None else Path(audio_dir), f"s{self.index}-")
            result.echo_verified = any(t["reply_heard_unix"] is not None for t in result.turns)
            result.verified = verified(self.config.verifies, result.echo_verified,
                                       result.datachannel_echo)
            if self.talk.error and result.ok:
                result.ok, result.stage = False, "call"
                result.error = f"conversation: {self.talk.error}"
        return result, extras

    async def _call(self) -> dict:
        """The page's call; with a conversation, spoken beside it (talk.py)."""
        options = self.config.page_options(self.i)
        if self.talk is None:
            return await self.page.evaluate("options => window.runSession(options)", options)
        call = asyncio.ensure_future(self.page.evaluate(
            "options => window.runTalkSession(options)", {**options, **self.talk.options()}))
        talking = asyncio.ensure_future(self.talk.converse())
        try:
            await asyncio.wait({call, talking}, return_when=asyncio.FIRST_COMPLETED)
            return await call   # hung up by the conversation, or ended by itself
        finally:
            for task in (call, talking):
                task.cancel()
            await asyncio.gather(call, talking, return_exceptions=True)

    async def close(self) -> None:
        """Close the context (its page, peer connection and renderer work); never raises."""
        if self.context is None:
            return
        context, self.context = self.context, None
        try:
            await asyncio.wait_for(asyncio.shield(context.close()), CONTEXT_CLOSE_TIMEOUT_S)
        except Exception:  # the browser is going away: its close ends the context
            log.debug("browser session %d: context close failed", self.index, exc_info=True)
