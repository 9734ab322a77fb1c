"""Coverage-guided fuzzing of the impairment engine's native core (topology/impairment/_engine.c).

    python -m bench.fuzz_impairment --runs 1000000     fuzz: atheris (libFuzzer) drives the C
    python -m bench.fuzz_impairment --replay PATH...   run inputs once (a crash file, a corpus)
    python -m bench.fuzz_impairment --coverage [DIR]   line/branch coverage of the C over a corpus

Built and run like bench/fuzz_mediaplane.py (bench/fuzzing.py: a clang ASan/UBSan build with
libFuzzer's instrumentation under build/fuzz-impairment/, atheris's runtime preloaded).

An input is a program against one fresh ``Core`` with one queue whose verdicts go to a
socket the harness reads: a first byte picks the impairment (of ``MODELS``) and the seed, then
operations: netlink buffers fed (well-formed packet messages, several in one buffer, raw bytes,
cut as by a short read or not, an error message), releases, direct decisions and runtime
changes of the model (``set``, a fault or not), with the clock moving on. A model checks after
every operation: the buffer read by a Python reading of the same rules (RFC-less: the
nfnetlink layout in nfqueue.py, the C's rules for what is malformed); each packet decided as
the Python ``Direction`` decides it with the same random stream (so the C and the reference
make the same decisions on every input); a loss answered at once with exactly one DROP, a
release with exactly one ACCEPT, in due order, byte for byte the Python engine's verdict; the
counters, the held count and the histogram as the model's. A broken invariant raises
``Violation``: libFuzzer saves the input and stops.
"""
from __future__ import annotations

import random
import socket
import struct
from pathlib import Path

from bench.fuzzing import Harness, Tally, Target, command

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / "build" / "fuzz-impairment"
TARGET = Target(suffix="._engine", work=WORK, source_env="VOICEEDGE_FUZZ_ENGINE_SOURCE",
                tool="fuzz_impairment")

NFQNL_MSG_PACKET, NLMSG_ERROR = (3 << 8) | 0, 2
NFQA_PACKET_HDR, NFQA_PAYLOAD, NFQA_CAP_LEN, NLA_TYPE_MASK = 1, 10, 13, 0x3FFF
QUEUE = 5


class Violation(AssertionError):
    """The core broke one of the invariants the harness checks."""


def check(ok: bool, what: str, *detail) -> None:
    if not ok:
        raise Violation(what + (": " + ", ".join(repr(d) for d in detail) if detail else ""))


def models():
    from topology.impairment.model import BernoulliLoss, GilbertElliottLoss, Impairment

    return [Impairment(), Impairment(delay_ms=2), Impairment(delay_ms=3, jitter_ms=2),
            Impairment(delay_ms=3, jitter_ms=2, distribution="uniform"),
            Impairment(delay_ms=4, jitter_ms=3, reorder=False),
            Impairment(delay_ms=1, jitter_ms=0.5, rate_mbit=4.0),
            Impairment(delay_ms=2, loss=BernoulliLoss(30)),
            Impairment(delay_ms=2, jitter_ms=1, loss=GilbertElliottLoss(p=20, r=40, bad_loss=80,
                                                                          good_loss=5)),
            Impairment(loss=BernoulliLoss(100))]


# ------------------------------------------------------------------ the model's reading

def read_buffer(buf: bytes, cut: bool) -> tuple[list[tuple[int, int]], int, int]:
    """What the core must make of one received buffer: the packets ``(id, length)`` in order,
    the malformed messages, the error messages with a nonzero errno."""
    packets, malformed, errors, off, n = [], 0, 0, 0, len(buf)
    while off + 16 <= n:
        length, kind = struct.unpack_from("=IH", buf, off)
        if length < 16 or (length > n - off and not cut):
            malformed += 1
            break
        last = length > n - off
        if last:
            length = n - off
        if kind == NFQNL_MSG_PACKET:
            got = _packet(buf[off:off + length], last)
            if got is None:
                malformed += 1
            else:
                packets.append(got)
        elif kind == NLMSG_ERROR:
            err = struct.unpack_from("=i", buf, off + 16)[0] if length >= 20 else 0
            errors += err != 0
        if last:
            break
        off += (length + 3) & ~3
    return packets, malformed, errors


def _packet(m: bytes, cut: bool) -> tuple[int, int] | None:
    pos, packet_id, payload, cap = 20, None, 0, 0
    while pos + 4 <= len(m):
        alen, akind = struct.unpack_from("=HH", m, pos)
        if alen < 4 or pos + alen > len(m):
            if cut:
                break
            return None
        akind &= NLA_TYPE_MASK
        if akind == NFQA_PACKET_HDR and alen >= 8:
            packet_id = struct.unpack_from(">I", m, pos + 4)[0]
        elif akind == NFQA_PAYLOAD:
            payload = alen - 4
        elif akind == NFQA_CAP_LEN and alen >= 8:
            cap = struct.unpack_from(">I", m, pos + 4)[0]
        pos += (alen + 3) & ~3
    return None if packet_id is None else (packet_id, cap or payload)


def packet_message(packet_id: int, payload: int, cap: int | None) -> bytes:
    from topology.impairment import nfqueue as nfq

    attrs = (nfq.attr(NFQA_PACKET_HDR, struct.pack(">IHB", packet_id, 0x0800, 0))
             + nfq.attr(NFQA_PAYLOAD, bytes(payload)))
    if cap is not None:
        attrs += nfq.attr(NFQA_CAP_LEN, struct.pack(">I", cap))
    return nfq.message(NFQNL_MSG_PACKET, QUEUE, attrs)


# ------------------------------------------------------------------ one input

class Bytes:
    """The input, read a field at a time; zeros once it is used up."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out + bytes(n - len(out))

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return struct.unpack(">H", self.take(2))[0]

    def u32(self) -> int:
        return struct.unpack(">I", self.take(4))[0]

    @property
    def left(self) -> bool:
        return self.pos < len(self.data)


class World:
    """The module under test and what every input shares: the verdict socket pair."""

    def __init__(self, module) -> None:
        from topology.impairment import nfqueue
        from topology.impairment.direction import Direction

        self.module, self.nfq, self.Direction = module, nfqueue, Direction
        self.models = models()
        self.tally = Tally()
        self.count = self.tally.add


class Case:
    """One input's core, its queue and the model beside it."""

    def __init__(self, world: World, data: bytes) -> None:
        self.w, self.b = world, Bytes(data)
        first = self.b.u8()
        self.imp = world.models[first % len(world.models)]
        seed = first // len(world.models)
        self.model = world.Direction(self.imp, random.Random(seed))
        twin = world.Direction(self.imp, random.Random(seed))
        self.engine_end, self.kernel_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.engine_end.setblocking(False)   # a full pair: send_errors, never a hang
        self.core = world.module.Core(buckets=5000)
        self.index = self.core.add(self.engine_end.fileno(), QUEUE, twin.params(),
                                   twin.random_state())
        self.now, self.fault = 100.0, False
        self.held: list[tuple[float, int]] = []     # (due, id)
        self.counts = {"seen": 0, "dropped": 0, "dropped_fault": 0, "released": 0,
                       "malformed": 0, "verdict_errors": 0}

    def close(self) -> None:
        self.engine_end.close()
        self.kernel_end.close()

    def run(self) -> None:
        ops = (self.op_packets, self.op_packets, self.op_raw, self.op_error, self.op_release,
               self.op_decide, self.op_set)
        steps = 0
        while self.b.left and steps < 64:
            steps += 1
            op = ops[self.b.u8() % len(ops)]
            self.w.count(op.__name__)
            op()
            self.verify()

    # -- operations

    def _tick(self) -> None:
        self.now += self.b.u16() * 1e-6

    def _feed(self, buf: bytes, cut: bool) -> None:
        packets, malformed, errors = read_buffer(buf, cut)
        drops = []
        for packet_id, length in packets:
            self.counts["seen"] += 1
            due = self.model.decide(self.now, length)
            if due is None:
                self.counts["dropped_fault" if self.fault else "dropped"] += 1
                drops.append((self.w.nfq.NF_DROP, packet_id))
            else:
                self.held.append((due, packet_id))
        self.counts["malformed"] += malformed
        self.counts["verdict_errors"] += errors
        self.core.feed(self.index, buf, self.now, cut)
        got = self.verdicts()
        check(got == drops, "the losses' verdicts", got[:8], drops[:8])

    def op_packets(self) -> None:
        """One to eight well-formed packet messages in one buffer, perhaps cut short."""
        self._tick()
        k, buf = 1 + self.b.u8() % 8, b""
        for _ in range(k):
            flags = self.b.u8()
            payload = self.b.u16() % 1500 if flags & 1 else self.b.u8() % 65
            cap = self.b.u16() if flags & 2 else None
            buf += packet_message(self.b.u32(), payload, cap)
        cut = self.b.u8()
        if cut & 1:
            buf = buf[:max(16, len(buf) - 1 - self.b.u16() % len(buf))]
        self._feed(buf, bool(cut & 2))

    def op_raw(self) -> None:
        """Bytes as they come: a header that may say anything, attributes of any kind."""
        self._tick()
        n = self.b.u8()
        self._feed(self.b.take(n), bool(self.b.u8() & 1))

    def op_error(self) -> None:
        self._tick()
        buf = struct.pack("=IHHIIi", 36, NLMSG_ERROR, 0, 0, 0, -(self.b.u8() % 3)) + bytes(16)
        self._feed(buf, False)

    def op_release(self) -> None:
        self.now += self.b.u16() * 1e-5
        due = sorted((d, i) for d, i in self.held if d <= self.now)
        self.held = [(d, i) for d, i in self.held if d > self.now]
        self.counts["released"] += len(due)
        self.core.release(self.now)
        got = self.verdicts()
        check(got == [(self.w.nfq.NF_ACCEPT, i) for _, i in due], "the releases' verdicts",
              got[:8], due[:8])

    def op_decide(self) -> None:
        self._tick()
        length = self.b.u16()
        expected = self.model.decide(self.now, length)
        got = self.core.decide(self.index, self.now, length)
        check(got == expected, "a direct decision", got, expected)

    def op_set(self) -> None:
        imp = self.w.models[self.b.u8() % len(self.w.models)]
        self.fault = bool(self.b.u8() & 1)
        self.model = self.model.changed(imp)
        self.core.set(self.index, self.w.Direction(imp).params(), self.fault)

    # -- what is checked after every operation

    def verdicts(self) -> list[tuple[int, int]]:
        out = []
        while True:
            try:
                data = self.kernel_end.recv(1 << 16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return out
            check(len(data) % 32 == 0, "verdicts are whole", len(data))
            for off in range(0, len(data), 32):
                code, packet_id = struct.unpack_from(">II", data, off + 24)
                check(data[off:off + 32] == self.w.nfq.verdict(QUEUE, packet_id, code),
                      "a verdict's bytes", data[off:off + 32].hex())
                out.append((code, packet_id))

    def verify(self) -> None:
        s = self.core.stats()
        seen, dropped, dropped_fault, released, fault = s["queues"][0]
        c = self.counts
        check((seen, dropped, dropped_fault, released) ==
              (c["seen"], c["dropped"], c["dropped_fault"], c["released"]), "the counters",
              (seen, dropped, dropped_fault, released), c)
        check(fault == self.fault, "the fault flag")
        check(s["held"] == len(self.held) == seen - dropped - dropped_fault - released,
              "the held packets", s["held"], len(self.held))
        check(s["malformed"] == c["malformed"], "malformed", s["malformed"], c["malformed"])
        check(s["verdict_errors"] == c["verdict_errors"], "verdict errors")
        check(sum(s["hist"].values()) == released, "the lateness histogram")
        check(s["send_errors"] == 0, "a verdict was not sent", s["send_errors"])


def run_input(world: World, data: bytes) -> None:
    case = Case(world, data)
    try:
        case.run()
    finally:
        case.close()


def seeds() -> list[bytes]:
    """A few programs that reach every operation."""
    out = []
    for model in range(9):
        out.append(bytes([model, 0, 3, 0, 1, 0, 60, 0, 0, 0, 7, 0, 4, 0x10, 0, 5, 0, 0x20,
                          1, 0x30, 0x80, 0x00, 0x06, 3, 0, 0, 0, 0, 0x14, 0x20, 6, 2, 1]))
    return out


HARNESS = Harness(target=TARGET, module="bench.fuzz_impairment", doc=__doc__, seeds=seeds,
                  world=World, run_input=run_input)

if __name__ == "__main__":
    command(HARNESS)
