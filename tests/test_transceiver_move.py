"""A connected client whose address changes (a NAT rebinding as the transceiver sees it): once
the client nominates its pair from the new address, the transceiver's media goes there, on
both media paths and in both modes, with the same session and DTLS association.

The rebinding: the aiortc client's ICE socket is replaced under its protocol by one on a new
port and the old one no longer delivers (the NAT forgot that mapping); the client does not
know, as behind a real NAT. The nomination is a check with USE-CANDIDATE on its pair, which
now leaves from the new port (docs/mobility.md). Loopback only.
"""
from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import AudioStreamTrack
from yarl import URL

from services.client.renominate import renominate
from services.transceiver import ice
from services.transceiver.ice import selected_remote_address
from services.transceiver.server import TransceiverConfig, TransceiverServer


class _Forward(asyncio.DatagramProtocol):
    def __init__(self, protocol) -> None:
        self.protocol = protocol

    def datagram_received(self, data, addr) -> None:
        self.protocol.datagram_received(data, addr)

    def connection_lost(self, exc) -> None:   # aioice's close waits for it
        self.protocol.connection_lost(exc)


async def rebind(pc) -> tuple[tuple, tuple]:
    """The client's ICE socket moves to a new port; (old, new) local address."""
    connection = pc.getTransceivers()[0].receiver.transport.transport._connection
    protocol = connection._nominated[1].protocol
    old = protocol.transport
    before = old.get_extra_info("sockname")[:2]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((before[0], 0))
    new, _ = await asyncio.get_running_loop().create_datagram_endpoint(
        lambda: _Forward(protocol), sock=sock)
    old._protocol = asyncio.DatagramProtocol()   # the old mapping delivers nothing any more
    old.close()
    protocol.transport = new
    return before, new.get_extra_info("sockname")[:2]


class Ear:
    """Counts the audio frames the client receives."""

    def __init__(self, pc) -> None:
        self.frames = 0
        pc.on("track", self._track)

    def _track(self, track) -> None:
        async def consume():
            while True:
                try:
                    await track.recv()
                except Exception:
                    return
                self.frames += 1
        asyncio.ensure_future(consume())

    async def count(self, seconds: float) -> int:
        start = self.frames
        await asyncio.sleep(seconds)
        return self.frames - start


async def connected_call(http: aiohttp.ClientSession, url: str):
    """An aiortc caller sending a tone, its offer POSTed to ``url`` (a transceiver's /sessions
    or a front's /v1/calls), connected: (peer connection, its Ear, the call's URL)."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTrack(AudioStreamTrack())
    ear = Ear(pc)
    connected = asyncio.Event()
    pc.on("connectionstatechange", lambda: pc.connectionState == "connected" and connected.set())
    await pc.setLocalDescription(await pc.createOffer())
    async with http.post(url, data=pc.localDescription.sdp,
                         headers={"Content-Type": "application/sdp"}) as r:
        answer, location = await r.text(), r.headers["Location"]
    await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
    await asyncio.wait_for(connected.wait(), 10)
    return pc, ear, str(URL(url).join(URL(location)))


# aioice moves the Python path's media in either mode (its selected pair): one case of it
@pytest.mark.parametrize("mode, media_path", [(ice.SHARED, "python"), (ice.SHARED, "native"),
                                              (ice.PORT_PER_SESSION, "native")])
def test_media_follows_a_pair_the_client_nominates_from_a_new_address(mode, media_path):
    async def call():
        config = TransceiverConfig(cluster_id=1, transceiver_id=1, media_host="127.0.0.1",
                                   control=("127.0.0.1", 0), mode=mode, media_path=media_path)
        async with TransceiverServer(config) as server, aiohttp.ClientSession() as http:
            pc, ear, _ = await connected_call(http, f"http://127.0.0.1:{server.control_port}"
                                                    "/sessions")
            [session] = server.sessions.values()
            dtls = session._pc.getTransceivers()[0].sender.transport
            heard = {"connected": await ear.count(0.5)}
            old, new = await rebind(pc)
            await asyncio.sleep(0.2)
            heard["rebound"] = await ear.count(0.5)
            assert await renominate(pc)   # the client's own (services/client/renominate.py)
            await asyncio.sleep(0.2)
            heard["nominated"] = await ear.count(0.5)
            out = (heard, old, new, selected_remote_address(session._pc),
                   list(server.sessions.values()) == [session],
                   session._pc.getTransceivers()[0].sender.transport is dtls, dtls.state)
            await pc.close()
            return out

    heard, old, new, selected, same_session, same_dtls, dtls_state = asyncio.run(call())
    assert old != new and selected == new, (old, new, selected)
    # 25 frames in each half second while connected, none where the NAT forgot the mapping,
    # flowing again once the new pair is nominated (at least half of them: the check tier
    # runs beside other tests on two cores)
    assert heard["connected"] >= 12 and heard["rebound"] <= 2, heard
    assert heard["nominated"] >= 12, heard
    assert same_session and same_dtls and dtls_state == "connected"
