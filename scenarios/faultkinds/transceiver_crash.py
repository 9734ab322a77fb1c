"""``transceiver_crash``: SIGKILL of transceiver ID (1) of a cluster; its calls are gone. It
starts again after ``restart_after_s`` (none: it stays down)."""
from __future__ import annotations

from analysis.faulteffect import FIRST_CALL_ELSEWHERE
from scenarios.faultkinds.base import FaultKind, Restarting


class TransceiverCrash(FaultKind):
    name = "transceiver_crash"
    targets = ("cluster",)
    options = Restarting  # restart_after_s
    names_transceiver = True
    measures = (FIRST_CALL_ELSEWHERE,)  # the first call that connected off the crashed one

    def apply(self, run):
        t = run.spec.target
        cluster = run.edge.plan.cluster(t.region)
        run.down_then_up([cluster.transceiver_name(t.transceiver or 1)],
                         run.spec.options.restart_after_s)


KIND = TransceiverCrash()
