"""``cluster_outage``: SIGKILL of every transceiver, the relay, Redis and the agent of a
cluster, for ``duration_s`` (none: to the end of the run)."""
from __future__ import annotations

from dataclasses import dataclass

from analysis.faulteffect import EXTRA_RTT, FIRST_CALL_ELSEWHERE
from scenarios.faultkinds.base import FaultKind, Lasting


@dataclass(frozen=True)
class ClusterOutageOptions(Lasting):
    optional = True


class ClusterOutage(FaultKind):
    name = "cluster_outage"
    targets = ("cluster",)
    options = ClusterOutageOptions
    # the first call placed on another cluster, and what the longer path costs the calls
    measures = (FIRST_CALL_ELSEWHERE, EXTRA_RTT)
    steers = True

    def apply(self, run):
        region = run.spec.target.region
        cluster = run.edge.plan.cluster(region)
        names = [cluster.transceiver_name(i) for i in cluster.transceiver_ids]
        names += [n for n in (f"relay-{region}", f"redis-{region}", f"agent-{region}")
                  if n in run.edge.services]
        run.down_then_up(names, run.spec.options.duration_s)


KIND = ClusterOutage()
