"""TURN at the edge: clients relay-only through coturn in their own region (on the edge host's
public address, where a TURN provider would place it), the transceivers one port per session
behind it; the region's front hands out the TURN URL with time-limited credentials
(docs/turn.md). Asked for by name: not in a scenario's default set."""
from scenarios.architectures.base import PER_SESSION, Architecture
from topology.preflight import Requirement

ARCHITECTURE = Architecture(
    name="turn", label="TURN (coturn)", colour="#CC79A7", order=40, ports=PER_SESSION,
    fixed_ports_per_client_region=1, turn=True,  # each region's listening port
    requirements=(Requirement("turnserver", "coturn", "the turn architecture's TURN servers"),))
