"""The edge services: relay, transceiver, signaling front, agent and clients."""
