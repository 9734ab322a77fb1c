"""bench/hostile/flood.py: the flood's packets, the transit matching, and the quick flood
against a live edge (the hostile-input issue's rules)."""
from __future__ import annotations

import ipaddress
import os
import shutil
import struct
import subprocess
import sys
import threading

import pytest
from aioice import stun

from bench.hostile.flood import (FloodConfig, RelayCore, RelayPath, Sources, binding_request,
                                 capture_filter, flood_packets, lines, relay_transits, run)
from analysis.pcap.reader import Datagram
from services.wire import hop as hopwire
from services.wire.stun import read_username, server_ufrag
from services.wire.ufrag import DEV_SECRET, UfragCodec
from tests.conftest import REPO, needs


def test_binding_request_routes_and_does_not_authenticate():
    import random

    codec = UfragCodec(DEV_SECRET)
    data = binding_request(codec.encode(1, 1), random.Random(3))
    hint = codec.decode(server_ufrag(read_username(data)))
    assert (hint.cluster_id, hint.transceiver_id) == (1, 1)
    message = stun.parse_message(data)
    assert message.message_method == stun.Method.BINDING
    assert message.attributes["ICE-CONTROLLING"] and message.attributes["PRIORITY"]
    assert message.attributes["FINGERPRINT"] == stun.message_fingerprint(data[:-8])
    assert not message.check_message_integrity(b"any session password")


def test_flood_packets_sources_and_shares():
    cfg = FloodConfig(sources=400, prefixes=40, one_prefix_share=0.1, one_ip_share=0.05)
    packets = flood_packets(cfg, ("10.77.0.1", 3478), 20_000, pool=100)
    net = ipaddress.ip_network(cfg.source_net)
    sources = Sources.plan(cfg)
    seen, ports, one_ip, one_prefix = set(), set(), 0, 0
    for p in packets:
        src = p[12:16]
        assert ipaddress.ip_address(src) in net and p[16:20] == bytes([10, 77, 0, 1])
        assert struct.unpack("!H", p[22:24])[0] == 3478 and p[9] == 17
        assert struct.unpack("!H", p[2:4])[0] == len(p)
        seen.add(src)
        ports.add((src, p[20:22]))
        one_ip += src == sources.one_ip
        one_prefix += src in sources.one_prefix
    assert len(seen) > 600 and len({s[:3] for s in seen}) == 42  # 40 /24s, one /24, one IP
    assert len(ports) > 19_900  # nearly every packet a first packet (a new address)
    assert 0.04 < one_ip / len(packets) < 0.06 and 0.08 < one_prefix / len(packets) < 0.12


def _d(ts, src, dst, payload):
    return Datagram(ts, src[0], src[1], dst[0], dst[1], payload)


def test_relay_transits_match_both_directions():
    path = RelayPath(("10.77.0.1", 3478), ("10.77.0.2", 3480))
    client, hop_sock = ("10.77.0.2", 5555), ("10.77.0.2", 40001)
    up = hopwire.encode(client, hopwire.TO_SERVER)
    down = hopwire.encode(client, hopwire.TO_CLIENT)
    check = b"\x00\x01" + bytes(30)
    flood_copy = hopwire.encode(("127.96.0.9", 9), hopwire.TO_SERVER) + b"flood"
    datagrams = [
        _d(1.000, client, path.public, check),           # a check, retransmitted once
        _d(1.001, client, path.public, check),
        _d(1.0002, hop_sock, path.media, up + check),
        _d(1.0013, hop_sock, path.media, up + check),
        _d(1.002, hop_sock, path.media, flood_copy),     # the capture filter keeps these out
        _d(1.003, path.media, hop_sock, down + b"answer"),
        _d(1.00305, path.public, client, b"answer"),
        _d(1.004, client, path.public, b"\x80media"),     # never forwarded
        _d(1.005, path.public, client, b"orphan"),        # no captured arrival
    ]
    got = sorted(((d, t, None if x is None else round(x * 1e6)) for d, t, x in
                  relay_transits(datagrams, path)), key=lambda r: (r[1] is None, r[1] or 0))
    assert got == [("to_server", 1.000, 200), ("to_server", 1.001, 300),
                   ("to_client", 1.003, 50), ("to_server", 1.004, None),
                   ("to_server", None, None), ("to_client", None, None)]


@pytest.mark.root
def test_capture_filter_compiles():
    if shutil.which("tcpdump") is None:
        pytest.skip("needs tcpdump")
    import subprocess

    proc = subprocess.run(["tcpdump", "-d", "-i", "lo", capture_filter("127.96.0.0/11")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "0x7f600000" in capture_filter("127.96.0.0/11")


def _affinities() -> dict[int, set[int]]:
    """Each live thread's CPUs (a thread that ends between the listing and the look is
    skipped: earlier tests leave pool threads that come and go)."""
    out = {}
    for t in map(int, os.listdir("/proc/self/task")):
        try:
            out[t] = os.sched_getaffinity(t)
        except ProcessLookupError:
            pass
    return out


def test_the_relay_core_keeps_this_process_and_its_children_off_the_relays_cpu_until_exit():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    before = _affinities()
    seen, release = {}, threading.Event()

    def started_inside():
        seen["inside"] = os.sched_getaffinity(0)
        release.wait(10)
        seen["after"] = os.sched_getaffinity(0)

    with RelayCore(10) as core:
        assert (core.cpu, core.others) == (cpus[-1], set(cpus[:-1]))
        assert core.relay_args() == ("--cpus", str(cpus[-1]), "--realtime", "10")
        assert core.describe() == {"cpu": cpus[-1], "realtime": 10, "others": cpus[:-1],
                                   "realtime_refused": None}
        assert set(map(frozenset, _affinities().values())) == {frozenset(cpus[:-1])}
        child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                               capture_output=True, text=True, timeout=30)
        assert child.stdout.strip() == str(cpus[:-1])
        thread = threading.Thread(target=started_inside)
        thread.start()
    release.set()
    thread.join()
    assert seen == {"inside": set(cpus[:-1]), "after": set(cpus)}
    assert {t: a for t, a in _affinities().items() if t in before} == before
    with RelayCore(None) as shared:
        assert shared.cpu is None and shared.relay_args() == () and shared.describe() is None
        # every thread that was there before keeps its CPUs (threads that other code started
        # meanwhile, as xdist's worker does, have nothing to compare with)
        now = _affinities()
        assert {t: a for t, a in now.items() if t in before} == {
            t: a for t, a in before.items() if t in now}


def test_without_the_right_to_real_time_the_relay_core_pins_only_and_says_why(as_nobody):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    code = ("from bench.hostile.flood import RelayCore\n"
            "with RelayCore(10) as core:\n"
            "    print(core.relay_args(), core.describe()['realtime_refused'])")
    proc = subprocess.run([*as_nobody, sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    last = max(os.sched_getaffinity(0))
    assert proc.stdout.strip() == (f"('--cpus', '{last}') --realtime 10 needs root or "
                                   "CAP_SYS_NICE")


TRANSIT = "relay transit p99"  # the violations of the 2x p99 rule start so


@pytest.fixture(scope="module")
@needs("netns")
def quick_flood(tmp_path_factory):
    """A few seconds of 10,000 first packets a second against a live edge with a few calls."""
    cfg = FloodConfig.quick()
    result = run(cfg.__class__(**{**cfg.__dict__, "workdir": tmp_path_factory.mktemp("flood")}))
    print("\n".join(lines(result)))
    return cfg, result


def test_quick_flood_keeps_the_table_and_the_calls(quick_flood):
    cfg, result = quick_flood
    table = result["flow_table"]
    assert result["sender"]["sent"] == cfg.rate * cfg.flood_s
    assert table["max_flows_pending"] is not None
    assert table["max_flows_pending"] <= cfg.pending_cap
    assert table["max_attack_flows"] <= cfg.pending_cap
    assert result["new_calls"]["flood"]["ok"] == cfg.new_calls
    assert [v for v in result["violations"] if not v.startswith(TRANSIT)] == []


def test_quick_flood_keeps_the_calls_transit_under_twice_the_quiet_one(quick_flood):
    """The relay's worker on a CPU of its own (RelayCore): what the flood does to it, not
    what the machine's other processes do to its CPU (docs/hostile.md, "A core of its own")."""
    _, result = quick_flood
    assert result["relay_core"] is not None or len(os.sched_getaffinity(0)) < 2
    assert [v for v in result["violations"] if v.startswith(TRANSIT)] == []
