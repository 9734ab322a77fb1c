"""The client's TURN request log (services/client/turnlog.py) against a real coturn on loopback,
through a forwarder that loses chosen datagrams: a request that aioice had to send again is
counted as sent twice, and its RTT holds the retransmission timeout."""
from __future__ import annotations

import asyncio
import time

from aioice import turn

from services.client.turnlog import TurnLog, recording
from services.turn.credentials import issue
from tests.turnserver import Coturn


class _LossyForwarder(asyncio.DatagramProtocol):
    """Client -> server datagrams numbered from 0; those in ``lose`` are dropped."""

    def __init__(self, server: tuple[str, int], lose: set[int]) -> None:
        self.server, self.lose, self.count = server, lose, 0
        self.client: tuple[str, int] | None = None
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        if addr == self.server:
            self.transport.sendto(data, self.client)
            return
        self.client = addr
        index, self.count = self.count, self.count + 1
        if index not in self.lose:
            self.transport.sendto(data, self.server)


async def _allocate_through(server: tuple[str, int], secret: str, lose: set[int]) -> list[list]:
    loop = asyncio.get_running_loop()
    forward, _ = await loop.create_datagram_endpoint(
        lambda: _LossyForwarder(server, lose), local_addr=("127.0.0.1", 0))
    via = forward.get_extra_info("sockname")
    credential = issue(secret, "test-log", 60)
    log = TurnLog()
    t0 = loop.time()
    with recording(log):
        transport, client = await loop.create_datagram_endpoint(
            lambda: turn.TurnClientUdpProtocol(via, credential.username, credential.credential,
                                               600, 500), remote_addr=via)
        try:
            await client.connect()
            await client.delete()
        finally:
            transport.close()
            forward.close()
    return log.rows(t0)


def test_a_lost_request_is_sent_again_and_counted_and_a_clean_one_is_sent_once(tmp_path):
    with Coturn(tmp_path, "127.0.0.1") as server:
        addr = ("127.0.0.1", server.port)
        clean = asyncio.run(asyncio.wait_for(_allocate_through(addr, server.secret, set()), 20))
        # datagram 1 is the authenticated Allocate (0: the one the 401 challenge answers)
        lossy = asyncio.run(asyncio.wait_for(_allocate_through(addr, server.secret, {1}), 20))
    assert [(m, outcome, sends) for m, _, _, outcome, sends in clean] == [
        ("Allocate", "401", 1), ("Allocate", "ok", 1), ("Refresh", "ok", 1)], clean
    assert all(rtt < 100 for _, _, rtt, _, _ in clean), clean
    assert [(m, outcome, sends) for m, _, _, outcome, sends in lossy] == [
        ("Allocate", "401", 1), ("Allocate", "ok", 2), ("Refresh", "ok", 1)], lossy
    # answered after aioice's first retransmission timeout (500 ms), within a loopback RTT
    assert 500 <= lossy[1][2] < 600, lossy


async def _allocate_with_a_stalled_loop(server: tuple[str, int], secret: str,
                                        stall_s: float) -> list[list]:
    """Allocate straight to the server; right after the authenticated Allocate leaves, the
    event loop is kept busy for ``stall_s`` (as another session's work would keep it)."""
    loop = asyncio.get_running_loop()
    credential = issue(secret, "test-stall", 60)
    log = TurnLog()
    with recording(log):
        transport, client = await loop.create_datagram_endpoint(
            lambda: turn.TurnClientUdpProtocol(server, credential.username, credential.credential,
                                               600, 500), remote_addr=server)
        send, sent = client.send_stun, []

        def send_then_stall(message, addr) -> None:
            send(message, addr)
            sent.append(message.message_method)
            if len(sent) == 2:  # the authenticated Allocate
                loop.call_soon(time.sleep, stall_s)

        client.send_stun = send_then_stall
        try:
            await client.connect()
            await client.delete()
        finally:
            transport.close()
    return log.rows(loop.time())


def test_a_response_is_timed_when_it_arrived_not_when_a_busy_loop_read_it(tmp_path):
    with Coturn(tmp_path, "127.0.0.1") as server:
        started = time.monotonic()
        rows = asyncio.run(asyncio.wait_for(
            _allocate_with_a_stalled_loop(("127.0.0.1", server.port), server.secret, 0.3), 20))
        took = time.monotonic() - started
    assert [(m, outcome, sends) for m, _, _, outcome, sends in rows] == [
        ("Allocate", "401", 1), ("Allocate", "ok", 1), ("Refresh", "ok", 1)], rows
    assert took >= 0.3  # the stall happened, with the answer waiting in the socket
    assert all(0 < rtt < 100 for _, _, rtt, _, _ in rows), rows  # a loopback RTT, not 300 ms
