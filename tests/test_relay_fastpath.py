"""The relay's C fast path (services/relay/_fastpath.c) called directly, on loopback sockets:
what it forwards, byte for byte, and what it hands back to Python as a miss. Also run under
AddressSanitizer (scripts/asan-test) and fuzzed (bench/fuzz_fastpath.py).

The cluster tier's ``forward_internal`` is checked datagram by datagram against the rule of
the Python path it replaces (``RelayWorker._upstream_datagram``): an established IPv4 flow's
datagram, with a valid hop header towards the server, from the ingress relay the flow names.
"""
from __future__ import annotations

import random
import socket
import time

import pytest

from services.relay import _fastpath, mmsg
from services.relay.flows import DOWN_PACKETS, LAST_SEEN_NS, UP_BYTES, UP_PACKETS, Flow, Hop
from services.wire import hop

ROUNDS = 4


def bound() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.setblocking(False)
    return s


def drain(sock: socket.socket, wait: float = 0.2) -> list[tuple[bytes, tuple[str, int]]]:
    """Everything ``sock`` receives until ``wait`` passes with nothing new."""
    out, deadline = [], time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            out.append(sock.recvfrom(65535))
            deadline = time.monotonic() + wait
        except BlockingIOError:
            time.sleep(0.005)
    return out


class ClusterTier:
    """A cluster relay's internal socket and hop socket, two ingress relays, a transceiver,
    and the batches and fast table a worker would pass."""

    def __init__(self, size: int = 16) -> None:
        self.internal, self.hop_sock = bound(), bound()
        self.ingress = [bound(), bound()]
        self.transceiver = bound()
        self.rx, self.tx = mmsg.RecvBatch(size), mmsg.SendBatch(size)
        self.misses = bytearray(4 * size)
        self.miss_index = memoryview(self.misses).cast("I")
        self.table: dict[int, int] = {}
        self.flows: dict[int, Flow] = {}
        self.next = Hop(self.transceiver.getsockname())
        self.prevs = [Hop(s.getsockname()) for s in self.ingress]

    def open(self, client: tuple[str, int], via: int) -> Flow:
        name = mmsg.sockaddr(*client)
        key = int.from_bytes(name[:8], "little") >> 16
        flow = Flow(key, client, self.next, self.prevs[via], 4, 7, time.monotonic_ns(), "stun")
        self.flows[key] = flow
        self.table[key] = flow.record_ptr
        return flow

    def send(self, via: int, datagram: bytes) -> None:
        self.ingress[via].sendto(datagram, self.internal.getsockname())

    def forward(self) -> tuple[int, list[int]]:
        """One call: (received, the missed slots)."""
        time.sleep(0.02)  # loopback delivers at once; this makes sure of it
        received, missed, failed = _fastpath.forward_internal(
            self.internal.fileno(), self.rx.hdrs_addr, self.rx.size, self.table,
            self.tx.hdrs_addr, self.tx.iovs_addr, self.hop_sock.fileno(),
            mmsg.address_of(self.misses), ROUNDS)
        assert failed == 0
        return received, [self.miss_index[k] for k in range(missed)]

    def close(self) -> None:
        for s in (self.internal, self.hop_sock, self.transceiver, *self.ingress):
            s.close()


@pytest.fixture
def tier():
    t = ClusterTier()
    yield t
    t.close()


CLIENT = ("198.51.100.7", 40000)
RTP = b"\x80\x6f" + bytes(range(170))


def test_an_established_flows_datagram_goes_to_its_next_hop_unchanged_and_is_counted(tier):
    flow = tier.open(CLIENT, via=0)
    seen = flow.words[LAST_SEEN_NS]
    datagram = hop.encode(CLIENT) + RTP
    tier.send(0, datagram)
    tier.send(0, hop.encode(CLIENT))  # an empty client datagram is still the client's
    assert tier.forward() == (2, [])
    got = drain(tier.transceiver)
    assert got == [(datagram, tier.hop_sock.getsockname()),
                   (hop.encode(CLIENT), tier.hop_sock.getsockname())]
    w = flow.words
    assert (w[UP_PACKETS], w[UP_BYTES], w[DOWN_PACKETS]) == (2, len(RTP), 0)
    assert w[LAST_SEEN_NS] > seen


def test_everything_else_is_a_miss_for_python_and_nothing_is_sent(tier):
    flow = tier.open(CLIENT, via=0)
    other = ("198.51.100.8", 40000)
    good = hop.encode(CLIENT) + RTP
    cases = [
        (1, good),                                            # from the other ingress
        (0, hop.encode(other) + RTP),                         # no such flow
        (0, hop.encode(CLIENT, hop.TO_CLIENT) + RTP),         # towards the client
        (0, bytes([0x0E, 0x04]) + good[2:]),                  # unknown flag bits
        (0, hop.encode(("2001:db8::1", 40000)) + RTP),        # IPv6 client
        (0, bytes([0x0F]) + good[1:]),                        # not the hop magic
        (0, good[:7]),                                        # shorter than a header
        (0, b""),
        (0, good[:2] + bytes(2048)),                          # truncated by the slot
    ]
    for via, datagram in cases:
        tier.send(via, datagram)
    received, missed = tier.forward()
    assert received == len(cases) and missed == list(range(len(cases)))
    assert drain(tier.transceiver, 0.1) == []
    assert flow.words[UP_PACKETS] == 0


def test_a_check_for_the_flows_own_ufrag_stays_here_and_another_goes_to_python(tier):
    """A NAT may give a flow's address to another caller: a STUN Binding request naming
    another server ufrag than the one the flow was routed by is Python's to route again;
    the flow's own consent checks stay here (through Python, under a flood, they were the
    calls' slowest datagrams)."""
    from services.wire.stun import binding_request
    flow = tier.open(CLIENT, via=0)
    own, other = b"AQAgARBVjRvxDqvDHWNE", b"AQAwARBVjRvxDqvDHWNE"
    flow.ufrag = own
    cases = [(binding_request(own + b":cli1"), False),
             (binding_request(other + b":cli1"), True),
             (binding_request(own[:-1] + b":cli1"), True),     # a prefix is another
             (binding_request(own + b"x:cli1"), True),
             (binding_request(own), False),                    # no colon: all of it
             (binding_request(own + b":")[:-4], False),        # USERNAME past the message
             (b"\x01\x01" + binding_request(other + b":c")[2:], False),  # an answer
             (RTP, False)]
    for datagram, _ in cases:
        tier.send(0, hop.encode(CLIENT) + datagram)
    received, missed = tier.forward()
    assert received == len(cases)
    assert missed == [k for k, (_, miss) in enumerate(cases) if miss]
    assert flow.words[UP_PACKETS] == len(cases) - len(missed)
    flow.ufrag = b""          # recovered from Redis or opened by the C admission: none yet
    tier.send(0, hop.encode(CLIENT) + cases[0][0])
    assert tier.forward() == (1, [0])
    flow.ufrag = b"u" * 25    # longer than a record holds: never the flow's own
    assert flow.ufrag == b""


def test_a_flow_that_moved_to_another_ingress_is_forwarded_only_from_there(tier):
    flow = tier.open(CLIENT, via=0)
    flow.route(tier.next, tier.prevs[1])  # what the worker does when a check came via ingress 1
    tier.send(0, hop.encode(CLIENT) + b"\x80old")
    tier.send(1, hop.encode(CLIENT) + b"\x80new")
    received, missed = tier.forward()
    assert (received, missed) == (2, [0])
    assert [d for d, _ in drain(tier.transceiver)] == [hop.encode(CLIENT) + b"\x80new"]


def test_a_batch_with_a_miss_ends_the_call_before_the_next_read(tier):
    """Python must handle the misses before their slots are reused: the call returns after
    the first batch that had one, and the next call goes on from there."""
    tier.open(CLIENT, via=0)
    for k in range(tier.rx.size):
        tier.send(0, hop.encode(CLIENT) + bytes([0x80, k]))
    tier.send(1, hop.encode(CLIENT) + b"\x80x")  # a miss in the second batch
    tier.send(0, hop.encode(CLIENT) + b"\x80y")
    received, missed = tier.forward()
    assert (received, missed) == (tier.rx.size + 2, [0])
    assert tier.rx.length(0) == len(hop.encode(CLIENT)) + 2  # the miss is still in its slot
    assert len(drain(tier.transceiver)) == tier.rx.size + 1


def test_forward_internal_decides_as_the_python_path_on_random_traffic(tier):
    """Random datagrams from both ingress relays and a stranger, for flows via either
    ingress, some moved, some gone: forwarded exactly when the Python rule says so."""
    rng = random.Random(7)
    stranger = bound()
    clients = [(f"198.51.100.{n}", 40000 + n) for n in range(1, 7)]
    flows = {c: tier.open(c, via=n % 2) for n, c in enumerate(clients[:4])}
    flows[clients[3]].route(tier.next, tier.prevs[0])
    senders = [*tier.ingress, stranger]
    forwarded = 0
    for _ in range(40):
        sent = []
        for _ in range(rng.randrange(1, 12)):
            client = rng.choice(clients)
            flags = rng.choice([0x00, 0x00, 0x00, 0x01, 0x04])
            header = bytes([0x0E, flags]) + hop.encode(client)[2:]
            datagram = header + rng.randbytes(rng.randrange(0, 300))
            sender = rng.randrange(3)
            senders[sender].sendto(datagram, tier.internal.getsockname())
            sent.append((client, flags, sender, datagram))
        received, missed = tier.forward()  # up to 11 datagrams: one batch
        expected, misses = [], []
        for i, (client, flags, sender, datagram) in enumerate(sent):
            flow = flows.get(client)
            if (flags == 0x00 and flow is not None and sender < 2
                    and flow.prev is tier.prevs[sender]):
                expected.append(datagram)
            else:
                misses.append(i)
        assert (received, missed) == (len(sent), misses)
        assert [d for d, _ in drain(tier.transceiver, 0.05)] == expected
        forwarded += len(expected)
    assert sum(f.words[UP_PACKETS] for f in flows.values()) == forwarded
    stranger.close()
