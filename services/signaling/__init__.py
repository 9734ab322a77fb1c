"""Signaling: the HTTP API that takes an SDP offer and returns the answer of a transceiver."""
