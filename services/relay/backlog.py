"""First packets waiting for a relay worker's slow path: a preallocated ring of slots.

A worker's public socket carries every flow's datagrams. Known flows are forwarded in C at a
fraction of a microsecond each; a datagram from an address without a flow needs Python (STUN
parsing, the ufrag's HMAC, a new flow: tens of microseconds). Handling those as they arrive
let a flood of first packets fill the socket's receive queue, and every call's datagrams then
waited behind thousands of them (0.8 s at 10,000 first packets a second on a loaded 2-core
host). So the worker copies them here and drains the socket at fast-path speed; it works
through the ring between socket reads, a chunk at a time, and when the ring is full a new first
packet is dropped unparsed (``drops_overload``): a flood costs first packets their latency and
some of them their life, never the established flows.
"""
from __future__ import annotations

from services.relay.mmsg import RecvBatch, address_of


class Backlog:
    """``size`` slots of ``slot`` bytes; reads like a RecvBatch (``length``, ``truncated``,
    ``source``, ``view``, ``slot``, ``data_addr``) so the slow path takes either."""

    def __init__(self, size: int = 1024, slot: int = 2048) -> None:
        self.size, self.slot = size, slot
        self.data = bytearray(size * slot)
        self.view = memoryview(self.data)
        self.data_addr = address_of(self.data)
        self._sources: list[bytes] = [b""] * size
        self._lengths = [0] * size
        self._head = 0   # the oldest waiting slot
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def push(self, rx: RecvBatch, i: int, source: bytes) -> bool:
        """Copy receive slot i (from ``source``) in; False when the ring is full."""
        if self._count == self.size:
            return False
        k = (self._head + self._count) % self.size
        n = rx.length(i)
        self.view[k * self.slot:k * self.slot + n] = rx.view[i * rx.slot:i * rx.slot + n]
        self._sources[k], self._lengths[k] = source, n
        self._count += 1
        return True

    def pop(self) -> int:
        """The oldest waiting slot's index. It stays valid until ``size`` more pushes: the
        caller sends from it before the next receive."""
        k = self._head
        self._head = (k + 1) % self.size
        self._count -= 1
        return k

    def length(self, k: int) -> int:
        return self._lengths[k]

    def truncated(self, k: int) -> bool:
        return False  # truncated datagrams are dropped before they get here

    def source(self, k: int) -> bytes:
        return self._sources[k]
