"""Just enough STUN (RFC 8489) framing for a relay: recognise a message and read USERNAME."""
from __future__ import annotations

import os
import struct

MAGIC_COOKIE = 0x2112A442
HEADER_LENGTH = 20
ATTR_USERNAME = 0x0006


STUN_FIRST_BYTE_MAX = 3  # RFC 7983: a first byte of 0-3 is STUN (16-19 ZRTP, 20-63 DTLS...)


def in_stun_range(data: bytes | bytearray | memoryview) -> bool:
    """True when the first byte of ``data`` is in STUN's demultiplexing range (RFC 7983).

    The cheap test of what may be parsed as STUN at all; ``is_stun`` checks the framing.
    """
    return bool(data) and data[0] <= STUN_FIRST_BYTE_MAX


def is_stun(data: bytes | memoryview) -> bool:
    """True when ``data`` is framed like a STUN message (header and cookie, length fits)."""
    if len(data) < HEADER_LENGTH or data[0] & 0xC0:
        return False
    length = (data[2] << 8) | data[3]
    cookie = int.from_bytes(data[4:8], "big")
    return cookie == MAGIC_COOKIE and length % 4 == 0 and HEADER_LENGTH + length <= len(data)


class StunError(ValueError):
    """Bytes in the STUN range that are not a well-framed STUN message."""


def read_username(data: bytes | memoryview) -> bytes | None:
    """USERNAME of a STUN message, or None when it has none.

    Raises StunError when ``data`` is not well-framed STUN: short header, wrong cookie,
    length past the datagram, or an attribute whose length runs past the message.
    """
    if not is_stun(data):
        raise StunError("not a well-framed STUN message")
    end = HEADER_LENGTH + ((data[2] << 8) | data[3])
    pos = HEADER_LENGTH
    while pos + 4 <= end:
        attr_type = (data[pos] << 8) | data[pos + 1]
        attr_len = (data[pos + 2] << 8) | data[pos + 3]
        value_end = pos + 4 + attr_len
        if value_end > end:
            raise StunError("attribute length runs past the message")
        if attr_type == ATTR_USERNAME:
            return bytes(data[pos + 4:value_end])
        pos = value_end + (-attr_len % 4)
    return None


def server_ufrag(username: bytes) -> bytes:
    """The receiving side's ufrag: the part of ``local:remote`` before the colon."""
    return username.split(b":", 1)[0]


def binding_request(username: bytes, transaction_id: bytes | None = None) -> bytes:
    """A minimal STUN binding request carrying USERNAME (for load generators and tests; real
    clients add PRIORITY, ICE-CONTROLLING, MESSAGE-INTEGRITY and FINGERPRINT)."""
    tid = transaction_id if transaction_id is not None else os.urandom(12)
    attr = struct.pack("!HH", ATTR_USERNAME, len(username)) + username + bytes(-len(username) % 4)
    return struct.pack("!HHI", 0x0001, len(attr), MAGIC_COOKIE) + tid + attr


def binding_success(transaction_id: bytes = bytes(12)) -> bytes:
    """An empty STUN binding success response (stand-in next hops answer checks with it)."""
    return struct.pack("!HHI", 0x0101, 0, MAGIC_COOKIE) + transaction_id
