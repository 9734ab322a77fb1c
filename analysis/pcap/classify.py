"""What a captured UDP payload is, and the key that names the same datagram at every capture
point.

Relays forward a client's datagram unchanged, behind a hop header on the internal network
(services/wire/hop.py), so one datagram carries the same bytes from the client to the
transceiver. A TURN server (RFC 8656) forwards it unchanged too, wrapped between the client and
itself: in ChannelData (first byte 64-79: a 4-byte header, channel number and length, then
the datagram) or, before a channel is bound, in a Send indication (client to server) or a Data
indication (server to client), a STUN message whose DATA attribute holds it; between the
TURN server and the peer it is bare. Both wrappings are looked through like the hop header,
so the same key names the datagram on both sides. Kinds follow RFC 7983's first-byte
demultiplexing; keys are what identifies a datagram of each kind:

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
SEND_INDICATION, DATA_INDICATION = 0x0016, 0x0017
# TURN's own transactions (RFC 8656), by STUN method
TURN_METHODS = {0x003: "Allocate", 0x004: "Refresh", 0x008: "CreatePermission",
                0x009: "ChannelBind"}
REQUEST, SUCCESS, ERROR = "request", "success", "error"
_CLASSES = {0: REQUEST, 2: SUCCESS, 3: ERROR}
_ATTR_ERROR_CODE, _ATTR_DATA = 0x0009, 0x0013
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
    inner = _turn_payload(data)
    if inner is not None:  # a TURN server's wrapping: the datagram inside is the key
        start, total = inner
        offset += start
        data = data[start:start + total]
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


def _attributes(data: bytes):
    """(type, value offset, value length) of a STUN message's attributes, as far as the
    captured bytes go."""
    end = min(len(data), 20 + int.from_bytes(data[2:4], "big"))
    pos = 20
    while pos + 4 <= end:
        kind = int.from_bytes(data[pos:pos + 2], "big")
        size = int.from_bytes(data[pos + 2:pos + 4], "big")
        yield kind, pos + 4, size
        pos += 4 + size + (-size % 4)


def _turn_payload(data: bytes) -> tuple[int, int] | None:
    """(where the wrapped datagram starts, its length) in ChannelData or a Send/Data
    indication; None for anything else."""
    if len(data) >= 4 and 64 <= data[0] <= 79:
        return 4, int.from_bytes(data[2:4], "big")
    if (len(data) >= 20 and data[4:8] == _MAGIC_COOKIE
            and int.from_bytes(data[0:2], "big") in (SEND_INDICATION, DATA_INDICATION)):
        for kind, start, size in _attributes(data):
            if kind == _ATTR_DATA:
                return start, size
    return None


def turn_control(data: bytes) -> tuple[str, str, int | None] | None:
    """(method, class, error code or None) of one of TURN's own transactions (Allocate,
    Refresh, CreatePermission, ChannelBind: requests and their answers); None otherwise."""
    if len(data) < 20 or data[4:8] != _MAGIC_COOKIE or data[0] & 0xC0:
        return None
    kind = int.from_bytes(data[0:2], "big")
    method = (kind & 0x000F) | ((kind & 0x00E0) >> 1) | ((kind & 0x3E00) >> 2)
    klass = _CLASSES.get(((kind >> 7) & 0x2) | ((kind >> 4) & 0x1))
    if method not in TURN_METHODS or klass is None:
        return None
    code = None
    if klass == ERROR:
        for attr, start, size in _attributes(data):
            if attr == _ATTR_ERROR_CODE and size >= 4 and start + 4 <= len(data):
                code = (data[start + 2] & 0x7) * 100 + data[start + 3]
                break
    return TURN_METHODS[method], klass, code
