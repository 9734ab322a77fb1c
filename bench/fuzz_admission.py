"""Coverage-guided fuzzing of the relay's native first-packet admission (services/relay/_admission.c).

    python -m bench.fuzz_admission --runs 1000000     fuzz: atheris (libFuzzer) drives the C
    python -m bench.fuzz_admission --replay PATH...   run inputs once (a crash file, a corpus)
    python -m bench.fuzz_admission --coverage [DIR]   line/branch coverage of the C over a corpus

Built and run like bench/fuzz_mediaplane.py (bench/fuzzing.py: a clang ASan/UBSan build with
libFuzzer's instrumentation under build/fuzz-admission/, atheris's runtime preloaded).

An input is a program against one fresh ``Admission``: two bytes pick the limits (pending
cap, per-IP and per-/24 caps, token rate and how many sources get a bucket, TTL) and the tier,
then operations: ``first`` with a
routable check, a check mutated by the input's bytes, or the input's raw bytes, from one of a
few clients (some sharing an IP or a /24), with the table's room from the input; ``take``,
``hop_of``, ``forget``; ``allow`` with IPv4, IPv6 and odd-sized keys; ``sweep``; the clock
moving on by the input's amounts. The model beside it is the Python the C replaces: Router
(the STUN walk, the ufrag's tag, the route table), FirstPacketLimiter and PendingFlows, with
the worker's rules for room and eviction. Every result must be the model's, every hop header
the client's, and after every operation the pending flows and counters the model's. A broken
invariant raises ``Violation``: libFuzzer saves the input and stops.
"""
from __future__ import annotations

import random
from pathlib import Path

from bench.fuzzing import Harness, InputReader, Tally, Target, command

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / "build" / "fuzz-admission"
TARGET = Target(suffix="._admission", work=WORK, source_env="VOICEEDGE_FUZZ_ADMISSION_SOURCE",
                tool="fuzz_admission")
SECRET = b"fuzz-admission-secret"
ROUTES = {1: ("10.0.0.1", 3479), 2: ("10.0.0.2", 3479), 5: ("10.0.0.5", 3479)}
CLIENTS = [("127.7.0.1", 1), ("127.7.0.1", 2), ("127.7.0.1", 3), ("127.7.0.2", 1),
           ("127.7.0.3", 9), ("127.7.1.1", 1), ("127.8.0.1", 65535), ("127.7.0.4", 0)]
MAX_OPS = 96
# the operations, by the low 4 bits of their byte (the high ones move the clock)
OPS = ("op_first",) * 8 + ("op_take", "op_take", "op_forget", "op_allow", "op_allow",
                           "op_sweep", "op_sweep", "op_first")


class Violation(AssertionError):
    """The C broke one of the invariants the harness checks."""


def check(ok: bool, what: str, *detail) -> None:
    if not ok:
        raise Violation(what + (": " + ", ".join(repr(d) for d in detail) if detail else ""))


class World:
    def __init__(self, module) -> None:
        from services.relay import mmsg
        from services.relay.flows import sockaddr_key
        from services.wire.ufrag import UfragCodec
        self.module, self.mmsg, self.key_of = module, mmsg, sockaddr_key
        self.codec = UfragCodec(SECRET)
        self.clients = [mmsg.sockaddr(*c) for c in CLIENTS]
        self.header = bytearray(8)
        self.header_addr = mmsg.address_of(self.header)
        self.tally = Tally()
        self.count = self.tally.add
        rng = random.Random(1)
        from bench.hostile.flood import binding_request
        # routable checks for each route (and one for a route that is not there)
        self.checks = {(c, t): binding_request(self.codec.encode(c, t), rng)
                       for c in (1, 2, 3, 5) for t in (1, 2, 5, 7)}


class Case:
    """One input against a fresh Admission, with the Python rules beside it."""

    def __init__(self, world: World, data: bytes) -> None:
        from services.relay.admission import FirstPacketLimiter, PendingFlows
        from services.relay.config import RouteTable
        from services.relay.routing import Router
        self.w, self.r = world, InputReader(data)
        cfg, cfg2 = self.r.byte(), self.r.byte()
        self.cap = 1 + (cfg & 7)
        self.per_ip, self.per_prefix = 1 + (cfg >> 3 & 3), 1 + (cfg >> 3 & 3) + (cfg >> 5 & 1)
        self.rate, burst = (0.0, 1.0) if cfg & 0x80 else (20.0, 3.0)
        ingress = not cfg & 0x40
        # few token buckets, so a full limiter lets new sources through untracked
        max_sources = (1, 3, 16, 65_536)[cfg2 & 3]
        self.ttl = 1_000_000 * (1 + (cfg2 >> 2))
        routes = RouteTable("ingress" if ingress else "cluster", ROUTES, None if ingress else 2)
        self.hops = list(ROUTES.values())
        self.router = Router(world.codec, routes, lambda addr: addr)
        self.limiter = FirstPacketLimiter(self.rate, burst, max_sources)
        self.pending = PendingFlows(self.cap, self.per_ip, self.per_prefix, self.ttl / 1e9)
        self.native = world.module.Admission(
            SECRET, ingress, -1 if ingress else 2, {k: i for i, k in enumerate(ROUTES)},
            self.rate, burst, max_sources, self.cap, self.per_ip, self.per_prefix, self.ttl)
        self.hop_of: dict[int, int] = {}    # the model's pending flows' next hops
        self.now = 1_000_000_000
        self.counts = {"created": 0, "evicted": 0, "expired": 0, "taken": 0}

    def run(self) -> None:
        try:
            for _ in range(MAX_OPS):
                op = self.r.byte()
                self.now += (0, 1_000, 400_000, 30_000_000)[op >> 6] * (1 + (op >> 4 & 3))
                getattr(self, OPS[op & 15])()
                self.verify()
        except EOFError:
            self.verify()

    # -- operations

    def datagram(self) -> bytes:
        kind = self.r.byte()
        good = self.w.checks[(1, 2, 3, 5)[kind & 3], (1, 2, 5, 7)[kind >> 2 & 3]]
        if kind >> 4 == 0:
            return good
        if kind >> 4 < 8:               # mutated: a byte replaced, or cut short
            b = bytearray(good)
            at = self.r.byte() % (len(b) + 1)
            if kind & 0x40:
                return bytes(b[:at])
            if at < len(b):
                b[at] = self.r.byte()
            return bytes(b)
        return self.r.take(self.r.byte() % 160)   # raw

    def op_first(self) -> None:
        from services.relay.admission import source_keys
        from services.wire.stun import in_stun_range, is_stun
        sockaddr = self.w.clients[self.r.byte() % len(self.w.clients)]
        data = self.datagram()
        room = (self.r.byte() % 12) - 2
        key = self.w.key_of(sockaddr)
        ip, prefix = source_keys(sockaddr)
        self.w.header[:] = bytes(8)
        got = self.native.first(data, sockaddr, self.now, room, self.w.header_addr)
        reasons = self.w.module.REASONS
        name = "not_stun" if got == self.w.module.NOT_STUN else (
            got if got >= 0 else reasons[-1 - got])
        if key in self.hop_of:
            expected = ("pending_not_stun" if not is_stun(data) else
                        "rate_limited" if not self.limiter.allow(ip, self.now) else
                        self.hop_of[key])
        elif not in_stun_range(data):
            expected = "not_stun"
        elif not self.limiter.allow(ip, self.now):
            expected = "rate_limited"
        else:
            routed = self.router.route(memoryview(data))
            expected = routed if isinstance(routed, str) else self.open(key, sockaddr, routed, room)
        check(name == expected, "first()", data.hex(), sockaddr.hex(), name, expected)
        self.w.count(f"first_{name if isinstance(name, str) else 'forwarded'}")
        if isinstance(name, int):
            check(bytes(self.w.header) == bytes((0x0E, 0)) + sockaddr[2:8], "the hop header",
                  bytes(self.w.header).hex())

    def open(self, key, sockaddr, routed, room):
        """The worker's rules for a new pending flow: the caps, the room, the eviction."""
        from services.relay.admission import source_keys
        refusal = self.pending.refusal(*source_keys(sockaddr))
        if refusal is not None:
            return refusal
        if room <= 0 and not len(self.pending):
            return "flow_table_full"
        if len(self.pending) >= self.cap or room <= 0:
            oldest = self.pending.oldest()
            self.pending.remove(oldest.key, oldest)
            del self.hop_of[oldest.key]
            self.counts["evicted"] += 1
        hop = self.hops.index(routed[2])
        self.pending.add(key, Entry(key, sockaddr, self.now))
        self.hop_of[key] = hop
        self.counts["created"] += 1
        return hop

    def op_take(self) -> None:
        key = self.w.key_of(self.w.clients[self.r.byte() % len(self.w.clients)])
        check(self.native.hop_of(key) == self.hop_of.get(key, -1), "hop_of()")
        got = self.native.take(key)
        if key not in self.hop_of:
            check(got is None, "take() of no pending flow", got)
            return
        check(got is not None and got[0] == self.hop_of.pop(key), "take()", got)
        entry = self.pending._flows[key]
        check(got[3] == entry.created, "take()'s creation time", got, entry.created)
        self.pending.remove(key, entry)
        self.counts["taken"] += 1
        self.w.count("taken")

    def op_forget(self) -> None:
        key = self.w.key_of(self.w.clients[self.r.byte() % len(self.w.clients)])
        got = self.native.forget(key)
        check(got == (key in self.hop_of), "forget()", got)
        if got:
            self.pending.remove(key, self.pending._flows[key])
            del self.hop_of[key]

    def op_allow(self) -> None:
        sel = self.r.byte()
        ip = (bytes([127, 7, 0, sel & 7]) if sel < 128 else
              bytes([sel & 3]) * 16 if sel < 224 else bytes([sel]) * (sel % 7))
        check(self.native.allow(ip, self.now) == self.limiter.allow(ip, self.now), "allow()", ip)

    def op_sweep(self) -> None:
        expired = self.native.sweep(self.now)
        gone = [key for key, _ in self.pending.expired(self.now)]
        for key in gone:
            del self.hop_of[key]
        self.limiter.sweep(self.now)
        self.counts["expired"] += len(gone)
        check(expired == len(gone), "sweep()'s expired flows", expired, len(gone))

    # -- after every operation

    def verify(self) -> None:
        c = self.native.counters()
        check(len(self.native) == c["pending"] == len(self.pending) == len(self.hop_of),
              "the pending flows", c["pending"], len(self.pending))
        for k in self.counts:
            check(c[k] == self.counts[k], k, c[k], self.counts[k])
        check(c["sources"] == len(self.limiter), "the token buckets", c["sources"],
              len(self.limiter))
        check(c["untracked"] == self.limiter.untracked == self.native.untracked, "untracked")


class Entry:
    """What PendingFlows holds for the model."""

    def __init__(self, key, sockaddr: bytes, now: int) -> None:
        from services.relay.admission import source_keys
        self.key, self.created = key, now
        self.ip_key, self.prefix_key = source_keys(sockaddr)


def run_input(world: World, data: bytes) -> None:
    if len(data) >= 2:   # the two config bytes
        Case(world, data).run()


def seeds() -> list[bytes]:
    """A few programs that reach every operation."""
    out = []
    for cfg in (0x00, 0x3F, 0x41, 0x80, 0xC7):
        out.append(bytes([cfg, cfg & 0x1F, 0, 0, 0, 5, 0x40, 1, 0x03, 1, 0x10, 2, 0x05, 1, 9, 0x06, 2,
                          0x07, 0x81, 0x48, 0xC8, 0x00, 3, 0x20, 5, 0x11, 0x00, 4, 0x95, 3, 4]))
    return out


HARNESS = Harness(target=TARGET, module="bench.fuzz_admission", doc=__doc__, seeds=seeds,
                  world=World, run_input=run_input)

if __name__ == "__main__":
    command(HARNESS)
