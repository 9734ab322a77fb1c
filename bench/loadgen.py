"""A paced UDP load generator and a timestamping sink, in one process on one CPU.

Every datagram carries its send time (CLOCK_REALTIME ns, taken just before the send call) and
the sink reads the kernel's receive timestamp (SO_TIMESTAMPNS) of the same clock, so one-way
latency includes neither the generator's nor the sink's scheduling. Both ends use batched
system calls so that the generator, not Python, sets the rate.
"""
from __future__ import annotations

import random
import socket
import struct
import time
from dataclasses import dataclass, field

from services.relay import mmsg
from services.wire import hop as hopwire
from services.wire.stun import binding_success

SO_TIMESTAMPNS = 35
_STAMP = struct.Struct("!Q")
_STAMP_AT = 4  # RTP-like datagram: 0x80, pad, 2-byte flow index, then the send time
_ANSWER = binding_success()  # a STUN binding success response


@dataclass
class PhaseResult:
    sent: int
    received: int
    seconds: float
    latencies_us: list[float] = field(repr=False)

    @property
    def lost(self) -> int:
        return self.sent - self.received


class Sink:
    """Receives datagrams (raw or hop-encapsulated) and records their one-way latency."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.sock.bind((host, 0))
        self.sock.setblocking(False)
        self.address = self.sock.getsockname()
        self._rx = mmsg.RecvBatch(64, timestamps=True)
        self.received = 0
        self.first_packets: list[bytes] = []  # STUN-range datagrams, kept for checks
        self.latencies_us: list[float] = []

    def drain(self) -> int:
        rx, got = self._rx, 0
        fd, data, view, slot = self.sock.fileno(), rx.data, rx.view, rx.slot
        while True:
            n = rx.recv(fd)
            if not n:
                return got
            for i in range(n):
                off = i * slot
                if data[off] == hopwire.MAGIC:
                    off += hopwire.IPV4_LENGTH
                if data[off] < 4:  # STUN (a flow's first packet)
                    self.first_packets.append(bytes(view[off:i * slot + rx.length(i)]))
                    if off:  # through a relay: answer, as a transceiver would
                        self._answer(view[i * slot:i * slot + rx.length(i)], rx.source(i))
                    continue
                sent_ns = _STAMP.unpack_from(data, off + _STAMP_AT)[0]
                self.latencies_us.append((rx.timestamp_ns(i) - sent_ns) / 1000)
            got += n
            self.received += n
            if n < rx.size:
                return got

    def _answer(self, datagram, relay: bytes) -> None:
        """A relay keeps a flow pending (only STUN passes) until its next hop answers."""
        client = hopwire.decode(datagram)[0].client
        self.sock.sendto(hopwire.encode(client, hopwire.TO_CLIENT) + _ANSWER,
                         mmsg.sockaddr_to_tuple(relay))

    def reset(self) -> None:
        self.received = 0
        self.latencies_us = []
        self.first_packets = []

    def close(self) -> None:
        self.sock.close()


class LoadGenerator:
    """``flows`` client sockets sending ``size``-byte datagrams at ``rate`` per second in all."""

    def __init__(self, flows: int = 100, size: int = 200, host: str = "127.0.0.1") -> None:
        self.socks = []
        self._bufs = []
        for k in range(flows):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.setsockopt(socket.SOL_SOCKET, 32, 4 << 20)  # SO_SNDBUFFORCE
            sock.bind((host, 0))
            sock.setblocking(False)
            self.socks.append(sock)
            buf = bytearray(size)
            buf[0] = 0x80
            buf[2:4] = k.to_bytes(2, "big")
            self._bufs.append(buf)

    def send_first(self, target: tuple[str, int], datagram_for) -> None:
        """One first datagram per flow (e.g. a STUN binding request)."""
        for k, sock in enumerate(self.socks):
            sock.sendto(datagram_for(k), target)

    def run(self, target: tuple[str, int], rate: float, seconds: float, sink: Sink,
            seed: int = 1) -> PhaseResult:
        """Send for ``seconds`` with Poisson arrivals at ``rate`` (flows taking turns) while
        draining ``sink``; then wait for stragglers.

        Poisson arrivals are what many independent calls add up to; a perfectly even stream
        would be the kindest case for a relay that wakes per datagram, bursts the harshest.
        """
        sink.reset()
        rng = random.Random(seed)
        expo = rng.expovariate
        socks, bufs, nflows = self.socks, self._bufs, len(self.socks)
        total = int(rate * seconds)
        sent, k = 0, 0
        clock, wall, pack = time.perf_counter, time.time_ns, _STAMP.pack_into
        start = clock()
        next_at = expo(rate)
        while sent < total:
            now = clock() - start
            while next_at <= now and sent < total:
                buf = bufs[k]
                pack(buf, _STAMP_AT, wall())
                try:
                    socks[k].sendto(buf, target)
                    sent += 1
                except BlockingIOError:
                    pass
                k = (k + 1) % nflows
                next_at += expo(rate)
            sink.drain()
        elapsed = clock() - start
        quiet_until = clock() + 0.3
        while clock() < quiet_until:
            if sink.drain():
                quiet_until = clock() + 0.3
            time.sleep(0.001)
        return PhaseResult(sent=sent, received=sink.received, seconds=elapsed,
                           latencies_us=sink.latencies_us)

    def close(self) -> None:
        for sock in self.socks:
            sock.close()
