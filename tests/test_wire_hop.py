"""Tests for the relay hop header (services/wire/hop.py)."""
import ipaddress
import os

import pytest
from hypothesis import given, settings, strategies as st

from services.relay.mmsg import sockaddr
from services.wire import hop
from services.wire.hop import HopHeaderError

ports = st.integers(0, 65535)
directions = st.sampled_from([hop.TO_SERVER, hop.TO_CLIENT])
RFC7983_RANGES = [range(0, 4), range(16, 20), range(20, 64), range(64, 80), range(128, 192)]


@settings(max_examples=200)
@given(st.ip_addresses(), ports, directions, st.binary(max_size=64))
def test_round_trip(ip, port, direction, payload):
    raw = hop.encode((str(ip), port), direction)
    assert len(raw) == (8 if ip.version == 4 else 20)
    assert raw[0] == 0x0E
    header, rest = hop.decode(raw + payload)
    assert header.direction == direction
    assert ipaddress.ip_address(header.client[0]) == ip
    assert header.client == (str(ip), port)
    assert header.length == len(raw)
    assert bytes(rest) == payload


def test_concrete_ipv4_header():
    assert hop.encode(("192.0.2.1", 0x1234)) == bytes([0x0E, 0x00, 0x12, 0x34, 192, 0, 2, 1])
    assert hop.encode(("192.0.2.1", 443), hop.TO_CLIENT)[:2] == b"\x0e\x01"


def test_concrete_ipv6_header():
    raw = hop.encode(("2001:db8::1", 65535), hop.TO_CLIENT)
    assert raw == b"\x0e\x03\xff\xff" + bytes.fromhex("20010db8000000000000000000000001")
    header, rest = hop.decode(raw + b"rtp")
    assert header == hop.HopHeader(hop.TO_CLIENT, ("2001:db8::1", 65535))
    assert header.length == 20 and bytes(rest) == b"rtp"


def test_magic_is_outside_rfc7983_ranges():
    assert hop.MAGIC == 0x0E
    assert not any(hop.MAGIC in r for r in RFC7983_RANGES)


@settings(max_examples=100)
@given(st.ip_addresses(v=4), ports)
def test_ipv4_header_matches_sockaddr_in(ip, port):
    assert hop.encode((str(ip), port))[2:8] == sockaddr(str(ip), port)[2:8]


@pytest.mark.parametrize("client", [("10.0.0.1", 5000), ("0.0.0.0", 0), ("255.255.255.255", 65535)])
def test_ipv4_header_matches_sockaddr_in_concrete(client):
    assert hop.encode(client)[2:8] == sockaddr(*client)[2:8]


@settings(max_examples=200)
@given(st.binary(max_size=40).filter(lambda d: d[:1] != b"\x0e"))
def test_wrong_magic_rejected(data):
    with pytest.raises(HopHeaderError):
        hop.decode(data)


@pytest.mark.parametrize("first", [0x00, 0x01, 0x14, 0x16, 0x40, 0x80, 0x0F, 0x0D])
def test_stun_dtls_rtp_first_bytes_rejected(first):
    with pytest.raises(HopHeaderError, match="no hop header"):
        hop.decode(bytes([first]) + hop.encode(("10.0.0.1", 1))[1:] + b"payload")


@pytest.mark.parametrize("flags", [0x04, 0x08, 0x10, 0x80, 0xFC, 0xFF, 0x05])
def test_unknown_flag_bits_rejected(flags):
    data = bytes([0x0E, flags]) + bytes(18) + b"payload"
    with pytest.raises(HopHeaderError, match="flags"):
        hop.decode(data)


@pytest.mark.parametrize("client", [("198.51.100.7", 3478), ("2001:db8::7", 3478)])
def test_truncated_headers_rejected(client):
    raw = hop.encode(client)
    for cut in range(len(raw)):
        with pytest.raises(HopHeaderError):
            hop.decode(raw[:cut])
    header, rest = hop.decode(raw)
    assert header.client == client and bytes(rest) == b""


def test_payload_unchanged_and_memoryview_input():
    payload = os.urandom(1200)
    raw = hop.encode(("203.0.113.9", 40000), hop.TO_CLIENT) + payload
    header, rest = hop.decode(memoryview(raw))
    assert header == hop.HopHeader(hop.TO_CLIENT, ("203.0.113.9", 40000))
    assert isinstance(rest, memoryview) and bytes(rest) == payload



@settings(max_examples=200)
@given(st.ip_addresses(), ports, directions)
def test_the_header_from_a_raw_sockaddr_is_the_header_from_the_address(ip, port, direction):
    client = (str(ip), port)
    assert hop.encode_sockaddr(sockaddr(*client), direction) == hop.encode(client, direction)
