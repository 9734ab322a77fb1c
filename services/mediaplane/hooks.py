"""What the native media plane needs of an aiortc session, and what aiortc needs back.

aiortc keeps ICE, DTLS, SDP and the session's lifecycle. For the plane to carry a connected
session's RTP and RTCP it is given the SRTP keys (the DTLS-SRTP exporter, RFC 5764 4.2, read
from aiortc's DTLS connection the way aiortc's own ``_setup_srtp`` reads it), the negotiated
RTP parameters and the CNAME; aiortc's sender and receiver are kept from sending RTP and RTCP
(``IdleSender``). The plane reports what aiortc's RTCP would have: its statistics carry the
RTT from the peer's receiver reports and the receive statistics (jitter) of the peer's stream.

Hooks into aiortc 1.16 internals (pinned): ``RTCDtlsTransport._ssl``, ``_role``,
``_srtp_profiles``; ``RTCRtpTransceiver._codecs``, ``_headerExtensions``;
``RTCRtpSender._run_rtp``, ``_run_rtcp``, ``_ssrc`` and its private ``__rtp_started``,
``__rtp_exited``, ``__rtcp_started``, ``__rtcp_exited``; ``RTCRtpReceiver._run_rtcp`` and its
private ``__rtcp_started``, ``__rtcp_exited``; ``RTCPeerConnection.__cname``. And into aioice
0.13's (pinned): a candidate pair's ``protocol.transport`` (an asyncio datagram transport: its
socket and ``_read_ready``) and the selector loop's ``_add_reader``/``_remove_reader``, which
transports themselves use; a TURN pair's ``TurnTransport.__inner_protocol`` (its
``peer_to_channel``, ``server`` and ``transport``).
"""
from __future__ import annotations

import asyncio
import functools
import ipaddress
import os
import random
from dataclasses import dataclass

from aioice.turn import TurnClientUdpProtocol

_SENDER = "_RTCRtpSender__"
_RECEIVER = "_RTCRtpReceiver__"
_MID_URI = "urn:ietf:params:rtp-hdrext:sdes:mid"
_ABS_SEND_TIME_URI = "http://www.webrtc.org/experiments/rtp-hdrext/abs-send-time"


@dataclass(frozen=True)
class SrtpKeys:
    profile: int   # libsrtp's srtp_profile_t
    rx: bytes      # key and salt, the peer's direction
    tx: bytes


def srtp_keys(dtls) -> SrtpKeys:
    """The SRTP keys of a connected aiortc DTLS transport."""
    ssl = dtls._ssl
    name = ssl.get_selected_srtp_profile()
    profile = next(p for p in dtls._srtp_profiles if p.openssl_profile == name)
    material = ssl.export_keying_material(b"EXTRACTOR-dtls_srtp",
                                          2 * (profile.key_length + profile.salt_length))
    ours, theirs = (1, 0) if dtls._role == "server" else (0, 1)
    return SrtpKeys(profile.libsrtp_profile, profile.get_key_and_salt(material, theirs),
                    profile.get_key_and_salt(material, ours))


class IdleSender:
    """Stands in for aiortc's media loops of one transceiver (set before negotiation):
    ``RTCRtpSender._run_rtp`` and the sender's and receiver's ``_run_rtcp``. aiortc sends no
    RTP and no RTCP (the plane does both); it keeps the negotiated payload type.
    ``release()`` hands all three back to aiortc's own loops (a session the plane cannot
    carry)."""

    def __init__(self, sender, receiver) -> None:
        self.sender = sender
        self.payload_type: int | None = None
        self._released = False
        self._wakes: list[asyncio.Future] = []
        self._loops = [(sender, "_run_rtp", sender._run_rtp),       # for release()
                       (sender, "_run_rtcp", sender._run_rtcp),
                       (receiver, "_run_rtcp", receiver._run_rtcp)]
        sender._run_rtp = self._run_rtp
        sender._run_rtcp = functools.partial(self._idle, sender, _SENDER + "rtcp",
                                             sender._run_rtcp)
        receiver._run_rtcp = functools.partial(self._idle, receiver, _RECEIVER + "rtcp",
                                               receiver._run_rtcp)

    def release(self) -> None:
        self._released = True
        for owner, name, original in self._loops:
            setattr(owner, name, original)
        for wake in self._wakes:
            if not wake.done():
                wake.set_result(None)

    async def _run_rtp(self, codec) -> None:
        self.payload_type = codec.payloadType
        await self._idle(self.sender, _SENDER + "rtp", functools.partial(self._loops[0][2], codec))

    async def _idle(self, owner, loop: str, original) -> None:
        """Started and idle until aiortc cancels it (stopped as aiortc's loop stops, without
        its BYE: the plane sends that), or until ``release()`` runs aiortc's own loop."""
        if self._released:
            return await original()
        getattr(owner, f"{loop}_started").set()
        wake = asyncio.get_running_loop().create_future()
        self._wakes.append(wake)
        try:
            await wake
        except asyncio.CancelledError:
            getattr(owner, f"{loop}_exited").set()
            return
        await original()


def cname(pc) -> bytes:
    """The CNAME aiortc gives every stream of a peer connection (RFC 7022)."""
    return getattr(pc, "_RTCPeerConnection__cname").encode()


@dataclass(frozen=True)
class RtpParameters:
    """The plane's ``add`` arguments after the keys: what the session sends with."""
    ssrc: int
    seq: int
    timestamp: int
    payload_type: int
    mid: bytes
    mid_id: int
    abs_send_time_id: int


def rtp_parameters(transceiver, idle: IdleSender) -> RtpParameters:
    """The negotiated parameters (aiortc may call ``sender.send`` only after "connected"),
    with a random first sequence number and timestamp (RFC 3550 5.1)."""
    ids = {ext.uri: ext.id for ext in transceiver._headerExtensions}
    payload_type = (idle.payload_type if idle.payload_type is not None
                    else transceiver._codecs[0].payloadType)
    return RtpParameters(transceiver.sender._ssrc, random.randint(0, 0xFFFF),
                         random.randint(0, 0xFFFFFFFF), payload_type,
                         (transceiver.mid or "").encode(), ids.get(_MID_URI, 0),
                         ids.get(_ABS_SEND_TIME_URI, 0))


def media_stats(stats: dict | None) -> tuple[float | None, float | None]:
    """(jitter of the peer's stream, RTT of ours) in ms from a plane's ``stats(channel)``: the
    figures aiortc's getStats gives (inbound-rtp jitter, remote-inbound-rtp roundTripTime,
    smoothed the same way)."""
    if stats is None:
        return None, None
    jitter = round((stats["jitter_q4"] >> 4) / 48.0, 3) if stats["have_ssrc"] else None
    rtt = stats.get("rtt_s")
    return jitter, None if rtt is None else round(rtt * 1000.0, 3)


@dataclass
class SessionSocket:
    """A session's own socket (its selected pair's), read through the plane once the plane
    carries its RTP: the plane's ``read_session`` keeps the media and hands back the rest
    (STUN, DTLS), which goes on to aioice as before. The plane holds a duplicate of the
    socket's descriptor (``fd``), so that aioice closing its socket can never leave the plane
    a number the next socket reuses. ``give_back`` (after the plane's ``remove``) closes the
    duplicate and restores aioice's reader.

    A pair through a TURN server over UDP is carried the same way on the allocation's socket:
    the plane sends and takes ChannelData of the pair's channel (``turn_channel``, bound by
    aioice's first send to the peer) to and from the server (``peer``); the rest goes to the
    allocation's protocol, which unwraps it for aioice as before."""

    fd: int                # the plane's duplicate
    own_fd: int            # aioice's
    protocol: object       # what takes the datagrams the plane hands back
    transport: object      # the datagram transport whose reader the plane borrows
    peer: tuple[str, int]  # where the plane sends: the client, or the TURN server
    turn_channel: int = 0

    @classmethod
    def of(cls, pair) -> "SessionSocket | None":
        """The pair's socket; None for one the plane cannot carry (TURN over TCP, a channel
        not bound yet, a server named by an IPv6 address)."""
        protocol = pair.protocol
        transport = getattr(protocol, "transport", None)
        if transport is None:
            return None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            return cls(os.dup(sock.fileno()), sock.fileno(), protocol, transport,
                       tuple(pair.remote_addr))
        turn = getattr(transport, "_TurnTransport__inner_protocol", None)
        if not isinstance(turn, TurnClientUdpProtocol):
            return None
        channel = turn.peer_to_channel.get(tuple(pair.remote_addr))
        sock = turn.transport.get_extra_info("socket")
        server = tuple(turn.server)
        if channel is None or sock is None or not _ipv4(server[0]):
            return None
        return cls(os.dup(sock.fileno()), sock.fileno(), turn, turn.transport, server, channel)

    def read_through(self, plane, channel: int) -> None:
        remove, add = _readers(asyncio.get_running_loop())
        remove(self.own_fd)
        add(self.fd, self._readable, plane, channel)

    def discard(self) -> None:
        """Close the duplicate of a socket the plane never took (its ``add`` failed)."""
        os.close(self.fd)

    def give_back(self) -> None:
        remove, add = _readers(asyncio.get_running_loop())
        remove(self.fd)
        os.close(self.fd)
        if not self.transport.is_closing():
            add(self.own_fd, self.transport._read_ready)

    def _readable(self, plane, channel: int) -> None:
        try:
            datagrams = plane.read_session(channel)
        except KeyError:  # taken off the plane while the event was pending
            return
        for data, addr in datagrams:
            self.protocol.datagram_received(data, addr)


def _readers(loop):
    """(remove_reader, add_reader) for a session's socket. asyncio's selector loop refuses its
    public pair on a descriptor one of its transports holds (the light clients' sockets): its
    private pair is what that transport itself uses. Other loops (uvloop: the transceiver's)
    see only sockets that ice.py reads with the public ``add_reader``."""
    if hasattr(loop, "_add_reader"):
        return loop._remove_reader, loop._add_reader
    return loop.remove_reader, loop.add_reader


def _ipv4(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 4
    except ValueError:
        return False
