"""Tests for the minimal STUN reader (services/wire/stun.py) on hand-built binding requests."""
import os
import struct

import pytest
from hypothesis import given, settings, strategies as st

from services.wire.stun import (
    MAGIC_COOKIE, StunError, in_stun_range, is_stun, read_username, server_ufrag,
)

TXID = bytes(range(12))


def attr(attr_type: int, value: bytes) -> bytes:
    """A TLV attribute padded to a 4-byte boundary."""
    return struct.pack("!HH", attr_type, len(value)) + value + bytes(-len(value) % 4)


def binding_request(*attrs: bytes, cookie: int = MAGIC_COOKIE) -> bytes:
    body = b"".join(attrs)
    return struct.pack("!HHI12s", 0x0001, len(body), cookie, TXID) + body


def ice_request(username: bytes) -> bytes:
    """USERNAME, then a dummy MESSAGE-INTEGRITY and FINGERPRINT, as a browser sends them."""
    return binding_request(attr(0x0006, username), attr(0x0008, b"\xaa" * 20),
                           attr(0x8028, b"\x12\x34\x56\x78"))


usernames = st.binary(min_size=1, max_size=80)


def test_hand_built_request_layout():
    msg = ice_request(b"srv:cli")  # 7 bytes of username, padded to 8
    assert len(msg) == 20 + (4 + 8) + (4 + 20) + (4 + 4)
    assert msg[2:4] == struct.pack("!H", len(msg) - 20)
    assert is_stun(msg)


@settings(max_examples=200)
@given(usernames)
def test_read_username(username):
    msg = ice_request(username)
    assert read_username(msg) == username
    assert read_username(memoryview(msg)) == username
    assert read_username(msg + os.urandom(3)) == username  # bytes after the message are ignored


def test_read_username_concrete():
    assert read_username(ice_request(b"AQBwCQAAAAAAabcdefgh:rEmOtE")) == b"AQBwCQAAAAAAabcdefgh:rEmOtE"
    assert read_username(ice_request(b"abcd")) == b"abcd"  # no padding needed


@pytest.mark.parametrize("username, expected", [
    (b"local:remote", b"local"),
    (b"a:b:c", b"a"),
    (b":remote", b""),
    (b"nocolon", b"nocolon"),
    (b"", b""),
])
def test_server_ufrag(username, expected):
    assert server_ufrag(username) == expected


def test_username_not_first_attribute_is_found():
    msg = binding_request(attr(0x0024, b"\x6e\x7f\x1e\xff"),      # PRIORITY
                          attr(0x8029, bytes(8)),                  # ICE-CONTROLLED
                          attr(0x8022, b"odd-len"),                # SOFTWARE, padded
                          attr(0x0006, b"server:client"),
                          attr(0x0008, bytes(20)), attr(0x8028, bytes(4)))
    assert read_username(msg) == b"server:client"


def test_first_username_wins():
    msg = binding_request(attr(0x0006, b"first:x"), attr(0x0006, b"second:y"))
    assert read_username(msg) == b"first:x"


@pytest.mark.parametrize("attrs", [
    (),
    (attr(0x0008, bytes(20)), attr(0x8028, bytes(4))),
    (attr(0x8022, b"abc"), attr(0x0024, bytes(4))),
])
def test_no_username_returns_none(attrs):
    assert read_username(binding_request(*attrs)) is None


def test_every_truncation_raises():
    msg = ice_request(b"serverufrag:clientufrag")
    for cut in range(len(msg)):
        with pytest.raises(StunError):
            read_username(msg[:cut])


@pytest.mark.parametrize("declared", [41, 44, 100, 0xFFFF])
def test_attribute_length_past_end_raises(declared):
    msg = bytearray(ice_request(b"srv:cli"))  # 44-byte body: at most 40 bytes of value fit
    struct.pack_into("!H", msg, 22, declared)  # the USERNAME attribute's length field
    with pytest.raises(StunError, match="attribute length"):
        read_username(bytes(msg))


@pytest.mark.parametrize("declared", [9, 12, 13])
def test_last_attribute_length_past_end_raises(declared):
    msg = bytearray(binding_request(attr(0x0006, b"srv:cli")))  # 8-byte value slot
    struct.pack_into("!H", msg, 22, declared)
    with pytest.raises(StunError, match="attribute length"):
        read_username(bytes(msg) + bytes(16))  # even with datagram bytes after the message


def test_header_length_not_multiple_of_four_raises():
    msg = bytearray(ice_request(b"srv:cli"))
    struct.pack_into("!H", msg, 2, len(msg) - 20 - 1)
    with pytest.raises(StunError):
        read_username(bytes(msg))


@pytest.mark.parametrize("cookie", [0, 0x2112A443, 0x42A41221, 0xFFFFFFFF])
def test_wrong_cookie_raises(cookie):
    msg = binding_request(attr(0x0006, b"srv:cli"), cookie=cookie)
    assert not is_stun(msg)
    with pytest.raises(StunError):
        read_username(msg)


@pytest.mark.parametrize("first_byte", [0x40, 0x80, 0xC0, 0x16, 0x0E])
def test_non_stun_first_byte(first_byte):
    msg = bytearray(ice_request(b"srv:cli"))
    msg[0] = first_byte
    if first_byte & 0xC0:
        with pytest.raises(StunError):
            read_username(bytes(msg))
    else:  # 0x16/0x0E keep the top two bits clear: still framed like STUN
        assert read_username(bytes(msg)) == b"srv:cli"


@pytest.mark.parametrize("data, expected", [
    (b"", False), (b"\x00", True), (b"\x01\x01", True), (b"\x03", True), (b"\x04", False),
    (b"\x0e\x00", False), (b"\x16\xfe\xfd", False), (b"\x80\x6f", False), (b"\xff", False),
])
def test_stun_range_is_the_first_byte_0_to_3(data, expected):
    """RFC 7983's demultiplexing: STUN 0-3, ZRTP 16-19, DTLS 20-63, RTP 128-191; the hop
    header's 0x0E is outside every range. Framing does not matter to the range test."""
    assert in_stun_range(data) is expected
    assert in_stun_range(memoryview(bytearray(data) + b"junk")[:len(data)]) is expected


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_random_bytes_raise_stun_error_only(data):
    if is_stun(data):  # vanishingly rare: random bytes with the cookie
        try:
            result = read_username(data)
        except StunError:
            return
        assert result is None or isinstance(result, bytes)
    else:
        with pytest.raises(StunError):
            read_username(data)


@settings(max_examples=300)
@given(st.binary(max_size=120).map(lambda b: b[: len(b) - len(b) % 4]), st.binary(max_size=8))
def test_random_body_behind_valid_header(body, trailer):
    """Well-framed headers with garbage attributes: bytes, None or StunError, nothing else."""
    msg = struct.pack("!HHI12s", 0x0001, len(body), MAGIC_COOKIE, TXID) + body + trailer
    try:
        result = read_username(msg)
    except StunError:
        return
    assert result is None or (isinstance(result, bytes) and result in body)
