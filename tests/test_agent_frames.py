"""The agent's frames link (docs/agent-protocol.md, "Frames link") against a real AgentServer
on loopback: sessions join it from their session.started, echo comes back in one batch per
batch, the codec follows the mode, and bad records are counted, never delivered."""
from __future__ import annotations

import asyncio
import json
import struct

import aiohttp

from services.agent.config import AgentConfig
from services.agent.frameslink import record, records
from services.agent.server import AgentServer


def run(coro, timeout: float = 20.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def _join(http, base: str, sid: str, link: str, channel: int, codecs) -> tuple:
    ws = await http.ws_connect(f"{base}/v1/sessions/{sid}")
    await ws.send_str(json.dumps({"type": "session.started", "session_id": sid,
                                  "frames": {"link": link, "channel": channel,
                                             "codecs": codecs}}))
    created = json.loads((await ws.receive()).data)
    return ws, created


def test_echo_sessions_take_opus_on_the_link_and_get_their_batches_back():
    async def scenario():
        async with AgentServer(AgentConfig(port=0)) as agent, aiohttp.ClientSession() as http:
            base = f"ws://127.0.0.1:{agent.port}"
            link = await http.ws_connect(f"{base}/v1/frames/tx1")
            a, created_a = await _join(http, base, "a", "tx1", 7, ["opus", "pcm16"])
            b, created_b = await _join(http, base, "b", "tx1", 1 << 31, ["opus"])
            batch = record(7, b"opus-a1") + record(1 << 31, b"opus-b1") + record(9, b"nobody")
            await link.send_bytes(batch)
            back = (await link.receive(timeout=5)).data
            # a second link under the same name is refused; a bad name too
            async with http.get(f"http://127.0.0.1:{agent.port}/v1/frames/tx1",
                                headers={"Upgrade": "websocket", "Connection": "Upgrade",
                                         "Sec-WebSocket-Key": "x3JJHMbDL1EzLkh9GBhXDw==",
                                         "Sec-WebSocket-Version": "13"}) as r:
                again = r.status
            await link.send_bytes(record(7, b"ok") + b"\0\0\0\7\0\x09cut")
            cut_back = (await link.receive(timeout=5)).data
            counters = (agent.links["tx1"].unknown_channel, agent.links["tx1"].bad_records)
            for ws in (a, b, link):
                await ws.close()
            return created_a, created_b, back, again, cut_back, counters

    created_a, created_b, back, again, cut_back, counters = run(scenario())
    for created in (created_a, created_b):
        assert created["audio"]["encoding"] == "opus" and created["frames"] == {"link": "tx1"}
    assert list(records(back)) == [(7, b"opus-a1"), (1 << 31, b"opus-b1")]  # one batch back
    assert again == 409
    assert list(records(cut_back)) == [(7, b"ok")]
    assert counters == (1, 1)


def test_a_reply_session_takes_pcm_and_a_session_without_the_link_stays_on_its_websocket():
    async def scenario():
        async with AgentServer(AgentConfig(port=0, mode="reply")) as agent, \
                aiohttp.ClientSession() as http:
            base = f"ws://127.0.0.1:{agent.port}"
            link = await http.ws_connect(f"{base}/v1/frames/tx2")
            ws, created = await _join(http, base, "r", "tx2", 3, ["opus", "pcm16"])
            _, opus_only = await _join(http, base, "o", "tx2", 4, ["opus"])
            _, unknown = await _join(http, base, "u", "nolink", 5, ["pcm16"])
            await link.close()
            return created, opus_only, unknown

    created, opus_only, unknown = run(scenario())
    assert created["audio"]["encoding"] == "pcm_s16le" and created["frames"] == {"link": "tx2"}
    assert "frames" not in opus_only and opus_only["audio"]["encoding"] == "pcm_s16le"
    assert "frames" not in unknown


def test_records_parse_what_record_packs_and_stop_at_a_cut():
    packed = record(1, b"x") + record(0xFFFFFFFF, b"") + record(2, bytes(1275))
    assert [(c, len(p)) for c, p in records(packed)] == [(1, 1), (0xFFFFFFFF, 0), (2, 1275)]
    assert list(records(struct.pack("!IH", 1, 10) + b"short")) == []
