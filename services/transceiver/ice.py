"""How the transceiver's ICE differs from stock aiortc: the ufrag, the socket, the candidate.

aiortc builds its aioice ``Connection`` objects itself, inside ``setRemoteDescription``, with no
parameter for the ufrag or the socket. ``install()`` points the name ``Connection`` in
``aiortc.rtcicetransport`` at a factory that builds an ``EdgeConnection`` while an ``IcePlan`` is
active (``with ice_plan(plan): await pc.setRemoteDescription(...)``) and a stock Connection
otherwise, so other peer connections in the same process (clients in a demo) are untouched.

- shared mode: the session's only host candidate is the advertised address (a relay VIP, or the
  shared socket itself); its StunProtocol writes into the transceiver's ``SharedSocket``.
- port-per-session mode: stock aioice behaviour on one bind address: a socket per session.
  On the native media path that socket is read with the loop's ``add_reader`` (any loop,
  uvloop included) instead of the loop's own UDP transport, so that the media plane can take
  its reads over once the session is attached (``SessionTransport``).

Per-call work done once or ahead of the call (the answer is on every call's signaling path):

- ``gather_candidates`` does not ask the OS for the host's addresses (``ifaddr``, a few hundred
  microseconds per call, more on a host with many interfaces): the plan says where the one
  candidate is, in both modes;
- DTLS certificates (a fresh EC key each, never reused) come from a ``CertificatePool`` filled
  in the background while one is active (``with certificates(pool): RTCPeerConnection()``),
  compute their fingerprints once instead of for every SDP aiortc writes, and bring their
  DTLS context along.

Hooks into aioice 0.13 / aiortc 1.16 internals (pinned in pyproject.toml):
``Connection.get_component_candidates`` (the only place aioice creates sockets),
``Connection.gather_candidates`` and the attributes it sets (``_local_candidates_start``,
``_local_candidates``, ``_local_candidates_end``, ``_components``),
``Connection._protocols``, ``Connection.data_received`` (overridden: SRTP goes to the session's
shortcut once DTLS is up, inbound.py), ``StunProtocol`` (subclassed) and its private closed
future, which ``connection_lost`` resolves; the name ``RTCCertificate`` in ``aiortc.rtcpeerconnection``
(its ``generateCertificate`` is the only certificate ``RTCPeerConnection()`` makes) and
``RTCCertificate._create_ssl_context`` (overridden by the pool's certificates).
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import socket
import time
from dataclasses import dataclass

import aioice
import aiortc.rtcicetransport
import aiortc.rtcpeerconnection
from aioice import stun
from aioice.candidate import Candidate, candidate_foundation, candidate_priority
from aioice.ice import StunProtocol
from aioice.turn import UDP_SOCKET_BUFFER_SIZE
from aiortc.rtcdtlstransport import SRTP_PROFILES, RTCCertificate

from services.transceiver.inbound import is_srtp
from services.transceiver.mux import SharedSocket

SHARED, PORT_PER_SESSION = "shared", "port-per-session"
MODES = (SHARED, PORT_PER_SESSION)


@dataclass(frozen=True)
class IcePlan:
    """ICE set-up of one server-side session."""

    ufrag: str
    mode: str
    mux: SharedSocket | None = None          # shared mode
    advertise: tuple[str, int] | None = None  # shared mode: the one candidate in the answer
    bind_host: str = "0.0.0.0"                # port-per-session mode: where sockets bind
    plane_readable: bool = False              # port-per-session: SessionTransport sockets


_PLAN: contextvars.ContextVar[IcePlan | None] = contextvars.ContextVar("voiceedge_ice_plan",
                                                                      default=None)


@contextlib.contextmanager
def _scoped(var: contextvars.ContextVar, value):
    """``var`` is ``value`` inside the block (and in tasks started there)."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def ice_plan(plan: IcePlan):
    """Make peer connections set up inside this block use ``plan``."""
    return _scoped(_PLAN, plan)


def _connection_factory(*args, **kwargs) -> aioice.Connection:
    plan = _PLAN.get()
    if plan is None:
        return aioice.Connection(*args, **kwargs)
    kwargs["local_username"] = plan.ufrag
    return EdgeConnection(plan, *args, **kwargs)


def install() -> None:
    """Route aiortc's Connection construction through the plan-aware factory, and its
    certificate generation through the active ``CertificatePool`` (idempotent)."""
    aiortc.rtcicetransport.Connection = _connection_factory
    aiortc.rtcpeerconnection.RTCCertificate = _CertificateSource


class PooledCertificate(RTCCertificate):
    """An RTCCertificate that computes its fingerprints once (aiortc asks for them, three
    digests of the certificate, every time it writes an SDP) and has its DTLS context ready
    (~0.5 ms, otherwise made when the session is nominated, before its first DTLS flight)."""

    def __init__(self, key, cert) -> None:
        super().__init__(key, cert)
        self.made = time.monotonic()
        self._fingerprints = super().getFingerprints()
        self._context = super()._create_ssl_context(SRTP_PROFILES)

    def getFingerprints(self):
        return list(self._fingerprints)

    def _create_ssl_context(self, srtp_profiles):
        context, self._context = self._context, None
        if context is not None and list(srtp_profiles) == SRTP_PROFILES:
            return context
        return super()._create_ssl_context(srtp_profiles)


class CertificatePool:
    """DTLS certificates made ahead of the calls: each has its own fresh key and serves one
    peer connection only (a shared one would let anyone link a transceiver's calls by
    fingerprint). ``take`` hands out the oldest, or makes one on the spot when the pool ran
    dry (counted in ``made_on_call``), and refills in the background a little later (the call
    that took one is still being answered and set up), one certificate per event-loop turn,
    so no other work waits for more than one."""

    def __init__(self, size: int = 32, max_age_s: float = 3600.0,
                 refill_after_s: float = 0.05) -> None:
        self.size = size
        self.refill_after_s = refill_after_s
        self.max_age_s = max_age_s  # aiortc's certificates are valid for 30 days
        self.made_ahead = 0
        self.made_on_call = 0
        self._ready: collections.deque[PooledCertificate] = collections.deque()
        self._refill: asyncio.Task | None = None

    def __len__(self) -> int:
        return len(self._ready)

    def fill(self) -> None:
        """Fill the pool now (at start-up, before any call)."""
        while len(self._ready) < self.size:
            self._ready.append(PooledCertificate.generateCertificate())
            self.made_ahead += 1

    def take(self) -> PooledCertificate:
        now = time.monotonic()
        cert = None
        while self._ready:
            candidate = self._ready.popleft()
            if now - candidate.made < self.max_age_s:
                cert = candidate
                break
        if cert is None:
            cert = PooledCertificate.generateCertificate()
            self.made_on_call += 1
        self._refill_soon()
        return cert

    def _refill_soon(self) -> None:
        if self._refill is not None and not self._refill.done():
            return
        try:
            self._refill = asyncio.get_running_loop().create_task(self._refill_loop())
        except RuntimeError:  # no event loop: the next take refills
            pass

    async def _refill_loop(self) -> None:
        await asyncio.sleep(self.refill_after_s)
        while len(self._ready) < self.size:
            await asyncio.sleep(0)  # let the loop's other work run between two certificates
            self._ready.append(PooledCertificate.generateCertificate())
            self.made_ahead += 1

    def close(self) -> None:
        if self._refill is not None:
            self._refill.cancel()
        self._ready.clear()


_CERTS: contextvars.ContextVar[CertificatePool | None] = contextvars.ContextVar(
    "voiceedge_certificates", default=None)


def certificates(pool: CertificatePool):
    """Make peer connections created inside this block take their certificate from ``pool``."""
    return _scoped(_CERTS, pool)


class _CertificateSource:
    """Stands in for ``RTCCertificate`` in ``aiortc.rtcpeerconnection``: the active pool's
    certificate inside ``certificates(pool)``, a stock one elsewhere (clients in a demo)."""

    @staticmethod
    def generateCertificate() -> RTCCertificate:
        pool = _CERTS.get()
        if pool is None:
            return RTCCertificate.generateCertificate()
        return pool.take()


class _MuxTransport:
    """The asyncio transport a StunProtocol sees in shared mode: writes go to the mux."""

    def __init__(self, protocol: "MuxStunProtocol", mux: SharedSocket) -> None:
        self._protocol, self._mux = protocol, mux
        self._closing = False

    def sendto(self, data: bytes, addr: tuple[str, int]) -> None:
        if not self._closing:
            self._mux.sendto(self._protocol, data, addr)

    def get_extra_info(self, name: str, default=None):
        return self._mux.get_extra_info(name, default)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._mux.unregister(self._protocol)
            asyncio.get_running_loop().call_soon(self._protocol.connection_lost, None)


class SessionTransport(asyncio.DatagramTransport):
    """A port-per-session socket read with the loop's public ``add_reader``: the native
    plane can move its reads to itself (hooks.SessionSocket), which no event loop allows on
    a socket of its own UDP transport (uvloop's has no way to pause it). Writes are
    non-blocking ``sendto``: a full buffer drops the datagram, as UDP does."""

    READS_PER_WAKE = 64

    def __init__(self, sock: socket.socket, protocol: StunProtocol) -> None:
        super().__init__(extra={"socket": sock, "sockname": sock.getsockname()})
        self._sock, self._protocol = sock, protocol
        self._closing = False
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._read_ready)

    @classmethod
    def bind(cls, host: str, protocol: StunProtocol) -> "SessionTransport":
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_SOCKET_BUFFER_SIZE)
            sock.bind((host, 0))
            transport = cls(sock, protocol)
        except BaseException:
            sock.close()
            raise
        protocol.connection_made(transport)
        return transport

    def _read_ready(self) -> None:
        for _ in range(self.READS_PER_WAKE):
            try:
                data, addr = self._sock.recvfrom(2048)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._protocol.error_received(exc)
                return
            self._protocol.datagram_received(data, addr)

    def sendto(self, data: bytes, addr=None) -> None:
        if self._closing:
            return
        try:
            self._sock.sendto(data, addr)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            self._protocol.error_received(exc)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._loop.remove_reader(self._sock.fileno())
        self._loop.call_soon(self._closed)

    def abort(self) -> None:
        self.close()

    def _closed(self) -> None:
        try:
            self._protocol.connection_lost(None)
        finally:
            self._sock.close()


class MuxStunProtocol(StunProtocol):
    """aioice's STUN protocol for one session, on the shared socket."""

    def __init__(self, receiver: "EdgeConnection", mux: SharedSocket) -> None:
        super().__init__(receiver)
        self.transport = _MuxTransport(self, mux)

    def media_received(self, data: bytes) -> None:
        # DTLS/SRTP: skip StunProtocol's attempt to parse it as STUN (an exception per packet).
        self.receiver.data_received(data, self.local_candidate.component)

    def stun_received(self, message: stun.Message, data: bytes, addr: tuple[str, int]) -> None:
        """StunProtocol.datagram_received for a message the mux has parsed already: aioice's
        dispatch, without parsing the same bytes a second time."""
        if message.message_class in (stun.Class.RESPONSE, stun.Class.ERROR):
            transaction = self.transactions.get(message.transaction_id)
            if transaction is not None:
                transaction.response_received(message, addr)
        elif message.message_class == stun.Class.REQUEST:
            self.receiver.request_received(message, addr, self)

    @property
    def ufrag(self) -> str:
        return self.receiver.local_username

    @property
    def password(self) -> bytes:
        return self.receiver.local_password.encode("utf8")


class EdgeConnection(aioice.Connection):
    """An aioice Connection whose host candidate comes from the plan, and which accepts a
    nominated pair the way an ICE-lite agent does (RFC 8445 §2.5, §7.3.1.5)."""

    def __init__(self, plan: IcePlan, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.plan = plan
        self.media_sink = None  # set once DTLS is up: SRTP goes there, not to the queue
        # called with (old, new) pair when the client nominates another one on a connected
        # session (a NAT rebinding, a handover): whoever sends the session's media moves too
        self.on_moved = None

    def data_received(self, data: bytes, component: int) -> None:
        """Every non-STUN datagram of the session (both modes). SRTP goes to ``media_sink``
        when one is set (inbound.py), everything else to aioice's queue."""
        sink = self.media_sink
        if sink is not None and is_srtp(data):
            sink(data)
        else:
            super().data_received(data, component)

    def check_incoming(self, message, addr, protocol) -> None:
        """An authenticated check with USE-CANDIDATE from the controlling client validates and
        nominates its pair at once.

        Stock aioice (full ICE) waits for its own triggered check on that pair to succeed. A
        server behind a relay cannot check towards the client before the client's first check
        teaches it the address, so that wait is one more media round trip of setup that only
        the relayed architectures would pay: an artefact of this transceiver, not of the
        architecture (edge servers are commonly ICE-lite). Same rule in both modes."""
        super().check_incoming(message, addr, protocol)
        if "USE-CANDIDATE" not in message.attributes or self.ice_controlling:
            return
        for pair in self._check_list:
            if pair.protocol is protocol and pair.remote_addr == (addr[0], addr[1]):
                if not pair.nominated:
                    if pair.task is not None:
                        pair.task.cancel()  # the triggered check is no longer needed
                    pair.state = aioice.ice.CandidatePair.State.SUCCEEDED
                    pair.nominated = True
                    self.check_complete(pair)
                return

    def check_complete(self, pair) -> None:
        """aioice's; the connection follows a pair the client nominates after the first (its
        selected pair then changes: RFC 8445 8.1.1) and says so through ``on_moved``."""
        before = self._nominated.get(pair.component)
        super().check_complete(pair)
        if (before is not None and self._nominated.get(pair.component) is pair
                and (pair.protocol, pair.remote_addr) != (before.protocol, before.remote_addr)
                and self.on_moved is not None):   # not an ICE restart on the same path
            self.on_moved(before, pair)

    async def gather_candidates(self) -> None:
        """aioice's, without enumerating the host's addresses (neither mode uses them: the
        plan says where the candidate is) and without a task per component (one component
        here: BUNDLE and rtcp-mux), so gathering costs no extra event-loop turn."""
        if not self._local_candidates_start:
            self._local_candidates_start = True
            for component in self._components:
                self._local_candidates += await self.get_component_candidates(
                    component=component, addresses=[])
            self._local_candidates_end = True

    async def get_component_candidates(self, component: int, addresses: list[str],
                                       timeout: int = 5) -> list[Candidate]:
        plan = self.plan
        if plan.mode == PORT_PER_SESSION:
            if not plan.plane_readable:
                return await super().get_component_candidates(component, [plan.bind_host],
                                                               timeout)
            protocol = StunProtocol(self)
            transport = SessionTransport.bind(plan.bind_host, protocol)
            host, port = transport.get_extra_info("sockname")[:2]
            protocol.local_candidate = Candidate(
                foundation=candidate_foundation("host", "udp", host), component=component,
                transport="udp", priority=candidate_priority(component, "host"), host=host,
                port=port, type="host")
            self._protocols.append(protocol)
            return [protocol.local_candidate]
        protocol = MuxStunProtocol(self, plan.mux)
        host, port = plan.advertise
        protocol.local_candidate = Candidate(
            foundation=candidate_foundation("host", "udp", host), component=component,
            transport="udp", priority=candidate_priority(component, "host"), host=host,
            port=port, type="host")
        plan.mux.register(protocol)
        self._protocols.append(protocol)
        return [protocol.local_candidate]


def selected_pair(pc):
    """``pc``'s selected candidate pair (aioice's ``CandidatePair``), or None before ICE
    completes. Reads aioice's ``Connection._nominated``."""
    for transceiver in pc.getTransceivers():
        connection = transceiver.receiver.transport.transport._connection
        pair = connection._nominated.get(1)
        if pair is not None:
            return pair
    return None


def selected_remote_address(pc) -> tuple[str, int] | None:
    """The client address of ``pc``'s selected candidate pair (the real one, also behind a
    relay), or None before ICE completes."""
    pair = selected_pair(pc)
    return None if pair is None else pair.remote_addr
