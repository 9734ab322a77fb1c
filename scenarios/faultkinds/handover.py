"""``handover``: the callers of a client region (target ``last_mile/R``) leave their access
network for another region's (``to: S``), as a phone that leaves Wi-Fi for cellular: R's last
mile goes down both ways and the client host's traffic leaves through S's access link and
S's NAT (a new public address; for the global relay, S's ingress, the anycast address's
nearest). The world builds that second link for the run (``WorldSpec.handovers``); the fault
moves the client onto it, and puts it back when the architecture's run stops.

The client's operating system tells it of the new network, as a phone's does: its process is
sent SIGUSR2, and each live call restarts ICE through S's front (a ``PATCH`` of the call over
a new connection: docs/mobility.md), before its silence would make it renominate (0.5 s) or
call again (its media watchdog). Chromium's sessions are not told (they would renominate
nothing: their media stops until their watchdog calls again)."""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass

from analysis.faulteffect import GAP_OVER_DETECTION_RESTART
from scenarios.faultkinds.base import FaultKind, Options


@dataclass(frozen=True)
class Destination(Options):
    """``to``: the client region whose access network the callers move to."""

    to: str = ""

    @classmethod
    def parse(cls, raw: dict, where: str, kind: str) -> "Destination":
        to = raw.get("to")
        if not isinstance(to, str) or not to:
            raise ValueError(f"{where}: {kind} needs to: the client region whose access "
                             "network the callers move to")
        return cls(to)

    @property
    def client_regions(self) -> tuple[str, ...]:
        return (self.to,)


class Handover(FaultKind):
    name = "handover"
    targets = ("last_mile",)
    options = Destination
    # the gap beyond the client's detection and its ICE restart (target: at most 100 ms)
    measures = (GAP_OVER_DETECTION_RESTART,)

    def access_links(self, spec):
        if spec.options.to == spec.target.region:
            raise ValueError(f"{spec.kind} of {spec.target}: to names the same region")
        return ((spec.target.region, spec.options.to),)

    def apply(self, run):
        t, r = run.spec.target, run.record
        world = run.world
        r.at_unix = time.time()
        now_in = world.handover(t.region)
        r.end_unix = r.ready_unix = time.time()
        r.detail["to"] = now_in
        told = run.signal_clients(t.region, signal.SIGUSR2)   # the OS: a new network
        r.detail["clients_told"] = told
        run.hold(lambda: world.hand_back(t.region), after=None, at_stop=True)


KIND = Handover()
