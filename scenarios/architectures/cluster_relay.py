"""One public UDP port at each cluster's relay: clients cross the public internet to it, the
relay hands datagrams to the transceivers' shared sockets."""
from __future__ import annotations

from dataclasses import dataclass

from scenarios.architectures.base import Relayed


@dataclass(frozen=True)
class ClusterRelay(Relayed):
    def advertise(self, plan, cluster) -> str:
        return f"{cluster.public}:{plan.ports.relay}"


ARCHITECTURE = ClusterRelay(name="cluster-relay", label="cluster relay", colour="#0072B2",
                            order=20, default=True)
