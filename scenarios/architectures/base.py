"""What the testbed knows about an edge architecture, in one object.

An ``Architecture`` says which services a run starts on which hosts and how (``start``), the
candidate address answers carry (``advertise``), the link its media crosses between regions
(the network floor), the clients' extra options, the processes on a session's path (the
saturation rule), whether its public UDP ports are shared or grow with the sessions, what a
client can verify through it, and its label and colour in the report. ``facts()`` is what a
run writes about it into ``architectures.json``: the analysis reads that, never this module.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from services.client.verify import CHECKS

if TYPE_CHECKING:
    from scenarios.edge import ClusterPlan, Edge, EdgePlan

BASELINE, COMPARED = "baseline", "compared"      # role
PUBLIC, BACKBONE = "public", "backbone"          # media_link: the inter-region link of media
SHARED, PER_SESSION = "shared", "per-session"    # ports: public UDP ports vs sessions
VERIFIABLE = CHECKS                              # what a client can verify (services/client/verify.py)
# The processes every session crosses (log sources: the edge launcher's service names).
ENGINE = "impairment-engine"
COMMON_PATH = ("client-{client}", "front-{client}", ENGINE)
PROJECT_CLUSTER_PATH = ("transceiver-{cluster}", "agent-{cluster}")


@dataclass(frozen=True)
class Architecture:
    """One way of building the edge. Subclasses override the hooks; fields are facts."""

    name: str
    label: str
    colour: str                          # "#rrggbb" in every figure
    role: str = COMPARED                 # BASELINE: what every other one is compared with
    order: int = 100                     # position in the registry (and the default scenario)
    default: bool = False                # run when a scenario names no architectures
    media_link: str = PUBLIC             # the link media crosses from client to cluster region
    ports: str = SHARED                  # PER_SESSION: public UDP ports grow with sessions
    fixed_ports_per_client_region: int = 0  # ports that do not grow (a TURN listening port)
    ingress: bool = False                # services on each client region's edge host (VIP)
    turn: bool = False                   # a TURN server per client region; clients relay-only
    external: bool = False               # not this project's edge code (bring your own edge)
    verifies: tuple[str, ...] = VERIFIABLE
    path: tuple[str, ...] = COMMON_PATH + PROJECT_CLUSTER_PATH  # log-source templates
    requirements: tuple = field(default=(), compare=False)  # topology.preflight.Requirement

    def __post_init__(self) -> None:
        if self.role not in (BASELINE, COMPARED):
            raise ValueError(f"{self.name}: role is {BASELINE} or {COMPARED}")
        if self.media_link not in (PUBLIC, BACKBONE):
            raise ValueError(f"{self.name}: media_link is {PUBLIC} or {BACKBONE}")
        if self.ports not in (SHARED, PER_SESSION):
            raise ValueError(f"{self.name}: ports is {SHARED} or {PER_SESSION}")
        if set(self.verifies) - set(VERIFIABLE):
            raise ValueError(f"{self.name}: verifies only {', '.join(VERIFIABLE)}")

    # ------------------------------------------------------------ hooks

    @property
    def relayed(self) -> bool:
        """Whether cluster relays carry the media (faults that kill a relay apply)."""
        return False

    def advertise(self, plan: "EdgePlan", cluster: "ClusterPlan") -> str | None:
        """The candidate answers carry for calls to ``cluster`` (None: the transceiver's own
        per-session port)."""
        return None

    def front_route(self, edge: "Edge", cluster: "ClusterPlan") -> dict:
        """Where a front sends calls for ``cluster`` (services/signaling/cli.py's clusters
        file): the transceivers' control URLs and the candidate answers advertise."""
        return {"advertise": self.advertise(edge.plan, cluster),
                "transceivers": [edge.control_url(cluster, tid)
                                 for tid in cluster.transceiver_ids]}

    def client_args(self) -> list[str]:
        """Options of every client (both types) under this architecture."""
        return ["--ice-from-signaling"] if self.turn else []

    def start(self, edge: "Edge") -> None:
        """Start every service of ``edge.plan``, each ready before the next: clusters, then
        the client regions' services, then the fronts (side by side)."""
        for cluster in edge.plan.clusters:
            self.start_cluster(edge, cluster)
        for ingress in edge.plan.ingresses:
            if edge.plan.redis:
                edge.start_ingress_redis(ingress)
            edge.start_ingress(ingress)
        for turn in edge.plan.turns:
            edge.start_turn(turn)
        edge.start_fronts()

    def start_cluster(self, edge: "Edge", cluster: "ClusterPlan") -> None:
        edge.start_agent(cluster)
        for tid in cluster.transceiver_ids:
            edge.start_transceiver(cluster, tid)

    def transceiver_media(self, edge: "Edge", cluster: "ClusterPlan", tid: int) -> list[str]:
        """The transceiver's media options: by default a UDP port per session on the
        cluster's public address."""
        return ["--mode", "port-per-session", "--media", f"{cluster.public}:0"]

    def relay_listen(self, cluster: "ClusterPlan") -> str:
        """Where the cluster relay takes clients' datagrams."""
        return cluster.public

    def session_path(self, client: str, cluster: str | None) -> list[str]:
        """The log sources a session from ``client`` on ``cluster`` crosses (saturation)."""
        out = []
        for template in self.path:
            if "{cluster}" in template and not cluster:
                continue
            out.append(template.format(client=client, cluster=cluster))
        return out

    def facts(self) -> dict:
        """This architecture's entry in architectures.json (docs/scenarios.md)."""
        return {"label": self.label, "colour": self.colour, "role": self.role,
                "path": list(self.path), "media_link": self.media_link, "ports": self.ports,
                "fixed_ports_per_client_region": self.fixed_ports_per_client_region,
                "turn": self.turn, "external": self.external, "ingress": self.ingress,
                "verifies": list(self.verifies)}


@dataclass(frozen=True)
class Relayed(Architecture):
    """The project's relays carry the media to the transceivers' shared sockets."""

    path: tuple[str, ...] = COMMON_PATH + PROJECT_CLUSTER_PATH + ("relay-{cluster}",)

    @property
    def relayed(self) -> bool:
        return True

    def start_cluster(self, edge: "Edge", cluster: "ClusterPlan") -> None:
        edge.start_agent(cluster)
        if edge.plan.redis:
            edge.start_redis(cluster)
        edge.start_relay(cluster)
        for tid in cluster.transceiver_ids:
            edge.start_transceiver(cluster, tid)

    def transceiver_media(self, edge: "Edge", cluster: "ClusterPlan", tid: int) -> list[str]:
        return ["--media", f"{cluster.internal}:{edge.media_port(tid)}"]
