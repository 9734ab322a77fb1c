"""The transceiver's end of the agent frames link (docs/agent-protocol.md, "Frames link").

On the native media path every session's audio to and from the agent travels over one
WebSocket, ``{agent}/v1/frames/{link}``: a binary message is the batch of records the plane
packed in one tick (``Plane.take_batch``), and what the agent sends back goes straight to
``Plane.put_batch``. Sessions join it through their own WebSocket's ``session.started``. The
link is (re)connected in the background: until it is up, the plane's queues to the agent just
keep their newest frames.
"""
from __future__ import annotations

import asyncio
import logging
import secrets

import aiohttp

from services.logs import log_event
from services.transceiver.eager import write_now

log = logging.getLogger("voiceedge.transceiver")
RETRY_S = 0.5


class AgentFrames:
    """``await start(plane)``, ``send(batch)`` per tick, ``await stop()``."""

    def __init__(self, agent_url: str, http: aiohttp.ClientSession) -> None:
        self.name = secrets.token_hex(8)
        self._url = f"{agent_url}/v1/frames/{self.name}"
        self._http = http
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._task: asyncio.Task | None = None
        self._up = asyncio.Event()
        self.batches_out = self.batches_in = self.send_failures = 0

    async def start(self, plane) -> None:
        self._task = asyncio.create_task(self._run(plane))

    async def wait_up(self) -> None:
        await self._up.wait()

    @property
    def up(self) -> bool:
        return self._up.is_set()

    def send(self, batch: bytes) -> None:
        ws = self._ws
        if ws is None or ws.closed:
            return
        if write_now(ws.send_bytes(batch)):
            self.batches_out += 1
        else:
            self.send_failures += 1

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._ws is not None:
            await self._ws.close()

    async def _run(self, plane) -> None:
        while True:
            try:
                self._ws = await self._http.ws_connect(self._url, heartbeat=None,
                                                       max_msg_size=1 << 20)
            except (aiohttp.ClientError, OSError) as exc:
                log_event(log, "agent_frames_unreachable", level=logging.WARNING,
                          url=self._url, error=str(exc))
                await asyncio.sleep(RETRY_S)
                continue
            self._up.set()
            log_event(log, "agent_frames_link_up", link=self.name)
            async for message in self._ws:
                if message.type == aiohttp.WSMsgType.BINARY:
                    self.batches_in += 1
                    plane.put_batch(message.data)
                elif message.type != aiohttp.WSMsgType.TEXT:
                    break
            self._up.clear()
            log_event(log, "agent_frames_link_down", level=logging.WARNING, link=self.name)
            await asyncio.sleep(RETRY_S)
