"""Offers for tests. ``STATIC_OFFER``: a minimal SDP offer that aiortc answers without
gathering anything: no candidates, so the session it creates never sends a datagram (the
transceiver's mux only sends to addresses that authenticated), and its setup timeout or a
DELETE ends it. ``offer_answer``: a real peer's offer/answer with a transceiver."""
from __future__ import annotations

from aiortc import RTCSessionDescription

STATIC_OFFER = "\r\n".join([
    "v=0", "o=- 1 1 IN IP4 0.0.0.0", "s=-", "t=0 0", "a=group:BUNDLE 0",
    "m=audio 9 UDP/TLS/RTP/SAVPF 111", "c=IN IP4 0.0.0.0", "a=sendrecv", "a=mid:0",
    "a=rtcp-mux", "a=rtpmap:111 opus/48000/2", "a=ice-ufrag:test", "a=ice-pwd:" + "p" * 24,
    "a=fingerprint:sha-256 " + ":".join(["AB"] * 32), "a=setup:actpass", ""])


async def offer_answer(http, url: str, pc) -> tuple[str, str]:
    """Offer ``pc``'s description to a transceiver's ``url``, expect 201, apply the answer;
    returns (the session's Location, the answer's SDP)."""
    await pc.setLocalDescription(await pc.createOffer())
    async with http.post(url, data=pc.localDescription.sdp,
                         headers={"Content-Type": "application/sdp"}) as r:
        answer = await r.text()
        assert r.status == 201, answer
        location = r.headers["Location"]
    await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
    return location, answer
