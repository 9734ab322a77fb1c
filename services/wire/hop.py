"""The relay hop header: what a datagram carries between relays and transceivers.

Every datagram on the internal network (ingress relay <-> cluster relay <-> transceiver) starts
with this header, followed by the client's datagram unchanged::

    byte 0      0x0E  magic and version; outside every RFC 7983 / RFC 9443 demux range
                      (STUN 0-3, ZRTP 16-19, DTLS 20-63, TURN 64-79, QUIC 64-127/192-255,
                      RTP/RTCP 128-191), so a transceiver can share one socket with direct media
    byte 1      flags: bit 0 direction (0 towards the server, 1 towards the client),
                       bit 1 address family (0 IPv4, 1 IPv6), other bits zero
    bytes 2-3   client UDP port, network order
    bytes 4-    client IP address: 4 bytes (IPv4) or 16 bytes (IPv6)

So 8 bytes for an IPv4 client, 20 for IPv6. Bytes 2-7 of an IPv4 header are laid out exactly
like bytes 2-7 of a ``struct sockaddr_in`` (port, then address, both network order): the relay
uses that to key flows the same way from either. The return path needs nothing more: each hop
answers the address it received the datagram from, and each relay keeps the previous hop in
its flow, so no per-flow sockets exist anywhere.
"""
from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

MAGIC = 0x0E
TO_SERVER = 0
TO_CLIENT = 1
FLAG_DIRECTION = 0x01
FLAG_IPV6 = 0x02
IPV4_LENGTH = 8
IPV6_LENGTH = 20


class HopHeaderError(ValueError):
    """A datagram that does not start with a valid hop header."""


@dataclass(frozen=True, slots=True)
class HopHeader:
    direction: int
    client: tuple[str, int]

    @property
    def length(self) -> int:
        return IPV6_LENGTH if ":" in self.client[0] else IPV4_LENGTH


def encode(client: tuple[str, int], direction: int = TO_SERVER) -> bytes:
    """The header for a datagram of ``client`` travelling in ``direction``."""
    host, port = client[0], client[1]
    ip = ipaddress.ip_address(host)
    flags = direction & FLAG_DIRECTION
    if ip.version == 6:
        flags |= FLAG_IPV6
    return struct.pack("!BBH", MAGIC, flags, port) + ip.packed


def encode_sockaddr(raw: bytes | bytearray, direction: int = TO_SERVER) -> bytes:
    """``encode`` for a client given as a raw ``sockaddr_in``/``sockaddr_in6`` (the relay's
    receive slots): no address parsing, so it costs a tenth of ``encode``."""
    flags = direction & FLAG_DIRECTION
    if raw[0] | (raw[1] << 8) == 10:  # AF_INET6
        return bytes((MAGIC, flags | FLAG_IPV6)) + bytes(raw[2:4]) + bytes(raw[8:24])
    return bytes((MAGIC, flags)) + bytes(raw[2:8])  # port and address, as the header has them


def decode(data: bytes | memoryview) -> tuple[HopHeader, memoryview]:
    """Split a datagram into its header and the client's datagram."""
    if len(data) < IPV4_LENGTH or data[0] != MAGIC:
        raise HopHeaderError("no hop header")
    flags = data[1]
    if flags & ~(FLAG_DIRECTION | FLAG_IPV6):
        raise HopHeaderError(f"unknown hop header flags {flags:#x}")
    size = IPV6_LENGTH if flags & FLAG_IPV6 else IPV4_LENGTH
    if len(data) < size:
        raise HopHeaderError("truncated hop header")
    port = (data[2] << 8) | data[3]
    host = str(ipaddress.ip_address(bytes(data[4:size])))
    header = HopHeader(direction=flags & FLAG_DIRECTION, client=(host, port))
    return header, memoryview(data)[size:]
