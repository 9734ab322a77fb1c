"""``nat_rebind``: the NAT in front of a client region (target ``last_mile/R``, a scenario
with ``nat:``) loses every UDP mapping of the region's clients at once, as a carrier NAT that
reboots or rebinds: from its next packet on, each call's client leaves from a new public port.
Nothing is mended (the new mappings are the ones from then on); the calls recover only if the
edge follows the new address (docs/mobility.md): after 0.5 s of silence the client
renominates its pair, or its media watchdog calls again."""
from __future__ import annotations

import time

from analysis.faulteffect import GAP_OVER_DETECTION_RTT
from scenarios.faultkinds.base import FaultKind


class NatRebind(FaultKind):
    name = "nat_rebind"
    targets = ("last_mile",)
    measures = (GAP_OVER_DETECTION_RTT,)  # the gap beyond the client's detection and one RTT

    def apply(self, run):
        t, r = run.spec.target, run.record
        run.world.nat_rebind(t.region)
        r.at_unix = r.end_unix = r.ready_unix = time.time()


KIND = NatRebind()
