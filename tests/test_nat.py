"""NATs in front of a region's clients (topology/nat.py) in a two-region world (needs root):
what the other region sees, both mapping behaviours, a rebinding and the binding timeout."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from topology.calibrate import calibrate
from topology.impairment.factory import make_backend
from topology.impairment.model import Impairment
from topology.nat import NatSpec, public_address
from topology.world import RELAY_VIP, World, WorldSpec

# the one world of make test's shareable tier (its other files use lab namespaces): it runs
# beside one of them, its own hosts, addresses and rules, behaviour only
pytestmark = [pytest.mark.world, pytest.mark.shareable]

# In the far region's edge host: UDP on two ports, answering each datagram with the address
# and port it came from.
SERVER = """
import select, socket
socks = []
for port in (7001, 7002):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", port))
    socks.append(s)
print("up", flush=True)
while True:
    for s in select.select(socks, [], [])[0]:
        data, src = s.recvfrom(100)
        s.sendto(f"{src[0]}:{src[1]}".encode(), src)
"""
# In the NAT region's client host: from one socket (port 5555), to each port given; what the
# server saw of it, in order.
CLIENT = """
import json, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5555))
s.settimeout(2)
seen = []
for port in map(int, sys.argv[2:]):
    s.sendto(b"x", (sys.argv[1], port))
    seen.append(s.recvfrom(100)[0].decode())
print(json.dumps(seen))
"""


class NatWorld:
    def __init__(self, world: World, tmp_path) -> None:
        self.world = world
        self.client_script = tmp_path / "client.py"
        self.client_script.write_text(CLIENT)
        self.server_ip = world.addresses["edge2"]["public"]
        edge = world.host("edge", "b1")
        self.server = edge.popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE,
                                 text=True)
        assert self.server.stdout.readline().strip() == "up"

    def seen(self, *ports: int) -> list[tuple[str, int]]:
        client = self.world.host("client", "a1")
        out = client.cmd(f"{sys.executable} {self.client_script} {self.server_ip} "
                         + " ".join(map(str, ports)))
        return [(a, int(p)) for a, p in (x.rsplit(":", 1) for x in json.loads(out))]

    def reaches_client(self) -> bool:
        """Whether a datagram from the far region's edge to the client's own (LAN) address
        arrives."""
        client, edge = self.world.host("client", "a1"), self.world.host("edge", "b1")
        listener = client.popen([sys.executable, "-c",
                                 "import socket; s = socket.socket(socket.AF_INET, "
                                 "socket.SOCK_DGRAM); s.bind(('0.0.0.0', 5556)); "
                                 "s.settimeout(1); print('up', flush=True); "
                                 "print(len(s.recvfrom(10)[0]))"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert listener.stdout.readline().strip() == "up"
        edge.cmd(f"{sys.executable} -c \"import socket; socket.socket(socket.AF_INET, "
                 f"socket.SOCK_DGRAM).sendto(b'x', ('10.1.1.2', 5556))\"")
        got = listener.stdout.readline().strip()
        listener.wait()
        return got == "1"

    def bindings(self) -> int:
        pub = self.world.host("pub", "a1")
        out = pub.cmd("conntrack -L -p udp --orig-src 10.1.1.2 2>/dev/null")
        return sum(1 for line in out.splitlines() if line.startswith("udp"))

    def close(self) -> None:
        self.server.kill()
        self.server.wait()


@pytest.fixture
def nat_world(request, tmp_path):
    spec = WorldSpec(regions=("a1", "b1"), clusters=(), nats={"a1": request.param})
    with World(spec, make_backend("userspace")) as world:
        env = NatWorld(world, tmp_path)
        try:
            yield env
        finally:
            env.close()


@pytest.mark.parametrize("nat_world", [NatSpec("endpoint-independent", udp_timeout_s=2)],
                         indirect=True)
def test_an_endpoint_independent_nat_keeps_a_sockets_port_rebinds_it_and_forgets_it(nat_world):
    first, second = nat_world.seen(7001, 7002)
    assert first[0] == second[0] == public_address(1)        # not the client's 10.1.1.2
    assert first[1] == second[1]                              # one port, any destination
    assert nat_world.bindings() == 2
    port = nat_world.world.nat_rebind("a1", ("10.1.1.2", 5555))
    [after] = nat_world.seen(7001)
    assert after == (public_address(1), port) and port != first[1]
    [again] = nat_world.seen(7002)                            # the new mapping, everywhere
    assert again == after
    time.sleep(3)                                             # idle past the 2 s timeout
    assert nat_world.bindings() == 0
    # nothing unasked crosses it: the far region sends to the client's LAN address directly
    assert not nat_world.reaches_client()


def test_a_world_with_a_nat_calibrates(mapping="symmetric"):
    """Calibration measures links (the last mile to the public router, router to router), which
    a NAT on the public router does not change: it holds in a world with one."""
    link = Impairment(delay_ms=10)
    spec = WorldSpec(regions=("a1", "b1"), clusters=("b1",), nats={"a1": NatSpec(mapping)},
                     impairments={("last_mile_up", "a1", "a1"): link,
                                  ("last_mile_down", "a1", "a1"): link,
                                  ("public", "a1", "b1"): link, ("public", "b1", "a1"): link})
    with World(spec, make_backend("userspace")) as world:
        report = calibrate(world, count=40)
    kinds = {p.kind for p in report.paths}
    assert report.ok and {"last_mile_up", "last_mile_down", "public"} <= kinds, \
        [(p.kind, p.src, p.dst, p.mean_ms, p.loss_pct) for p in report.paths]


@pytest.mark.parametrize("nat_world", [NatSpec("symmetric")], indirect=True)
def test_a_symmetric_nat_gives_each_destination_its_own_port(nat_world):
    seen = nat_world.seen(7001, 7002, 7001)
    assert {a for a, _ in seen} == {public_address(1)}
    assert seen[0][1] != seen[1][1] and seen[2] == seen[0]    # per destination, kept
    port = nat_world.world.nat_rebind("a1", ("10.1.1.2", 5555))
    a, b = nat_world.seen(7001, 7002)
    assert port <= a[1] < port + 1000 and port <= b[1] < port + 1000 and a[1] != b[1]


# In each edge host: UDP on the relay VIP's 7003 (bound to it, so answers come from it),
# answering with the edge's name and the address it saw.
TAGGED = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[2], 7003))
print("up", flush=True)
while True:
    data, src = s.recvfrom(100)
    s.sendto(f"{sys.argv[1]} {src[0]}".encode(), src)
"""


def test_a_handover_moves_the_clients_traffic_to_the_other_regions_access_and_back(tmp_path):
    """``handover``: a1's client leaves through b1's access link and NAT (b1's public
    address), to the anycast address's nearest edge there, b1's; its own last mile is down;
    the new link is calibrated with b1's last mile, and the client has no address on it (no
    new ICE candidate); ``hand_back`` puts everything back."""
    a_mile, b_mile = Impairment(delay_ms=4), Impairment(delay_ms=9)
    spec = WorldSpec(regions=("a1", "b1"), clusters=(), handovers=(("a1", "b1"),),
                     nats={"a1": NatSpec(), "b1": NatSpec()},
                     impairments={("last_mile_up", "a1", "a1"): a_mile,
                                  ("last_mile_down", "a1", "a1"): a_mile,
                                  ("last_mile_up", "b1", "b1"): b_mile,
                                  ("last_mile_down", "b1", "b1"): b_mile})
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    with World(spec, make_backend("userspace")) as world:
        servers = [world.host("edge", r).popen([sys.executable, "-c", TAGGED, r, RELAY_VIP],
                                               stdout=subprocess.PIPE, text=True)
                   for r in ("a1", "b1")]
        try:
            for server in servers:
                assert server.stdout.readline().strip() == "up"
            client = world.host("client", "a1")

            def seen() -> list[str]:
                out = client.cmd(f"{sys.executable} {script} {RELAY_VIP} 7003")
                return json.loads(out)[0].split()

            assert seen() == ["a1", public_address(1)]
            report = calibrate(world, count=40)
            handover = {p.kind: p for p in report.paths if p.kind.startswith("handover")}
            assert report.ok and set(handover) == {"handover_up", "handover_down"}
            assert all(8.5 < p.mean_ms < 11 for p in handover.values()), handover  # b1's 9 ms
            assert "inet " not in client.cmd("ip -4 addr show dev client1-eth1")

            assert world.handover("a1") == "b1"
            assert seen() == ["b1", public_address(2)]   # b1's edge, through b1's NAT
            assert world.link_directions("last_mile", "a1")[0].key in world.backend.stats()[
                "interfaces"]
            world.hand_back("a1")
            assert seen() == ["a1", public_address(1)]
        finally:
            for server in servers:
                server.kill()
                server.wait()


def test_a_handover_needs_nats_on_both_ends_and_two_regions():
    with pytest.raises(ValueError, match="behind a NAT"):
        WorldSpec(regions=("a1", "b1"), clusters=(), handovers=(("a1", "b1"),),
                  nats={"b1": NatSpec()})
    with pytest.raises(ValueError, match="two different regions"):
        WorldSpec(regions=("a1", "b1"), clusters=(), handovers=(("a1", "a1"),),
                  nats={"a1": NatSpec()})
