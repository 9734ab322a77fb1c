"""The baseline: the transceiver binds a UDP port per session on its cluster host's public
address and advertises it; no relay. Clients cross the public internet to it."""
from scenarios.architectures.base import BASELINE, PER_SESSION, Architecture

ARCHITECTURE = Architecture(
    name="port-per-session", label="one port per session", colour="#6b6b6b",
    role=BASELINE, order=10, default=True, ports=PER_SESSION)
