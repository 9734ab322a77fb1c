"""Faults on links while traffic runs: ``World.set_link`` / ``restore_link`` on a real two-region
world with the userspace engine, probed the way calibration probes (needs root).
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from topology.calibrate import PROBE_BYTES, Expectation, judge
from topology.impairment.factory import make_backend
from topology.impairment.model import BernoulliLoss, Impairment
from topology.probe import ProbeResult, udp_probe
from topology.impairment.model import link_down, with_extra_loss
from topology.world import ImpairedLink, World, WorldSpec

pytestmark = pytest.mark.world

# The two directions of the backbone differ, so a fault built per direction must keep each.
AB, BA = Impairment(delay_ms=20, jitter_ms=1), Impairment(delay_ms=25, jitter_ms=1)
LAST_MILE = Impairment(delay_ms=3)


@pytest.fixture(scope="module")
def world():
    # No public-internet impairment: that link is changed only once a fault asks for it.
    spec = WorldSpec(regions=("a1", "b1"), clusters=(), impairments={
        ("backbone", "a1", "b1"): AB, ("backbone", "b1", "a1"): BA,
        ("last_mile_up", "a1", "a1"): LAST_MILE, ("last_mile_down", "a1", "a1"): LAST_MILE})
    backend = make_backend("userspace", seed=5)
    with World(spec, backend) as w:
        engine = backend.engine_pid
        yield w
    assert not Path(f"/proc/{engine}").exists()


def probe(world: World, links: list[ImpairedLink], count: int, rate: float = 200.0,
          drain_s: float = 0.3) -> list[ProbeResult]:
    """Probe every direction in ``links`` at once, as calibration does."""
    with ThreadPoolExecutor(max_workers=len(links)) as pool:
        futures = [pool.submit(udp_probe, world.node(link.sender).ns_path,
                               world.node(link.receiver).ns_path, link.receiver_ip, count=count,
                               rate=rate, size=PROBE_BYTES, drain_s=drain_s) for link in links]
        return [f.result() for f in futures]


def verdicts(links: list[ImpairedLink], results: list[ProbeResult]):
    """Calibration's verdict on each direction against its configured impairment."""
    return [judge(Expectation.of(link.impairment), r.sent, r.first_delays_ms, r.reordered,
                  link.kind, link.src, link.dst, link.sender, link.receiver)
            for link, r in zip(links, results)]


def counters(world: World, link: ImpairedLink) -> dict:
    return world.backend.stats()["interfaces"][link.key]


def test_a_cut_backbone_passes_nothing_either_way_and_comes_back_as_configured(world):
    links = world.link_directions("backbone", "a1", "b1")
    assert [(l.src, l.dst, l.impairment) for l in links] == [("a1", "b1", AB), ("b1", "a1", BA)]
    before = verdicts(links, probe(world, links, 100))
    assert all(v.ok for v in before), before

    down = world.set_link("backbone", "a1", "b1", link_down)
    assert [d.impairment for d in down] == [link_down(AB), link_down(BA)]
    assert all(r.received == 0 for r in probe(world, links, 50)), "a cut link let packets by"
    for link in links:
        c = counters(world, link)
        assert c["fault"] and c["dropped_fault"] >= 50 and c["dropped_loss"] == 0, c

    assert world.restore_link("backbone", "a1", "b1") == links
    after = verdicts(links, probe(world, links, 100))
    assert all(v.ok for v in after), after  # delay, spread and (no) loss as configured
    assert not any(counters(world, link)["fault"] for link in links)


def test_a_50_percent_loss_burst_loses_about_half(world):
    links = world.link_directions("backbone", "b1", "a1")
    burst = world.set_link("backbone", "b1", "a1", lambda imp: with_extra_loss(imp, 50))
    assert [b.impairment.loss for b in burst] == [BernoulliLoss(50)] * 2
    assert [b.impairment.delay_ms for b in burst] == [25, 20]  # b1 -> a1 first
    n = 400
    results = probe(world, links, n, rate=400)
    world.restore_link("backbone", "b1", "a1")
    # Binomial(400, 0.5): sd 10; 5 sd either side fails a correct engine once in ~2 million
    band = 5 * math.sqrt(n * 0.25)
    for link, r in zip(links, results):
        lost = n - len(set(seq for seq, _ in r.arrivals))
        assert abs(lost - n / 2) <= band, (link.src, link.dst, r.summary())
        # what gets through is still delayed as configured
        assert abs(r.mean_ms - link.impairment.delay_ms) <= 1.5, r.summary()
    assert all(v.ok for v in verdicts(links, probe(world, links, 100)))


def test_a_last_mile_and_an_unimpaired_link_can_be_cut_too(world):
    mile = world.link_directions("last_mile", "a1")
    assert [l.kind for l in mile] == ["last_mile_up", "last_mile_down"]
    assert world.link_directions("last_mile", "a1", "a1") == mile
    world.set_link("last_mile", "a1", None, link_down)
    assert all(r.received == 0 for r in probe(world, mile, 30))
    world.restore_link("last_mile", "a1")
    assert all(r.received == 30 for r in probe(world, mile, 30))

    # The public internet was configured without impairment, so nothing was applied there:
    # the fault applies it on demand, and the restored link is as fast as before.
    public = world.link_directions("public", "a1", "b1")
    assert all(p.impairment.is_null and p not in world.links for p in public)
    world.set_link("public", "a1", "b1", link_down)
    assert all(r.received == 0 for r in probe(world, public, 30))
    world.restore_link("public", "a1", "b1")
    results = probe(world, public, 30)
    assert all(r.received == 30 and r.mean_ms < 1.5 for r in results), \
        [r.summary() for r in results]


def test_links_that_are_not_in_the_world_are_refused_by_name(world):
    with pytest.raises(ValueError, match=r"backbone/a1/zz: 'zz' is not a region of this "
                                         r"world \(a1, b1\)"):
        world.set_link("backbone", "a1", "zz", link_down)
    with pytest.raises(ValueError, match="public/a1/a1: a public link joins two different"):
        world.restore_link("public", "a1", "a1")
    with pytest.raises(ValueError, match=r"last_mile/a1: a last mile is one region's"):
        world.set_link("last_mile", "a1", "b1", link_down)
    with pytest.raises(ValueError, match="unknown link kind 'satellite'"):
        world.set_link("satellite", "a1", "b1", link_down)
    assert not any(c["fault"] for c in world.backend.stats()["interfaces"].values())
