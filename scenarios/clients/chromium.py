"""Headless Chromium sessions (``voiceedge browser``, docs/browser.md): one browser per client
region, launched with its pages loaded before any call of the run starts (its start-up is
seconds of CPU on this machine and must not lie under the calls)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from scenarios.clients.base import ClientType, RegionClients
from services.browser.cli import READY_EVENT  # logged once every page is loaded
from services.clienttypes import CHROMIUM

if TYPE_CHECKING:
    from scenarios.spec import Scenario


def browser_start_rate(scenario: "Scenario", sessions: int) -> float:
    """Browser sessions a second: a region's ``sessions`` spread over its other sessions'
    start window, never faster than the scenario's start rate."""
    others = sum(n for name, n in scenario.clients.items() if name != CHROMIUM)
    window_s = others / scenario.start_rate
    return min(sessions / window_s if window_s > 0 else scenario.start_rate,
               scenario.start_rate)


class ChromiumClient(ClientType):
    name = CHROMIUM
    process = "browser"
    results_suffix = "-chromium"
    needs_browser = True
    realtime = False   # a renderer at a real-time priority would hold a core
    ready_event = READY_EVENT
    max_per_region = 20
    max_reason = "each is a browser page with its own renderer"

    def ready_timeout_s(self, sessions: int) -> float:
        return 20 + 5 * sessions

    def argv(self, scenario: "Scenario", where: RegionClients, sessions: int, index_base: int,
             verifies: tuple[str, ...] | None = None, extra_args: tuple[str, ...] = ()
             ) -> list[str]:
        """Spread over the other sessions' start window and interleaved with the other
        regions' browsers (a browser session is seconds of CPU: two at once on the 2-core
        machine make every process on the calls' paths lag), none with the first calls.
        Offer styles alternate, gathered first; with one browser session a region, from
        region to region instead."""
        sc = scenario
        rate = browser_start_rate(sc, sessions)
        offer = "alternate" if sessions > 1 else ("gathered", "immediate")[where.number % 2]
        delay = (where.number + 0.5) / (where.regions * rate)
        return ["browser", "--url", where.url, "-n", str(sessions), "--rate", f"{rate:.3f}",
                "--start-delay", f"{delay:.3f}", "--duration", str(sc.call_duration_s),
                "--offer", offer, "--index-base", str(index_base),
                *self._conversation(sc, where), *self._credential(where),
                *self._verify(verifies), *self._outputs(where), "-q", *extra_args]
