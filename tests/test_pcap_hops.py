"""analysis/pcap/hops.py on captures written here, frame by frame, with known times: every hop's
delay comes out as written, a slow relay shows in its own hop only, a retransmitted check is
split into its trips, and a relay's forward for a flow no check opened is counted."""
from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import CookedLinuxV2
from scapy.utils import PcapWriter

from analysis.pcap.hops import analyse
from services.wire import hop
from services.wire.stun import binding_request, binding_success
from voiceedge.cli import main

CLIENT = ("10.1.1.2", 40000)
VIP = ("203.0.113.10", 3478)
EDGE_BB = ("10.1.3.2", 5000)
CLUSTER_BB = ("10.2.5.2", 3479)
TRANSCEIVER = ("10.2.5.2", 6000)
LAST_MILE = {"delay_ms": 6.0, "jitter_ms": 1.0, "distribution": "normal"}
BACKBONE = {"delay_ms": 114.5, "jitter_ms": 0.5, "distribution": "normal"}
IMPAIRMENTS = {"last_mile_up apac-se->apac-se": LAST_MILE,
               "last_mile_down apac-se->apac-se": LAST_MILE,
               "backbone apac-se->na-east": BACKBONE, "backbone na-east->apac-se": BACKBONE}
# host -> (role, region, sent_only, {ifindex: (name, peer)})
HOSTS = {
    "client1": ("client", "apac-se", False, {2: ("client1-eth0", "pub1")}),
    "pub1": ("pub", "apac-se", True, {2: ("pub1-eth0", "client1"), 3: ("pub1-eth1", "edge1")}),
    "edge1": ("edge", "apac-se", False, {2: ("edge1-eth0", "pub1"), 3: ("edge1-eth1", "bb1")}),
    "bb1": ("bb", "apac-se", True, {2: ("bb1-eth0", "edge1"), 3: ("bb1-eth1", "bb2")}),
    "bb2": ("bb", "na-east", True, {2: ("bb2-eth0", "bb1"), 3: ("bb2-eth1", "cluster2")}),
    "cluster2": ("cluster", "na-east", False,
                 {1: ("lo", None), 3: ("cluster2-eth1", "bb2")}),
}
OUT, IN = 4, 0  # Linux packet types: sent by this host, to this host


class Captures:
    """Frames per host, written as tcpdump -i any -y LINUX_SLL2 would."""

    def __init__(self) -> None:
        self.frames: dict[str, list[tuple[float, bytes]]] = {h: [] for h in HOSTS}
        self.arrivals: list[list] = []  # the client's own receive times (--rx-log)
        self._headers: dict[tuple, bytes] = {}

    def see(self, host: str, ifindex: int, sent: bool, t: float, src, dst, payload: bytes):
        # scapy builds the headers, once per shape (building each frame costs 200 us); the
        # UDP checksum is then the first payload's, which no reader here checks
        shape = (ifindex, sent, src, dst, len(payload))
        header = self._headers.get(shape)
        if header is None:
            frame = CookedLinuxV2(ifindex=ifindex, pkttype=OUT if sent else IN,
                                  proto=0x0800) / IP(src=src[0], dst=dst[0]) / \
                UDP(sport=src[1], dport=dst[1]) / payload
            header = self._headers[shape] = bytes(frame)[:-len(payload)]
        self.frames[host].append((t, header + payload))

    def up(self, t: float, payload: bytes, last_mile: float, backbone: float,
           ingress: float = 0.1, cluster: float = 0.2, client=CLIENT) -> float:
        """A client's datagram through the global relay to the transceiver; when it got
        there."""
        up_header = hop.encode(client, hop.TO_SERVER)
        t1 = t + last_mile / 1000
        self.see("client1", 2, True, t, client, VIP, payload)
        self.see("pub1", 3, True, t1, client, VIP, payload)
        self.see("edge1", 2, False, t1 + 1e-5, client, VIP, payload)
        t2 = t1 + 1e-5 + ingress / 1000
        self.see("edge1", 3, True, t2, EDGE_BB, CLUSTER_BB, up_header + payload)
        self.see("bb1", 3, True, t2 + 1e-5, EDGE_BB, CLUSTER_BB, up_header + payload)
        t3 = t2 + 1e-5 + backbone / 1000
        self.see("bb2", 3, True, t3, EDGE_BB, CLUSTER_BB, up_header + payload)
        self.see("cluster2", 3, False, t3 + 1e-5, EDGE_BB, CLUSTER_BB, up_header + payload)
        arrived = t3 + 1e-5 + cluster / 1000
        self.see("cluster2", 1, False, arrived, CLUSTER_BB, TRANSCEIVER, up_header + payload)
        return arrived

    def down(self, t: float, payload: bytes, backbone: float, ingress: float = 0.1,
             cluster: float = 0.2, last_mile: float = 6.0, app_ms: float | None = None,
             wire_s: float = 1e-5) -> float:
        """The transceiver's datagram back to the client; when it got there. ``last_mile``:
        held that long on pub1's egress, before pub1's capture sees it leave (as the world
        holds it); ``wire_s``: from pub1 sending it to the client receiving it; ``app_ms``: an
        RTP packet reaches the client's application that much after its capture."""
        header = hop.encode(CLIENT, hop.TO_CLIENT)
        self.see("cluster2", 1, False, t, TRANSCEIVER, CLUSTER_BB, header + payload)
        t1 = t + cluster / 1000
        self.see("cluster2", 3, True, t1, CLUSTER_BB, EDGE_BB, header + payload)
        self.see("bb2", 2, True, t1 + 1e-5, CLUSTER_BB, EDGE_BB, header + payload)
        t2 = t1 + 1e-5 + backbone / 1000
        self.see("bb1", 2, True, t2, CLUSTER_BB, EDGE_BB, header + payload)
        self.see("edge1", 3, False, t2 + 1e-5, CLUSTER_BB, EDGE_BB, header + payload)
        t3 = t2 + 1e-5 + ingress / 1000
        self.see("edge1", 2, True, t3, VIP, CLIENT, payload)
        t4 = t3 + 1e-5 + last_mile / 1000
        self.see("pub1", 2, True, t4, VIP, CLIENT, payload)
        got = t4 + wire_s
        self.see("client1", 2, False, got, VIP, CLIENT, payload)
        if app_ms is not None:
            ssrc, seq = struct.unpack("!IH", payload[8:12] + payload[2:4])
            self.arrivals.append([ssrc, seq, got + app_ms / 1000])
        return got

    def write(self, run, capped: dict[str, float] | None = None) -> None:
        """``capped``: host -> the time its capture stopped at the size cap."""
        arch = run / "pcap" / "global-relay"
        arch.mkdir(parents=True)
        points = []
        for host, frames in self.frames.items():
            role, region, sent_only, ifaces = HOSTS[host]
            stop = (capped or {}).get(host)
            frames = [f for f in frames if stop is None or f[0] <= stop]
            with PcapWriter(str(arch / f"{host}.pcap"), linktype=276, nano=True) as w:
                w.write_header(None)
                for t, frame in sorted(frames):
                    w.write_packet(frame, sec=int(t), usec=round((t - int(t)) * 1e9))
            points.append({"host": host, "role": role, "region": region, "file": f"{host}.pcap",
                           "sent_only": sent_only, "bytes": (arch / f"{host}.pcap").stat().st_size,
                           "cpu_s": 0.01, "dropped_by_kernel": 0,
                           "capped_after_s": 1.0 if stop is not None else None,
                           "interfaces": {str(i): {"name": n, "peer": p}
                                          for i, (n, p) in ifaces.items()}})
        (arch / "captures.json").write_text(json.dumps({"points": points, "seconds": 5}))
        (arch / "client1.rx.jsonl").write_text(json.dumps({"index": 0,
                                                           "arrivals": self.arrivals}) + "\n")
        (run / "config.json").write_text(json.dumps({"architectures": ["global-relay"],
                                                     "impairments": IMPAIRMENTS}))


def _rtp(seq: int, ssrc: int) -> bytes:
    return struct.pack("!BBHII", 0x80, 111, seq, 0, ssrc) + os.urandom(60)


def _call(caps: Captures, cluster_ms: float = 0.2, n: int = 300) -> None:
    rng = np.random.default_rng(7)
    check = binding_request(b"srv:cli", os.urandom(12))
    # the first check is lost on the last mile and sent again 300 ms later: both copies are
    # seen at the client; only the second travels on (a point with fewer copies: unmatched)
    caps.see("client1", 2, True, 100.0, CLIENT, VIP, check)
    arrived = caps.up(100.3, check, 6.0, 114.5, cluster=cluster_ms)
    caps.down(arrived + 0.001, binding_success(check[8:20]), 114.5, cluster=cluster_ms)
    # the transceiver's own check, which the client answers: not a turnaround of the
    # transceiver's (its answer reaches the cluster a round trip later)
    own = binding_request(b"cli:srv", os.urandom(12))
    got = caps.down(arrived + 0.0005, own, 114.5, cluster=cluster_ms)
    caps.up(got + 0.002, binding_success(own[8:20]), 6.0, 114.5, cluster=cluster_ms)
    for i in range(n):
        t = 101.0 + i * 0.02
        caps.up(t, _rtp(i, 1111), rng.normal(6.0, 1.0), rng.normal(114.5, 0.5),
                cluster=cluster_ms)
        caps.down(t + 0.005, _rtp(i, 2222), rng.normal(114.5, 0.5), cluster=cluster_ms,
                  last_mile=rng.normal(6.0, 1.0), app_ms=rng.normal(0.3, 0.1))


def _hops(archs) -> dict[tuple[str, str], object]:
    [arch] = archs
    return {(h.direction, h.hop): h for h in arch.hops}


def test_each_hop_is_the_time_written_between_its_points(tmp_path):
    caps = Captures()
    _call(caps)
    # a datagram the ingress relay passed on for an address no check had opened through it
    caps.up(110.0, _rtp(1, 3333), 6.0, 114.5, client=("10.1.1.2", 40001))
    caps.write(tmp_path)
    archs = analyse(tmp_path)
    hops = _hops(archs)
    # 300 RTP, the answer to the transceiver's check, the stray (the check: unmatched)
    mile = hops[("up", "last mile up apac-se")]
    assert mile.datagrams == 302 and abs(mile.mean_ms - 6.0) < 0.2 and mile.ok
    assert abs(mile.sd_robust_ms - 1.0) < 0.2
    for direction, arrow in (("up", "apac-se->na-east"), ("down", "na-east->apac-se")):
        bb = hops[(direction, f"backbone {arrow}")]
        assert abs(bb.mean_ms - 114.5) < 0.1 and bb.expected_mean_ms == 114.5 and bb.ok
    assert hops[("up", "ingress relay apac-se")].p50_ms == pytest.approx(0.1, abs=0.002)
    assert hops[("down", "cluster relay na-east")].p50_ms == pytest.approx(0.2, abs=0.002)
    assert hops[("up", "edge1->bb1 (in region)")].p50_ms == pytest.approx(0.01, abs=0.002)
    # held on pub1's egress: in the hop that ends at pub1's capture of what it sends
    down = hops[("down", "last mile down apac-se")]
    assert down.datagrams == 302 and abs(down.mean_ms - 6.0) < 0.2 and down.ok
    assert down.expected_mean_ms == 6.0 and abs(down.sd_robust_ms - 1.0) < 0.2
    assert hops[("down", "pub1->client1 (wire)")].p50_ms == pytest.approx(0.01, abs=0.002)
    app = hops[("down", "client app apac-se (receive path)")]
    assert app.datagrams == 300 and app.rule == "median" and app.ok
    assert abs(app.p50_ms - 0.3) < 0.05 and app.expected_mean_ms == 0
    turnaround = hops[("up", "transceiver na-east (check -> answer)")]
    assert turnaround.datagrams == 1 and turnaround.p50_ms == pytest.approx(1.0, abs=0.01)
    assert turnaround.rule == "reported" and hops[("up", "ingress relay apac-se")].rule == \
        "processing"
    assert all(h.ok for h in hops.values()), [h for h in hops.values() if not h.ok]
    wire = archs[0].wire
    assert wire.first_checks == 1 and wire.first_checks_retransmitted == 1
    assert wire.checks == 2 and wire.checks_retransmitted == 1
    assert wire.public_ports == 1 and wire.sessions == 1
    assert wire.unmatched == 2 + 7  # the check: 2 at the client, 1 at each later point
    # RTP both ways, the answer, the transceiver's check and its answer; the stray
    assert wire.relay_forwards == 2 * (2 * 300 + 3) + 2
    assert wire.relay_forwards_unexpected == 2  # both relays passed the stray one on
    assert (tmp_path / "pcap" / "analysis.json").exists()


def test_a_frame_sent_and_received_in_the_same_microsecond_keeps_its_direction(tmp_path):
    """A veth delivers within the capture's microsecond: pub1's sending and the client's
    receiving often carry one timestamp. The client's capture is read first, so a sort by
    time alone put its receiving first, and the trip grew a "last mile up" hop of 0 ms in
    the down direction (seen in make test)."""
    caps = Captures()
    for i in range(20):
        t = 101.0 + i * 0.02
        caps.up(t, _rtp(i, 1111), 6.0, 114.5)
        caps.down(t + 0.005, _rtp(i, 2222), 114.5, app_ms=0.2, wire_s=0.0)
    caps.write(tmp_path)
    hops = _hops(analyse(tmp_path))
    assert ("down", "last mile up apac-se") not in hops, hops[("down", "last mile up apac-se")]
    wire = hops[("down", "pub1->client1 (wire)")]
    assert wire.datagrams == 20 and wire.p50_ms == 0.0 and wire.ok
    assert hops[("down", "last mile down apac-se")].datagrams == 20


def _pcap(capsys, *args) -> tuple[int, str, str]:
    """``voiceedge pcap ARGS`` in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    status = main(["pcap", *map(str, args)])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_a_slow_relay_shows_in_its_hop_and_nowhere_else(tmp_path, capsys):
    caps = Captures()
    _call(caps, cluster_ms=20.0)
    caps.write(tmp_path)
    hops = _hops(analyse(tmp_path))
    off = {key for key, h in hops.items() if not h.ok}
    assert off == {("up", "cluster relay na-east"), ("down", "cluster relay na-east")}
    assert hops[("up", "cluster relay na-east")].mean_ms == pytest.approx(20.0, abs=0.01)
    status, out, err = _pcap(capsys, tmp_path)
    assert status == 1, err
    assert "OFF" in out and "off: global-relay: up cluster relay na-east" in " ".join(out.split())
    status, out, _ = _pcap(capsys, tmp_path, "--json")
    [arch] = json.loads(out)["architectures"]
    assert status == 1 and {h["hop"] for h in arch["hops"] if not h["ok"]} == \
        {"cluster relay na-east"}


def test_the_pcap_command_explains_what_it_cannot_read(tmp_path, capsys):
    status, _, err = _pcap(capsys, tmp_path / "nothing")
    assert status == 2 and "not a results folder" in err
    (tmp_path / "config.json").write_text("{}")
    status, _, err = _pcap(capsys, tmp_path)
    assert status == 2 and "--capture" in err
    caps = Captures()
    _call(caps, n=10)
    run = tmp_path / "run"
    caps.write(run)
    (run / "pcap" / "global-relay" / "edge1.pcap").write_bytes(b"not a pcap at all")
    status, _, err = _pcap(capsys, run)
    assert status == 2 and "cannot read the captures" in err and err.count("\n") == 1


def test_after_a_capture_hits_its_cap_no_hop_skips_its_point(tmp_path):
    """The ingress relay's capture stopped half-way: later datagrams would go from pub1 straight
    to bb1, one 'hop' across the relay's host; they are left out instead."""
    caps = Captures()
    _call(caps)
    caps.write(tmp_path, capped={"edge1": 104.0})
    [arch] = analyse(tmp_path)
    hops = {(h.direction, h.hop): h for h in arch.hops}
    assert all(h.ok for h in hops.values()), [h for h in hops.values() if not h.ok]
    assert not [h for h in hops.values() if h.frm == "pub1" and h.to == "bb1"]
    assert arch.cost["capped"] == ["edge1"]
    # 150 datagrams a direction were sent by 104 s; those in flight then lose their later hops
    assert 140 <= hops[("up", "last mile up apac-se")].datagrams <= 152
    assert hops[("up", "backbone apac-se->na-east")].datagrams < 150
