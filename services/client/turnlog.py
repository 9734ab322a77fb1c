"""Every TURN request of one connection, timed: method, first transmission, response, outcome,
and how many times it was sent.

aioice sends its TURN requests (Allocate, Refresh, ChannelBind; CreatePermission is not used:
a channel binding installs the permission too) through ``TurnClientMixin.request`` of a TURN
client protocol that it creates itself while candidates are gathered, so no instance exists
before the first Allocate. ``install()`` wraps that class method once per process; the wrapper
is inert (it calls the original and nothing else) unless a ``TurnLog`` is active in the
context of the call (``with recording(log):``; asyncio tasks started inside inherit it). The
first request through a TURN client in such a context binds the client to that log for good
(its refreshes and its final Refresh at close are then logged whatever context they run in)
and shadows its ``datagram_received`` on that one instance, so the response's arrival is
timed by the kernel's receive stamp of the datagram (services/rxstamp.py), not when the event
loop next ran, as services/client/probes.py does for ICE checks; its ``send_stun`` is shadowed
the same way to time the first transmission and count transmissions, so a request answered
only after aioice retransmitted it (a lost request or answer: its RTT then holds the
retransmission timeout, 500 ms first) says so. Requests,
responses and retries are aioice's own: nothing is changed.

An Allocate answered 401 (the long-term credential challenge: realm and nonce) and sent again
with credentials counts as two requests, outcomes ``401`` and ``ok``. Pinned to aioice 0.13.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import time
from dataclasses import dataclass
from typing import Any

from aioice import stun, turn

from services.rxstamp import ReceiveStamps

METHODS = {stun.Method.ALLOCATE: "Allocate", stun.Method.REFRESH: "Refresh",
           stun.Method.CREATE_PERMISSION: "CreatePermission",
           stun.Method.CHANNEL_BIND: "ChannelBind"}
OK, TIMEOUT = "ok", "timeout"
_BOUND = "_voiceedge_turn_log"   # the TurnLog a TURN client instance reports to

_ACTIVE: contextvars.ContextVar["TurnLog | None"] = contextvars.ContextVar(
    "voiceedge_turn_log", default=None)


@dataclass
class TurnRequest:
    method: str
    sent_at: float                   # first transmission (monotonic)
    answered_at: float | None = None  # when the event loop handed the response over (monotonic)
    outcome: str | None = None       # ok, an error code ("401"), timeout; None: pending
    sends: int = 0                   # transmissions: 1, or more after aioice's retransmissions
    sent_wall: float | None = None   # first transmission, wall clock (the kernel's stamps are)
    arrived_wall: float | None = None  # the response's receive stamp, when the kernel gave one

    @property
    def rtt_ms(self) -> float | None:
        if self.sent_wall is not None and self.arrived_wall is not None:
            return (self.arrived_wall - self.sent_wall) * 1000.0
        if self.answered_at is None:
            return None
        return (self.answered_at - self.sent_at) * 1000.0


class TurnLog:
    """The TURN requests of one connection (one attempt of a session)."""

    def __init__(self) -> None:
        self.requests: list[TurnRequest] = []
        self._pending: dict[bytes, TurnRequest] = {}

    def rows(self, t0: float) -> list[list]:
        """``[method, sent_ms, rtt_ms or None, outcome, sends]`` per request, ms on the
        timeline that starts at ``t0`` (monotonic)."""
        return [[r.method, round((r.sent_at - t0) * 1000.0, 3),
                 None if r.rtt_ms is None else round(r.rtt_ms, 3), r.outcome, r.sends]
                for r in self.requests]

    def _bind(self, client: Any) -> None:
        setattr(client, _BOUND, self)
        received, send = client.datagram_received, client.send_stun
        pending = self._pending
        stamps = ReceiveStamps.of(client.transport)
        stamps.enable()

        def datagram_received(data: bytes, addr: Any) -> None:
            if pending and len(data) >= 20 and not data[0] & 0xC0:  # STUN, not ChannelData
                entry = pending.get(bytes(data[8:20]))
                if entry is not None and entry.answered_at is None:
                    entry.answered_at = time.monotonic()
                    stamp = stamps.last()
                    if stamp is not None and entry.sent_wall is not None \
                            and stamp >= entry.sent_wall:  # this datagram's, not an older one's
                        entry.arrived_wall = stamp
            received(data, addr)

        def send_stun(message: stun.Message, addr: Any) -> None:
            entry = pending.get(message.transaction_id)
            if entry is not None:
                if entry.sends == 0:
                    entry.sent_at, entry.sent_wall = time.monotonic(), time.time()
                entry.sends += 1
            send(message, addr)

        client.datagram_received = datagram_received
        client.send_stun = send_stun

    async def _timed(self, original, client: Any, request: stun.Message):
        entry = TurnRequest(METHODS.get(request.message_method, str(request.message_method)),
                            time.monotonic())
        self.requests.append(entry)
        self._pending[request.transaction_id] = entry
        try:
            result = await original(client, request)
            entry.outcome = OK
            return result
        except stun.TransactionFailed as exc:
            entry.outcome = str(exc.response.error_code or "error")
            raise
        except stun.TransactionTimeout:
            entry.outcome = TIMEOUT
            raise
        finally:
            self._pending.pop(request.transaction_id, None)
            if entry.outcome == OK and entry.answered_at is None:  # not seen arriving
                entry.answered_at = time.monotonic()


@contextlib.contextmanager
def recording(log: TurnLog):
    """TURN clients created inside the block (and in tasks started there) report to ``log``."""
    install()
    token = _ACTIVE.set(log)
    try:
        yield log
    finally:
        _ACTIVE.reset(token)


def install() -> None:
    """Wrap ``TurnClientMixin.request`` once (idempotent)."""
    original = turn.TurnClientMixin.request
    if getattr(original, "_voiceedge_timed", False):
        return

    @functools.wraps(original)
    async def request(self, request: stun.Message):
        log = getattr(self, _BOUND, None)
        if log is None:
            log = _ACTIVE.get()
            if log is None:
                return await original(self, request)
            log._bind(self)
        return await log._timed(original, self, request)

    request._voiceedge_timed = True
    turn.TurnClientMixin.request = request
