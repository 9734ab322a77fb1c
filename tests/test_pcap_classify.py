"""analysis/pcap/classify.py: each kind of a call's datagram, and its key, against scapy's own
STUN and RTP layers; a hop header is looked through, not keyed."""
from __future__ import annotations

import os
import struct

from scapy.contrib.stun import STUN as ScapySTUN
from scapy.layers.rtp import RTP as ScapyRTP

from analysis.pcap.classify import (BINDING_REQUEST, DTLS, OTHER, RTCP, RTP, STUN, classify,
                                    stun_type)
from services.wire import hop
from services.wire.stun import binding_request, binding_success
from topology.calibrate import PROBE_BYTES


def _rtp(seq: int, ssrc: int, pt: int = 111, marker: bool = False) -> bytes:
    return struct.pack("!BBHII", 0x80, pt | (0x80 if marker else 0), seq, 123456, ssrc) \
        + os.urandom(120)


def test_stun_keys_are_scapys_type_and_transaction_id():
    request = binding_request(b"srvufrag:cli", os.urandom(12))
    answer = binding_success(request[8:20])
    for message in (request, answer):
        c = classify(message)
        layer = ScapySTUN(message)
        assert c.kind == STUN and c.offset == 0 and c.client is None
        assert stun_type(c.key) == layer.stun_message_type
        assert int.from_bytes(c.key[2], "big") == layer.transaction_id
    # a request and its answer share the transaction id, not the key
    assert classify(request).key != classify(answer).key
    assert classify(request).key[2] == classify(answer).key[2]
    assert stun_type(classify(request).key) == BINDING_REQUEST


def test_rtp_keys_are_scapys_ssrc_and_sequence_number():
    for seq, ssrc, marker in ((0, 1, False), (65535, 0xDEADBEEF, True), (1234, 42, False)):
        packet = _rtp(seq, ssrc, marker=marker)
        c = classify(packet)
        layer = ScapyRTP(packet)
        assert c.kind == RTP
        assert (int.from_bytes(c.key[1], "big"), int.from_bytes(c.key[2], "big")) == \
            (layer.sourcesync, layer.sequence)
    assert classify(_rtp(7, 9)).key != classify(_rtp(8, 9)).key
    assert classify(_rtp(7, 9)).key != classify(_rtp(7, 10)).key


def test_rtcp_dtls_and_what_is_not_a_call():
    sender_report = struct.pack("!BBHI", 0x80, 200, 6, 99) + os.urandom(40)
    assert classify(sender_report).kind == RTCP
    client_hello = bytes([22, 0xFE, 0xFD]) + bytes(8) + struct.pack("!H", 100) + os.urandom(100)
    c = classify(client_hello)
    assert c.kind == DTLS and c.key[1][0] == 22
    assert classify(client_hello).key != classify(client_hello[:13] + os.urandom(100)).key
    # calibration's probes start with a zero byte (sequence number) but carry no STUN cookie
    probe = struct.pack("!Qd", 5, 1.5).ljust(PROBE_BYTES, b"\0")
    assert classify(probe) == (OTHER, None, 0, None)
    assert classify(b"").kind == OTHER and classify(b"\x70hello").kind == OTHER


def test_a_hop_header_is_looked_through():
    inner = _rtp(77, 0xABCDEF)
    for direction in (hop.TO_SERVER, hop.TO_CLIENT):
        wrapped = hop.encode(("10.1.1.2", 40000), direction) + inner
        c = classify(wrapped)
        assert c.kind == RTP and c.key == classify(inner).key
        assert c.offset == hop.IPV4_LENGTH and c.client == ("10.1.1.2", 40000)
    # the key of a cut capture still matches: only the first bytes and the wire length count
    dtls = bytes([23, 0xFE, 0xFD]) + os.urandom(300)
    assert classify(dtls[:100], len(dtls)).key == classify(dtls).key
    assert classify(b"\x0e\xff" + bytes(10)).kind == OTHER  # bad flags: not a hop header
