"""The call page as a person uses it: its Call and Hang up buttons in a real Chromium.

The demo's one-cluster edge (as tests/test_browser.py starts it) in a lab namespace, where the
front listens on 127.0.0.1 (a secure context, as http://localhost is for a person). Playwright
drives Debian's chromium with the driver's flags (services/browser/chromium.py: its fake
microphone plays a tone) from a thread inside the namespace: it clicks Call, waits for the
status to say connected and for audio to arrive, clicks Hang up, and checks that the call
ended ok with its figures and was DELETEd at the edge. Needs root and chromium (`make test`).
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import time

from scenarios.edge import Edge
from services.browser.chromium import Chromium
from services.procfs import descendants
from tests.browser_edge import (calls_created, chromium, edge, live_sessions,  # noqa: F401
                                signaling_url, wait_for_sessions)
from tests.conftest import lab_fixture
from topology.netns import in_namespace

lab = lab_fixture("veperson")
STATE = "document.getElementById('status').dataset.state"


def browser_processes() -> list[int]:
    """This process's descendants that are Chromium or Playwright's driver."""
    found = []
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
        except OSError:
            continue
        if b"chromium" in cmd or b"playwright" in cmd:
            found.append(pid)
    return found


def deleted_calls(edge: Edge) -> list[str]:
    """The call ids the front logged as DELETEd."""
    log = edge.logs / f"front-{edge.plan.fronts[0].region}.log"
    calls = []
    for line in log.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == "call_deleted":
            calls.append(record.get("call"))
    return calls


async def person_call(chromium: str, origin: str, workdir, checks) -> dict:
    """Load the page, click Call, let the call run, click Hang up; what the page showed."""
    seen: dict = {}
    async with Chromium(chromium, origin, workdir, 440.0) as browser:
        context = await browser.new_context()
        try:
            page = await context.new_page()
            await page.goto(f"{origin}/call", timeout=10_000)
            # Loaded, nothing started: the driver's pages stay idle until runSession.
            seen["idle"] = (await page.evaluate(STATE), await page.text_content("#status"),
                            await page.is_disabled("#hangup"))
            await asyncio.sleep(0.3)
            seen["calls_before_click"] = checks["calls"]()

            await page.click("#call")
            await page.wait_for_function(f"{STATE} === 'connected'", timeout=15_000)
            seen["connected"] = await page.text_content("#status")
            seen["sessions_in_call"] = checks["sessions"]()
            # audio arrives: the page's live figures count packets
            await page.wait_for_function(
                "window.callSession.live && window.callSession.live.packets_received > 0",
                timeout=5_000)
            await asyncio.sleep(1.5)
            seen["details_in_call"] = await page.text_content("#details")
            seen["mic"] = await page.evaluate(
                "window.callSession.stream.getAudioTracks()[0].getSettings()")
            seen["still_calling"] = await page.evaluate(STATE)

            clicked = time.monotonic()
            await page.click("#hangup")
            await page.wait_for_function(f"{STATE} === 'ended' || {STATE} === 'failed'",
                                         timeout=10_000)
            seen["hangup_s"] = time.monotonic() - clicked
            seen["ended"] = await page.text_content("#status")
            seen["details_ended"] = await page.text_content("#details")
            seen["view"] = await page.evaluate("window.lastView")
            seen["buttons_after"] = (await page.is_enabled("#call"),
                                     await page.is_disabled("#hangup"))
        finally:
            await context.close()
    return seen


def test_a_person_calls_and_hangs_up(lab, edge, chromium, tmp_path):
    origin = signaling_url(edge).removesuffix("/v1/calls")
    before = calls_created(lab, edge)
    checks = {"calls": lambda: calls_created(lab, edge),
              "sessions": lambda: live_sessions(lab, edge)}
    seen = in_namespace(lab.name, asyncio.run,
                        asyncio.wait_for(person_call(chromium, origin, tmp_path, checks), 60))
    assert browser_processes() == []

    assert seen["idle"] == ("idle", "ready", True)
    assert seen["calls_before_click"] == before  # the page started nothing by itself
    assert seen["connected"] == "connected: the agent repeats what you say"
    assert seen["sessions_in_call"] == 1
    got = re.match(r"received (\d+) packets, lost \d+, jitter ", seen["details_in_call"])
    assert got and int(got.group(1)) > 0, seen["details_in_call"]
    # human audio: the browser's echo cancellation, noise suppression and gain control on
    mic = seen["mic"]
    assert (mic.get("echoCancellation"), mic.get("noiseSuppression"),
            mic.get("autoGainControl")) == (True, True, True), mic
    assert seen["still_calling"] == "connected"  # a 1-hour call: only Hang up ends it

    assert re.fullmatch(r"ended: ok, setup \d+ ms, RTT \d+ ms", seen["ended"]), seen["ended"]
    assert seen["hangup_s"] < 5, seen["hangup_s"]
    assert "session closed (DELETE 204)" in seen["details_ended"], seen["details_ended"]
    assert seen["buttons_after"] == (True, True)
    view = seen["view"]
    assert view["ok"] and view["stage"] == "done" and view["error"] is None
    assert view["packets_received"] > 50 and 1500 <= view["call_ms"] < 20_000, view["call_ms"]
    assert view["delete_status"] == 204 and view["teardown_error"] is None
    assert view["datachannel_verified"]
    # the edge: the front passed the DELETE on, the transceiver has no session left
    call = view["location"].rsplit("/", 1)[1]
    assert call in deleted_calls(edge)
    wait_for_sessions(lab, edge, 0, timeout=5)
    assert calls_created(lab, edge) == before + 1
