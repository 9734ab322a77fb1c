"""The frames link: one WebSocket from a transceiver carrying the audio of many sessions.

With one binary message per 20 ms frame per session, the WebSocket messages cost more than
the media (docs/agent-protocol.md, "Frames link"). A transceiver on the native media path opens
``GET /v1/frames/{link}`` once; each binary message on it is a batch of records
``[u32 channel][u16 length][payload]`` (network order), one per frame, for any sessions. A
session joins the link in its ``session.started`` (``"frames": {"link": ..., "channel": N,
"codecs": [...]}``); its events stay on its own WebSocket. What the sessions send back is
collected and leaves as one batch per turn of the event loop.
"""
from __future__ import annotations

import asyncio
import struct

from aiohttp import web

_RECORD = struct.Struct("!IH")


def records(batch: bytes):
    """(channel, payload) per record; stops at a record cut short (returns how many bytes were
    left unread as the generator's value)."""
    view, offset = memoryview(batch), 0
    while offset + _RECORD.size <= len(view):
        channel, length = _RECORD.unpack_from(view, offset)
        offset += _RECORD.size
        if offset + length > len(view):
            return len(view) - offset + _RECORD.size
        yield channel, bytes(view[offset:offset + length])
        offset += length
    return len(view) - offset


def record(channel: int, payload: bytes) -> bytes:
    return _RECORD.pack(channel, len(payload)) + payload


class FramesLink:
    """One transceiver's link: the sessions on it by channel, and the batch going back."""

    def __init__(self, name: str, ws: web.WebSocketResponse) -> None:
        self.name = name
        self.ws = ws
        self.sessions: dict[int, object] = {}   # channel -> services.agent.session.Session
        self.batches_in = 0
        self.records_in = 0
        self.unknown_channel = 0
        self.bad_records = 0
        self._out: list[bytes] = []
        self._flush_scheduled = False

    def join(self, channel: int, session) -> None:
        self.sessions[channel] = session

    def leave(self, channel: int, session) -> None:
        if self.sessions.get(channel) is session:
            del self.sessions[channel]

    async def received(self, batch: bytes) -> None:
        """Feed every record to its session (in order)."""
        self.batches_in += 1
        parse = records(batch)
        while True:
            try:
                channel, payload = next(parse)
            except StopIteration as end:
                if end.value:
                    self.bad_records += 1
                return
            self.records_in += 1
            session = self.sessions.get(channel)
            if session is None:
                self.unknown_channel += 1
                continue
            await session.on_frame(payload)

    def send(self, channel: int, payload: bytes) -> None:
        """Queue a record; everything queued in this turn of the loop leaves as one message."""
        self._out.append(record(channel, payload))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._out or self.ws.closed:
            self._out.clear()
            return
        batch, self._out = b"".join(self._out), []
        asyncio.ensure_future(self._write(batch))

    async def _write(self, batch: bytes) -> None:
        try:
            await self.ws.send_bytes(batch)
        except (ConnectionError, RuntimeError):
            pass  # the transceiver went away; its sessions end on their own WebSockets


class LinkedChannel:
    """A session's way back when it is on a frames link: frames as records on the link,
    events on its own WebSocket."""

    def __init__(self, link: FramesLink, channel: int, ws) -> None:
        self.link, self.channel, self._ws = link, channel, ws

    async def send_bytes(self, data: bytes) -> None:
        self.link.send(self.channel, data)

    async def send_str(self, data: str) -> None:
        await self._ws.send_str(data)
