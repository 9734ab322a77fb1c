"""An offer without candidates (a browser's offer sent before ICE gathering, no trickle).

The transceiver answers it, waits for a check (no end-of-candidates: aioice keeps waiting),
learns the client's address from that check as a peer-reflexive candidate and connects. A
real aiortc peer whose offer is stripped of its candidates, as Chromium's "immediate" offer
has none (docs/browser.md, Offer styles), in a lab namespace (needs root).
"""
from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import AudioStreamTrack

from services.transceiver.ice import selected_remote_address
from services.transceiver.server import TransceiverConfig, TransceiverServer
from tests.conftest import lab_fixture
from topology.netns import in_namespace

pytestmark = pytest.mark.shareable  # make test runs it beside another (pyproject)

lab = lab_fixture("veprflx")


def without_candidates(sdp: str) -> str:
    return "".join(line for line in sdp.splitlines(keepends=True)
                   if not line.startswith(("a=candidate:", "a=end-of-candidates")))


def test_an_offer_without_candidates_connects_through_a_peer_reflexive_candidate(lab):
    async def scenario():
        config = TransceiverConfig(cluster_id=1, transceiver_id=1, media_host=lab.addresses[0],
                                   control=("127.0.0.1", 0))
        async with TransceiverServer(config) as server, aiohttp.ClientSession() as http:
            pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
            pc.addTrack(AudioStreamTrack())
            pc.createDataChannel("oai-events")
            connected = asyncio.Event()
            pc.on("connectionstatechange",
                  lambda: pc.connectionState == "connected" and connected.set())
            await pc.setLocalDescription(await pc.createOffer())
            offer = without_candidates(pc.localDescription.sdp)
            url = f"http://127.0.0.1:{server.control_port}/sessions"
            async with http.post(url, data=offer,
                                 headers={"Content-Type": "application/sdp"}) as r:
                answer, status = await r.text(), r.status
            await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
            await asyncio.wait_for(connected.wait(), 10)
            [session] = server.sessions.values()
            connection = session._pc.getTransceivers()[0].receiver.transport.transport._connection
            learned = [(c.type, c.host, c.port) for c in connection.remote_candidates]
            chosen = selected_remote_address(session._pc)
            client = pc.getTransceivers()[0].receiver.transport.transport._connection
            client_addr = client._nominated[1].local_candidate
            await pc.close()
            return offer, status, learned, chosen, (client_addr.host, client_addr.port)

    offer, status, learned, chosen, client = in_namespace(lab.name, asyncio.run, scenario())
    assert "a=candidate:" not in offer and "end-of-candidates" not in offer
    assert status == 201
    assert ("prflx", *client) in learned and all(t == "prflx" for t, _, _ in learned)
    assert chosen == client
