"""The global relay: answers advertise the anycast relay VIP, so clients reach the ingress
relay of their own region, which carries the media over the backbone to the cluster relay.
The cluster relay's client port then faces the backbone (its internal address), not the
public internet."""
from __future__ import annotations

from dataclasses import dataclass

from scenarios.architectures.base import BACKBONE, COMMON_PATH, PROJECT_CLUSTER_PATH, Relayed


@dataclass(frozen=True)
class GlobalRelay(Relayed):
    def advertise(self, plan, cluster) -> str:
        return f"{plan.relay_vip}:{plan.ports.relay}"

    def relay_listen(self, cluster) -> str:
        return cluster.internal


ARCHITECTURE = GlobalRelay(
    name="global-relay", label="global relay", colour="#009E73", order=30, default=True,
    media_link=BACKBONE, ingress=True,
    path=COMMON_PATH + ("ingress-{client}",) + PROJECT_CLUSTER_PATH + ("relay-{cluster}",))
