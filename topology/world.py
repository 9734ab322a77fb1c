"""An emulated world: Mininet hosts for routers, services and clients, per region.

Per region *i* (numbered from 1 in the order given):

    client_i --last mile-- pub_i ==public internet mesh== pub_j
                             |                                  edge_i: ingress relay + signaling
    edge_i ------------------+  (public side)                           front, on the anycast
    edge_i ---------------- bb_i ==backbone mesh======== bb_j           addresses
    cluster_i (cluster regions only) -- pub_i and -- bb_i: cluster relay, transceivers, agent

Address plan (region *i*, so every address tells its region): ``10.i.1.0/24`` client-pub,
``10.i.2.0/24`` edge-pub, ``10.i.3.0/24`` edge-bb, ``10.i.4.0/24`` cluster-pub,
``10.i.5.0/24`` cluster-bb (router ``.1``, host ``.2``); the public mesh link between regions
*i* < *j* is ``10.200.k.0/24`` and the backbone one ``10.201.k.0/24`` (*k* numbers the pair;
``.1`` on *i*, ``.2`` on *j*); ``10.i.7.0/24`` is region *i*'s NAT's, where its clients sit
behind one (``WorldSpec.nats``, topology/nat.py). Geo steering is anycast: every edge host carries the relay VIP
``203.0.113.10`` and the signaling address ``203.0.113.20``, and each public router routes them
to its own region's edge.

A client that can hand over (``WorldSpec.handovers``, region *i* to *j*) has a second access
link to ``pub_j``, with *j*'s last mile each way: ``10.j.8.i`` on the router, no address on
the client (it would be gathered as an ICE candidate), *j*'s NAT for the client's LAN address.
``handover`` moves the client's default route onto it and takes its own last mile down.

Impairment is applied on the public router: each direction it receives on its ingress (last
mile up, public internet and backbone on both routers of every mesh link), the last mile down
on its egress towards the client (the client reads kernel receive stamps). The links inside a
region (edge, cluster to their routers) are not impaired (same data centre).

Faults change a link while traffic runs: ``set_link(kind, a, b, impairment)`` changes both
directions of a link, ``restore_link(kind, a, b)`` puts the configured impairment back; build
the fault's impairment from the configured one with ``link_down`` or ``with_extra_loss``.
"""
from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from topology import nat
from topology.impairment.backend import iface_key
from topology.impairment.model import Impairment, NetNode, link_down
from topology.nat import NatSpec
from topology.netns import refuse_if_forbidden
from voiceedge import reaper

log = logging.getLogger("voiceedge.topology")

RELAY_VIP = "203.0.113.10"
SIGNALING_VIP = "203.0.113.20"
LINK_KINDS = ("last_mile", "public", "backbone")  # what set_link / restore_link change
# the second access link of a client that hands over: (kind, from region, to region), with the
# to region's last mile each way
HANDOVER_KINDS = {"handover_up": "last_mile_up", "handover_down": "last_mile_down"}
HANDOVER_SUBNET = 8   # 10.j.8.0/24: region j's router side of the access links handed over to
HOST_ROLES = ("client", "pub", "bb", "edge", "cluster")


@dataclass(frozen=True)
class WorldSpec:
    """What to build: regions (short names, in order), which of them host clusters, and the
    impairment of each direction of each impaired link."""

    regions: tuple[str, ...]
    clusters: tuple[str, ...]
    # (kind, from region, to region) -> Impairment; kinds: last_mile_up (client -> pub),
    # last_mile_down (pub -> client), public, backbone.
    impairments: dict[tuple[str, str, str], Impairment] = field(default_factory=dict)
    # region -> the NAT in front of its clients (topology/nat.py); none: clients are public
    nats: dict[str, NatSpec] = field(default_factory=dict)
    # (from region, to region): the first's client host gets a second access link, to the
    # second's public router and through its NAT, to hand its calls over to (``handover``)
    handovers: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.regions:
            raise ValueError("a world needs at least one region")
        if len(set(self.regions)) != len(self.regions):
            raise ValueError("regions repeat")
        if len(self.regions) > 60:
            raise ValueError("at most 60 regions (the address plan numbers them 1..60)")
        unknown = set(self.clusters) - set(self.regions)
        if unknown:
            raise ValueError(f"cluster regions not in the world: {', '.join(sorted(unknown))}")
        unknown = set(self.nats) - set(self.regions)
        if unknown:
            raise ValueError(f"NAT regions not in the world: {', '.join(sorted(unknown))}")
        for a, b in self.handovers:
            if a == b or a not in self.regions or b not in self.regions:
                raise ValueError(f"handover {a} -> {b}: two different regions of the world "
                                 f"({', '.join(self.regions)})")
            # the visiting client leaves b through b's NAT; a's keeps its own LAN address
            # private, so no one outside a routes to it (b's router routes it to the visitor)
            if a not in self.nats or b not in self.nats:
                raise ValueError(f"handover {a} -> {b}: both regions' clients must be behind a "
                                 "NAT (a scenario's nat:)")
        if len({a for a, _ in self.handovers}) != len(self.handovers):
            raise ValueError("a region's clients hand over to one other region at most")


@dataclass(frozen=True)
class ImpairedLink:
    """One impaired direction, held by ``holder`` on its ``interface``: what the receiver
    receives there, or, ``egress``, what the sender sends there. A direction into a host that
    reads kernel receive stamps (a client: its media plane, its ICE and TURN timings) is held
    on the sending router's egress, so the host's stamps come after the link's delay
    (topology/impairment/backend.py says why)."""

    kind: str
    src: str          # region the direction leaves
    dst: str          # region it reaches
    sender: str       # host names at both ends
    receiver: str
    receiver_ip: str  # the receiver's address on this link (probe target)
    interface: str    # the holder's
    impairment: Impairment
    egress: bool = False

    @property
    def holder(self) -> str:
        return self.sender if self.egress else self.receiver

    @property
    def key(self) -> str:
        """Its key in the impairment backend's ``stats()["interfaces"]``."""
        return iface_key(self.holder, self.interface, self.egress)


def _reap(shells) -> None:
    """Wait for the hosts' shells to exit (Mininet only sends SIGHUP); kill stragglers."""
    deadline = time.monotonic() + 5
    for shell in shells:
        try:
            shell.wait(timeout=max(0.0, deadline - time.monotonic()))
        except Exception:  # still there after 5 s: SIGHUP was ignored
            shell.kill()
            shell.wait()


class World:
    """``with World(spec, backend) as world:`` builds the hosts and links, applies impairment,
    and tears everything down on exit, also after an exception or Ctrl-C."""

    def __init__(self, spec: WorldSpec, backend) -> None:
        self.spec = spec
        self.backend = backend
        self.net = None
        self.index = {name: i + 1 for i, name in enumerate(spec.regions)}
        self.links: list[ImpairedLink] = []  # the directions with an impairment applied
        # every direction of every impairable link, by (kind, src, dst), null ones included
        self.directions: dict[tuple[str, str, str], ImpairedLink] = {}
        self.addresses: dict[str, dict[str, str]] = {}  # host -> role -> address
        self.peers: dict[str, str] = {}  # interface name -> the host at its other end
        self.build_seconds: float | None = None
        self.teardown_seconds: float | None = None
        self._applied_later: set[str] = set()  # keys of null directions a fault applied
        self._rebinds = 0   # NAT mappings moved so far (each to ports of its own)
        # from region -> (to region, the client's interface there, the router's address there)
        self._access: dict[str, tuple[str, str, str]] = {}
        self.handed_over: set[str] = set()   # regions whose clients are on their second link

    # ------------------------------------------------------------ names and addresses

    def host(self, role: str, region: str):
        return self.net[f"{role}{self.index[region]}"]

    def role_of(self, name: str) -> tuple[str, str]:
        """(role, region) of a host name: ``("cluster", "na-east")`` for ``cluster2``. Roles:
        client, pub (public router), bb (backbone router), edge, cluster."""
        role = name.rstrip("0123456789")
        number = name[len(role):]
        if role not in HOST_ROLES or not number.isdigit() \
                or not 1 <= int(number) <= len(self.spec.regions):
            raise ValueError(f"no host {name!r} in this world")
        return role, self.spec.regions[int(number) - 1]

    def node(self, name: str) -> NetNode:
        host = self.net[name]
        return NetNode(name, f"/proc/{host.pid}/ns/net")

    @staticmethod
    def lan(i: int, subnet: int, which: int) -> str:
        return f"10.{i}.{subnet}.{which}"

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> "World":
        started = time.monotonic()
        try:
            self._build()
            self.backend.start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.build_seconds = time.monotonic() - started
        return self

    def __exit__(self, *exc) -> None:
        started = time.monotonic()
        try:
            self.backend.stop()
        finally:
            if self.net is not None:
                from mininet.log import setLogLevel
                setLogLevel("error")
                shells = [h.shell for h in self.net.hosts if h.shell is not None]
                self.net.stop()
                self.net = None
                _reap(shells)
                for shell in shells:
                    reaper.untrack_process(shell.pid)
        self.teardown_seconds = time.monotonic() - started

    def _build(self) -> None:
        from mininet.link import Link
        from mininet.log import setLogLevel
        from mininet.net import Mininet
        from mininet.node import Host

        refuse_if_forbidden("a Mininet world")  # the test suite's guard (topology/netns.py)
        setLogLevel("error")
        spec = self.spec
        # No switches, no controller (no Open vSwitch here): hosts joined by veth pairs. Not
        # calling net.build() keeps Mininet from re-addressing the first interface of hosts.
        self.net = net = Mininet(topo=None, controller=None, link=Link, host=Host, build=False)
        for region in spec.regions:
            i = self.index[region]
            for role in ("pub", "bb", "edge", "client") + (
                    ("cluster",) if region in spec.clusters else ()):
                host = net.addHost(f"{role}{i}", ip=None)
                reaper.track_process(host.pid)  # its namespace dies with its shell
        for host in net.hosts:
            host.cmd("ip link set lo up")  # services bind loopback addresses inside hosts
        for region in spec.regions:
            self._build_region(region)
        for a, b in itertools.combinations(spec.regions, 2):
            self._build_mesh(a, b)
        for a, b in spec.handovers:
            self._build_handover(a, b)
        for region in spec.regions:
            self._route_region(region)
        for a, b in spec.handovers:
            self._route_handover(a, b)
        for link in self.links:
            self._apply(link)

    def _link(self, a: str, b: str, ip_a: str, ip_b: str):
        net = self.net
        node_a, node_b = net[a], net[b]
        name_a = f"{a}-eth{len(node_a.intfList())}"
        name_b = f"{b}-eth{len(node_b.intfList())}"
        net.addLink(node_a, node_b, intfName1=name_a, intfName2=name_b,
                    params1={"ip": f"{ip_a}/24"}, params2={"ip": f"{ip_b}/24"})
        self.peers[name_a], self.peers[name_b] = b, a
        return name_a, name_b

    def _configured(self, spec: WorldSpec, key: tuple[str, str, str]) -> Impairment:
        """What ``spec`` configures for a direction; a handover link has its new region's
        last mile."""
        kind, _, dst = key
        if kind in HANDOVER_KINDS:
            key = (HANDOVER_KINDS[kind], dst, dst)
        return spec.impairments.get(key) or Impairment()

    def _impair(self, kind: str, src: str, dst: str, sender: str, receiver: str,
                receiver_ip: str, interface: str, egress: bool = False) -> None:
        impairment = self._configured(self.spec, (kind, src, dst))
        link = ImpairedLink(kind, src, dst, sender, receiver, receiver_ip, interface,
                            impairment, egress)
        self.directions[(kind, src, dst)] = link
        if not impairment.is_null:
            self.links.append(link)

    def _apply(self, link: ImpairedLink) -> None:
        self.backend.apply(self.node(link.holder), link.interface, link.impairment, link.egress)

    def _change(self, link: ImpairedLink, impairment: Impairment) -> None:
        self.backend.change(self.node(link.holder), link.interface, impairment, link.egress)

    # ------------------------------------------------------------ faults: links at runtime

    def link_directions(self, kind: str, a: str, b: str | None = None) -> list[ImpairedLink]:
        """Both directions, as configured, of the ``kind`` link between regions ``a`` and
        ``b`` ("public", "backbone"), or of region ``a``'s last mile ("last_mile": up, then
        down; ``b`` is None or ``a``)."""
        if kind not in LINK_KINDS:
            raise ValueError(f"unknown link kind {kind!r} (choose from {', '.join(LINK_KINDS)})")
        where = f"{kind}/{a}" if kind == "last_mile" else f"{kind}/{a}/{b}"
        missing = [r for r in (a, b) if r is not None and r not in self.index]
        if missing:
            raise ValueError(f"no link {where}: {', '.join(map(repr, missing))} is not a region "
                             f"of this world ({', '.join(self.spec.regions)})")
        if kind == "last_mile":
            if b not in (None, a):
                raise ValueError(f"no link {where}: a last mile is one region's "
                                 f"(last_mile/{a})")
            keys = [("last_mile_up", a, a), ("last_mile_down", a, a)]
        elif b is None or b == a:
            raise ValueError(f"no link {where}: a {kind} link joins two different regions")
        else:
            keys = [(kind, a, b), (kind, b, a)]
        if self.net is None:
            raise RuntimeError(f"{where}: the world is not built (use it inside `with World`)")
        return [self.directions[key] for key in keys]

    def set_link(self, kind: str, a: str, b: str | None,
                 impairment: Impairment | Callable[[Impairment], Impairment]
                 ) -> list[ImpairedLink]:
        """Change both directions of a link (``link_directions``) from now on: to
        ``impairment``, or to ``impairment(configured)`` per direction when it is a function
        (``link_down``, ``lambda imp: with_extra_loss(imp, 30)``). Packets already delayed
        keep their release times. Returns the directions with what is now in force."""
        changed = []
        for link in self.link_directions(kind, a, b):
            new = impairment(link.impairment) if callable(impairment) else impairment
            if link not in self.links and link.key not in self._applied_later:
                # no impairment was configured, so none was applied: apply one now (null)
                self._apply(link)
                self._applied_later.add(link.key)
            self._change(link, new)
            changed.append(replace(link, impairment=new))
        log.info("link %s %s%s changed: %s", kind, a, "" if b in (None, a) else f"/{b}",
                 "; ".join(f"{c.src}->{c.dst} {c.impairment}" for c in changed))
        return changed

    def reimpair(self, spec: WorldSpec) -> list[ImpairedLink]:
        """Make ``spec`` the world's configuration from now on: every direction whose
        impairment differs is changed in place (hosts, addresses and routes stay), and
        calibration then judges the world against ``spec``. The topology must be the same (a
        sweep over impairments: scenarios/sweep.py). Returns the directions changed."""
        if (spec.regions, spec.clusters, spec.handovers) != (
                self.spec.regions, self.spec.clusters, self.spec.handovers):
            raise ValueError("reimpair changes impairments only: regions and clusters must be "
                             "the world's (build another world for another topology)")
        if self.net is None:
            raise RuntimeError("the world is not built (use it inside `with World`)")
        changed = []
        applied = {link.key for link in self.links} | self._applied_later
        for key, link in list(self.directions.items()):
            new = self._configured(spec, key)
            if new == link.impairment:
                continue
            if link.key not in applied:  # null so far, so never applied: apply that first
                self._apply(link)
            self._applied_later.add(link.key)  # applied from now on, whatever it becomes
            self._change(link, new)
            self.directions[key] = replace(link, impairment=new)
            changed.append(self.directions[key])
        self.links = [link for link in self.directions.values() if not link.impairment.is_null]
        self.spec = spec
        log.debug("world re-impaired: %d directions changed", len(changed))
        return changed

    def restore_link(self, kind: str, a: str, b: str | None = None) -> list[ImpairedLink]:
        """Put back the configured impairment of both directions of a link; returns them."""
        links = self.link_directions(kind, a, b)
        for link in links:
            if link in self.links or link.key in self._applied_later:
                self._change(link, link.impairment)
        log.info("link %s %s%s restored", kind, a, "" if b in (None, a) else f"/{b}")
        return links

    def _build_region(self, region: str) -> None:
        i = self.index[region]
        pub, bb, edge, client = f"pub{i}", f"bb{i}", f"edge{i}", f"client{i}"
        _, p_if = self._link(client, pub, self.lan(i, 1, 2), self.lan(i, 1, 1))
        self._impair("last_mile_up", region, region, client, pub, self.lan(i, 1, 1), p_if)
        # held on pub's egress, not the client's ingress: the client reads receive stamps
        self._impair("last_mile_down", region, region, pub, client, self.lan(i, 1, 2), p_if,
                     egress=True)
        self._link(edge, pub, self.lan(i, 2, 2), self.lan(i, 2, 1))
        self._link(edge, bb, self.lan(i, 3, 2), self.lan(i, 3, 1))
        self.addresses[client] = {"public": self.lan(i, 1, 2)}
        if region in self.spec.nats:   # what the client looks like from outside its LAN
            self.addresses[client]["nat"] = nat.public_address(i)
        self.addresses[edge] = {"public": self.lan(i, 2, 2), "backbone": self.lan(i, 3, 2),
                                "relay_vip": RELAY_VIP, "signaling_vip": SIGNALING_VIP}
        if region in self.spec.clusters:
            cluster = f"cluster{i}"
            self._link(cluster, pub, self.lan(i, 4, 2), self.lan(i, 4, 1))
            self._link(cluster, bb, self.lan(i, 5, 2), self.lan(i, 5, 1))
            self.addresses[cluster] = {"public": self.lan(i, 4, 2),
                                       "backbone": self.lan(i, 5, 2)}

    def _build_mesh(self, a: str, b: str) -> None:
        i, j = self.index[a], self.index[b]
        k = self._pair_number(i, j)
        for kind, role, net_octet in (("public", "pub", 200), ("backbone", "bb", 201)):
            ip_a, ip_b = f"10.{net_octet}.{k}.1", f"10.{net_octet}.{k}.2"
            if_a, if_b = self._link(f"{role}{i}", f"{role}{j}", ip_a, ip_b)
            self._impair(kind, a, b, f"{role}{i}", f"{role}{j}", ip_b, if_b)
            self._impair(kind, b, a, f"{role}{j}", f"{role}{i}", ip_a, if_a)

    def _pair_number(self, i: int, j: int) -> int:
        n = len(self.spec.regions)
        pairs = [(x, y) for x in range(1, n + 1) for y in range(x + 1, n + 1)]
        return pairs.index((min(i, j), max(i, j))) + 1

    def _peer_ip(self, role: str, i: int, j: int) -> str:
        """Address of router ``role``+j on the mesh link between regions i and j."""
        k = self._pair_number(i, j)
        octet = 200 if role == "pub" else 201
        return f"10.{octet}.{k}.{2 if j > i else 1}"

    def _route_region(self, region: str) -> None:
        net, i = self.net, self.index[region]
        others = [self.index[r] for r in self.spec.regions if r != region]
        pub, bb, edge, client = (net[f"pub{i}"], net[f"bb{i}"], net[f"edge{i}"],
                                 net[f"client{i}"])
        for router in (pub, bb):
            router.cmd("sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0")
        cmds = {pub: [], bb: [], edge: [], client: []}
        # Clients and edges reach everything public through their public router.
        cmds[client].append(f"ip route add default via {self.lan(i, 1, 1)}")
        cmds[edge].append(f"ip route add default via {self.lan(i, 2, 1)}")
        for vip in (RELAY_VIP, SIGNALING_VIP):
            cmds[edge].append(f"ip addr add {vip}/32 dev lo")
            cmds[pub].append(f"ip route add {vip}/32 via {self.lan(i, 2, 2)}")
        cluster = net.get(f"cluster{i}") if region in self.spec.clusters else None
        if cluster is not None:
            cmds[cluster] = [f"ip route add default via {self.lan(i, 4, 1)}"]
        for j in others:
            # Public internet: every region's client/edge/cluster subnets via that region's
            # public router; backbone: edge and cluster backbone subnets via its bb router.
            for subnet in (1, 2, 4, nat.NAT_SUBNET):
                cmds[pub].append(f"ip route add 10.{j}.{subnet}.0/24 via {self._peer_ip('pub', i, j)}")
            for subnet in (3, 5):
                cmds[bb].append(f"ip route add 10.{j}.{subnet}.0/24 via {self._peer_ip('bb', i, j)}")
                cmds[edge].append(f"ip route add 10.{j}.{subnet}.0/24 via {self.lan(i, 3, 1)}")
                if cluster is not None:
                    cmds[cluster].append(
                        f"ip route add 10.{j}.{subnet}.0/24 via {self.lan(i, 5, 1)}")
        if region in self.spec.nats:
            cmds[pub] += nat.setup_commands(i, self.spec.nats[region])
        for host, lines in cmds.items():
            if lines:
                out = host.cmd("; ".join(lines))
                if "Error" in out or "RTNETLINK" in out or "iptables" in out or "sysctl" in out:
                    raise RuntimeError(f"routing on {host.name}: {out.strip()}")

    # ------------------------------------------------------------ handover: a second access

    def _handover_ip(self, a: str, b: str) -> str:
        """Region ``b``'s router's address on the access link handed over from ``a``."""
        return self.lan(self.index[b], HANDOVER_SUBNET, self.index[a])

    def _build_handover(self, a: str, b: str) -> None:
        """A second access link for region ``a``'s client, to ``b``'s public router, with
        ``b``'s last mile each way. The client's end has no address (aioice and Chromium
        would gather one as a candidate): the client reaches the router's address there by a
        host route and sends from its own LAN address."""
        i, j = self.index[a], self.index[b]
        client, pub = self.net[f"client{i}"], self.net[f"pub{j}"]
        c_if, p_if = f"client{i}-eth{len(client.intfList())}", f"pub{j}-eth{len(pub.intfList())}"
        self.net.addLink(client, pub, intfName1=c_if, intfName2=p_if)
        self.peers[c_if], self.peers[p_if] = pub.name, client.name
        router_ip, client_ip = self._handover_ip(a, b), self.lan(i, 1, 2)
        self._impair("handover_up", a, b, client.name, pub.name, router_ip, p_if)
        self._impair("handover_down", a, b, pub.name, client.name, client_ip, p_if, egress=True)
        self._access[a] = (b, c_if, p_if)

    def _route_handover(self, a: str, b: str) -> None:
        """The new access link's routes, and ``b``'s NAT for the visiting client (what it
        sends anywhere leaves from ``b``'s NAT address; the answers come back over the link).
        The client's default route stays on its own last mile until ``handover``."""
        i, j = self.index[a], self.index[b]
        _, c_if, p_if = self._access[a]
        client, pub = self.net[f"client{i}"], self.net[f"pub{j}"]
        router_ip, client_ip = self._handover_ip(a, b), self.lan(i, 1, 2)
        random = " --random-fully" if self.spec.nats[b].mapping == "symmetric" else ""
        public = nat.public_address(j)
        lines = {
            client: [f"sysctl -qw net.ipv4.conf.all.rp_filter=0 "
                     f"net.ipv4.conf.{c_if}.rp_filter=0",
                     f"ip route add {router_ip}/32 dev {c_if}"],
            pub: [f"sysctl -qw net.ipv4.conf.{p_if}.rp_filter=0",
                  f"ip addr add {router_ip}/32 dev {p_if}",
                  f"ip route add {client_ip}/32 dev {p_if}",
                  f"iptables -w -t nat -I POSTROUTING 1 -s {client_ip} -p udp "
                  f"-j SNAT --to-source {public}{random}",
                  f"iptables -w -t nat -I POSTROUTING 2 -s {client_ip} "
                  f"-j SNAT --to-source {public}"]}
        for host, cmds in lines.items():
            out = host.cmd("; ".join(cmds))
            if "Error" in out or "RTNETLINK" in out or "iptables" in out or "sysctl" in out:
                raise RuntimeError(f"handover routing on {host.name}: {out.strip()}")

    def handover(self, region: str) -> str:
        """``region``'s client leaves its access network for the one the world built it
        (``WorldSpec.handovers``): its last mile goes down both ways and its default route
        moves to the other region's router. Its sockets keep their local address; from
        outside its traffic comes from that region's NAT, through that region (its anycast
        ingress and front). Returns the region it is in now."""
        if region not in self._access:
            raise ValueError(f"region {region}'s client has no second access link (a "
                             "handover fault in the scenario builds it)")
        if region in self.handed_over:
            raise ValueError(f"region {region}'s client is handed over already")
        to, c_if, _ = self._access[region]
        self.set_link("last_mile", region, None, link_down)
        out = self.host("client", region).cmd(
            f"ip route replace default via {self._handover_ip(region, to)} dev {c_if} onlink")
        if out.strip():
            raise RuntimeError(f"handover of {region}'s client: {out.strip()}")
        self.handed_over.add(region)
        log.info("client of %s handed over to %s's access network", region, to)
        return to

    def hand_back(self, region: str) -> None:
        """Undo ``handover``: the client's default route and last mile are its own again."""
        if region not in self.handed_over:
            return
        i = self.index[region]
        out = self.host("client", region).cmd(
            f"ip route replace default via {self.lan(i, 1, 1)} dev client{i}-eth0")
        if out.strip():
            raise RuntimeError(f"hand back of {region}'s client: {out.strip()}")
        self.restore_link("last_mile", region)
        self.handed_over.discard(region)
        log.info("client of %s back on its own access network", region)

    def nat_rebind(self, region: str, client: tuple[str, int | None] | None = None) -> int:
        """The NAT in front of ``region``'s clients gives ``client``'s socket (its LAN address
        and port; None: every UDP socket of the region's client host) a new public port from
        its next packet on, as a carrier NAT that lost the mapping: returns the port (the
        first of the block the new ports come from, for more than one socket or a symmetric
        NAT)."""
        spec = self.spec.nats.get(region)
        if spec is None:
            raise ValueError(f"region {region} has no NAT (a scenario's nat:)")
        if client is None:
            client = (self.addresses[f"client{self.index[region]}"]["public"], None)
        low, high = nat.REBIND_PORTS
        port = low + (self._rebinds * nat.REBIND_BLOCK) % (high - low)
        self._rebinds += 1
        pub = self.host("pub", region)
        i = self.index[region]
        out = pub.cmd("; ".join(nat.rebind_commands(i, client, port, spec)))
        if "iptables" in out or "Bad" in out:
            raise RuntimeError(f"NAT rebind on {pub.name}: {out.strip()}")
        for _ in range(5):  # a mapping being created during the delete survives it: again
            time.sleep(0.01)
            stale = nat.stale_mappings(pub.cmd(f"conntrack -L -p udp --orig-src {client[0]} "
                                               "2>/dev/null"), i, client, port)
            if not stale:
                break
            log.info("NAT %s: %d mapping(s) outlived the rebinding; deleted", region, len(stale))
            pub.cmd("; ".join(stale) + "; true")
        log.info("NAT %s: %s:%s now leaves from port %d", region, client[0], client[1] or "*",
                 port)
        return port
