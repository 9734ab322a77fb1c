"""A minimal SDP offer that aiortc answers without gathering anything: no candidates, so the
session it creates never sends a datagram (the transceiver's mux only sends to addresses that
authenticated), and its setup timeout or a DELETE ends it."""
from __future__ import annotations

STATIC_OFFER = "\r\n".join([
    "v=0", "o=- 1 1 IN IP4 0.0.0.0", "s=-", "t=0 0", "a=group:BUNDLE 0",
    "m=audio 9 UDP/TLS/RTP/SAVPF 111", "c=IN IP4 0.0.0.0", "a=sendrecv", "a=mid:0",
    "a=rtcp-mux", "a=rtpmap:111 opus/48000/2", "a=ice-ufrag:test", "a=ice-pwd:" + "p" * 24,
    "a=fingerprint:sha-256 " + ":".join(["AB"] * 32), "a=setup:actpass", ""])
