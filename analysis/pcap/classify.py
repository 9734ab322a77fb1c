"""What a captured UDP payload is, and the key that names the same datagram at every capture
point.

Relays forward a client's datagram unchanged, behind a hop header on the internal network
(services/wire/hop.py), so one datagram carries the same bytes from the client to the
transceiver. Kinds follow RFC 7983's first-byte demultiplexing; keys are what identifies a
datagram of each kind:

- STUN (RFC 5389: with the magic cookie): message type and transaction id (a
  retransmission repeats both);
- RTP: SSRC and sequence number;
- DTLS and RTCP (SRTCP): their first 48 bytes and length (headers, then ciphertext or random
  values, which no two datagrams share).

The parsing is by hand (a few slices a datagram, run on every captured frame); tests check it
against scapy's STUN and RTP layers.
"""
from __future__ import annotations

from typing import NamedTuple

from services.wire import hop, stun

STUN, DTLS, RTP, RTCP, OTHER = "stun", "dtls", "rtp", "rtcp", "other"
BINDING_REQUEST, BINDING_SUCCESS = 0x0001, 0x0101
_OPAQUE_PREFIX = 48
_MAGIC_COOKIE = stun.MAGIC_COOKIE.to_bytes(4, "big")


class Classified(NamedTuple):
    kind: str
    key: tuple | None          # None: not a datagram of a call (kind OTHER)
    offset: int                # where the client's datagram starts (after a hop header)
    client: tuple[str, int] | None  # from the hop header, if there was one


def classify(payload: bytes, length: int | None = None) -> Classified:
    """The kind and key of one UDP payload (``length``: its length on the wire, when the
    capture cut it)."""
    offset, client = 0, None
    if payload[:1] == b"\x0e":
        try:
            header, _ = hop.decode(payload)
        except hop.HopHeaderError:
            return Classified(OTHER, None, 0, None)
        offset, client = header.length, header.client
    data = payload[offset:]
    total = (len(payload) if length is None else length) - offset
    if not data:
        return Classified(OTHER, None, offset, client)
    first = data[0]
    if first < 4:
        if len(data) < 20 or data[4:8] != _MAGIC_COOKIE:  # e.g. calibration's probes
            return Classified(OTHER, None, offset, client)
        return Classified(STUN, (STUN, data[0:2], data[8:20]), offset, client)
    if 20 <= first <= 63:
        return Classified(DTLS, (DTLS, data[:_OPAQUE_PREFIX], total), offset, client)
    if 128 <= first <= 191 and len(data) >= 12:
        if 192 <= data[1] <= 223:  # RFC 5761: RTCP packet types 192-223
            return Classified(RTCP, (RTCP, data[:_OPAQUE_PREFIX], total), offset, client)
        return Classified(RTP, (RTP, data[8:12], data[2:4]), offset, client)
    return Classified(OTHER, None, offset, client)


def stun_type(key: tuple) -> int:
    """The message type of a STUN key."""
    return int.from_bytes(key[1], "big")
