"""The single-port relay: first-packet routing by STUN USERNAME, opaque forwarding after that."""
