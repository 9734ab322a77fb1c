"""Wire formats shared by the services: the routing ufrag, STUN framing, the relay hop header."""
