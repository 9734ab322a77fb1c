"""A relay worker's UDP sockets (services/relay/worker.py says what each carries)."""
from __future__ import annotations

import socket

from services.relay.config import RelayConfig


def udp_socket(addr: tuple[str, int], reuseport: bool) -> socket.socket:
    """A bound, non-blocking UDP socket with 4 MiB buffers (forced past the limits as root)."""
    family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuseport:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    for opt, force in ((socket.SO_RCVBUF, 33), (socket.SO_SNDBUF, 32)):  # *BUFFORCE as root
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, 4 << 20)
        except PermissionError:
            sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
    sock.bind(addr)
    sock.setblocking(False)
    return sock


class WorkerSockets:
    """A worker's sockets, opened before the worker process starts so bind errors surface."""

    def __init__(self, config: RelayConfig, index: int = 0) -> None:
        self.public = udp_socket(config.listen, reuseport=True)
        self.internal = self.hop = None
        try:
            if config.tier == "cluster" and config.internal:
                self.internal = udp_socket(config.internal, reuseport=True)
            hop_port = config.hop_port + index if config.hop_port else 0
            self.hop = udp_socket((config.hop_bind, hop_port), reuseport=False)
        except OSError:
            self.close()
            raise

    def close(self) -> None:
        for sock in (self.public, self.internal, self.hop):
            if sock is not None:
                sock.close()
