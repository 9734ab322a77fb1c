"""Impairment backends: netem's commands (pure), backend choice checked against the kernel, the
userspace NFQUEUE engine measured on two namespaces joined by a veth, and its failure modes.

Needs root; never skipped: a testbed whose impairment is untested measures nothing. Whether the
kernel has netem is asked independently (tests/netem_kernel.py): the tests that need netem run
only where it has it, the ones about its absence only where it has none, the rest everywhere
(userspace tests ask for that backend by name).
"""
from __future__ import annotations

import json
import logging
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from topology.impairment import bench
from topology.impairment.backend import (BackendUnavailable, Detection, ImpairmentError,
                                         detect, iface_key)
from topology.impairment.factory import make_backend
from topology.impairment.direction import Direction
from topology.impairment.engine import CORES
from topology.impairment.lab import pair_lab
from topology.impairment.model import (BernoulliLoss, GilbertElliottLoss, Impairment, NetNode,
                                       impairment_from_dict, impairment_to_dict, link_down,
                                       with_extra_loss)
from topology.impairment.netem import (NetemBackend, change_command, change_problem, netem_args,
                                       netem_commands, parse_qdisc_stats, teardown_commands)
from topology.netns import entered
from topology import probe as probe_module
from topology.probe import PROBE_REALTIME, udp_probe
from topology.impairment.userspace import DEFAULT_REALTIME, UserspaceBackend, rule_spec
from tests.conftest import needs
from tests.netem_kernel import kernel, netem, no_netem  # noqa: F401 (fixtures)

# -- pure: netem commands, the per-packet model -------------------------------------------------


def test_netem_commands_redirect_ingress_to_an_ifb_with_netem_on_it():
    cmds = netem_commands("eth0", "vifb0", Impairment(delay_ms=20, jitter_ms=5))
    assert cmds[0] == ["ip", "link", "add", "vifb0", "type", "ifb"]
    assert cmds[1] == ["ip", "link", "set", "vifb0", "up"]
    assert cmds[2] == ["tc", "qdisc", "add", "dev", "vifb0", "root", "handle", "1:", "netem",
                       "limit", "20000", "delay", "20000us", "5000us", "distribution", "normal"]
    # the redirect comes after netem is in place: nothing passes unimpaired meanwhile
    assert cmds[3] == ["tc", "qdisc", "add", "dev", "eth0", "handle", "ffff:", "ingress"]
    assert cmds[4] == ["tc", "filter", "add", "dev", "eth0", "parent", "ffff:", "protocol", "all",
                       "u32", "match", "u32", "0", "0", "action", "mirred", "egress", "redirect",
                       "dev", "vifb0"]
    assert teardown_commands("eth0", "vifb0") == [
        ["tc", "qdisc", "del", "dev", "eth0", "handle", "ffff:", "ingress"],
        ["ip", "link", "del", "vifb0"]]


def test_an_egress_impairment_is_netem_on_the_interface_or_a_postrouting_queue():
    imp = Impairment(delay_ms=6, jitter_ms=1)
    assert netem_commands("eth0", "vifb0", imp, egress=True) == [
        ["tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "netem", *netem_args(imp)]]
    assert teardown_commands("eth0", "vifb0", egress=True) == [
        ["tc", "qdisc", "del", "dev", "eth0", "root"]]
    assert rule_spec("eth0", 4201)[:3] == ["PREROUTING", "-i", "eth0"]
    assert rule_spec("eth0", 4201, egress=True)[:3] == ["POSTROUTING", "-o", "eth0"]
    assert rule_spec("eth0", 4201, egress=True)[-2:] == ["--queue-num", "4201"]
    node = NetNode("pub1", "/proc/1/ns/net")
    assert iface_key(node, "pub1-eth0") == "pub1:pub1-eth0"
    assert iface_key(node, "pub1-eth0", egress=True) == "pub1:pub1-eth0>"


def test_netem_args_loss_models_rate_uniform_and_fifo():
    assert netem_args(Impairment()) == ["limit", "20000"]
    assert netem_args(Impairment(loss=BernoulliLoss(2))) == ["limit", "20000", "loss", "random", "2%"]
    assert netem_args(Impairment(loss=GilbertElliottLoss(p=1, r=25)))[2:] == [
        "loss", "gemodel", "1%", "25%", "100%", "0%"]
    # uniform: jitter is an sd, netem's "delay D J" is uniform on D +- J
    assert netem_args(Impairment(delay_ms=10, jitter_ms=2, distribution="uniform"))[2:] == [
        "delay", "10000us", "3464us"]
    # reorder=False with jitter: the rate trick keeps netem FIFO
    assert netem_args(Impairment(delay_ms=50, jitter_ms=10, reorder=False))[-2:] == ["rate", "10gbit"]
    assert "rate" not in netem_args(Impairment(delay_ms=50, jitter_ms=10))
    assert "rate" not in netem_args(Impairment(delay_ms=50, reorder=False))  # no jitter: FIFO anyway
    assert netem_args(Impairment(delay_ms=5, jitter_ms=1, reorder=False, rate_mbit=1.5))[-2:] == [
        "rate", "1500000bit"]


def test_parse_qdisc_stats():
    text = ("qdisc netem 1: root refcnt 2 limit 20000 delay 20ms  5ms\n"
            " Sent 123456 bytes 980 pkt (dropped 20, overlimits 0 requeues 0)\n"
            " backlog 600b 3p requeues 0\n")
    assert parse_qdisc_stats(text) == {"seen": 1003, "delayed": 980, "dropped_loss": 20, "held": 3}
    assert parse_qdisc_stats("") == {}


def test_impairment_round_trips_through_json():
    for imp in (Impairment(), Impairment(delay_ms=5, jitter_ms=1, distribution="uniform",
                                         reorder=False, loss=BernoulliLoss(1), rate_mbit=10),
                Impairment(loss=GilbertElliottLoss(p=1, r=25, bad_loss=90, good_loss=0.5))):
        assert impairment_from_dict(json.loads(json.dumps(impairment_to_dict(imp)))) == imp


def _loss_runs(lost: list[bool]) -> list[int]:
    runs, run = [], 0
    for x in lost + [False]:
        if x:
            run += 1
        elif run:
            runs.append(run)
            run = 0
    return runs


def test_direction_loss_models_match_their_expectations():
    ge = Direction(Impairment(loss=GilbertElliottLoss(p=1, r=25)), random.Random(1))
    lost = [ge.decide(0.0) is None for _ in range(200_000)]
    assert 100 * sum(lost) / len(lost) == pytest.approx(100 / 26, rel=0.1)  # 3.85%
    assert statistics.fmean(_loss_runs(lost)) == pytest.approx(4.0, rel=0.1)
    bern = Direction(Impairment(loss=BernoulliLoss(2)), random.Random(2))
    lost = [bern.decide(0.0) is None for _ in range(200_000)]
    assert 100 * sum(lost) / len(lost) == pytest.approx(2.0, rel=0.1)
    assert statistics.fmean(_loss_runs(lost)) < 1.1


def test_direction_delays_fifo_and_rate():
    for dist in ("normal", "uniform"):
        d = Direction(Impairment(delay_ms=50, jitter_ms=10, distribution=dist), random.Random(3))
        delays = [d.decide(1.0) - 1.0 for _ in range(50_000)]
        assert statistics.fmean(delays) == pytest.approx(0.050, abs=0.0005)
        assert statistics.pstdev(delays) == pytest.approx(0.010, rel=0.05)
    # no reorder: never before the previous packet, which raises the mean at high rates
    d = Direction(Impairment(delay_ms=50, jitter_ms=10, reorder=False), random.Random(4))
    releases = [d.decide(i / 1000) for i in range(5000)]
    assert releases == sorted(releases)
    assert statistics.fmean(r - i / 1000 for i, r in enumerate(releases)) > 0.055
    # rate: 1000 bytes at 8 Mbit/s = 1 ms each, back to back
    d = Direction(Impairment(rate_mbit=8), random.Random(5))
    assert [round(d.decide(0.0, 1000), 6) for _ in range(3)] == [0.001, 0.002, 0.003]
    # clipped at zero
    d = Direction(Impairment(delay_ms=1, jitter_ms=10), random.Random(6))
    assert min(d.decide(0.0) for _ in range(1000)) == 0.0


def test_link_down_and_extra_loss_keep_the_configured_delay():
    imp = Impairment(delay_ms=20, jitter_ms=2, reorder=False, loss=BernoulliLoss(1))
    down = link_down(imp)
    assert down.loss == BernoulliLoss(100) and (down.delay_ms, down.jitter_ms) == (20, 2)
    assert not down.reorder
    burst = with_extra_loss(imp, 50)
    assert burst.delay_ms == 20 and burst.expected_loss_pct == pytest.approx(50.5)  # 1-.99*.5
    assert with_extra_loss(Impairment(), 30).loss == BernoulliLoss(30)
    ge = with_extra_loss(Impairment(loss=GilbertElliottLoss(p=1, r=25)), 50).loss
    assert (ge.p, ge.r, ge.bad_loss, ge.good_loss) == (1, 25, 100, 50)  # still bursty
    assert ge.expected_pct == pytest.approx(100 - (100 - 100 / 26) * 0.5)
    for bad in (0, -5, 101):
        with pytest.raises(ValueError, match="extra loss"):
            with_extra_loss(imp, bad)


def test_a_changed_direction_keeps_its_random_stream_loss_state_and_order():
    d = Direction(Impairment(delay_ms=100, reorder=False), random.Random(7))
    assert d.decide(0.0) == pytest.approx(0.1)
    faster = d.changed(Impairment(delay_ms=10, reorder=False))
    assert faster.decide(0.01) == pytest.approx(0.1)  # FIFO: not before the held packet
    assert faster.decide(0.2) == pytest.approx(0.21)
    down = faster.changed(link_down(faster.impairment))
    assert all(down.decide(1.0 + i) is None for i in range(1000))
    ge = Direction(Impairment(loss=GilbertElliottLoss(p=50, r=1)), random.Random(8))
    while not ge._bad:
        ge.decide(0.0)
    assert ge.changed(with_extra_loss(ge.impairment, 10))._bad  # the burst goes on


def test_netem_change_command_and_what_netem_would_keep():
    imp = Impairment(delay_ms=20, jitter_ms=5)
    assert change_command("vifb0", link_down(imp)) == [
        "tc", "qdisc", "change", "dev", "vifb0", "root", "handle", "1:", "netem", "limit",
        "20000", "delay", "20000us", "5000us", "distribution", "normal", "loss", "random",
        "100%"]
    # the fault helpers keep what netem would keep anyway
    assert change_problem(imp, link_down(imp)) is None
    assert change_problem(link_down(imp), imp) is None
    assert change_problem(imp, with_extra_loss(imp, 30)) is None
    rated = Impairment(delay_ms=5, rate_mbit=10)
    assert change_problem(rated, link_down(rated)) is None
    assert "rate" in change_problem(rated, Impairment(delay_ms=5))
    assert "distribution" in change_problem(imp, Impairment(delay_ms=20, jitter_ms=5,
                                                             distribution="uniform"))
    assert change_problem(imp, Impairment(delay_ms=20)) is None  # no jitter: no table used


class _FakeNetemNode:
    """Records commands; ``tc -s qdisc show`` reports ``self.dropped`` drops."""

    def __init__(self) -> None:
        self.name, self.ns_path, self.commands, self.dropped = "h1", "/nonexistent", [], 0

    def run(self, *cmd: str, check: bool = True) -> str:
        self.commands.append(list(cmd))
        if cmd[:3] == ("tc", "-s", "qdisc"):
            return (f"qdisc netem 1: root refcnt 2 limit 20000\n Sent 1000 bytes 10 pkt "
                    f"(dropped {self.dropped}, overlimits 0 requeues 0)\n backlog 0b 0p\n")
        return ""


def test_netem_change_counts_fault_drops_between_the_changes():
    node, imp = _FakeNetemNode(), Impairment(delay_ms=20, loss=BernoulliLoss(1))
    be = NetemBackend()
    be.apply(node, "eth0", imp)
    with pytest.raises(ImpairmentError, match="h1:eth1 was never applied"):
        be.change(node, "eth1", imp)
    be.start()
    node.dropped = 5
    be.change(node, "eth0", link_down(imp))
    assert node.commands[-1] == change_command("vifb0", link_down(imp))
    node.dropped = 105
    s = be.stats()["interfaces"]["h1:eth0"]
    assert (s["dropped_loss"], s["dropped_fault"], s["fault"]) == (5, 100, True)
    be.change(node, "eth0", imp)
    node.dropped = 107
    s = be.stats()["interfaces"]["h1:eth0"]
    assert (s["dropped_loss"], s["dropped_fault"], s["fault"]) == (7, 100, False)
    with pytest.raises(ImpairmentError, match="keep the old rate"):
        rated = NetemBackend()
        rated.apply(node, "eth0", Impairment(rate_mbit=1))
        rated.change(node, "eth0", Impairment())


def test_userspace_change_of_an_interface_never_applied_is_refused():
    with pytest.raises(ImpairmentError, match="ghost:x0 was never applied"):
        UserspaceBackend().change(NetNode("ghost", "/nonexistent"), "x0", Impairment())


# -- backend choice -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
@needs("netns")
def root():
    """For the tests that make namespaces (skipped when not root: tests/conftest.py)."""


def test_detect_says_what_the_kernel_supports_and_why(root, kernel, caplog):
    found = detect()
    assert isinstance(found, Detection)
    assert found.name == kernel.backend  # what our own tc in our own namespace said
    if kernel.has_netem:
        assert "can make a netem qdisc" in found.reason
    else:
        assert "no sch_netem" in found.reason and kernel.answer in found.reason
    with caplog.at_level(logging.INFO, logger="voiceedge.impairment"):
        chosen = make_backend(None)
    assert chosen.name == kernel.backend
    assert isinstance(chosen, NetemBackend if kernel.has_netem else UserspaceBackend)
    assert f"impairment backend: {kernel.backend} (chosen automatically: {found.reason})" \
        in caplog.text
    assert isinstance(make_backend("userspace"), UserspaceBackend)
    with pytest.raises(ValueError, match="unknown impairment backend"):
        make_backend("tbf")


def test_netem_is_refused_where_the_kernel_has_none(root, no_netem):
    with pytest.raises(BackendUnavailable, match="no sch_netem") as err:
        make_backend("netem")
    assert no_netem.answer in str(err.value)


def test_netem_is_used_when_asked_where_the_kernel_has_it(root, netem):
    assert isinstance(make_backend("netem"), NetemBackend)


# -- on two namespaces joined by a veth -------------------------------------------------------------

ENGINE_MODULE = b"topology.impairment.engine"


def _our_engines() -> list[int]:
    """Engine processes that are children of this test process."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ENGINE_MODULE in cmdline and ppid == os.getpid():
            pids.append(int(proc.name))
    return pids


def _leftovers(*nodes) -> list[str]:
    """NFQUEUE rules and bound queues left in ``nodes``."""
    found = []
    for node in nodes:
        for save in ("iptables-save", "ip6tables-save"):
            found += [f"{node.name}: {line}" for line in node.run(save).splitlines()
                      if "NFQUEUE" in line]
        queues = node.run("cat", "/proc/net/netfilter/nfnetlink_queue").strip()
        if queues:
            found.append(f"{node.name}: bound queue {queues}")
    return found


@pytest.fixture(scope="module")
def lab(root):
    with pair_lab() as world:
        yield world
        assert not _leftovers(world.a, world.b)
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"veimp-{os.getpid()}" not in names
    assert not Path("/proc/net/netfilter/nfnetlink_queue").read_text().strip()
    assert not _our_engines()


@pytest.fixture
def backends(lab):
    """Make userspace backends (asked for by name: these tests are about that engine); every
    one is stopped afterwards, whatever happened."""
    made: list = []

    def make(**options) -> UserspaceBackend:
        made.append(make_backend("userspace", **options))
        return made[-1]

    yield make
    for b in made:
        b.stop()
    assert not _leftovers(lab.a, lab.b)


def probe(lab, **kw):
    return udp_probe(lab.a.ns_path, lab.b.ns_path, kw.pop("addr", lab.addr_b), **kw)


def _tolerance_ms(configured: float) -> float:
    return max(1.0, 0.05 * configured) + 0.5


def test_delay_and_jitter_normal(lab, backends):
    be = backends(seed=11)
    be.apply(lab.b, lab.if_b, Impairment(delay_ms=20, jitter_ms=5))
    be.start()
    r = probe(lab, count=300, rate=100)
    assert r.received == 300
    assert abs(r.mean_ms - 20) <= _tolerance_ms(20), r.summary()
    assert r.sd_ms == pytest.approx(5, abs=0.75), r.summary()
    assert r.reordered > 0  # reorder=True: jitter larger than the spacing lets packets overtake
    s = be.stats()
    iface = s["interfaces"][f"{lab.b.name}:vb"]
    assert iface["seen"] >= 300 and iface["delayed"] == iface["seen"] and iface["dropped_loss"] == 0
    assert iface["ipv6"] and iface["kernel"]["queue_dropped"] == 0
    assert s["cpu_seconds"] > 0 and s["lateness_p50_us"] is not None
    assert s["lateness_p50_us"] < 1000


def test_ipv6_is_impaired_too(lab, backends):
    be = backends()
    be.apply(lab.b, lab.if_b, Impairment(delay_ms=10))
    be.start()
    r = probe(lab, addr=lab.addr6_b, count=50, rate=200)
    assert r.received == 50 and abs(r.mean_ms - 10) <= _tolerance_ms(10), r.summary()
    assert r.percentile_ms(0.0) >= 10.0


def test_bernoulli_loss_within_a_binomial_band(lab, backends):
    be = backends(seed=21, ipv6=False)  # IPv4 only: no neighbour discovery in the counts
    be.apply(lab.b, lab.if_b, Impairment(loss=BernoulliLoss(2)))
    be.start()
    n = 3000
    r = probe(lab, count=n, rate=1000, drain_s=0.2)
    band = 4 * math.sqrt(n * 0.02 * 0.98)  # 4 sd of the binomial
    assert abs((n - r.received) - 0.02 * n) <= band, r.summary()
    iface = be.stats()["interfaces"][f"{lab.b.name}:vb"]
    assert iface["seen"] == n and iface["dropped_loss"] == n - r.received  # every loss is ours
    assert not iface["ipv6"]


def test_both_cores_lose_the_same_packets_for_the_same_seed(lab, backends):
    """The native core (the default) and the Python reference draw the same random stream
    per packet, so the same seed and the same packets lose the same sequence numbers."""
    lost = {}
    for core in CORES:
        be = backends(seed=23, ipv6=False, core=core)
        be.apply(lab.b, lab.if_b, Impairment(delay_ms=3, jitter_ms=1,
                                             loss=GilbertElliottLoss(p=3, r=25)))
        be.start()
        r = probe(lab, count=1500, rate=1000, drain_s=0.2)
        stats = be.stats()
        be.stop()
        assert stats["core"] == core
        arrived = {seq for seq, _ in r.arrivals}
        lost[core] = sorted(set(range(1500)) - arrived)
        assert stats["interfaces"][f"{lab.b.name}:vb"]["dropped_loss"] == len(lost[core])
        mean = statistics.fmean(r.first_delays_ms)
        assert abs(mean - 3) <= _tolerance_ms(3), (core, r.summary())
    assert lost["native"] and lost["native"] == lost["python"]


def test_gilbert_elliott_loss_is_bursty(lab, backends):
    be = backends(seed=31)
    loss = GilbertElliottLoss(p=1, r=25)  # 3.85% expected, bursts of 4 on average
    be.apply(lab.b, lab.if_b, Impairment(loss=loss))
    be.start()
    r = probe(lab, count=6000, rate=2000, drain_s=0.2)
    assert 1.5 <= r.loss_pct <= 6.5, r.summary()
    assert statistics.fmean(r.loss_bursts) > 1.5, r.summary()


def test_reorder_false_keeps_order_and_reorder_true_does_not(lab, backends):
    jittery = dict(delay_ms=20, jitter_ms=10)
    fifo = backends(seed=41)
    fifo.apply(lab.b, lab.if_b, Impairment(reorder=False, **jittery))
    fifo.start()
    kept = probe(lab, count=500, rate=500, drain_s=0.2)
    fifo.stop()
    free = backends(seed=41)
    free.apply(lab.b, lab.if_b, Impairment(**jittery))
    free.start()
    mixed = probe(lab, count=500, rate=500, drain_s=0.2)
    assert kept.received == mixed.received == 500
    assert kept.reordered == 0, kept.summary()
    assert mixed.reordered > 50, mixed.summary()  # the check can see reordering when it happens


def test_rate_serialises_packets(lab, backends):
    be = backends()
    be.apply(lab.b, lab.if_b, Impairment(rate_mbit=8))  # 1 us per byte
    be.start()
    # bursts of 20 back-to-back datagrams of 1000 bytes on the wire (972 + UDP 8 + IPv4 20)
    r = probe(lab, count=60, rate=100, burst=20, size=972, drain_s=0.2)
    assert r.received == 60
    gaps = [b - a for a, b in zip(r.recv_ms, r.recv_ms[1:]) if b - a < 50]
    assert statistics.median(gaps) == pytest.approx(1.0, abs=0.15), gaps


def test_killed_engine_blackholes_traffic(lab, backends):
    be = backends()
    be.apply(lab.b, lab.if_b, Impairment(delay_ms=5))
    be.start()
    assert probe(lab, count=20, rate=200, drain_s=0.1).received == 20
    os.kill(be.engine_pid, signal.SIGKILL)
    after = probe(lab, count=50, rate=200, drain_s=0.2)
    assert after.received == 0, "a dead engine must not let traffic through unimpaired"
    with pytest.raises(ImpairmentError, match="not running"):
        be.stats()
    be.stop()
    assert not _leftovers(lab.a, lab.b)
    assert probe(lab, count=20, rate=200, drain_s=0.1).received == 20  # the rule is gone


def test_sigterm_stops_the_engine_cleanly(lab, backends):
    be = backends()
    be.apply(lab.b, lab.if_b, Impairment(delay_ms=1))
    be.start()
    pid = be.engine_pid
    os.kill(pid, signal.SIGTERM)
    assert be._engine.proc.wait(timeout=5) == 0  # exit 0: it unbound and left on its own
    assert "bound queue" not in "\n".join(_leftovers(lab.b))
    assert probe(lab, count=20, rate=200, drain_s=0.1).received == 0  # the rule stays: blackhole
    be.stop()
    assert not _leftovers(lab.a, lab.b)


def test_stop_removes_everything_and_is_idempotent(lab, backends):
    be = backends()
    be.apply(lab.b, lab.if_b, Impairment(delay_ms=3))
    be.start()
    be.apply(lab.a, lab.if_a, Impairment(delay_ms=3))  # after start: takes effect at once
    assert _leftovers(lab.a) and _leftovers(lab.b)
    assert probe(lab, count=20, rate=200, drain_s=0.1).mean_ms >= 3
    engine = be.engine_pid
    s = be.stats()
    assert set(s["interfaces"]) == {f"{lab.a.name}:va", f"{lab.b.name}:vb"}
    be.stop()
    assert not _leftovers(lab.a, lab.b)
    assert not Path(f"/proc/{engine}").exists() and engine not in _our_engines()
    be.stop()
    # A delay left behind would hold back every datagram; one a loaded host schedules late
    # (CI saw one at ~20 ms: a mean of 1.13 ms) says nothing about the rule, so the median.
    r = probe(lab, count=20, rate=200, drain_s=0.1)
    assert r.received == 20 and r.percentile_ms(0.5) < 1, r.summary()


def _lab_sockets(lab) -> tuple[socket.socket, socket.socket]:
    """(a UDP socket in b's namespace, one in a's): what b receives crosses the impairment."""
    with entered(lab.b.ns_path):
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with entered(lab.a.ns_path):
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    return rx, tx


def test_stop_releases_what_the_engine_holds(lab, backends):
    be = backends(ipv6=False)  # IPv4 only: a neighbour discovery packet would be held too
    be.apply(lab.b, lab.if_b, Impairment(delay_ms=2000))
    be.start()
    rx, tx = _lab_sockets(lab)
    with rx, tx:
        rx.bind((lab.addr_b, 0))
        rx.settimeout(1.0)
        for i in range(10):
            tx.sendto(b"held %d" % i, rx.getsockname())
        time.sleep(0.2)
        assert be.stats()["interfaces"][f"{lab.b.name}:vb"]["held"] == 10
        t0 = time.monotonic()
        be.stop()
        got = [rx.recv(64) for _ in range(10)]
    assert sorted(got) == sorted(b"held %d" % i for i in range(10))
    assert time.monotonic() - t0 < 1.5  # released at stop, not after their 2 s


def test_change_at_runtime_keeps_held_packets_and_counts_fault_drops(lab, backends):
    configured = Impairment(delay_ms=400)
    be = backends(ipv6=False)
    be.apply(lab.b, lab.if_b, configured)
    be.start()
    key = f"{lab.b.name}:vb"
    rx, tx = _lab_sockets(lab)
    with rx, tx:
        rx.bind((lab.addr_b, 0))
        rx.settimeout(0.2)
        t0 = time.monotonic()
        for i in range(10):
            tx.sendto(b"before %d" % i, rx.getsockname())
        time.sleep(0.1)
        be.change(lab.b, lab.if_b, link_down(configured))
        for i in range(10):
            tx.sendto(b"during %d" % i, rx.getsockname())
        got = []
        while time.monotonic() - t0 < 1.0:
            try:
                got.append((rx.recv(64), time.monotonic() - t0))
            except TimeoutError:
                pass
    # the held ones arrive at their time; the ones sent during the cut are lost
    assert sorted(m for m, _ in got) == sorted(b"before %d" % i for i in range(10))
    assert all(0.39 < t < 0.6 for _, t in got), got
    s = be.stats()["interfaces"][key]
    assert (s["seen"], s["delayed"], s["held"]) == (20, 10, 0)
    assert (s["dropped_loss"], s["dropped_fault"], s["fault"], s["changes"]) == (0, 10, True, 1)
    be.change(lab.b, lab.if_b, configured)
    r = probe(lab, count=20, rate=200, drain_s=0.6)
    assert r.received == 20 and abs(r.mean_ms - 400) <= _tolerance_ms(400), r.summary()
    s = be.stats()["interfaces"][key]
    assert (s["dropped_fault"], s["fault"], s["changes"]) == (10, False, 2)
    with pytest.raises(ImpairmentError, match="never applied"):
        be.change(lab.a, lab.if_a, configured)


def test_a_change_before_start_is_in_force_from_start(lab, backends):
    be = backends(ipv6=False)
    be.apply(lab.b, lab.if_b, Impairment(delay_ms=2))
    be.change(lab.b, lab.if_b, link_down(Impairment(delay_ms=2)))
    be.start()
    assert probe(lab, count=20, rate=200, drain_s=0.1).received == 0
    s = be.stats()["interfaces"][f"{lab.b.name}:vb"]
    assert s["dropped_fault"] == 20 and s["fault"]


def test_a_failed_apply_after_start_leaves_the_rest_working(lab, backends):
    be = backends()
    be.apply(lab.b, lab.if_b, Impairment(delay_ms=2))
    be.start()
    with pytest.raises(ImpairmentError, match="ghost:x0"):
        be.apply(NetNode("ghost", "/var/run/netns/no-such-namespace"), "x0", Impairment(delay_ms=1))
    assert set(be.stats()["interfaces"]) == {f"{lab.b.name}:vb"}
    assert probe(lab, count=20, rate=200, drain_s=0.1).mean_ms >= 2


def test_a_busy_queue_fails_start_clearly(lab, backends):
    holder = backends(queue_base=4300)
    holder.apply(lab.b, lab.if_b, Impairment(delay_ms=1))
    holder.start()
    rival = backends(queue_base=4300)
    rival.apply(lab.b, "lo", Impairment(delay_ms=1))
    with pytest.raises(ImpairmentError, match="holds this queue"):
        rival.start()
    assert rival.engine_pid is None and len(_our_engines()) == 1
    assert "--queue-num 4300" in "\n".join(_leftovers(lab.b))  # the holder's rule only
    assert "-i lo" not in "\n".join(_leftovers(lab.b))


def _netem_leftovers(node) -> list[str]:
    """IFB devices and ingress qdiscs the netem backend could leave in ``node``."""
    found = [line for line in node.run("ip", "-o", "link").splitlines() if "vifb" in line]
    found += [line for line in node.run("tc", "qdisc", "show").splitlines() if "ingress" in line]
    return found


def test_netem_backend_fails_without_netem_and_leaves_nothing(lab, no_netem):
    be = NetemBackend()
    be.apply(lab.b, lab.if_b, Impairment(delay_ms=5))
    with pytest.raises(ImpairmentError, match="netem"):
        be.start()
    assert not _netem_leftovers(lab.b)
    be.stop()


def test_netem_backend_impairs_and_leaves_nothing(lab, netem):
    be = NetemBackend()
    be.apply(lab.b, lab.if_b, Impairment(delay_ms=20, jitter_ms=5))
    with be:
        assert _netem_leftovers(lab.b)  # the IFB and the ingress redirect are in place
        r = probe(lab, count=300, rate=100)
        s = be.stats()
    assert r.received == 300
    assert abs(r.mean_ms - 20) <= _tolerance_ms(20), r.summary()
    assert r.sd_ms == pytest.approx(5, abs=0.75), r.summary()
    assert s["backend"] == "netem" and s["interfaces"][f"{lab.b.name}:vb"]["seen"] >= 300
    assert not _netem_leftovers(lab.b)
    r = probe(lab, count=20, rate=200, drain_s=0.1)
    assert r.received == 20 and r.percentile_ms(0.5) < 1, r.summary()  # as above: the median
    be.stop()  # idempotent


def test_bench_reports_cost_and_accuracy(root, capsys):
    import argparse

    parser = argparse.ArgumentParser()
    bench.add_parser(parser.add_subparsers())
    # The floor phase as long as the impaired one: the probe's fixed cost (its start, its
    # drain) spread over 100 packets against 500 made the floor 10-20 us a packet dearer and
    # hid the engine (CI once measured 0.37 us added).
    args = parser.parse_args(["impairment", "--json", "--rate", "500", "--seconds", "1",
                              "--delay-ms", "10"])
    t0 = time.monotonic()
    assert bench.run(args) == 0
    reports = json.loads(capsys.readouterr().out)
    assert [r["config"]["core"] for r in reports] == ["python", "native"]  # side by side
    for report in reports:
        assert report["received"] == report["sent"] == 500
        assert abs(report["added_mean_ms"] - 10) <= _tolerance_ms(10)
        assert report["cpu_us_per_packet"] > 0 and report["lateness_p50_us"] is not None
        assert report["kernel_dropped"] == 0
        assert report["host_us_per_packet_floor"] > 0 and report["host_us_per_packet"] > 0
    # The Python engine costs tens of us a packet (its own CPU): the host's busy time, with
    # it against without it, must show that.
    assert reports[0]["added_host_us_per_packet"] > 10, reports[0]
    assert time.monotonic() - t0 < 30


def test_bench_refuses_an_unknown_core(capsys):
    import argparse

    from voiceedge.errors import UserError

    parser = argparse.ArgumentParser()
    bench.add_parser(parser.add_subparsers())
    with pytest.raises(UserError, match="unknown engine core 'rust'"):
        bench.run(parser.parse_args(["impairment", "--core", "native,rust"]))


def test_the_seed_variable_seeds_the_userspace_backend_and_a_bad_one_is_refused(monkeypatch):
    from topology.impairment.seed import SEED_ENV

    monkeypatch.setenv(SEED_ENV, "41")
    assert make_backend("userspace").seed == 41
    assert make_backend("userspace", seed=7).seed == 7  # an explicit seed wins
    monkeypatch.setenv(SEED_ENV, "")
    assert make_backend("userspace").seed is None
    monkeypatch.setenv(SEED_ENV, "forty-one")
    with pytest.raises(ValueError, match="must be an integer"):
        make_backend("userspace")


def test_a_bad_seed_variable_is_one_line_before_anything_runs():
    proc = subprocess.run([sys.executable, "-m", "voiceedge", "calibrate", "--regions", "apac-se"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "VOICEEDGE_IMPAIRMENT_SEED": "x"})
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("voiceedge calibrate: VOICEEDGE_IMPAIRMENT_SEED must be an "
                                   "integer, not 'x'")


def test_the_engine_runs_at_real_time_priority_unless_told_not_to(lab, backends):
    """The wire first: a due packet is released while the emulated hosts wait (the engine's
    SCHED_FIFO priority, above the flood bench's relay at 10); 0 keeps it ordinary."""
    first = backends()
    first.apply(lab.b, lab.if_b, Impairment(delay_ms=1))
    first.start()
    assert os.sched_getscheduler(first.engine_pid) == os.SCHED_FIFO
    assert os.sched_getparam(first.engine_pid).sched_priority == DEFAULT_REALTIME > 10
    assert first.engine_realtime == DEFAULT_REALTIME
    assert first.stats()["realtime"] == DEFAULT_REALTIME
    first.stop()
    ordinary = backends(realtime=0)
    ordinary.apply(lab.b, lab.if_b, Impairment(delay_ms=1))
    ordinary.start()
    assert os.sched_getscheduler(ordinary.engine_pid) == os.SCHED_OTHER
    assert ordinary.engine_realtime == 0 and ordinary.stats()["realtime"] == 0


def test_an_engine_refused_real_time_priority_runs_ordinary_and_says_so(root):
    """As user nobody (no CAP_SYS_NICE, no RLIMIT_RTPRIO) the engine still starts, ordinary,
    and its hello says priority 0."""
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable,
         "-m", "topology.impairment.engine", "--realtime", str(DEFAULT_REALTIME)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)})
    try:
        hello = json.loads(proc.stdout.readline())
        assert hello["ready"] and hello["realtime"] == 0
        assert os.sched_getscheduler(proc.pid) == os.SCHED_OTHER
    finally:
        proc.stdin.close()  # the end of its input stops it
        assert proc.wait(timeout=10) == 0, proc.stderr.read()


def test_engine_refuses_a_priority_that_is_not_one():
    out = subprocess.run([sys.executable, "-m", "topology.impairment.engine", "--realtime",
                          "100"], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 2 and "real-time priority (1-99)" in out.stderr


def test_the_probe_threads_run_at_real_time_priority(lab):
    """Calibration measures the links, not the prober's own wake-ups: its threads run at
    SCHED_FIFO (below the engine), so a probe on a busy host still reads on time."""
    seen = {}
    original = probe_module._realtime

    def spy() -> None:
        original()
        seen[threading.current_thread().name] = (os.sched_getscheduler(0),
                                                 os.sched_getparam(0).sched_priority)
    probe_module._realtime = spy
    try:
        assert probe(lab, count=10, rate=200, drain_s=0.1).received == 10
    finally:
        probe_module._realtime = original
    assert seen == {"probe-rx": (os.SCHED_FIFO, PROBE_REALTIME),
                    "probe-tx": (os.SCHED_FIFO, PROBE_REALTIME)}
    assert 0 < PROBE_REALTIME < DEFAULT_REALTIME
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller's own thread is untouched
