"""A one-way UDP probe between two namespaces: what a path really does to datagrams.

Each datagram carries its sequence number and its send time on CLOCK_MONOTONIC, which every
namespace of the machine shares (CLOCK_REALTIME gave values below the configured delay here);
the receiver takes its own monotonic time right after the datagram is read. So the delay is
one-way and includes the receiving host's ingress, where impairment happens (kernel
timestamps, as plain ``ping`` takes them, would miss it). Both sockets are made inside their
namespaces and used from threads of this process: no helper processes. Those two threads run
at real-time priority where the process may, so the probe measures the links and not its own
wake-ups on a busy host.
"""
from __future__ import annotations

import ctypes
import math
import socket
import statistics
import struct
import threading
import time
from dataclasses import dataclass

from topology.netns import entered
from topology.realtime import try_realtime

_HEADER = struct.Struct(">IQ")  # seq, send time in ns
# The probe threads' SCHED_FIFO priority: below the impairment engine's (the wire releases
# first), above every ordinary process. On a loaded host a receiver at ordinary priority read
# its datagrams 1-6 ms late, so calibration at load failed on paths whose packets the engine
# had released on time (docs/impairment.md, "The wire first").
PROBE_REALTIME = 10
PR_SET_TIMERSLACK = 29


@dataclass
class ProbeResult:
    sent: int
    arrivals: list[tuple[int, float]]  # (seq, one-way delay in ms) in arrival order
    recv_ms: list[float]  # receive times (monotonic, ms), same order

    @property
    def received(self) -> int:
        return len(self.arrivals)

    @property
    def delays_ms(self) -> list[float]:
        return [d for _, d in self.arrivals]

    @property
    def first_delays_ms(self) -> list[float]:
        """One delay per sequence number that arrived (its first copy), in arrival order."""
        seen: set[int] = set()
        out = []
        for seq, delay in self.arrivals:
            if seq not in seen:
                seen.add(seq)
                out.append(delay)
        return out

    @property
    def loss_pct(self) -> float:
        return 100.0 * (self.sent - len({s for s, _ in self.arrivals})) / self.sent

    @property
    def mean_ms(self) -> float:
        return statistics.fmean(self.delays_ms) if self.arrivals else math.nan

    @property
    def sd_ms(self) -> float:
        return statistics.pstdev(self.delays_ms) if len(self.arrivals) > 1 else math.nan

    def percentile_ms(self, q: float) -> float:
        d = sorted(self.delays_ms)
        return d[min(len(d) - 1, int(q * len(d)))] if d else math.nan

    @property
    def reordered(self) -> int:
        """Datagrams that arrived after one with a higher sequence number."""
        top, count = -1, 0
        for seq, _ in self.arrivals:
            if seq < top:
                count += 1
            top = max(top, seq)
        return count

    @property
    def lost_runs(self) -> list[tuple[int, int]]:
        """The runs of consecutive lost sequence numbers: (first lost, length)."""
        got = {s for s, _ in self.arrivals}
        runs: list[tuple[int, int]] = []
        for seq in range(self.sent):
            if seq in got:
                continue
            if runs and runs[-1][0] + runs[-1][1] == seq:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            else:
                runs.append((seq, 1))
        return runs

    @property
    def loss_bursts(self) -> list[int]:
        """Lengths of the runs of consecutive lost sequence numbers."""
        return [n for _, n in self.lost_runs]

    def summary(self) -> dict:
        bursts = self.loss_bursts
        return {"sent": self.sent, "received": self.received, "loss_pct": round(self.loss_pct, 3),
                "mean_ms": round(self.mean_ms, 3), "sd_ms": round(self.sd_ms, 3),
                "p50_ms": round(self.percentile_ms(0.5), 3),
                "p99_ms": round(self.percentile_ms(0.99), 3), "reordered": self.reordered,
                "mean_loss_burst": round(statistics.fmean(bursts), 2) if bursts else 0.0}


def _low_timer_slack() -> None:
    """1 us timer slack for the calling thread (the default 50 us blurs the send schedule)."""
    ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(1000), 0, 0, 0)


def _realtime() -> None:
    """SCHED_FIFO at PROBE_REALTIME for the calling thread (Linux schedules threads), where
    allowed; otherwise it stays ordinary."""
    try_realtime(PROBE_REALTIME)


def udp_probe(src_ns: str, dst_ns: str, dst_addr: str, *, count: int = 300, rate: float = 100.0,
              size: int = 64, drain_s: float = 0.5, burst: int = 1,
              stop: threading.Event | None = None) -> ProbeResult:
    """Send ``count`` datagrams of ``size`` bytes from namespace ``src_ns`` to ``dst_addr`` in
    namespace ``dst_ns`` (names or namespace file paths), ``rate`` per second (in groups of
    ``burst`` back to back); after the last, wait for the missing ones up to ``drain_s``.
    ``stop`` set: it sends no more and returns at once (an interrupted calibration)."""
    stop = stop or threading.Event()
    family = socket.AF_INET6 if ":" in dst_addr else socket.AF_INET
    with entered(dst_ns):
        rx = socket.socket(family, socket.SOCK_DGRAM)
    with entered(src_ns):
        tx = socket.socket(family, socket.SOCK_DGRAM)
    arrivals: list[tuple[int, float]] = []
    recv_ms: list[float] = []
    done, complete = threading.Event(), threading.Event()
    try:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        rx.bind((dst_addr, 0))
        rx.settimeout(0.05)
        target = rx.getsockname()[:2]

        def receive() -> None:
            _realtime()
            buf = bytearray(max(size, _HEADER.size))
            got: set[int] = set()
            while not done.is_set():
                try:
                    rx.recv_into(buf)
                except TimeoutError:
                    continue
                now = time.monotonic_ns()
                seq, sent_ns = _HEADER.unpack_from(buf)
                arrivals.append((seq, (now - sent_ns) / 1e6))
                recv_ms.append(now / 1e6)
                got.add(seq)
                if len(got) >= count:
                    complete.set()

        def send() -> None:
            _low_timer_slack()
            _realtime()
            pad = b"\0" * max(0, size - _HEADER.size)
            start = time.monotonic()
            for seq in range(count):
                if seq % burst == 0:
                    wait = start + (seq // burst) * burst / rate - time.monotonic()
                    if wait > 0 and stop.wait(wait):
                        return
                tx.sendto(_HEADER.pack(seq, time.monotonic_ns()) + pad, target)

        receiver = threading.Thread(target=receive, name="probe-rx", daemon=True)
        receiver.start()
        sender = threading.Thread(target=send, name="probe-tx", daemon=True)
        sender.start()
        sender.join()
        if not stop.is_set():
            complete.wait(drain_s)
        done.set()
        receiver.join()
    finally:
        done.set()
        rx.close()
        tx.close()
    return ProbeResult(count, arrivals, recv_ms)
