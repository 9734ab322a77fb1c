"""The edge launcher: one place that builds and starts the edge's services from a description.

An ``EdgePlan`` says which services run where (a host is a network namespace), on which
addresses, for one architecture; ``Edge`` starts them as real processes (redis-server, the
agent, relays, transceivers, signaling fronts), waits until each is ready, and stops them all,
also on errors and Ctrl-C. The scenario runner, the one-host demo and the tests all start the
edge through it; faults and new client types plug in here.

Per cluster, on its host: the agent, Redis and the metrics endpoints on the host's loopback;
the transceiver's control API and media socket on the cluster's internal address; the cluster
relay (relayed architectures) on its public address (on its internal one under the global
relay, where clients reach only the ingress points); a cluster may run several transceivers.
Per client region (global relay): the ingress relay on the anycast VIP with its own Redis.
Per client region (TURN): coturn on the region's edge host, on its public address, where a
TURN provider would place it; the transceivers then run one port per session behind it, and
the region's front hands out its URL with time-limited credentials from a secret generated per
run (``turn.secret`` in the logs folder, 0600; docs/turn.md).
Per front: signaling, steering to the plan's clusters. ``kill`` and ``start_service`` break
and mend one service by name (scenarios/faults.py). Which of these an architecture runs, and
how, is the architecture's (scenarios/architectures/): ``start`` asks it; an external
architecture starts its own commands instead (``start_external``).
"""
from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from scenarios import architectures
from scenarios.architectures.base import Architecture
from scenarios.ports import UdpBinding, process_sessions, udp_bindings
from scenarios.processes import ServiceError, ServiceProcess, http_ok, redis_cmd, tcp_open, voiceedge_cmd
from services.procfs import descendants
from services.relay.counters import scrape
from services.turn import coturn
from scenarios.credentials import EdgeCredentials
from services.turn.credentials import new_secret, write_secret
from topology.netns import in_namespace


@dataclass(frozen=True)
class Ports:
    """The ports the edge's services use; each host has its own, so one set serves all."""

    relay: int = 3478       # the one public UDP port of every relay
    internal: int = 3479    # cluster relay's port for the ingress tier (hop-encapsulated)
    media: int = 3480       # the transceiver's shared media socket
    control: int = 8900     # the transceiver's HTTP control API
    agent: int = 8800
    redis: int = 6379
    metrics: int = 9478     # relay Prometheus metrics
    signaling: int = 8080
    turn: int = 3478        # TURN servers (UDP), on the edge hosts' public addresses


@dataclass(frozen=True)
class Host:
    """Where services run: a network namespace (a name under /var/run/netns, or a path such as
    a Mininet host's /proc/PID/ns/net)."""

    name: str
    netns: str


@dataclass(frozen=True)
class ClusterPlan:
    """One transceiver cluster: agent, Redis, cluster relay and one transceiver on one host."""

    name: str                # region name; signaling's call ids carry it
    cluster_id: int          # the routing ufrag's cluster field
    host: Host
    public: str              # clients reach this address (relay port, or per-session ports)
    internal: str            # towards fronts and ingress relays (control API, media, hop port)
    transceivers: int = 1    # transceiver ids 1..n on the host, behind one relay

    def __post_init__(self) -> None:
        if not 1 <= self.transceivers <= 10:
            raise ValueError("a cluster runs 1 to 10 transceivers")

    @property
    def transceiver_ids(self) -> range:
        return range(1, self.transceivers + 1)

    def transceiver_name(self, tid: int) -> str:
        """The service name of transceiver ``tid`` (id 1 keeps the cluster's plain name)."""
        return f"transceiver-{self.name}" if tid == 1 else f"transceiver-{self.name}-{tid}"


@dataclass(frozen=True)
class IngressPlan:
    """A global relay ingress point in a client region, on the anycast VIP."""

    region: str
    host: Host
    listen: str              # the VIP
    hop_bind: str            # the host's backbone address


@dataclass(frozen=True)
class TurnPlan:
    """A TURN server (coturn) in a client region: listening and relaying on ``listen``."""

    region: str
    host: Host
    listen: str
    relay_ports: tuple[int, int] = coturn.DEFAULT_RELAY_PORTS  # one per allocation


@dataclass(frozen=True)
class FrontRoute:
    cluster: str
    rtt_ms: float            # seeds proximity steering


@dataclass(frozen=True)
class FrontPlan:
    """A signaling front (geo steering) in a region."""

    region: str
    host: Host
    listen: str
    routes: tuple[FrontRoute, ...]


@dataclass(frozen=True)
class EdgePlan:
    architecture: str | Architecture   # a registered name, or the architecture itself
    clusters: tuple[ClusterPlan, ...]
    fronts: tuple[FrontPlan, ...] = ()
    ingresses: tuple[IngressPlan, ...] = ()
    turns: tuple[TurnPlan, ...] = ()   # TURN servers (the turn architecture), one per region
    ports: Ports = field(default_factory=Ports)
    redis: bool = True                 # the relays' flow cache
    max_sessions: int = 500            # per transceiver
    relay_vip: str | None = None       # the global relay's anycast address (answers carry it)
    relay_args: tuple[str, ...] = ()   # extra options of every relay (benchmarks' variants)
    transceiver_args: tuple[str, ...] = ()  # ... and of every transceiver
    agent_args: tuple[str, ...] = ()   # ... and of every agent (a conversation's reply mode)
    # the fronts check API keys: a key generated per edge, a call token per client process
    # (scenarios/credentials.py); False: open fronts, as the lab tests call them
    api_keys: bool = False

    def __post_init__(self) -> None:
        arch = self.architecture
        if not isinstance(arch, Architecture):
            try:
                arch = architectures.get(arch)
            except KeyError as exc:
                raise ValueError(str(exc.args[0])) from None
        object.__setattr__(self, "arch", arch)
        object.__setattr__(self, "architecture", arch.name)
        if arch.ingress and self.relay_vip is None:
            raise ValueError(f"{arch.name} needs relay_vip")
        if arch.turn != bool(self.turns):
            raise ValueError(f"TURN servers go with an architecture that has them "
                             f"({arch.name} {'needs' if arch.turn else 'has'} none)")

    arch: Architecture = field(init=False, repr=False, compare=False)

    @property
    def relayed(self) -> bool:
        """Whether the cluster relays carry the media (else: a port per session)."""
        return self.arch.relayed

    def turn_for(self, region: str) -> TurnPlan | None:
        """The TURN server of a client region (None: none there)."""
        return next((t for t in self.turns if t.region == region), None)

    def cluster(self, name: str) -> ClusterPlan:
        return next(c for c in self.clusters if c.name == name)

    def advertise(self, cluster: ClusterPlan) -> str | None:
        """The candidate answers carry for calls to ``cluster`` (None: the transceiver's own
        per-session port)."""
        return self.arch.advertise(self, cluster)

    def public_addresses(self) -> dict[str, set[str]]:
        """Host name -> the addresses on it that face clients."""
        out: dict[str, set[str]] = {}
        for c in self.clusters:
            out.setdefault(c.host.name, set()).add(c.public)
        for i in self.ingresses:
            out.setdefault(i.host.name, set()).add(i.listen)
        for t in self.turns:  # its listening port and one relay port per allocation
            out.setdefault(t.host.name, set()).add(t.listen)
        return out


@dataclass
class Service:
    name: str
    host: Host
    process: ServiceProcess
    role: str                # agent, redis, relay, ingress, transceiver, turn, signaling,
    #                          external
    restart: object = None   # how start_service starts it again (external services)


class Edge:
    """The services of an ``EdgePlan``: ``with Edge(plan, logs) as edge:`` starts them all and
    stops them on the way out; ``start_*`` start one at a time (tests, faults). ``realtime``:
    every service's SCHED_FIFO priority, restarts included (0: ordinary;
    scenarios/priorities.py)."""

    def __init__(self, plan: EdgePlan, logs: Path, realtime: int = 0) -> None:
        self.plan = plan
        self.logs = logs
        self.realtime = realtime
        self.services: dict[str, Service] = {}
        self.credentials = EdgeCredentials() if plan.api_keys else None
        self._unready: list[tuple[Host, ServiceProcess, object]] | None = None

    def __enter__(self) -> "Edge":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------ names and addresses

    def control_url(self, cluster: ClusterPlan, tid: int = 1) -> str:
        return f"http://{cluster.internal}:{self.plan.ports.control + tid - 1}"

    def media_port(self, tid: int = 1) -> int:
        return self.plan.ports.media + tid - 1

    def signaling_url(self, front: FrontPlan) -> str:
        return f"http://{front.listen}:{self.plan.ports.signaling}/v1/calls"

    def metrics_url(self) -> str:
        """A relay's metrics URL, inside its own host."""
        return f"http://127.0.0.1:{self.plan.ports.metrics}/metrics"

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Every service of the plan, as its architecture starts them: clusters first, each
        service ready before the next starts, then the fronts side by side."""
        self.plan.arch.start(self)

    def stop(self) -> None:
        """Stop every service, last started first (SIGTERM, then SIGKILL after 5 s); the
        edge's credentials go with them."""
        for service in reversed(list(self.services.values())):
            service.process.stop()
        if self.credentials is not None:
            self.credentials.close()

    def token_file(self, name: str) -> Path | None:
        """A call token for client process ``name`` (None: the fronts are open)."""
        return None if self.credentials is None else self.credentials.token_file(name)

    @property
    def operator_headers(self) -> dict[str, str]:
        """What the testbed's own reads of a front's internals carry (none: open fronts)."""
        return {} if self.credentials is None else self.credentials.operator

    def add(self, name: str, host: Host, cmd: list[str], role: str, ready) -> ServiceProcess:
        """Start ``cmd`` in ``host`` as service ``name``; wait until ``ready()`` holds there."""
        old = self.services.get(name)
        if old is not None and old.process.alive():
            raise ServiceError(f"{name} is already running")
        proc = ServiceProcess(name, cmd, self.logs / f"{name}.log", netns=host.netns,
                              realtime=self.realtime).start()
        self.services[name] = Service(name, host, proc, role)
        if self._unready is not None:
            self._unready.append((host, proc, ready))
        else:
            in_namespace(host.netns, proc.wait_ready, ready)
        return proc

    @contextlib.contextmanager
    def side_by_side(self):
        """Services started in the block start at once and are waited for at its end, each
        in turn: for services that do not need each other (the fronts: a front's start is
        about a second of an interpreter's CPU, three in a row three seconds)."""
        self._unready = []
        try:
            yield
            unready, self._unready = self._unready, None
            for host, proc, ready in unready:
                in_namespace(host.netns, proc.wait_ready, ready)
        finally:
            self._unready = None

    def start_agent(self, cluster: ClusterPlan) -> ServiceProcess:
        port = self.plan.ports.agent
        return self.add(f"agent-{cluster.name}", cluster.host, voiceedge_cmd(
            "agent", "--listen", "127.0.0.1", "--port", str(port), *self.plan.agent_args),
            "agent",
            lambda: tcp_open("127.0.0.1", port))

    def start_redis(self, cluster: ClusterPlan) -> ServiceProcess:
        port = self.plan.ports.redis
        return self.add(f"redis-{cluster.name}", cluster.host,
                        redis_cmd("127.0.0.1", port, self.logs), "redis",
                        lambda: tcp_open("127.0.0.1", port))

    def start_ingress_redis(self, ingress: IngressPlan) -> ServiceProcess:
        """The ingress relay's own flow cache, on its host's loopback."""
        port = self.plan.ports.redis
        return self.add(f"redis-ingress-{ingress.region}", ingress.host,
                        redis_cmd("127.0.0.1", port, self.logs), "redis",
                        lambda: tcp_open("127.0.0.1", port))

    def start_relay(self, cluster: ClusterPlan) -> ServiceProcess:
        """The cluster relay: public port -> the transceiver's shared socket. Under the global
        relay, clients reach only their region's ingress, so the cluster relay's client port
        faces the backbone (its internal address), not the public internet."""
        p = self.plan.ports
        listen = self.plan.arch.relay_listen(cluster)
        routes = self.logs / f"routes-{cluster.name}.toml"
        routes.write_text(f"cluster_id = {cluster.cluster_id}\n[routes]\n" + "".join(
            f'{tid} = "{cluster.internal}:{self.media_port(tid)}"\n'
            for tid in cluster.transceiver_ids))
        cmd = ["relay", "--tier", "cluster", "--routes", str(routes), "--listen", listen,
               "--port", str(p.relay), "--internal", f"{cluster.internal}:{p.internal}",
               "--hop-bind", cluster.internal, "--relay-id", f"cluster-{cluster.name}",
               "--metrics", f"127.0.0.1:{p.metrics}", "--cpus", "none"]
        if self.plan.redis:
            cmd += ["--redis", f"redis://127.0.0.1:{p.redis}/0"]
        cmd += self.plan.relay_args
        return self.add(f"relay-{cluster.name}", cluster.host, voiceedge_cmd(*cmd), "relay",
                        lambda: http_ok(self.metrics_url()))

    def start_transceiver(self, cluster: ClusterPlan, tid: int = 1) -> ServiceProcess:
        p = self.plan.ports
        control = self.control_url(cluster, tid)
        cmd = ["transceiver", "--cluster", str(cluster.cluster_id), "--id", str(tid),
               "--control", f"{cluster.internal}:{p.control + tid - 1}",
               "--agent", f"ws://127.0.0.1:{p.agent}", "--max-sessions",
               str(self.plan.max_sessions)]
        cmd += self.plan.arch.transceiver_media(self, cluster, tid)
        cmd += self.plan.transceiver_args
        return self.add(cluster.transceiver_name(tid), cluster.host, voiceedge_cmd(*cmd),
                        "transceiver", lambda: http_ok(f"{control}/status"))

    def start_ingress(self, ingress: IngressPlan) -> ServiceProcess:
        """A global relay ingress: the VIP -> the cluster relays' hop ports over the backbone."""
        p = self.plan.ports
        routes = self.logs / f"routes-ingress-{ingress.region}.toml"
        routes.write_text("[routes]\n" + "".join(
            f'{c.cluster_id} = "{c.internal}:{p.internal}"\n' for c in self.plan.clusters))
        # A fixed hop port: the cluster relays' flows name this address as their previous
        # hop, so a restarted ingress must come back on it (docs/relay.md, "Restarts").
        cmd = ["relay", "--tier", "ingress", "--routes", str(routes), "--listen",
               ingress.listen, "--port", str(p.relay), "--hop-bind", ingress.hop_bind,
               "--hop-port", str(p.internal),
               "--relay-id", f"ingress-{ingress.region}", "--metrics",
               f"127.0.0.1:{p.metrics}", "--cpus", "none"]
        if self.plan.redis:
            cmd += ["--redis", f"redis://127.0.0.1:{p.redis}/0"]
        cmd += self.plan.relay_args
        return self.add(f"ingress-{ingress.region}", ingress.host, voiceedge_cmd(*cmd),
                        "ingress", lambda: http_ok(self.metrics_url()))

    def turn_secret(self) -> Path:
        """The file holding the secret the TURN servers share with the fronts: generated
        once per edge (a run's architecture), 0600, in the logs folder."""
        path = self.logs / "turn.secret"
        if not path.exists():
            write_secret(path, new_secret())
        return path

    def turn_config(self, turn: TurnPlan) -> coturn.TurnServerConfig:
        """coturn's configuration for ``turn``: it relays to the clusters' public addresses
        and nowhere else."""
        return coturn.TurnServerConfig(
            turn.listen, self.turn_secret(), self.logs, name=f"turn-{turn.region}",
            port=self.plan.ports.turn, relay_ports=turn.relay_ports,
            peers=tuple(dict.fromkeys(c.public for c in self.plan.clusters)))

    def start_turn(self, turn: TurnPlan) -> ServiceProcess:
        """coturn in its region: ready when it answers a STUN Binding request."""
        config = self.turn_config(turn)
        try:
            cmd = coturn.turnserver_cmd(coturn.write_config(config))
        except FileNotFoundError as exc:
            raise ServiceError(str(exc)) from None
        return self.add(f"turn-{turn.region}", turn.host, cmd, "turn",
                        lambda: coturn.answers_binding(turn.listen, config.port))

    def start_front(self, front: FrontPlan) -> ServiceProcess:
        clusters = []
        for route in front.routes:
            cluster = self.plan.cluster(route.cluster)
            clusters.append({"name": cluster.name, "rtt_ms": route.rtt_ms,
                             **self.front_route(cluster)})
        path = self.logs / f"front-{front.region}.json"
        path.write_text(json.dumps(clusters, indent=2))
        port = self.plan.ports.signaling
        extra: list[str] = []
        if self.plan.turns:
            turn = self.plan.turn_for(front.region)
            if turn is None:
                raise ServiceError(f"front-{front.region}: no TURN server in its region")
            extra = ["--turn-url", self.turn_config(turn).url,
                     "--turn-secret-file", str(self.turn_secret())]
        if self.credentials is not None:
            extra += ["--api-keys", str(self.credentials.key_file)]
        return self.add(f"front-{front.region}", front.host, voiceedge_cmd(
            "signaling", "--listen", f"{front.listen}:{port}", "--clusters", str(path),
            "--region", front.region, *extra),
            "signaling", lambda: http_ok(f"http://{front.listen}:{port}/healthz"))

    def start_fronts(self) -> None:
        """Every front of the plan, side by side: a front needs the clusters, not another
        front."""
        with self.side_by_side():
            for front in self.plan.fronts:
                self.start_front(front)

    def front_route(self, cluster: ClusterPlan) -> dict:
        """Where a front sends calls for ``cluster``: its transceivers' control URLs and the
        candidate to advertise, or an external edge's WHIP URL (services/signaling/cli.py)."""
        return self.plan.arch.front_route(self, cluster)

    def start_external(self, name: str, host: Host, cmd: list[str],
                       ready: str = "") -> ServiceProcess:
        """One process of an external edge (scenarios/architectures/external.py): ready when
        ``ready`` ("HOST:PORT") accepts TCP inside its host, else when still alive after half
        a second."""
        if ready:
            address, _, port = ready.rpartition(":")
            address = address.strip("[]")
            check = lambda: tcp_open(address, int(port))  # noqa: E731
        else:
            started = time.monotonic()
            check = lambda: time.monotonic() - started >= 0.5  # noqa: E731
        proc = self.add(name, host, cmd, "external", check)
        self.services[name].restart = lambda: self.start_external(name, host, cmd, ready)
        return proc

    def live_session_sources(self) -> list[tuple[str, str, object, dict[str, str]]]:
        """(netns, URL, reader, headers) per place that knows live sessions: every transceiver's
        ``/status?brief=1`` (the full status walks every descriptor and session of the
        transceiver, which the runner's polls four times a second must not cost it); for an
        external edge, the fronts' ``/healthz`` (they count the calls
        they placed with it and saw ended)."""
        if self.plan.arch.external:
            port = self.plan.ports.signaling
            return [(f.host.netns, f"http://{f.listen}:{port}/healthz",
                     lambda doc: sum(int(t["sessions"]) for t in doc["transceivers"]),
                     self.operator_headers)   # the details are for a key
                    for f in self.plan.fronts]
        return [(c.host.netns, f"{self.control_url(c, tid)}/status?brief=1",
                 lambda doc: int(doc["sessions"]), {})
                for c in self.plan.clusters for tid in c.transceiver_ids]

    def restart(self, name: str, kill: bool = True) -> ServiceProcess:
        """Stop service ``name`` (SIGKILL by default: a crash) and start it again."""
        if kill:
            self.kill(name)
        else:
            self.services[name].process.stop()
        return self.start_service(name)

    def kill(self, name: str) -> list[int]:
        """SIGKILL service ``name``'s main process only, as a crash or the OOM killer would
        (its children are left to fend for themselves); returns the pids it had, main first."""
        service = self.services[name]
        pids = self.processes(name)
        service.process.kill_main()
        return pids

    def start_service(self, name: str) -> ServiceProcess:
        """Start service ``name`` again as the plan describes it (after ``kill`` or a stop)."""
        service = self.services[name]
        role = service.role
        if service.restart is not None:
            return service.restart()
        if role == "ingress":
            return self.start_ingress(next(i for i in self.plan.ingresses
                                           if f"ingress-{i.region}" == name))
        if name.startswith("redis-ingress-"):
            return self.start_ingress_redis(next(i for i in self.plan.ingresses
                                                 if name == f"redis-ingress-{i.region}"))
        if role == "signaling":
            return self.start_front(next(f for f in self.plan.fronts
                                         if f"front-{f.region}" == name))
        if role == "turn":
            return self.start_turn(next(t for t in self.plan.turns
                                        if f"turn-{t.region}" == name))
        for cluster in self.plan.clusters:
            if role == "transceiver":
                for tid in cluster.transceiver_ids:
                    if cluster.transceiver_name(tid) == name:
                        return self.start_transceiver(cluster, tid)
            elif name == f"{role}-{cluster.name}":
                starter = {"agent": self.start_agent, "redis": self.start_redis,
                           "relay": self.start_relay}[role]
                return starter(cluster)
        raise KeyError(name)

    def processes(self, name: str) -> list[int]:
        """The pids of service ``name`` now: its main process, then its descendants."""
        service = self.services.get(name)
        return descendants(service.process.pid) if service else []

    # ------------------------------------------------------------ what the edge holds

    def relay_counters(self) -> dict[str, dict[str, int]]:
        """Counters of every relay (cluster and ingress), by service name."""
        return {s.name: in_namespace(s.host.netns, scrape, self.metrics_url())
                for s in self.services.values()
                if s.role in ("relay", "ingress") and s.process.alive()}

    def public_bindings(self) -> list[UdpBinding]:
        """UDP sockets bound on client-facing addresses (or a wildcard) by the edge's
        processes now, read from /proc: what a firewall in front of the edge must open."""
        public = self.plan.public_addresses()
        index = process_sessions()   # one pass over /proc for all services (twice a second)
        out: list[UdpBinding] = []
        for s in self.services.values():
            if s.role == "redis" or s.process.pid is None or not s.process.alive():
                continue
            for b in udp_bindings(s.process.pid, index):
                if b.address in public.get(s.host.name, ()) or b.wildcard:
                    out.append(b._replace(service=s.name, host=s.host.name))
        return out

    def public_udp_ports(self) -> int:
        """UDP ports the edge exposes to clients, measured: distinct (host, address, port), so
        an anycast VIP served in three regions counts three times (three hosts open it)."""
        return count_ports(self.public_bindings())


def count_ports(bindings: list[UdpBinding]) -> int:
    """Distinct (host, address, port) among ``bindings`` (workers sharing a port count once)."""
    return len({(b.host, b.address, b.port) for b in bindings})

