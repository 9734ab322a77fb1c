"""A front's warm connections to its transceivers: a burst of calls pays no TCP handshake.

A front sits a backbone round trip from the clusters it steers to, so a call that has to open
a connection first pays one more RTT of signaling. These tests count TCP connections on the
transceiver's side (the front's source ports: one per connection) and on the front's
(``connections_opened{when="on_call"}``, ``new_connection`` in ``call_created``), with a
transceiver that holds every call and every status probe a while (as a distant one does), so
the calls of a burst overlap and each needs a connection of its own.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from services.signaling.server import ClusterRoute, SignalingConfig, SignalingServer
from services.transceiver.server import TransceiverConfig, TransceiverServer
from tests.conftest import free_port, until
from tests.offers import STATIC_OFFER

SDP = {"Content-Type": "application/sdp"}


def run(coro, timeout: float = 60.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


@dataclass
class SlowTransceiver:
    """The transceiver's control API, answering after ``call_delay`` (POST) and
    ``status_delay`` (GET /status); records which front connection (source port) carried
    each request."""

    port: int
    call_delay: float = 0.3
    status_delay: float = 0.2
    ports: dict[str, list[int]] = field(default_factory=lambda: {"status": [], "ping": [],
                                                                 "sessions": []})
    _runner: web.AppRunner | None = None
    _n: int = 0

    def _peer(self, request: web.Request, kind: str) -> None:
        self.ports[kind].append(request.transport.get_extra_info("peername")[1])

    async def _status(self, request: web.Request) -> web.Response:
        self._peer(request, "status")
        assert request.query.get("brief") == "1"   # the front's probe reads the load only
        await asyncio.sleep(self.status_delay)
        return web.json_response({"sessions": 0, "capacity": 1000})

    async def _ping(self, request: web.Request) -> web.Response:
        self._peer(request, "ping")
        return web.Response(status=204)

    async def _sessions(self, request: web.Request) -> web.Response:
        self._peer(request, "sessions")
        await request.read()
        await asyncio.sleep(self.call_delay)
        self._n += 1
        return web.Response(status=201, text=STATIC_OFFER, content_type="application/sdp",
                            headers={"Location": f"/sessions/s{self._n:015d}"})

    async def start(self) -> "SlowTransceiver":
        app = web.Application()
        app.router.add_get("/status", self._status)
        app.router.add_get("/ping", self._ping)
        app.router.add_post("/sessions", self._sessions)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        await self._runner.cleanup()

    def connections(self) -> set[int]:
        """Every front connection seen so far (by source port)."""
        return {p for ports in self.ports.values() for p in ports}


def front(port: int, warm: int, poll_interval: float = 0.05) -> SignalingServer:
    route = ClusterRoute("far", (f"http://127.0.0.1:{port}",), rtt_ms=120.0)
    return SignalingServer(SignalingConfig(clusters=(route,), listen=("127.0.0.1", 0),
                                           poll_interval=poll_interval,
                                           warm_connections=warm))


async def burst(http: aiohttp.ClientSession, base: str, n: int) -> list[int]:
    async def one() -> int:
        async with http.post(f"{base}/v1/calls", data=STATIC_OFFER, headers=SDP) as r:
            await r.read()
            return r.status
    return list(await asyncio.gather(*(one() for _ in range(n))))


def test_a_burst_of_calls_uses_only_connections_opened_before_it(caplog):
    """8 calls at once, with status probes in flight all the time: every call goes over a
    connection that was open before the burst, never over a probe's."""
    caplog.set_level(logging.INFO, logger="voiceedge.signaling")
    port = free_port(socket.SOCK_STREAM)

    async def main():
        t = await SlowTransceiver(port).start()
        try:
            async with front(port, warm=8) as f, aiohttp.ClientSession() as http:
                pool = f.backends[0].pool
                await until(lambda: pool.warm >= 9)  # 8 spare + 1 for refreshing
                await until(lambda: len(t.ports["status"]) >= 3)  # probes are under way
                before = t.connections()
                statuses = await burst(http, f"http://127.0.0.1:{f.port}", 8)
                return statuses, before, dict(t.ports), pool.opened_on_call
        finally:
            await t.stop()

    statuses, before, ports, on_call = run(main())
    calls = ports["sessions"]
    assert statuses == [201] * 8
    assert len(set(calls)) == 8            # they overlapped: one connection each
    assert set(calls) <= before            # ... every one opened before the burst
    assert not set(calls) & set(ports["status"])  # and none is the probes' connection
    assert on_call == 0
    created = [r for r in caplog.records if "call_created" in r.getMessage()]
    assert len(created) == 8
    assert all('"new_connection": false' in r.getMessage() for r in created)


def test_a_bigger_burst_teaches_the_pool_its_size():
    """With 2 spare connections, a burst of 6 has to open some (the counters say so); the
    pool then keeps 6 warm, and the next burst of 6 opens none."""
    port = free_port(socket.SOCK_STREAM)

    async def main():
        t = await SlowTransceiver(port, status_delay=0.0).start()
        try:
            async with front(port, warm=2) as f, aiohttp.ClientSession() as http:
                pool, base = f.backends[0].pool, f"http://127.0.0.1:{f.port}"
                await until(lambda: pool.warm >= 3)
                first = await burst(http, base, 6)
                opened_first = pool.opened_on_call
                await until(lambda: pool.warm >= 7)
                before = t.connections()
                second = await burst(http, base, 6)
                async with http.get(f"{base}/metrics") as r:
                    text = await r.text()
                return (first, second, opened_first, pool.opened_on_call, before,
                        t.ports["sessions"][-6:], text)
        finally:
            await t.stop()

    first, second, opened_first, opened_total, before, last_calls, text = run(main())
    assert first == second == [201] * 6
    assert opened_first >= 3               # 6 at once, 3 warm: the burst paid handshakes
    assert opened_total == opened_first    # the second burst paid none
    assert set(last_calls) <= before
    assert ('voiceedge_signaling_transceiver_connections_opened_total{cluster="far",'
            f'transceiver="http://127.0.0.1:{port}",when="on_call"}} {float(opened_first)}'
            in text)


def test_connections_are_opened_again_ahead_of_calls_after_a_transceiver_restart():
    """The transceiver goes away (its connections die) and comes back: the front opens new
    warm connections when it sees it again, not when the next call arrives."""
    port = free_port(socket.SOCK_STREAM)

    async def main():
        t = await SlowTransceiver(port, call_delay=0.05, status_delay=0.0).start()
        async with front(port, warm=3) as f, aiohttp.ClientSession() as http:
            pool, base = f.backends[0].pool, f"http://127.0.0.1:{f.port}"
            await until(lambda: pool.warm >= 4)
            assert await burst(http, base, 3) == [201] * 3
            await t.stop()
            await until(lambda: not f.backends[0].healthy)
            t = await SlowTransceiver(port, call_delay=0.05, status_delay=0.0).start()
            try:
                await until(lambda: f.backends[0].healthy and pool.warm >= 4)
                before = t.connections()
                again = await burst(http, base, 3)
                return again, before, t.ports["sessions"], pool.opened_on_call
            finally:
                await t.stop()

    again, before, calls, on_call = run(main())
    assert again == [201] * 3
    assert set(calls) <= before and on_call == 0


def test_a_real_transceiver_keeps_the_front_s_connections_and_answers_ping():
    """Against the real control API: /ping is 204, and calls go over the warm connections."""
    port = free_port(socket.SOCK_STREAM)
    config = TransceiverConfig(cluster_id=1, transceiver_id=1, media_host="127.0.0.1",
                               control=("127.0.0.1", port), setup_timeout=20.0)

    async def main():
        async with TransceiverServer(config) as t, front(port, warm=4, poll_interval=0.1) as f, \
                aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/ping") as r:
                ping = r.status, await r.read()
            pool = f.backends[0].pool
            await until(lambda: pool.warm >= 5)
            statuses = await burst(http, f"http://127.0.0.1:{f.port}", 4)
            return ping, statuses, pool.opened_on_call, len(t.sessions)

    ping, statuses, on_call, sessions = run(main())
    assert ping == (204, b"")
    assert statuses == [201] * 4 and sessions == 4
    assert on_call == 0


def test_idle_connections_are_refreshed_one_at_a_time_without_new_ones():
    """Connections idle past refresh_s are used again (GET /ping), on the same connection,
    one at a time: the spare ones stay ready meanwhile."""
    port = free_port(socket.SOCK_STREAM)

    async def main():
        t = await SlowTransceiver(port, status_delay=0.0).start()
        try:
            async with front(port, warm=3) as f:
                pool = f.backends[0].pool
                await until(lambda: pool.warm >= 4)
                before, pings = t.connections(), len(t.ports["ping"])
                pool.refresh_s = 0.1
                lowest = pool.warm
                deadline = time.monotonic() + 1.5
                while time.monotonic() < deadline:
                    lowest = min(lowest, pool.warm)
                    await asyncio.sleep(0.01)
                return before, t.connections(), t.ports["ping"][pings:], lowest
        finally:
            await t.stop()

    before, after, refreshed, lowest = run(main())
    assert after == before                 # no connection was opened
    assert len(set(refreshed)) == 4        # every idle connection was used again
    assert lowest >= 3                     # never fewer than the spare ones ready
