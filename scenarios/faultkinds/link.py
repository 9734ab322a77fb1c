"""What the link kinds share: the target is a link of the world (``backbone/A/B``,
``public/A/B``, ``last_mile/R``), changed in both directions for ``duration_s`` and restored;
one still changed when the calls end is restored then (the world outlives the
architecture)."""
from __future__ import annotations

import time
from collections.abc import Callable

from scenarios.faultkinds.base import LINK_TIERS, FaultKind
from topology.impairment.model import Impairment


class LinkFault(FaultKind):
    """A kind that changes a link's impairment: ``change`` says how."""

    targets = LINK_TIERS

    def change(self, options) -> Callable[[Impairment], Impairment]:
        raise NotImplementedError

    def apply(self, run):
        t, r, world = run.spec.target, run.record, run.world
        world.set_link(t.tier, t.region, t.other, self.change(run.spec.options))
        r.at_unix = time.time()

        def mend() -> None:
            world.restore_link(t.tier, t.region, t.other)
            r.end_unix = r.ready_unix = time.time()

        run.hold(mend, run.spec.options.duration_s, at_stop=True)
