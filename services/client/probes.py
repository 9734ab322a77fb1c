"""Per-instance hooks into one session's aiortc/aioice objects, for timings aiortc does not expose.

Both probes replace a method on ONE instance (an instance attribute shadowing the class method),
so other sessions and other code in the process are untouched. Pinned to aiortc 1.16 / aioice 0.13:

- ``RTCRtpReceiver._handle_rtp_packet(packet, arrival_time_ms)``: called by the DTLS transport
  for every SRTP-decrypted RTP packet routed to the receiver (before the jitter buffer and the
  decoder). ``RtpProbe`` timestamps the first one, records every sequence number, counts
  voiced payloads (``voiced.py``) and feeds the arrival gaps (services/gaps.py).
- ``aioice.ice.StunProtocol.request(request, addr, ...)``: every connectivity check and consent
  check goes through it (``Connection.check_start``, ``Connection.query_consent``); it sends the
  first transmission synchronously before awaiting. ``StunProtocol.datagram_received`` is called by
  the asyncio transport for every datagram. ``StunProbe`` wraps both on every protocol of the
  Connection (they exist once ``setLocalDescription`` has gathered) to get, per binding
  transaction: local protocol, remote address, first-transmission time and the arrival time of
  the first success response: the kernel's receive stamp of the datagram, read in
  ``datagram_received`` (services/rxstamp.py), so neither the awaiting check's scheduling nor
  a busy event loop is counted (a relayed candidate's protocol has no socket of its own: its
  arrival is when ``datagram_received`` ran).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from aioice import stun

from services.client.seqstats import SeqTracker
from services.rxstamp import ReceiveStamps
from services.client.voiced import VoicedCount
from services.gaps import ArrivalGaps

_BINDING_SUCCESS = b"\x01\x01"  # STUN message type: Binding success response


class RtpProbe:
    """First-packet time, sequence numbers and voiced payloads of the RTP packets one
    receiver (one connection of a session) gets; every arrival also goes to the session's
    ``ArrivalGaps`` (services/gaps.py), which spans its connections."""

    def __init__(self, voiced: VoicedCount, gaps: ArrivalGaps, record: bool = False) -> None:
        self.first_packet_at: float | None = None
        # (ssrc, sequence number, monotonic arrival) of every packet, when ``record``
        self.arrivals: list[tuple[int, int, float]] | None = [] if record else None
        self.seq = SeqTracker()
        self.voiced = voiced
        self.gaps = gaps
        self.listener = None     # called with (payload size, monotonic arrival) per packet
        self._receiver: Any = None

    def attach(self, receiver: Any) -> None:
        original = receiver._handle_rtp_packet
        arrived = self.arrived

        async def handle_rtp_packet(packet: Any, arrival_time_ms: int) -> None:
            # the one clock read per packet (the CPU per session-second)
            arrived(packet.ssrc, packet.sequence_number, len(packet.payload), time.monotonic())
            await original(packet, arrival_time_ms=arrival_time_ms)

        receiver._handle_rtp_packet = handle_rtp_packet
        self._receiver = receiver

    def arrived(self, ssrc: int, seq: int, size: int, at: float) -> None:
        """A packet received at ``at`` (monotonic): by aiortc (``attach``'s hook) or by the
        native pump (services/client/pump.py)."""
        if self.first_packet_at is None:
            self.first_packet_at = at
        self.gaps.arrived(at)
        if self.arrivals is not None:
            self.arrivals.append((ssrc, seq, at))
        self.seq.add(seq)
        self.voiced.add(size, at)
        if self.listener is not None:
            self.listener(size, at)

    def detach(self) -> None:
        """Drop the instance attribute, restoring the class method (and breaking the cycle)."""
        if self._receiver is not None:
            self._receiver.__dict__.pop("_handle_rtp_packet", None)
            self._receiver = None


@dataclass
class StunTransaction:
    protocol: Any                  # the aioice StunProtocol (local socket) it was sent from
    remote: tuple[str, int]
    sent_at: float                 # first transmission
    answered_at: float | None = None   # first success response, handed over by the loop
    ok: bool = False               # the transaction returned a (authenticated) success
    sent_wall: float | None = None     # first transmission, wall clock (the kernel's stamps are)
    arrived_wall: float | None = None  # that response's receive stamp, when the kernel gave one

    @property
    def rtt_ms(self) -> float | None:
        if not self.ok or self.answered_at is None:
            return None
        if self.sent_wall is not None and self.arrived_wall is not None:
            return (self.arrived_wall - self.sent_wall) * 1000.0
        return (self.answered_at - self.sent_at) * 1000.0


class StunProbe:
    """Binding transactions of one aioice Connection, and its selected pair."""

    def __init__(self) -> None:
        self.transactions: list[StunTransaction] = []
        self._pending: dict[bytes, StunTransaction] = {}
        self._connection: Any = None
        self._protocols: list[Any] = []

    def attach(self, connection: Any) -> None:
        self._connection = connection
        for protocol in list(connection._protocols):
            self._wrap(protocol)

    def _wrap(self, protocol: Any) -> None:
        request_orig = protocol.request
        received_orig = protocol.datagram_received
        stamps = ReceiveStamps.of(getattr(protocol, "transport", None))
        stamps.enable()

        async def request(message: stun.Message, addr: tuple[str, int], *args: Any, **kwargs: Any):
            if (message.message_method != stun.Method.BINDING
                    or message.message_class != stun.Class.REQUEST):
                return await request_orig(message, addr, *args, **kwargs)
            record = StunTransaction(protocol, (addr[0], addr[1]), time.monotonic(),
                                     sent_wall=time.time())
            self.transactions.append(record)
            self._pending[message.transaction_id] = record
            try:
                result = await request_orig(message, addr, *args, **kwargs)
            finally:
                self._pending.pop(message.transaction_id, None)
            record.ok = True
            if record.answered_at is None:  # not seen by datagram_received (should not happen)
                record.answered_at = time.monotonic()
            return result

        def datagram_received(data: bytes, addr: tuple[Any, ...]) -> None:
            if self._pending and len(data) >= 20 and data[:2] == _BINDING_SUCCESS:
                record = self._pending.get(bytes(data[8:20]))
                if record is not None and record.answered_at is None:
                    record.answered_at = time.monotonic()
                    stamp = stamps.last()
                    if stamp is not None and stamp >= record.sent_wall:  # not an older datagram's
                        record.arrived_wall = stamp
            received_orig(data, addr)

        protocol.request = request
        protocol.datagram_received = datagram_received
        self._protocols.append(protocol)

    def detach(self) -> None:
        for protocol in self._protocols:
            protocol.__dict__.pop("request", None)
            protocol.__dict__.pop("datagram_received", None)
        self._protocols.clear()
        self._connection = None

    def selected_pair(self) -> Any:
        """aioice's nominated CandidatePair for component 1, or None."""
        if self._connection is None:
            return None
        return self._connection._nominated.get(1)

    def on_pair(self, pair: Any) -> list[StunTransaction]:
        return [t for t in self.transactions
                if t.protocol is pair.protocol and t.remote == tuple(pair.remote_addr)]

    def first_rtt_ms(self, pair: Any) -> float | None:
        """RTT of the first request on ``pair`` that succeeded, from its first transmission."""
        for t in self.on_pair(pair):
            if t.rtt_ms is not None:
                return t.rtt_ms
        return None

    def last_rtt_ms(self, pair: Any, sent_after: float) -> float | None:
        """RTT of the last successful binding request on ``pair`` sent after ``sent_after``."""
        rtts = [t.rtt_ms for t in self.on_pair(pair)
                if t.sent_at > sent_after and t.rtt_ms is not None]
        return rtts[-1] if rtts else None
