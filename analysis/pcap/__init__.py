"""What the wire saw: read a scenario's packet captures and break each datagram's path into
hops (docs/captures.md)."""
