"""What the transceiver does while a call waits for its answer: only the call's own work.

DTLS certificates are made ahead of the calls (each used once), the host's addresses are not
enumerated per call, and ``session_created`` says how long the answer took. Loopback and a
static offer (tests/offers.py): no namespace needed.
"""
from __future__ import annotations

import asyncio
import logging
import re

import aioice.ice
import aiohttp
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection
from aiortc.rtcdtlstransport import RTCCertificate

from services.logs import Event
from services.transceiver import ice
from services.transceiver.server import TransceiverConfig, TransceiverServer
from tests.offers import STATIC_OFFER


def certificate_of(pc: RTCPeerConnection) -> RTCCertificate:
    return pc._RTCPeerConnection__certificates[0]


def logged(caplog, name: str) -> list[dict]:
    return [r.msg.fields for r in caplog.records if isinstance(r.msg, Event) and r.msg.name == name]


def fingerprint(sdp: str) -> str:
    return re.search(r"a=fingerprint:sha-256 (\S+)", sdp).group(1)


def test_peer_connections_take_pooled_certificates_once_each_and_others_stay_stock():
    async def scenario():
        ice.install()
        pool = ice.CertificatePool(size=4, refill_after_s=0.05)
        pool.fill()
        ready = list(pool._ready)
        with ice.certificates(pool):
            pcs = [RTCPeerConnection(RTCConfiguration(iceServers=[])) for _ in range(6)]
        stock = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        taken = [certificate_of(pc) for pc in pcs]
        dry = pool.made_on_call
        await asyncio.sleep(0.3)  # the refill runs in the background, a little later
        refilled = len(pool)
        for pc in pcs + [stock]:
            await pc.close()
        pool.close()
        return ready, taken, dry, refilled, certificate_of(stock)

    ready, taken, dry, refilled, stock = asyncio.run(scenario())
    assert taken[:4] == ready                      # the pool's, oldest first
    assert dry == 2                                # the 5th and 6th were made on the spot
    assert len({id(c) for c in taken}) == 6        # never one certificate for two calls
    assert len({c.getFingerprints()[0].value for c in taken}) == 6
    assert refilled == 4
    assert type(stock) is RTCCertificate           # outside the block: aiortc's own


def test_an_old_certificate_is_not_handed_out():
    pool = ice.CertificatePool(size=2, max_age_s=0.0)
    pool.fill()
    old = list(pool._ready)
    cert = pool.take()  # no event loop: nothing is refilled, and that is fine
    assert cert not in old and pool.made_on_call == 1


@pytest.mark.parametrize("mode", [ice.SHARED, ice.PORT_PER_SESSION])
def test_answers_use_certificates_made_ahead_and_no_host_address_lookup(mode, monkeypatch,
                                                                       caplog):
    caplog.set_level(logging.INFO, "voiceedge.transceiver")

    def no_lookup(*args, **kwargs):
        raise AssertionError("the host's addresses were enumerated while answering")

    monkeypatch.setattr(aioice.ice, "get_host_addresses", no_lookup)
    cfg = TransceiverConfig(cluster_id=1, transceiver_id=1, media_host="127.0.0.1",
                            control=("127.0.0.1", 0), mode=mode, certificates_ahead=8,
                            advertise=("127.0.0.1", 3478) if mode == ice.SHARED else None)

    async def scenario():
        async with TransceiverServer(cfg) as server, aiohttp.ClientSession() as http:
            answers = []
            for _ in range(3):
                async with http.post(f"http://127.0.0.1:{server.control_port}/sessions",
                                     data=STATIC_OFFER,
                                     headers={"Content-Type": "application/sdp"}) as r:
                    answers.append((r.status, await r.text()))
            async with http.get(f"http://127.0.0.1:{server.control_port}/metrics") as r:
                text = await r.text()
            return answers, server.certificates.made_on_call, text

    answers, on_call, text = asyncio.run(scenario())
    assert [status for status, _ in answers] == [201] * 3, answers
    assert len({fingerprint(sdp) for _, sdp in answers}) == 3
    assert on_call == 0
    assert 'voiceedge_transceiver_certificates_made_total{when="on_call"} 0.0' in text
    created = logged(caplog, "session_created")
    assert len(created) == 3
    for record in created:
        assert 0 < record["negotiate_ms"] <= record["answer_ms"]
