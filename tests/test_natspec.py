"""A NAT's specification in a world and a scenario file (topology/nat.py): what is refused
and how. No root, no network."""
from __future__ import annotations

import pytest

from topology import nat
from topology.nat import NatSpec
from topology.world import WorldSpec


def test_a_nat_spec_says_what_is_wrong(tmp_path):
    from scenarios.spec import Scenario, ScenarioError

    base = ("name: nat\nclusters: [na-east]\nsessions_per_region: 3\ncall_duration_s: 30\n"
            "start_rate: 1\n")
    path = tmp_path / "s.yaml"
    path.write_text(base + "nat: {mapping: symmetric, udp_timeout_s: 20}\n")
    assert Scenario.load(path).nat == NatSpec("symmetric", 20)
    path.write_text(base)
    assert Scenario.load(path).nat is None
    for bad, said in (("nat: {mapping: cone}", "nat mapping 'cone'"),
                      ("nat: {timeout: 3}", "a mapping with mapping"),
                      ("nat: {udp_timeout_s: 0.5}", "whole number")):
        path.write_text(base + bad + "\n")
        with pytest.raises(ScenarioError, match=said):
            Scenario.load(path)
    with pytest.raises(ValueError, match="mapping"):
        NatSpec("full-cone")
    with pytest.raises(ValueError, match="udp_timeout_s"):
        NatSpec(udp_timeout_s=0)
    with pytest.raises(ValueError, match="NAT regions"):
        WorldSpec(regions=("a1",), clusters=(), nats={"b1": NatSpec()})


LISTING = """\
udp      17 29 src=10.1.1.2 dst=10.5.4.2 sport=41893 dport=3478 src=10.5.4.2 dst=10.1.7.1 \
sport=3478 dport=40127 [ASSURED] mark=0 use=1
udp      17 29 src=10.1.1.2 dst=10.5.4.2 sport=41894 dport=3478 src=10.5.4.2 dst=10.1.7.1 \
sport=3478 dport=41894 mark=0 use=1
udp      17 29 src=10.1.1.3 dst=10.5.4.2 sport=5000 dport=3478 src=10.5.4.2 dst=10.1.7.1 \
sport=3478 dport=40001 mark=0 use=1
udp      17 29 src=10.5.4.2 dst=10.1.7.1 sport=3478 dport=40127 [UNREPLIED] src=10.1.7.1 \
dst=10.5.4.2 sport=40127 dport=3478 mark=0 use=1
conntrack v1.4.7 (conntrack-tools): 4 flow entries have been shown.
"""


def test_a_mapping_that_outlived_a_rebinding_is_found_by_its_old_public_port():
    """A rebinding to the block at 41000: the client socket still on public port 40127 is
    stale; the one already on 41894, another client's, and an inbound entry are not."""
    [stale] = nat.stale_mappings(LISTING, 1, ("10.1.1.2", None), 41000)
    assert "--orig-src 10.1.1.2 --orig-dst 10.5.4.2 --sport 41893 --dport 3478" in stale
    assert nat.stale_mappings(LISTING, 1, ("10.1.1.2", 41894), 41000) == []
    assert len(nat.stale_mappings(LISTING, 1, ("10.1.1.2", 41893), 41000)) == 1
    assert nat.stale_mappings(LISTING, 2, ("10.1.1.2", None), 41000) == []   # not region 2's


def test_rebound_ports_come_from_outside_the_clients_ephemeral_range():
    """An SNAT keeps a socket's own port when the rebinding's block holds it: a block inside
    the ephemeral range left a call now and then on its old public port (not rebound)."""
    low, high = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    first, last = nat.REBIND_PORTS
    assert last <= low or first > high, (nat.REBIND_PORTS, (low, high))
    assert (last - first) % nat.REBIND_BLOCK == 0
