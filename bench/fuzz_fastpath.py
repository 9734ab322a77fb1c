"""Coverage-guided fuzzing of the relay's fast path (services/relay/_fastpath.c).

    python -m bench.fuzz_fastpath --runs 1000000     fuzz: atheris (libFuzzer) drives the C
    python -m bench.fuzz_fastpath --replay PATH...   run inputs once (a crash file, a corpus)
    python -m bench.fuzz_fastpath --coverage [DIR]   line/branch coverage of the C over a corpus

Built and run like bench/fuzz_mediaplane.py (bench/fuzzing.py: a clang ASan/UBSan build with
libFuzzer's instrumentation under build/fuzz-fastpath/, atheris's runtime preloaded).

The three entry points read real loopback sockets (127.0.0.1; the harness's own): a relay's
public port (``forward_public``), a cluster relay's internal port (``forward_internal``) and
its hop socket (``forward_return``). An input is a program: a first byte gives each of four
clients a flow or none (direct, or through one of two ingress relays), then operations: a
datagram from a client, an ingress, the next hop or a stranger to one of the three sockets (a
hop header for a client, towards the server or the client, with good or unknown flags, then
the input's bytes; a STUN Binding request, behind such a header to the internal port; the
input's raw bytes; or one longer than a receive slot), a flow moved to
another ingress, or a flush: each socket's entry point called, one receive batch a call, until
everything sent was received. The model is the Python path's rule (services/relay/worker.py:
``_public_slow``, ``_upstream_datagram``, ``_return_slow`` for established flows): every
datagram is forwarded, byte for byte, to the one address the model says, or handed back as
a miss, in order; the flows' packet and byte counters are the model's. A broken invariant
raises ``Violation``: libFuzzer saves the input and stops.
"""
from __future__ import annotations

import select
import socket
import struct
from pathlib import Path

from bench.fuzzing import Harness, InputReader, Tally, Target, command

REPO = Path(__file__).resolve().parent.parent
TARGET = Target(suffix="._fastpath", work=REPO / "build" / "fuzz-fastpath",
                source_env="VOICEEDGE_FUZZ_FASTPATH_SOURCE", tool="fuzz_fastpath")
BATCH = 16           # receive slots: a flush sends at most this many to a socket
SLOT = 2048
MAX_OPS = 64
BINDING = b"\x00\x01\x00\x00\x21\x12\xa4\x42"  # type, length 0, the magic cookie (RFC 8489)
# the flows' server ufrags: none yet (recovered), a routing one's 20 characters, the longest
UFRAGS = (b"", b"AQAgARBVjRvxDqvDHWNE", b"u" * 24)
PUBLIC, INTERNAL, RETURN = 0, 1, 2


class Violation(AssertionError):
    """The C broke one of the invariants the harness checks."""


def check(ok: bool, what: str, *detail) -> None:
    if not ok:
        raise Violation(what + (": " + ", ".join(repr(d) for d in detail) if detail else ""))


def udp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.setblocking(False)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    return s


class World:
    """The sockets, batches and hops, made once; each input gets fresh flows."""

    def __init__(self, module) -> None:
        from services.relay import mmsg
        from services.relay.flows import Hop
        self.module, self.mmsg = module, mmsg
        self.public, self.internal, self.hop = udp(), udp(), udp()
        self.clients = [udp() for _ in range(4)]
        self.ingress = [udp(), udp()]
        self.next = udp()                 # the transceiver (or the next relay)
        self.stranger = udp()
        self.next_hop = Hop(self.next.getsockname())
        self.prevs = [Hop(s.getsockname()) for s in self.ingress]
        self.rx = mmsg.RecvBatch(BATCH, SLOT)
        self.tx = [mmsg.SendBatch(BATCH) for _ in range(2)]
        self.misses = bytearray(4 * BATCH)
        self.miss_index = memoryview(self.misses).cast("I")
        self.misses_addr = mmsg.address_of(self.misses)
        self.receivers = [*self.clients, *self.ingress, self.next]
        self.tally = Tally()

    def drain(self) -> None:
        """Whatever an input that broke off left in a socket."""
        for s in (self.public, self.internal, self.hop, self.stranger, *self.receivers):
            while True:
                try:
                    s.recvfrom(65535)
                except BlockingIOError:
                    break


class Case:
    """One input: flows for the four clients, then the operations, the model beside the C."""

    def __init__(self, world: World, data: bytes) -> None:
        from services.relay.flows import Flow
        self.w, self.r = world, InputReader(data)
        self.flows: dict[int, Flow] = {}     # client index -> its flow
        self.table: dict[int, int] = {}
        setup = self.r.byte()
        for k, client in enumerate(world.clients):
            how = setup >> (2 * k) & 3
            if not how:
                continue
            prev = None if how == 1 else world.prevs[how - 2]
            addr = client.getsockname()
            flow = Flow(self.key(addr), addr, world.next_hop, prev, 4, 7, 1, "stun")
            flow.ufrag = UFRAGS[k % len(UFRAGS)]
            self.flows[k] = flow
            self.table[flow.key] = flow.record_ptr
        self.model = {k: [0, 0, 0, 0] for k in self.flows}   # up/down packets and bytes
        self.pending: list[list[tuple[socket.socket, bytes]]] = [[], [], []]

    @staticmethod
    def key(addr: tuple[str, int]) -> int:
        from services.relay import mmsg
        return int.from_bytes(mmsg.sockaddr(*addr)[:8], "little") >> 16

    def run(self) -> None:
        try:
            for _ in range(MAX_OPS):
                op = self.r.byte()
                if op >> 6 == 3:
                    self.flush()
                elif op >> 6 == 2 and op & 1:
                    self.move(op >> 1 & 3)
                else:
                    self.send(op)
        except EOFError:
            pass
        self.flush()

    # -- operations

    def move(self, k: int) -> None:
        flow = self.flows.get(k)
        if flow is not None and flow.prev is not None:
            flow.route(self.w.next_hop, self.w.prevs[1 - self.w.prevs.index(flow.prev)])

    def send(self, op: int) -> None:
        target = op % 3
        kind = self.r.byte()
        client = self.w.clients[kind & 3].getsockname()
        flags = (0x00, 0x01, 0x00, 0x01, 0x04, 0x02, 0x80, 0x00)[kind >> 2 & 7]
        body = self.r.take(self.r.byte() % 64)
        if kind >> 5 == 7:
            datagram = b"\x0e\x00" + bytes(SLOT)                  # past the slot: truncated
        elif kind >> 5 >= 5:
            datagram = body                                       # raw
        elif kind >> 5 == 4:                                      # a STUN Binding request
            from services.relay import mmsg
            stun = binding(body, self.flows.get(kind & 3))
            datagram = (stun if target == PUBLIC
                        else bytes([0x0E, flags]) + mmsg.sockaddr(*client)[2:8] + stun)
        else:
            from services.relay import mmsg
            datagram = bytes([0x0E, flags]) + mmsg.sockaddr(*client)[2:8] + body
        senders = ([*self.w.clients, self.w.stranger], [*self.w.ingress, self.w.stranger],
                   [self.w.next, self.w.stranger])[target]
        sender = senders[(op >> 3) % len(senders)]
        if len(self.pending[target]) < BATCH:
            self.pending[target].append((sender, datagram))

    def flush(self) -> None:
        for target in (PUBLIC, INTERNAL, RETURN):
            sent, self.pending[target] = self.pending[target], []
            if sent:
                self.forward(target, sent)
        self.verify_counters()

    # -- one socket's datagrams through the C, against the model

    def forward(self, target: int, sent: list[tuple[socket.socket, bytes]]) -> None:
        w = self.w
        sock = (w.public, w.internal, w.hop)[target]
        for sender, datagram in sent:
            sender.sendto(datagram, sock.getsockname())
        expected: dict[socket.socket, list[tuple[bytes, tuple]]] = {}
        misses = []
        for i, (sender, datagram) in enumerate(sent):
            out = self.model_one(target, sender, datagram)
            if out is None:
                misses.append(i)
            else:
                expected.setdefault(out[0], []).append((out[1], out[2]))
        got_misses, received = [], 0
        while received < len(sent):
            if not select.select([sock], [], [], 1.0)[0]:
                raise Violation("a datagram never arrived", target, received, len(sent))
            n, missed = self.call(target, sock)
            got_misses += [received + w.miss_index[k] for k in range(missed)]
            received += n
        check(got_misses == misses, "the misses", target, got_misses, misses)
        w.tally.add(f"forwarded_{('public', 'internal', 'return')[target]}", len(sent) - len(misses))
        w.tally.add("missed", len(misses))
        for receiver in w.receivers:
            got = []
            while True:
                try:
                    got.append(receiver.recvfrom(65535))
                except BlockingIOError:
                    break
            want = expected.get(receiver, [])
            # loopback delivers within sendmmsg, nearly always: give it a moment
            while len(got) < len(want) and select.select([receiver], [], [], 1.0)[0]:
                got.append(receiver.recvfrom(65535))
            check(got == want, "what arrived", target, receiver.getsockname(), got, want)

    def call(self, target: int, sock: socket.socket) -> tuple[int, int]:
        w, m = self.w, self.w.module
        up, down = w.tx
        if target == PUBLIC:
            n, missed, failed = m.forward_public(
                sock.fileno(), w.rx.hdrs_addr, BATCH, self.table, up.hdrs_addr, up.iovs_addr,
                w.hop.fileno(), w.misses_addr, 1)
        elif target == INTERNAL:
            n, missed, failed = m.forward_internal(
                sock.fileno(), w.rx.hdrs_addr, BATCH, self.table, up.hdrs_addr, up.iovs_addr,
                w.hop.fileno(), w.misses_addr, 1)
        else:
            n, missed, failed = m.forward_return(
                sock.fileno(), w.rx.hdrs_addr, BATCH, self.table, down.hdrs_addr,
                down.iovs_addr, w.public.fileno(), up.hdrs_addr, up.iovs_addr,
                w.internal.fileno(), w.misses_addr, 1)
        check(failed == 0, "a send failed", target)
        return n, missed

    def model_one(self, target: int, sender: socket.socket, d: bytes):
        """(receiver, datagram, from) the Python path would send, or None: a miss."""
        w = self.w
        if len(d) > SLOT:
            return None
        if target == PUBLIC:
            k = w.clients.index(sender) if sender in w.clients else None
            flow = self.flows.get(k)
            if flow is None or flow.prev is not None or binding_request(d, flow):
                return None
            self.model[k][0] += 1
            self.model[k][1] += len(d)
            return w.next, bytes(flow.header) + d, w.hop.getsockname()
        if len(d) < 8 or d[0] != 0x0E or d[1] != (0x00 if target == INTERNAL else 0x01):
            return None
        k = next((k for k, f in self.flows.items() if self.key_of_header(d) == f.key), None)
        if k is None:
            return None
        flow = self.flows[k]
        if target == INTERNAL:
            if sender not in w.ingress or flow.prev is not w.prevs[w.ingress.index(sender)]:
                return None
            if binding_request(d[8:], flow):
                return None
            self.model[k][0] += 1
            self.model[k][1] += len(d) - 8
            return w.next, d, w.hop.getsockname()
        if sender is not w.next:
            return None
        self.model[k][2] += 1
        self.model[k][3] += len(d) - 8
        if flow.prev is None:
            return w.clients[k], d[8:], w.public.getsockname()
        return w.ingress[w.prevs.index(flow.prev)], d, w.internal.getsockname()

    @staticmethod
    def key_of_header(d: bytes) -> int:
        return int.from_bytes(d[:8], "little") >> 16

    def verify_counters(self) -> None:
        from services.relay.flows import DOWN_BYTES, DOWN_PACKETS, UP_BYTES, UP_PACKETS
        for k, flow in self.flows.items():
            got = [flow.words[i] for i in (UP_PACKETS, UP_BYTES, DOWN_PACKETS, DOWN_BYTES)]
            check(got == self.model[k], "a flow's counters", k, got, self.model[k])


def binding(body: bytes, flow) -> bytes:
    """A STUN Binding request from the input: its first byte chooses a USERNAME naming the
    flow's server ufrag, another, one the input spells, or the input's bytes as attributes
    under a length that may or may not fit."""
    how, rest = (body[0] % 4, body[1:]) if body else (0, b"")
    own = flow.ufrag if flow is not None else b""
    if how < 3:
        ufrag = (own, own[::-1] + b"x", rest[:30])[how]
        value = ufrag + b":" + rest[:8]
        attrs = struct.pack("!HH", 6, len(value)) + value + bytes(-len(value) % 4)
        return struct.pack("!HHI", 1, len(attrs), 0x2112A442) + bytes(12) + attrs
    length = (rest[0] if rest else 0) & 0xFC
    return struct.pack("!HHI", 1, length, 0x2112A442) + bytes(12) + rest[1:]


def binding_request(d: bytes, flow) -> bool:
    """A STUN Binding request Python must route again (services/relay/worker.py's
    ``_routed_elsewhere``): one whose USERNAME names another server ufrag than the flow's."""
    from services.wire.stun import StunError, read_username, server_ufrag
    if not (len(d) >= 20 and d[:2] == b"\x00\x01" and d[4:8] == BINDING[4:8]):
        return False
    try:
        username = read_username(d)
    except StunError:
        return False
    return username is not None and server_ufrag(username) != flow.ufrag


def run_input(world: World, data: bytes) -> None:
    if data:
        world.drain()
        Case(world, data).run()


def seeds() -> list[bytes]:
    """Programs that reach each entry point's forwarding and its misses."""
    out = []
    for setup in (0b11100100, 0b01010101, 0b10101010, 0b11111111):
        ops = []
        for target in (0, 1, 2):
            for sender in (0, 1, 2):
                for kind in (0x00, 0x04, 0x01, 0x10, 0x80, 0xA0, 0xE0):
                    ops += [target | sender << 3, kind, 5, 0x80, 1, 2, 3, 4]
        out.append(bytes([setup, *ops[:120], 0x81, 0xC0, *ops[120:240], 0xC0]))
    return out


HARNESS = Harness(target=TARGET, module="bench.fuzz_fastpath", doc=__doc__, seeds=seeds,
                  world=World, run_input=run_input)

if __name__ == "__main__":
    command(HARNESS)
