"""The wire analysis under TURN: a datagram wrapped in ChannelData or a Send/Data indication
between the client and the TURN server is keyed like the bare one between the TURN server and
the transceiver (classify.py, checked against aioice's own TURN framing), the TURN server is a
hop judged like a relay, and TURN's control transactions are counted per session. Synthetic
captures, frame by frame with known times (as tests/test_pcap_hops.py)."""
from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
from aioice import stun
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import CookedLinuxV2
from scapy.utils import PcapWriter

from analysis.pcap.classify import DTLS, RTP, STUN, classify, turn_control
from analysis.pcap.hops import analyse
from services.wire.stun import binding_request, binding_success
from tests.conftest import write_architectures

CLIENT = ("10.1.1.2", 40000)
TURN_SERVER = ("10.1.2.2", 3478)
RELAY = ("10.1.2.2", 49152)       # the allocation's relayed address
TRANSCEIVER = ("10.2.4.2", 50000)
LAST_MILE = {"delay_ms": 6.0, "jitter_ms": 1.0, "distribution": "normal"}
PUBLIC = {"delay_ms": 115.5, "jitter_ms": 2.0, "distribution": "normal"}
IMPAIRMENTS = {"last_mile_up apac-ne->apac-ne": LAST_MILE,
               "last_mile_down apac-ne->apac-ne": LAST_MILE,
               "public apac-ne->na-east": PUBLIC, "public na-east->apac-ne": PUBLIC}
HOSTS = {  # host -> (role, region, sent_only, {ifindex: (name, peer)})
    "client1": ("client", "apac-ne", False, {2: ("client1-eth0", "pub1")}),
    "pub1": ("pub", "apac-ne", True, {2: ("pub1-eth0", "client1"), 3: ("pub1-eth1", "edge1"),
                                      4: ("pub1-eth2", "pub2")}),
    "edge1": ("edge", "apac-ne", False, {2: ("edge1-eth0", "pub1")}),
    "pub2": ("pub", "na-east", True, {2: ("pub2-eth0", "pub1"), 3: ("pub2-eth1", "cluster2")}),
    "cluster2": ("cluster", "na-east", False, {2: ("cluster2-eth0", "pub2")}),
}
CHANNEL = 0x4000


def channel_data(inner: bytes, pad: bool = False) -> bytes:
    """As aioice frames it (padded to 4 bytes, as over TCP, when ``pad``)."""
    return struct.pack("!HH", CHANNEL, len(inner)) + inner + (bytes(-len(inner) % 4) if pad
                                                               else b"")


def indication(method: stun.Method, inner: bytes, peer=TRANSCEIVER) -> bytes:
    message = stun.Message(method, stun.Class.INDICATION)
    message.attributes["XOR-PEER-ADDRESS"] = peer
    message.attributes["DATA"] = inner
    return bytes(message)


def _rtp(seq: int, ssrc: int) -> bytes:
    return struct.pack("!BBHII", 0x80, 111, seq, 0, ssrc) + os.urandom(60)


def _dtls(size: int) -> bytes:
    return bytes([22, 0xFE, 0xFD]) + os.urandom(size - 3)


def test_channel_data_and_indications_are_looked_through():
    for inner in (_rtp(9, 0xABCDEF), binding_request(b"srv:cli", os.urandom(12)), _dtls(201)):
        bare = classify(inner)
        assert bare.kind in (RTP, STUN, DTLS)
        for wrapped, offset in ((channel_data(inner), 4), (channel_data(inner, pad=True), 4),
                                (indication(stun.Method.SEND, inner), None),
                                (indication(stun.Method.DATA, inner), None)):
            c = classify(wrapped)
            assert (c.kind, c.key) == (bare.kind, bare.key), wrapped[:4]
            assert wrapped[c.offset:c.offset + len(inner)] == inner
            if offset is not None:
                assert c.offset == offset
        # a capture cut short (snaplen) still keys DTLS by the wrapped datagram's own length
        wrapped = channel_data(inner, pad=True)
        assert classify(wrapped[:100], len(wrapped)).key == bare.key
    # an indication that carries no DATA is STUN, keyed as itself
    empty = stun.Message(stun.Method.SEND, stun.Class.INDICATION)
    empty.attributes["XOR-PEER-ADDRESS"] = TRANSCEIVER
    assert classify(bytes(empty)).kind == STUN


def test_turn_control_messages_are_named_with_their_error_code():
    allocate = stun.Message(stun.Method.ALLOCATE, stun.Class.REQUEST)
    allocate.attributes["REQUESTED-TRANSPORT"] = 0x11000000
    challenge = stun.Message(stun.Method.ALLOCATE, stun.Class.ERROR, allocate.transaction_id)
    challenge.attributes["ERROR-CODE"] = (401, "Unauthorized")
    challenge.attributes["REALM"] = "voiceedge"
    challenge.attributes["NONCE"] = b"0123456789abcdef"
    forbidden = stun.Message(stun.Method.CHANNEL_BIND, stun.Class.ERROR)
    forbidden.attributes["ERROR-CODE"] = (403, "Forbidden IP")
    cases = {allocate: ("Allocate", "request", None), challenge: ("Allocate", "error", 401),
             stun.Message(stun.Method.ALLOCATE, stun.Class.RESPONSE): ("Allocate", "success",
                                                                       None),
             stun.Message(stun.Method.REFRESH, stun.Class.REQUEST): ("Refresh", "request", None),
             stun.Message(stun.Method.CREATE_PERMISSION, stun.Class.REQUEST):
                 ("CreatePermission", "request", None),
             stun.Message(stun.Method.CHANNEL_BIND, stun.Class.RESPONSE):
                 ("ChannelBind", "success", None),
             forbidden: ("ChannelBind", "error", 403)}
    for message, expected in cases.items():
        data = bytes(message)
        assert turn_control(data) == expected
        assert classify(data).kind == STUN
    assert turn_control(binding_request(b"a:b")) is None
    assert turn_control(indication(stun.Method.SEND, _rtp(1, 2))) is None
    assert turn_control(channel_data(_rtp(1, 2))) is None


# -- a call through a TURN server, captured ----------------------------------------------------

class TurnCaptures:
    """Frames per host of one call: client -last mile- pub1 - edge1 (TURN) - pub1 -public-
    pub2 - cluster2 (transceiver, a port per session)."""

    def __init__(self) -> None:
        self.frames: dict[str, list[tuple[float, bytes]]] = {h: [] for h in HOSTS}

    def see(self, host, ifindex, sent, t, src, dst, payload) -> None:
        frame = CookedLinuxV2(ifindex=ifindex, pkttype=4 if sent else 0, proto=0x0800) / \
            IP(src=src[0], dst=dst[0]) / UDP(sport=src[1], dport=dst[1]) / payload
        self.frames[host].append((t, bytes(frame)))

    def to_turn(self, t: float, payload: bytes, last_mile: float, client=CLIENT) -> float:
        """Client -> TURN server; when it got there."""
        self.see("client1", 2, True, t, client, TURN_SERVER, payload)
        t1 = t + last_mile / 1000
        self.see("pub1", 3, True, t1, client, TURN_SERVER, payload)
        self.see("edge1", 2, False, t1 + 1e-5, client, TURN_SERVER, payload)
        return t1 + 1e-5

    def from_turn(self, t: float, payload: bytes, last_mile: float = 6.0) -> float:
        """TURN server -> client (the last mile down held on pub1's egress, before pub1's
        capture of what it sends)."""
        self.see("edge1", 2, True, t, TURN_SERVER, CLIENT, payload)
        t1 = t + 1e-5 + last_mile / 1000
        self.see("pub1", 2, True, t1, TURN_SERVER, CLIENT, payload)
        self.see("client1", 2, False, t1 + 1e-5, TURN_SERVER, CLIENT, payload)
        return t1 + 1e-5

    def up(self, t, inner, last_mile, public, turn_ms, wrap=channel_data,
           client=CLIENT) -> float:
        t1 = self.to_turn(t, wrap(inner), last_mile, client) + turn_ms / 1000
        self.see("edge1", 2, True, t1, RELAY, TRANSCEIVER, inner)
        self.see("pub1", 4, True, t1 + 1e-5, RELAY, TRANSCEIVER, inner)
        t2 = t1 + 1e-5 + public / 1000
        self.see("pub2", 3, True, t2, RELAY, TRANSCEIVER, inner)
        self.see("cluster2", 2, False, t2 + 1e-5, RELAY, TRANSCEIVER, inner)
        return t2 + 1e-5

    def down(self, t, inner, public, turn_ms, wrap=channel_data, last_mile=6.0) -> float:
        self.see("cluster2", 2, True, t, TRANSCEIVER, RELAY, inner)
        self.see("pub2", 2, True, t + 1e-5, TRANSCEIVER, RELAY, inner)
        t1 = t + 1e-5 + public / 1000
        self.see("pub1", 3, True, t1, TRANSCEIVER, RELAY, inner)
        self.see("edge1", 2, False, t1 + 1e-5, TRANSCEIVER, RELAY, inner)
        return self.from_turn(t1 + 1e-5 + turn_ms / 1000, wrap(inner), last_mile)

    def control(self, t: float, request: stun.Message, answer: stun.Message) -> float:
        """One TURN transaction, answered 0.1 ms after it reached the server."""
        at = self.to_turn(t, bytes(request), 6.0)
        return self.from_turn(at + 1e-4, bytes(answer))

    def write(self, run) -> None:
        arch = run / "pcap" / "turn"
        arch.mkdir(parents=True)
        points = []
        for host, frames in self.frames.items():
            role, region, sent_only, ifaces = HOSTS[host]
            with PcapWriter(str(arch / f"{host}.pcap"), linktype=276, nano=True) as w:
                w.write_header(None)
                for t, frame in sorted(frames):
                    w.write_packet(frame, sec=int(t), usec=round((t - int(t)) * 1e9))
            points.append({"host": host, "role": role, "region": region,
                           "file": f"{host}.pcap", "sent_only": sent_only,
                           "bytes": (arch / f"{host}.pcap").stat().st_size, "cpu_s": 0.01,
                           "dropped_by_kernel": 0, "capped_after_s": None,
                           "interfaces": {str(i): {"name": n, "peer": p}
                                          for i, (n, p) in ifaces.items()}})
        (arch / "captures.json").write_text(json.dumps({"points": points, "seconds": 5}))
        (run / "config.json").write_text(json.dumps({"architectures": ["turn"],
                                                     "impairments": IMPAIRMENTS}))
        write_architectures(run, ["turn"])


def _turn_call(caps: TurnCaptures, turn_ms: float = 0.15, n: int = 150) -> None:
    rng = np.random.default_rng(11)
    t = 100.0
    first = stun.Message(stun.Method.ALLOCATE, stun.Class.REQUEST)
    challenge = stun.Message(stun.Method.ALLOCATE, stun.Class.ERROR, first.transaction_id)
    challenge.attributes["ERROR-CODE"] = (401, "Unauthorized")
    t = caps.control(t, first, challenge) + 0.001
    second = stun.Message(stun.Method.ALLOCATE, stun.Class.REQUEST)
    t = caps.control(t, second, stun.Message(stun.Method.ALLOCATE, stun.Class.RESPONSE,
                                             second.transaction_id)) + 0.05
    bind = stun.Message(stun.Method.CHANNEL_BIND, stun.Class.REQUEST)
    t = caps.control(t, bind, stun.Message(stun.Method.CHANNEL_BIND, stun.Class.RESPONSE,
                                           bind.transaction_id))
    # the transceiver's first check reaches the client in a Data indication (no channel yet
    # on the way down in this capture), the client's in ChannelData
    own = binding_request(b"cli:srv", os.urandom(12))
    caps.down(t - 0.05, own, 115.5, turn_ms, wrap=lambda d: indication(stun.Method.DATA, d))
    check = binding_request(b"srv:cli", os.urandom(12))
    at = caps.up(t, check, 6.0, 115.5, turn_ms, wrap=lambda d: indication(stun.Method.SEND, d))
    caps.down(at + 0.001, binding_success(check[8:20]), 115.5, turn_ms)  # 1 ms turnaround
    for i in range(n):
        at = t + 0.5 + i * 0.02
        caps.up(at, _rtp(i, 1111), rng.normal(6.0, 1.0), rng.normal(115.5, 2.0), turn_ms)
        caps.down(at + 0.005, _rtp(i, 2222), rng.normal(115.5, 2.0), turn_ms,
                  last_mile=rng.normal(6.0, 1.0))
    refresh = stun.Message(stun.Method.REFRESH, stun.Class.REQUEST)
    caps.control(at + 1, refresh, stun.Message(stun.Method.REFRESH, stun.Class.RESPONSE,
                                               refresh.transaction_id))


def test_every_hop_of_a_turn_call_is_found_and_the_turn_server_is_judged_like_a_relay(tmp_path):
    caps = TurnCaptures()
    _turn_call(caps)
    # a datagram the TURN server passed on for a client that had allocated nothing
    caps.up(140.0, _rtp(1, 3333), 6.0, 115.5, 0.15, client=("10.1.1.2", 40001))
    caps.write(tmp_path)
    [arch] = analyse(tmp_path)
    hops = {(h.direction, h.hop): h for h in arch.hops}
    server = hops[("up", "TURN server apac-ne")]
    assert server.kind == "relay" and server.rule == "processing" and server.ok
    assert server.p50_ms == pytest.approx(0.15, abs=0.002)
    assert hops[("down", "TURN server apac-ne")].p50_ms == pytest.approx(0.15, abs=0.002)
    # the wrapped datagram and the bare one are one datagram: the path runs end to end
    assert abs(hops[("up", "public internet apac-ne->na-east")].mean_ms - 115.5) < 0.5
    assert abs(hops[("down", "public internet na-east->apac-ne")].mean_ms - 115.5) < 0.5
    assert abs(hops[("up", "last mile up apac-ne")].mean_ms - 6.0) < 0.3
    assert hops[("up", "pub1->edge1 (in region)")].ok
    assert hops[("up", "edge1->pub1 (in region)")].ok
    assert abs(hops[("down", "last mile down apac-ne")].mean_ms - 6.0) < 0.1
    # RTP, the check, the stray
    assert hops[("up", "public internet apac-ne->na-east")].datagrams == 150 + 2
    assert all(h.ok for h in hops.values()), [h for h in hops.values() if not h.ok]
    assert not [h for h in hops.values() if "ingress relay" in h.hop]
    wire = arch.wire
    assert wire.public_ports == 1 and wire.sessions == 1  # the TURN server's port only
    assert wire.first_checks == 1 and wire.first_check_rtt_ms_p50 == pytest.approx(
        6.0 + 2 * 115.5 + 2 * 0.15 + 1.0 + 6.0, abs=0.2)
    # 150 RTP each way, the check and its answer, the transceiver's check (after the
    # client's Allocate: its flow was open), the stray (of a client that allocated nothing)
    assert wire.relay_forwards == 2 * 150 + 4 and wire.relay_forwards_unexpected == 1
    turn = {(x["method"], x["outcome"]): x for x in wire.turn["transactions"]}
    assert wire.turn["sessions"] == 1
    assert list(turn) == [("Allocate", "401"), ("Allocate", "success"),
                          ("ChannelBind", "success"), ("Refresh", "success")]
    for x in turn.values():  # both last miles and the server's 0.1 ms
        assert x["count"] == 1 and x["per_session_p50"] == 1 and x["retransmitted"] == 0
        assert x["rtt_ms_p50"] == pytest.approx(6.0 + 0.1 + 6.0, abs=0.05)
    saved = json.loads((tmp_path / "pcap" / "analysis.json").read_text())
    assert saved["architectures"][0]["wire"]["turn"]["sessions"] == 1


def test_a_slow_turn_server_shows_in_its_hop(tmp_path):
    caps = TurnCaptures()
    _turn_call(caps, turn_ms=20.0, n=40)
    caps.write(tmp_path)
    [arch] = analyse(tmp_path)
    assert {(h.direction, h.hop) for h in arch.off} == {("up", "TURN server apac-ne"),
                                                         ("down", "TURN server apac-ne")}
