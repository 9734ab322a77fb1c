"""How the transceiver's ICE differs from stock aiortc: the ufrag, the socket, the candidate.

aiortc builds its aioice ``Connection`` objects itself, inside ``setRemoteDescription``, with no
parameter for the ufrag or the socket. ``install()`` points the name ``Connection`` in
``aiortc.rtcicetransport`` at a factory that builds an ``EdgeConnection`` while an ``IcePlan`` is
active (``with ice_plan(plan): await pc.setRemoteDescription(...)``) and a stock Connection
otherwise, so other peer connections in the same process (clients in a demo) are untouched.

- shared mode: the session's only host candidate is the advertised address (a relay VIP, or the
  shared socket itself); its StunProtocol writes into the transceiver's ``SharedSocket``.
- port-per-session mode: stock aioice behaviour on one bind address: a socket per session.

Hooks into aioice 0.13 / aiortc 1.16 internals (pinned in pyproject.toml):
``Connection.get_component_candidates`` (the only place aioice creates sockets),
``Connection._protocols``, ``StunProtocol`` (subclassed) and its private closed future, which
``connection_lost`` resolves.
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
from dataclasses import dataclass

import aioice
import aiortc.rtcicetransport
from aioice.candidate import Candidate, candidate_foundation, candidate_priority
from aioice.ice import StunProtocol

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


_PLAN: contextvars.ContextVar[IcePlan | None] = contextvars.ContextVar("voiceedge_ice_plan",
                                                                      default=None)


@contextlib.contextmanager
def ice_plan(plan: IcePlan):
    """Make peer connections set up inside this block use ``plan``."""
    token = _PLAN.set(plan)
    try:
        yield
    finally:
        _PLAN.reset(token)


def _connection_factory(*args, **kwargs) -> aioice.Connection:
    plan = _PLAN.get()
    if plan is None:
        return aioice.Connection(*args, **kwargs)
    kwargs["local_username"] = plan.ufrag
    return EdgeConnection(plan, *args, **kwargs)


def install() -> None:
    """Route aiortc's Connection construction through the plan-aware factory (idempotent)."""
    aiortc.rtcicetransport.Connection = _connection_factory


class _MuxTransport:
    """The asyncio transport a StunProtocol sees in shared mode: writes go to the mux."""

    def __init__(self, protocol: "MuxStunProtocol", mux: SharedSocket) -> None:
        self._protocol, self._mux = protocol, mux
        self._closing = False

    def sendto(self, data: bytes, addr: tuple[str, int]) -> None:
        if not self._closing:
            self._mux.sendto(self._protocol, data, addr)

    def get_extra_info(self, name: str, default=None):
        return self._mux.transport.get_extra_info(name, default)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._mux.unregister(self._protocol)
            asyncio.get_running_loop().call_soon(self._protocol.connection_lost, None)


class MuxStunProtocol(StunProtocol):
    """aioice's STUN protocol for one session, on the shared socket."""

    def __init__(self, receiver: "EdgeConnection", mux: SharedSocket) -> None:
        super().__init__(receiver)
        self.transport = _MuxTransport(self, mux)

    def media_received(self, data: bytes) -> None:
        # DTLS/SRTP: skip StunProtocol's attempt to parse it as STUN (an exception per packet).
        self.receiver.data_received(data, self.local_candidate.component)

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

    async def get_component_candidates(self, component: int, addresses: list[str],
                                       timeout: int = 5) -> list[Candidate]:
        plan = self.plan
        if plan.mode == PORT_PER_SESSION:
            return await super().get_component_candidates(component, [plan.bind_host], timeout)
        protocol = MuxStunProtocol(self, plan.mux)
        host, port = plan.advertise
        protocol.local_candidate = Candidate(
            foundation=candidate_foundation("host", "udp", host), component=component,
            transport="udp", priority=candidate_priority(component, "host"), host=host,
            port=port, type="host")
        plan.mux.register(protocol)
        self._protocols.append(protocol)
        return [protocol.local_candidate]


def selected_remote_address(pc) -> tuple[str, int] | None:
    """The client address of ``pc``'s selected candidate pair (the real one, also behind a
    relay), or None before ICE completes. Reads aioice's ``Connection._nominated``."""
    for transceiver in pc.getTransceivers():
        connection = transceiver.receiver.transport.transport._connection
        pair = connection._nominated.get(1)
        if pair is not None:
            return pair.remote_addr
    return None
