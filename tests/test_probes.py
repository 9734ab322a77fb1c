"""The client's ICE check probe (services/client/probes.py) on two real aioice agents on
loopback, the answering one on a loop of its own (a thread): a check's RTT is the network's,
also when the checking agent's event loop was busy when the answer arrived."""
from __future__ import annotations

import asyncio
import threading
import time

import aioice
import aioice.ice

from services.client.probes import StunProbe


class _Answerer:
    """The controlled agent, on its own event loop in a thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.agent = self.run(self._make())

    def run(self, coro, timeout: float = 10):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _make(self) -> aioice.Connection:
        agent = aioice.Connection(ice_controlling=False, components=1)
        await agent.gather_candidates()
        return agent

    async def learn(self, peer: aioice.Connection) -> None:
        self.agent.remote_username, self.agent.remote_password = (peer.local_username,
                                                                  peer.local_password)
        for candidate in peer.local_candidates:
            await self.agent.add_remote_candidate(candidate)
        await self.agent.add_remote_candidate(None)

    def close(self) -> None:
        self.run(self.agent.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


async def _checks_with_a_stalled_loop(answerer: _Answerer, stall_s: float) -> tuple[list, float]:
    loop = asyncio.get_running_loop()
    a = aioice.Connection(ice_controlling=True, components=1)
    try:
        await a.gather_candidates()
        probe = StunProbe()
        probe.attach(a)
        for protocol in a._protocols:  # hold the loop right after every check leaves
            request = protocol.request

            async def stalled(message, addr, *args, _request=request, **kwargs):
                loop.call_soon(time.sleep, stall_s)
                return await _request(message, addr, *args, **kwargs)

            protocol.request = stalled
        answerer.run(answerer.learn(a))
        a.remote_username, a.remote_password = (answerer.agent.local_username,
                                                answerer.agent.local_password)
        for candidate in answerer.agent.local_candidates:
            await a.add_remote_candidate(candidate)
        await a.add_remote_candidate(None)
        accepted = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
            answerer.agent.connect(), answerer.loop))
        started = time.monotonic()
        await asyncio.wait_for(asyncio.gather(a.connect(), accepted), 10)
        took = time.monotonic() - started
        rtts = [t.rtt_ms for t in probe.transactions if t.rtt_ms is not None]
        probe.detach()
        return rtts, took
    finally:
        await a.close()


def test_a_check_is_timed_when_its_answer_arrived_not_when_a_busy_loop_read_it(monkeypatch):
    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda *_, **__: ["127.0.0.1"])
    answerer = _Answerer()
    try:
        rtts, took = asyncio.run(_checks_with_a_stalled_loop(answerer, 0.3))
    finally:
        answerer.close()
    assert took >= 0.3 and rtts  # the loop was held while a check was answered
    assert all(0 < rtt < 100 for rtt in rtts), rtts  # loopback RTTs, not the 300 ms stall
