"""A NAT's specification in a world and a scenario file (topology/nat.py): what is refused
and how. No root, no network."""
from __future__ import annotations

import pytest

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
