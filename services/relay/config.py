"""Relay configuration and route tables."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from services.config import parse_hostport
from services.mediapaths import NATIVE, PYTHON
from services.wire.ufrag import DEV_SECRET
from voiceedge.errors import ConfigError

TIERS = ("ingress", "cluster")


# Who admits first packets (RelayConfig.admission): the Python rules, or the same in C.
ADMISSIONS = (PYTHON, NATIVE)
# Who forwards the established flows' datagrams (RelayConfig.forwarding): Python or C.
FORWARDINGS = (PYTHON, NATIVE)

@dataclass(frozen=True)
class RouteTable:
    """Where a hint goes next: cluster id -> cluster relay (ingress tier), or
    transceiver id -> transceiver (cluster tier, for the one cluster ``cluster_id``)."""

    tier: str
    routes: dict[int, tuple[str, int]]
    cluster_id: int | None = None

    def next_hop(self, cluster_id: int, transceiver_id: int) -> tuple[str, int] | None:
        if self.tier == "ingress":
            return self.routes.get(cluster_id)
        if cluster_id != self.cluster_id:
            return None
        return self.routes.get(transceiver_id)

    @classmethod
    def load(cls, path: str | Path, tier: str) -> "RouteTable":
        """Read a routes file (TOML)::

            cluster_id = 1                # cluster tier only: the cluster this relay serves
            [routes]                      # id -> "host:port"
            1 = "10.0.1.2:3479"           # ingress: cluster 1's relay (its internal port)
                                          # cluster: transceiver 1
        """
        try:
            doc = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"routes file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"routes file {path} is not valid TOML: {exc}") from None
        return cls.from_dict(doc, tier, source=str(path))

    @classmethod
    def from_dict(cls, doc: dict, tier: str, source: str = "routes") -> "RouteTable":
        if tier not in TIERS:
            raise ConfigError(f"tier must be one of {', '.join(TIERS)}, not {tier!r}")
        raw = doc.get("routes")
        if not isinstance(raw, dict) or not raw:
            raise ConfigError(f"{source}: needs a [routes] table of id = \"host:port\"")
        routes = {}
        for key, value in raw.items():
            if not str(key).isdigit():
                raise ConfigError(f"{source}: route id {key!r} is not a number")
            if not isinstance(value, str):
                raise ConfigError(f"{source}: route {key} must be a \"host:port\" string")
            routes[int(key)] = parse_hostport(value, f"{source}: route {key}")
        cluster_id = doc.get("cluster_id")
        if tier == "cluster" and not isinstance(cluster_id, int):
            raise ConfigError(f"{source}: a cluster-tier relay needs cluster_id = N")
        return cls(tier=tier, routes=routes, cluster_id=cluster_id)


@dataclass(frozen=True)
class RelayConfig:
    routes: RouteTable
    listen: tuple[str, int] = ("0.0.0.0", 3478)
    # Cluster tier: where ingress relays send (hop-encapsulated). None on the ingress tier.
    internal: tuple[str, int] | None = None
    # Local address for the per-worker socket towards next hops; port hop_port + worker index,
    # or one the kernel chooses when hop_port is 0. A fixed port keeps the relay's address the
    # same across a restart: the next tier's flows (recovered or not) name it as their
    # previous hop and drop datagrams from anywhere else.
    hop_bind: str = "0.0.0.0"
    hop_port: int = 0
    relay_id: str = ""
    secret: bytes = DEV_SECRET
    redis_url: str | None = None
    workers: int = 1
    cpus: tuple[int, ...] | None = None  # None: pin worker i to CPU i mod ncpu; () no pinning
    realtime: int | None = None       # SCHED_FIFO priority of the workers (scheduling.py)
    idle_timeout: float = 30.0
    max_flows: int = 100_000
    # First packets (services/relay/admission.py). pending_flows=False is the unhardened
    # behaviour (a routable first packet opens an established flow), kept for the hostile
    # benchmark's comparison.
    pending_flows: bool = True
    pending_ttl: float = 5.0
    max_pending: int = 4096          # per worker
    pending_per_ip: int = 64
    pending_per_prefix: int = 256    # per /24 (IPv4) or /64 (IPv6)
    first_packet_rate: float = 100.0  # per source IP and second; 0: no limit
    first_packet_burst: float = 200.0
    max_lookups: int = 256           # Redis lookups in flight per worker
    backlog: int = 1024              # first packets waiting for the slow path (backlog.py)
    admission: str = NATIVE          # IPv4 first packets in C (nativeadmission.py), or PYTHON
    forwarding: str = NATIVE         # established IPv4 flows in C (_fastpath.c), or PYTHON
    redis_ttl: float = 120.0
    redis_queue: int = 10_000
    metrics: tuple[str, int] | None = ("127.0.0.1", 9478)
    batch: int = 64
    # Test-only: sleep this long before handling each readiness event, an injected regression
    # that the CI latency budgets must catch (tests/test_budgets.py). Never set in production.
    test_processing_delay_ms: float = 0.0

    @property
    def tier(self) -> str:
        return self.routes.tier

    @property
    def name(self) -> str:
        return self.relay_id or f"{self.tier}-{self.listen[0]}-{self.listen[1]}"
