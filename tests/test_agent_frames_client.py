"""The transceiver's own client end of the agent frames link (services/transceiver/agentframes.py):
its frames read back by this test's own reading of RFC 6455, the server frames it must take
and the ones it must refuse, and a link to the real agent (aiohttp's end) that carries batches
both ways, comes back after the agent restarts, and refuses an endpoint that is not a
WebSocket."""
from __future__ import annotations

import asyncio
import os
import struct

import pytest

from services.agent.config import AgentConfig
from services.agent.frameslink import record
from services.agent.server import AgentServer
from services.transceiver.agentframes import (OP_BINARY, OP_CLOSE, OP_CONTINUATION, OP_PING,
                                              OP_PONG, OP_TEXT, AgentFrames, FrameReader,
                                              LinkError, accept_key, client_frame)


def read_client_frame(frame: bytes) -> tuple[int, int, bytes]:
    """(fin and opcode byte, payload length field, unmasked payload), RFC 6455 5.2 by hand."""
    b0, b1 = frame[0], frame[1]
    assert b1 & 0x80, "a client frame is masked"
    n, pos = b1 & 0x7F, 2
    if n == 126:
        n, pos = struct.unpack("!H", frame[2:4])[0], 4
    elif n == 127:
        n, pos = struct.unpack("!Q", frame[2:10])[0], 10
    key, body = frame[pos:pos + 4], frame[pos + 4:]
    assert len(body) == n
    return b0, n, bytes(b ^ key[i % 4] for i, b in enumerate(body))


def server_frame(opcode: int, payload: bytes, fin: bool = True, rsv: int = 0,
                 mask: bool = False) -> bytes:
    n = len(payload)
    b0 = (0x80 if fin else 0) | rsv | opcode
    m = 0x80 if mask else 0
    if n < 126:
        head = bytes([b0, m | n])
    elif n < 1 << 16:
        head = bytes([b0, m | 126]) + struct.pack("!H", n)
    else:
        head = bytes([b0, m | 127]) + struct.pack("!Q", n)
    return head + (b"\0\0\0\0" if mask else b"") + payload


def test_the_accept_key_is_rfc_6455s_example():
    assert accept_key(b"dGhlIHNhbXBsZSBub25jZQ==") == b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 100_000])
def test_client_frames_are_final_masked_and_unmask_to_the_payload(size):
    payload = os.urandom(size)
    b0, n, body = read_client_frame(client_frame(OP_BINARY, payload))
    assert b0 == 0x80 | OP_BINARY and n == size and body == payload


def test_two_frames_of_the_same_payload_use_different_masks():
    payload = bytes(64)
    assert client_frame(OP_BINARY, payload)[2:] != client_frame(OP_BINARY, payload)[2:]


def test_the_reader_joins_what_arrives_a_byte_at_a_time_and_fragments():
    stream = (server_frame(OP_BINARY, b"one")
              + server_frame(OP_BINARY, b"tw", fin=False)
              + server_frame(OP_PING, b"p")                     # between fragments: allowed
              + server_frame(OP_CONTINUATION, b"o", fin=True)
              + server_frame(OP_TEXT, b"{}")
              + server_frame(OP_BINARY, bytes(70_000)))
    reader, got = FrameReader(), []
    for i in range(len(stream)):
        got += list(reader.feed(stream[i:i + 1]))
    assert got == [(OP_BINARY, b"one"), (OP_PING, b"p"), (OP_BINARY, b"two"), (OP_TEXT, b"{}"),
                   (OP_BINARY, bytes(70_000))]


@pytest.mark.parametrize("bad", [
    server_frame(OP_BINARY, b"x", mask=True),                 # the server must not mask
    server_frame(OP_BINARY, b"x", rsv=0x40),                  # no extension was negotiated
    server_frame(0x3, b"x"),                                  # a reserved opcode
    server_frame(OP_PING, bytes(126)),                        # a control frame over 125
    server_frame(OP_PING, b"x", fin=False),                   # a fragmented control frame
    server_frame(OP_CONTINUATION, b"x"),                      # nothing to continue
    server_frame(OP_BINARY, b"a", fin=False) + server_frame(OP_BINARY, b"b"),
], ids=["masked", "rsv", "opcode", "long-control", "fragmented-control", "lone-continuation",
        "message-in-message"])
def test_the_reader_refuses_a_broken_stream(bad):
    with pytest.raises(LinkError):
        list(FrameReader().feed(bad))


def test_the_reader_refuses_a_message_over_its_limit_even_in_fragments():
    with pytest.raises(LinkError):
        list(FrameReader(max_message=100).feed(server_frame(OP_BINARY, bytes(101))))
    reader = FrameReader(max_message=100)
    list(reader.feed(server_frame(OP_BINARY, bytes(60), fin=False)))
    with pytest.raises(LinkError):
        list(reader.feed(server_frame(OP_CONTINUATION, bytes(60))))


class RecordingPlane:
    def __init__(self) -> None:
        self.batches: list[bytes] = []

    def put_batch(self, batch: bytes) -> int:
        self.batches.append(batch)
        return 1


async def until(predicate, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.01)


def test_the_link_to_the_real_agent_carries_batches_and_comes_back_after_a_restart():
    """The agent's end is aiohttp's: a batch for a channel no session joined is counted there;
    a stopped agent takes the link down, and the link is up again once an agent listens on the
    same port (nothing is sent while it is down)."""
    async def scenario():
        plane = RecordingPlane()
        async with AgentServer(AgentConfig(port=0)) as agent:
            port = agent.port
            frames = AgentFrames(f"ws://127.0.0.1:{port}")
            await frames.start(plane)
            await asyncio.wait_for(frames.wait_up(), 5)
            frames.send(record(7, b"opus") + record(8, b"more"))
            link = agent.links[frames.name]
            await until(lambda: link.records_in == 2)
            assert link.unknown_channel == 2 and frames.batches_out == 1
        await until(lambda: not frames.up)
        frames.send(record(7, b"lost"))                        # down: dropped, not queued
        async with AgentServer(AgentConfig(port=port)) as agent:
            await asyncio.wait_for(frames.wait_up(), 5)
            frames.send(record(9, b"again"))
            await until(lambda: agent.links.get(frames.name) is not None
                        and agent.links[frames.name].records_in == 1)
        await frames.stop()
        return frames

    frames = asyncio.run(scenario())
    assert frames.batches_out == 2


def test_an_endpoint_that_will_not_upgrade_is_retried_not_taken_for_a_link():
    async def scenario():
        tries = 0

        async def plain(reader, writer):
            nonlocal tries
            await reader.readuntil(b"\r\n\r\n")
            tries += 1
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()

        server = await asyncio.start_server(plain, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        frames = AgentFrames(f"ws://127.0.0.1:{port}")
        await frames.start(RecordingPlane())
        await asyncio.sleep(1.2)            # two tries at least (RETRY_S 0.5)
        up = frames.up
        await frames.stop()
        server.close()
        return up, tries

    up, tries = asyncio.run(scenario())
    assert up is False and tries >= 2


def test_the_agent_url_must_be_a_websocket_url():
    with pytest.raises(ValueError):
        AgentFrames("http://127.0.0.1:8800")


def test_a_ping_gets_a_pong_with_its_payload_and_a_close_ends_the_link():
    """A stand-in agent end (asyncio server doing the upgrade by hand) pings, reads the pong,
    then closes: the link answers the close and goes down."""
    async def scenario():
        got: dict = {}
        done = asyncio.get_running_loop().create_future()

        async def handle(reader, writer):
            head = await reader.readuntil(b"\r\n\r\n")
            key = next(line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
                       if line.lower().startswith(b"sec-websocket-key"))
            writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                         b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept_key(key)
                         + b"\r\n\r\n" + server_frame(OP_PING, b"hello"))
            pong = await reader.readexactly(2 + 4 + 5)
            got["pong"] = read_client_frame(pong)
            writer.write(server_frame(OP_CLOSE, struct.pack("!H", 1000)))
            got["close"] = read_client_frame(await reader.readexactly(2 + 4 + 2))
            done.set_result(None)

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        frames = AgentFrames(f"ws://127.0.0.1:{port}")
        await frames.start(RecordingPlane())
        await asyncio.wait_for(done, 5)
        await until(lambda: not frames.up)
        await frames.stop()
        server.close()
        return got

    got = asyncio.run(scenario())
    assert got["pong"] == (0x80 | OP_PONG, 5, b"hello")
    assert got["close"] == (0x80 | OP_CLOSE, 2, struct.pack("!H", 1000))
