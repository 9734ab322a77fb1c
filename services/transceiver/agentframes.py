"""The transceiver's end of the agent frames link (docs/agent-protocol.md, "Frames link").

On the native media path every session's audio to and from the agent travels over one
WebSocket, ``{agent}/v1/frames/{link}``: a binary message is the batch of records the plane
packed in one tick (``Plane.take_batch``), and what the agent sends back goes straight to
``Plane.put_batch``. Sessions join it through their own WebSocket's ``session.started``. The
link is (re)connected in the background: until it is up, the plane's queues to the agent just
keep their newest frames.

The link is the one WebSocket of the transceiver that carries a message every 20 ms each way,
so its client end is this module's own (RFC 6455, the client's part: the opening handshake,
masked binary frames out, frames in) on a plain asyncio protocol: a message in is one
``data_received`` call and a message out one ``transport.write``, where aiohttp's client
spent a task wake-up, an async iterator and its writer's coroutine on each (the replies' task
steps alone were 3% of the transceiver's CPU at 100 sessions, docs/benchmarks.md). The
agent's end stays aiohttp's.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import os
import secrets
import ssl
import struct
from urllib.parse import urlsplit

from services.logs import log_event

log = logging.getLogger("voiceedge.transceiver")
RETRY_S = 0.5
CONNECT_TIMEOUT_S = 5.0
MAX_MESSAGE = 1 << 20          # a batch larger than this is a broken link (aiohttp's limit)
MAX_HEADER = 16 << 10          # the agent's handshake answer
MAX_WRITE_BUFFER = 1 << 20     # the agent not reading: batches are dropped, not queued
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"   # RFC 6455 1.3
OP_CONTINUATION, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


class LinkError(Exception):
    """The agent's end broke the protocol (or refused the upgrade): the link is closed."""


def accept_key(key: bytes) -> bytes:
    """Sec-WebSocket-Accept for a Sec-WebSocket-Key (RFC 6455 4.2.2)."""
    return base64.b64encode(hashlib.sha1(key + _GUID).digest())


def masked(payload: bytes, key: bytes) -> bytes:
    """``payload`` XOR the repeated 4-byte ``key`` (RFC 6455 5.3), as one big-integer XOR."""
    n = len(payload)
    if not n:
        return b""
    pad = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(pad, "big")).to_bytes(n, "big")


def client_frame(opcode: int, payload: bytes) -> bytes:
    """One final, masked frame of ``payload`` (a client masks everything it sends, 5.1)."""
    n, key = len(payload), os.urandom(4)
    if n < 126:
        header = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 1 << 16:
        header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    return header + key + masked(payload, key)


class FrameReader:
    """Server frames (unmasked, 5.1) off a byte stream: ``feed(data)`` yields every complete
    message as (opcode, payload), fragments joined; control frames come as they arrive.
    Raises LinkError on a protocol error."""

    def __init__(self, max_message: int = MAX_MESSAGE) -> None:
        self._buf = bytearray()
        self._max = max_message
        self._parts: list[bytes] = []
        self._parts_op: int | None = None
        self._parts_len = 0

    def feed(self, data: bytes):
        buf = self._buf
        buf += data
        pos = 0
        try:
            while len(buf) - pos >= 2:
                b0, b1 = buf[pos], buf[pos + 1]
                fin, opcode, length = b0 & 0x80, b0 & 0x0F, b1 & 0x7F
                if b0 & 0x70 or b1 & 0x80:
                    raise LinkError("reserved bits set, or a masked frame from the server")
                head = 2
                if length == 126:
                    head = 4
                elif length == 127:
                    head = 10
                if len(buf) - pos < head:
                    break
                if length == 126:
                    length = int.from_bytes(buf[pos + 2:pos + 4], "big")
                elif length == 127:
                    length = int.from_bytes(buf[pos + 2:pos + 10], "big")
                if opcode >= 0x8 and (not fin or length > 125):
                    raise LinkError("a fragmented or long control frame")
                if opcode not in (OP_CONTINUATION, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING,
                                  OP_PONG):
                    raise LinkError(f"unknown opcode {opcode}")
                if length > self._max or self._parts_len + length > self._max:
                    raise LinkError("a message over the link's size limit")
                if len(buf) - pos < head + length:
                    break
                payload = bytes(buf[pos + head:pos + head + length])
                pos += head + length
                if opcode >= 0x8:
                    yield opcode, payload
                    continue
                if opcode == OP_CONTINUATION:
                    if self._parts_op is None:
                        raise LinkError("a continuation with no message to continue")
                elif self._parts_op is not None:
                    raise LinkError("a new message inside a fragmented one")
                else:
                    self._parts_op = opcode
                self._parts.append(payload)
                self._parts_len += length
                if fin:
                    op, parts = self._parts_op, self._parts
                    self._parts, self._parts_op, self._parts_len = [], None, 0
                    yield op, parts[0] if len(parts) == 1 else b"".join(parts)
        finally:
            del buf[:pos]


class _LinkProtocol(asyncio.Protocol):
    """One connection: the upgrade, then frames. ``opened`` resolves once the agent agreed,
    ``closed`` when the connection is gone (with the reason)."""

    def __init__(self, host: str, path: str, plane, frames: "AgentFrames") -> None:
        self._request_key = base64.b64encode(secrets.token_bytes(16))
        self._request = (f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                         f"Connection: Upgrade\r\nSec-WebSocket-Key: "
                         f"{self._request_key.decode()}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                         ).encode()
        self._plane = plane
        self._frames = frames
        self._handshake = bytearray()
        self._reader: FrameReader | None = None
        self.transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self.opened: asyncio.Future = loop.create_future()
        self.closed: asyncio.Future = loop.create_future()

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        try:
            if self._reader is None:
                data = self._upgrade(data)
                if self._reader is None:
                    return
            for opcode, payload in self._reader.feed(data):
                self._message(opcode, payload)
        except LinkError as exc:
            self._fail(str(exc))

    def _upgrade(self, data: bytes) -> bytes:
        """The agent's answer to the upgrade: what follows it is frames."""
        self._handshake += data
        end = self._handshake.find(b"\r\n\r\n")
        if end < 0:
            if len(self._handshake) > MAX_HEADER:
                raise LinkError("no end to the agent's handshake answer")
            return b""
        head, rest = bytes(self._handshake[:end]), bytes(self._handshake[end + 4:])
        lines = head.split(b"\r\n")
        status = lines[0].split(b" ", 2)
        if len(status) < 2 or status[1] != b"101":
            raise LinkError(f"the agent answered {lines[0].decode(errors='replace')}")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if headers.get(b"sec-websocket-accept") != accept_key(self._request_key):
            raise LinkError("the agent's Sec-WebSocket-Accept does not match")
        self._handshake = bytearray()
        self._reader = FrameReader()
        if not self.opened.done():
            self.opened.set_result(None)
        return rest

    def _message(self, opcode: int, payload: bytes) -> None:
        if opcode == OP_BINARY:
            self._frames.batches_in += 1
            self._plane.put_batch(payload)
        elif opcode == OP_PING:
            self.transport.write(client_frame(OP_PONG, payload))
        elif opcode == OP_CLOSE:
            self.transport.write(client_frame(OP_CLOSE, payload[:2]))
            self._fail("the agent closed the link")
        # text and pong: nothing for the plane

    def send(self, batch: bytes) -> bool:
        transport = self.transport
        if (transport is None or transport.is_closing() or self._reader is None
                or transport.get_write_buffer_size() > MAX_WRITE_BUFFER):
            return False
        transport.write(client_frame(OP_BINARY, batch))
        return True

    def _fail(self, reason: str) -> None:
        if not self.closed.done():
            self.closed.set_result(reason)
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc) -> None:
        reason = f"connection lost: {exc}" if exc else "connection closed"
        if not self.opened.done():
            self.opened.set_exception(LinkError(reason))
        if not self.closed.done():
            self.closed.set_result(reason)


class AgentFrames:
    """``await start(plane)``, ``send(batch)`` per tick, ``await stop()``."""

    def __init__(self, agent_url: str) -> None:
        self.name = secrets.token_hex(8)
        url = urlsplit(agent_url)
        if url.scheme not in ("ws", "wss") or not url.hostname:
            raise ValueError(f"the agent URL must be ws:// or wss://, not {agent_url!r}")
        self._url = f"{agent_url.rstrip('/')}/v1/frames/{self.name}"
        self._host, self._tls = url.hostname, url.scheme == "wss"
        self._port = url.port or (443 if self._tls else 80)
        self._hostport = url.netloc
        self._path = f"{url.path.rstrip('/')}/v1/frames/{self.name}"
        self._link: _LinkProtocol | None = None
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
        link = self._link
        if link is None:
            return
        if link.send(batch):
            self.batches_out += 1
        else:
            self.send_failures += 1

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._link is not None and self._link.transport is not None:
            self._link.transport.close()
        self._link = None

    async def _connect(self, plane) -> _LinkProtocol:
        loop = asyncio.get_running_loop()
        _, link = await loop.create_connection(
            lambda: _LinkProtocol(self._hostport, self._path, plane, self),
            self._host, self._port, ssl=ssl.create_default_context() if self._tls else None)
        try:
            await link.opened
        except BaseException:
            link.transport.close()
            raise
        return link

    async def _run(self, plane) -> None:
        while True:
            try:
                link = await asyncio.wait_for(self._connect(plane), CONNECT_TIMEOUT_S)
            except (OSError, LinkError, asyncio.TimeoutError) as exc:
                log_event(log, "agent_frames_unreachable", level=logging.WARNING,
                          url=self._url, error=str(exc) or type(exc).__name__)
                await asyncio.sleep(RETRY_S)
                continue
            self._link = link
            self._up.set()
            log_event(log, "agent_frames_link_up", link=self.name)
            reason = await link.closed
            self._link = None
            self._up.clear()
            log_event(log, "agent_frames_link_down", level=logging.WARNING, link=self.name,
                      reason=reason)
            await asyncio.sleep(RETRY_S)
