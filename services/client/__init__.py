"""The measuring WebRTC client: aiortc sessions against an SDP-over-HTTP endpoint, with timings."""
