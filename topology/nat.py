"""A NAT in front of a region's clients (docs/mobility.md): the region's public router
translates its client LAN to a public address of its own, as a home router or a carrier-grade
NAT does, with iptables in the router's namespace and the kernel's connection tracking; from
outside, only the answers to what a client sent reach the LAN (the world routes every region's
client LAN: without this a client's host candidate would be reachable past its NAT).

Region *i*'s NAT address is ``10.i.7.1`` (on the router's loopback; every public router routes
``10.i.7.0/24`` to region *i*). Mappings, as RFC 4787 names them:

- ``endpoint-independent``: a client socket keeps one public port whatever it sends to (the
  kernel keeps the socket's own port when it is free: SNAT without a port range);
- ``symmetric`` (address- and port-dependent): each destination gets a port of its own
  (``--random-fully``).

A binding lives ``udp_timeout_s`` after its last packet (the namespace's conntrack UDP
timeouts, both the one-way and the two-way one). ``rebind_commands`` moves one client
socket's mapping to a new public port, as a carrier NAT that lost or reassigned it: its
connection-tracking entries are deleted and a rule maps that socket to the new port from now on.
"""
from __future__ import annotations

from dataclasses import dataclass

MAPPINGS = ("endpoint-independent", "symmetric")
NAT_SUBNET = 7              # 10.i.7.0/24: region i's NAT addresses
# New public ports of rebound mappings come from here, a block of REBIND_BLOCK a rebinding:
# below Linux's ephemeral range (32768-60999), where the clients' sockets are. An SNAT keeps a
# socket's own port when it falls in the block, so a block inside that range left about one
# call in 28 on its old public port: not rebound at all.
REBIND_PORTS = (10000, 30000)
REBIND_BLOCK = 1000


@dataclass(frozen=True)
class NatSpec:
    """A region's NAT: its mapping behaviour and its UDP binding timeout."""

    mapping: str = "endpoint-independent"
    udp_timeout_s: int = 30

    def __post_init__(self) -> None:
        if self.mapping not in MAPPINGS:
            raise ValueError(f"nat mapping {self.mapping!r} is not one of {', '.join(MAPPINGS)}")
        if not isinstance(self.udp_timeout_s, int) or not 1 <= self.udp_timeout_s <= 3600:
            raise ValueError("nat udp_timeout_s must be a whole number of seconds, 1-3600")


def public_address(i: int) -> str:
    """Region ``i``'s NAT address: what its clients look like from everywhere else."""
    return f"10.{i}.{NAT_SUBNET}.1"


def _lan(i: int) -> str:
    return f"10.{i}.1.0/24"


def setup_commands(i: int, spec: NatSpec) -> list[str]:
    """Shell lines for region ``i``'s public router: the address, the translation of what its
    client LAN sends anywhere else, then the binding timeout (the table is there by then)."""
    lan, random = _lan(i), " --random-fully" if spec.mapping == "symmetric" else ""
    t = spec.udp_timeout_s
    return [f"ip addr add {public_address(i)}/32 dev lo",
            f"iptables -w -t nat -A POSTROUTING -s {lan} ! -d {lan} -p udp "
            f"-j SNAT --to-source {public_address(i)}{random}",
            f"iptables -w -t nat -A POSTROUTING -s {lan} ! -d {lan} "
            f"-j SNAT --to-source {public_address(i)}",
            # nothing from outside reaches the LAN but the answers to what it sent (the
            # world routes every client LAN, and a NAT's is private)
            f"iptables -w -A FORWARD -d {lan} ! -s {lan} -m conntrack "
            f"! --ctstate ESTABLISHED,RELATED -j DROP",
            f"sysctl -qw net.netfilter.nf_conntrack_udp_timeout={t} "
            f"net.netfilter.nf_conntrack_udp_timeout_stream={t}"]


def rebind_commands(i: int, client: tuple[str, int | None], port: int, spec: NatSpec
                    ) -> list[str]:
    """Shell lines for region ``i``'s public router: ``client``'s socket (its LAN address and
    port) leaves from public ``port`` from its next packet on (symmetric: from the block at
    ``port``); with port None, every UDP socket of that address leaves from the block, as when
    a carrier NAT loses its table."""
    ip, sport = client
    lan = _lan(i)
    last = port + REBIND_BLOCK - 1
    if sport is None:
        to = f"{public_address(i)}:{port}-{last}" + (
            " --random-fully" if spec.mapping == "symmetric" else "")
    else:
        to = (f"{public_address(i)}:{port}-{last} --random-fully"
              if spec.mapping == "symmetric" else f"{public_address(i)}:{port}")
    which = "" if sport is None else f" --sport {sport}"
    return [f"iptables -w -t nat -I POSTROUTING 1 -s {ip} ! -d {lan} -p udp{which} "
            f"-j SNAT --to-source {to}",
            f"conntrack -D -p udp --orig-src {ip}{which} >/dev/null 2>&1; true"]


def stale_mappings(listing: str, i: int, client: tuple[str, int | None], port: int
                   ) -> list[str]:
    """Delete commands for the UDP mappings in ``listing`` (``conntrack -L -p udp`` on region
    ``i``'s public router) that a rebinding of ``client`` to the block at ``port`` left on an
    old public port. ``conntrack -D`` misses an entry a packet is creating at that moment
    (it is confirmed after the delete): such a call would keep its mapping and never notice
    the fault."""
    ip, sport = client
    public, last = public_address(i), port + REBIND_BLOCK - 1
    out = []
    for line in listing.splitlines():
        pairs = [f.split("=", 1) for f in line.split() if "=" in f]
        if len(pairs) < 8:   # not an entry (conntrack's summary line)
            continue
        original, reply = dict(pairs[:4]), dict(pairs[4:8])
        if original.get("src") != ip or reply.get("dst") != public:
            continue
        if sport is not None and original.get("sport") != str(sport):
            continue
        if port <= int(reply.get("dport", -1)) <= last:
            continue
        out.append(f"conntrack -D -p udp --orig-src {ip} --orig-dst {original['dst']} "
                   f"--sport {original['sport']} --dport {original['dport']} >/dev/null 2>&1")
    return out
