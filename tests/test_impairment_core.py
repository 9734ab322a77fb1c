"""The impairment engine's native core (topology/impairment/_engine.c) against its Python
reference (direction.py and engine.py): the same decisions for the same random stream and the
same arrivals, its netlink reading and verdicts, and bad input counted, never a crash."""
from __future__ import annotations

import random
import socket
import struct

import pytest

from topology.impairment import nfqueue as nfq
from topology.impairment._engine import Core
from topology.impairment.direction import Direction
from topology.impairment.model import BernoulliLoss, GilbertElliottLoss, Impairment

CASES = {
    "normal jitter": Impairment(delay_ms=20, jitter_ms=5),
    "uniform jitter": Impairment(delay_ms=12, jitter_ms=3, distribution="uniform"),
    "fifo": Impairment(delay_ms=30, jitter_ms=10, reorder=False),
    "rate": Impairment(delay_ms=5, jitter_ms=1, rate_mbit=2.0),
    "bernoulli": Impairment(delay_ms=8, loss=BernoulliLoss(7.5)),
    "gilbert-elliott": Impairment(delay_ms=8, jitter_ms=2,
                                  loss=GilbertElliottLoss(p=4, r=30, bad_loss=90, good_loss=1)),
    "none": Impairment(),
}


def arrivals(n: int, seed: int) -> list[tuple[float, int]]:
    """A recorded-looking arrival sequence: bursts and gaps (a 20 ms tick's packets arriving
    together), lengths of voice, video and control packets."""
    rnd = random.Random(seed)
    now, out = 1000.0 + rnd.random(), []
    while len(out) < n:
        now += rnd.expovariate(1 / 0.004) if rnd.random() < 0.7 else rnd.random() * 1e-5
        out.append((now, rnd.choice((60, 120, 200, 1200, 1400))))
    return out


def _pair(imp: Impairment, seed: int) -> tuple[Direction, Core, int]:
    """The reference direction, and a core whose one queue continues the same stream (no
    verdict is sent: these tests only ask for decisions)."""
    python = Direction(imp, random.Random(seed))
    twin = Direction(imp, random.Random(seed))
    core = Core()
    return python, core, core.add(-1, 7, twin.params(), twin.random_state())


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_same_arrivals_get_the_same_decisions(name):
    python, core, index = _pair(CASES[name], seed=hash(name) & 0xFFFF)
    for now, length in arrivals(5000, seed=3):
        assert core.decide(index, now, length) == python.decide(now, length), (name, now)


def test_a_change_keeps_the_stream_and_both_stay_equal():
    first, second = CASES["fifo"], CASES["gilbert-elliott"]
    python, core, index = _pair(first, seed=99)
    trace = arrivals(6000, seed=5)
    for i, (now, length) in enumerate(trace):
        if i == 2000:
            python = python.changed(second)
            core.set(index, Direction(second).params(), True)
        if i == 4000:
            python = python.changed(first)
            core.set(index, Direction(first).params(), False)
        assert core.decide(index, now, length) == python.decide(now, length), i


def test_a_cached_gauss_value_is_continued():
    rng = random.Random(1)
    rng.gauss(0, 1)  # leaves the pair's second value cached in the state
    python, twin = Direction(CASES["normal jitter"], rng), None
    state = rng.getstate()
    assert state[2] is not None
    twin = Direction(CASES["normal jitter"], random.Random())
    core = Core()
    index = core.add(-1, 1, twin.params(), state)
    assert core.decide(index, 5.0) == python.decide(5.0)


def packet_message(queue: int, packet_id: int, payload: bytes, cap_len: int | None = None) -> bytes:
    attrs = (nfq.attr(nfq.NFQA_PACKET_HDR, struct.pack(">IHB", packet_id, 0x0800, 0))
             + nfq.attr(nfq.NFQA_PAYLOAD, payload))
    if cap_len is not None:
        attrs += nfq.attr(nfq.NFQA_CAP_LEN, struct.pack(">I", cap_len))
    return nfq.message(nfq.NFQNL_MSG_PACKET, queue, attrs)


def verdicts(sock: socket.socket) -> list[tuple[int, int]]:
    """(verdict, packet id) of every verdict sent to ``sock`` so far, checked byte for byte
    against the Python engine's verdict message."""
    out = []
    while True:
        try:
            data = sock.recv(1 << 16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return out
        assert len(data) % 32 == 0
        for off in range(0, len(data), 32):
            code, pid = struct.unpack(">II", data[off + 24:off + 32])
            assert data[off:off + 32] == nfq.verdict(3, pid, code)
            out.append((code, pid))


def test_fed_packets_are_held_then_accepted_in_due_order_and_losses_dropped_at_once():
    imp = Impairment(delay_ms=10, jitter_ms=4, loss=BernoulliLoss(20))
    python = Direction(imp, random.Random(4))
    twin = Direction(imp, random.Random(4))
    engine_end, kernel_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    core = Core()
    index = core.add(engine_end.fileno(), 3, twin.params(), twin.random_state())
    due, lost, now = {}, [], 50.0
    for pid in range(1, 201):
        now += 0.001
        d = python.decide(now, 0)
        (lost.append(pid) if d is None else due.__setitem__(pid, d))
        core.feed(index, packet_message(3, pid, b"x" * 40), now)
    assert verdicts(kernel_end) == [(nfq.NF_DROP, pid) for pid in lost]
    core.release(now + 0.05)
    accepted = verdicts(kernel_end)
    assert accepted == [(nfq.NF_ACCEPT, pid) for pid in sorted(due, key=lambda p: (due[p], p))]
    stats = core.stats()
    seen, dropped, dropped_fault, delayed, fault = stats["queues"][0]
    assert (seen, dropped, dropped_fault, delayed, fault) == (200, len(lost), 0, len(due), False)
    assert stats["held"] == 0 and stats["malformed"] == 0
    assert sum(stats["hist"].values()) == len(due)


def test_the_length_for_a_rate_is_the_cap_length_when_the_copy_was_cut():
    imp = Impairment(rate_mbit=1.0)  # 8 us per byte
    twin = Direction(imp, random.Random(0))
    core = Core()
    index = core.add(-1, 3, twin.params(), twin.random_state())
    core.feed(index, packet_message(3, 1, b"y" * 64, cap_len=1000), 10.0)
    core.feed(index, packet_message(3, 2, b"y" * 64), 10.0)
    core.release(10.0 + 1000 * 8e-6 - 1e-7)
    assert core.stats()["queues"][0][3] == 0          # 1000 bytes at 1 Mbit/s: not yet
    core.release(10.0 + 1064 * 8e-6 + 1e-7)
    assert core.stats()["queues"][0][3] == 2


@pytest.mark.parametrize("data", [
    b"", b"\x00" * 15, b"\x00" * 16,                                      # too short, zero
    struct.pack("=IHHII", 4000, nfq.NFQNL_MSG_PACKET, 0, 0, 0) + b"\x00" * 40,  # beyond the end
    packet_message(3, 9, b"z" * 20)[:-10],                               # truncated attribute
    nfq.message(nfq.NFQNL_MSG_PACKET, 3, nfq.attr(nfq.NFQA_PAYLOAD, b"no id")),
    struct.pack("=IHHII", 20, nfq.NFQNL_MSG_PACKET, 0, 0, 0) + struct.pack("=HH", 2, 1),
], ids=["empty", "short", "zero-length", "beyond-end", "cut-attribute", "no-id", "tiny-attr"])
def test_bad_netlink_input_is_counted_and_decides_nothing(data):
    twin = Direction(Impairment(delay_ms=1), random.Random(0))
    core = Core()
    index = core.add(-1, 3, twin.params(), twin.random_state())
    core.feed(index, data, 1.0)
    stats = core.stats()
    assert stats["queues"][0][0] == 0 and stats["held"] == 0
    assert stats["malformed"] == (0 if len(data) < 16 else 1)


def test_bad_arguments_raise_not_crash():
    core = Core()
    good = Direction(Impairment(), random.Random(0))
    with pytest.raises(ValueError):
        core.add(-1, 70000, good.params(), good.random_state())
    with pytest.raises(ValueError):
        core.add(-1, 1, good.params(), (2, (), None))
    with pytest.raises(IndexError):
        core.decide(0, 1.0)
    with pytest.raises(TypeError):
        core.add(-1, 1, (1.0,), good.random_state())
    with pytest.raises(RuntimeError):
        Core.__new__(Core).stats()


def test_run_reads_the_queue_in_batches_and_releases_on_time():
    """``run`` over a socket standing in for the queue's netlink socket: it reads what
    arrived, holds it for the delay, accepts it in order, and returns when a control fd is
    readable."""
    import time

    imp = Impairment(delay_ms=5)
    twin = Direction(imp, random.Random(2))
    engine_end, kernel_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    control_r, control_w = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    core = Core()
    index = core.add(engine_end.fileno(), 3, twin.params(), twin.random_state())
    assert index == 0
    for pid in range(1, 201):  # more than a receive batch (64), within the pair's buffer
        kernel_end.send(packet_message(3, pid, b"p" * 64))
    kernel_end.send(packet_message(3, 999, b"q" * 1500))  # beyond a receive slot: cut
    control_w.send(b"x")
    assert core.run((control_r.fileno(),), 0.5) == [control_r.fileno()]
    stats = core.stats()
    assert stats["queues"][0][0] == 201 and stats["truncated"] == 1
    time.sleep(0.01)
    core.run((control_r.fileno(),), 0.5)
    assert verdicts(kernel_end) == [(nfq.NF_ACCEPT, pid) for pid in [*range(1, 201), 999]]
    lateness = core.stats()["hist"]
    assert sum(lateness.values()) == 201


@pytest.mark.parametrize("tick_s", [0.0, 0.0005])
def test_run_reads_only_the_queues_with_packets_among_many(tick_s):
    """200 queues (REGION=all's world), packets on three of them: each is read, held and
    accepted on its own queue's socket, on every event and in busy mode alike."""
    import time

    imp = Impairment(delay_ms=2)
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(200)]
    control_r, control_w = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    core = Core(tick_s=tick_s)
    for n, (engine_end, _) in enumerate(pairs):
        twin = Direction(imp, random.Random(n))
        assert core.add(engine_end.fileno(), 3, twin.params(), twin.random_state()) == n
    busy = {0: range(1, 41), 137: range(100, 160), 199: range(500, 503)}
    try:
        for index, pids in busy.items():
            for pid in pids:
                pairs[index][1].send(packet_message(3, pid, b"m" * 60))
        control_w.send(b"x")  # left unread: every ``run`` does one round and returns
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline:
            assert core.run((control_r.fileno(),), 0.01) == [control_r.fileno()]
            time.sleep(0.0005)
        seen = [q[0] for q in core.stats()["queues"]]
        assert {i: n for i, n in enumerate(seen) if n} == {i: len(p) for i, p in busy.items()}
        for index, (_, kernel_end) in enumerate(pairs):
            expected = [(nfq.NF_ACCEPT, pid) for pid in busy.get(index, ())]
            assert verdicts(kernel_end) == expected, index
        assert core.stats()["held"] == 0
    finally:
        for a, b in pairs:
            a.close()
            b.close()
        control_r.close()
        control_w.close()


def test_a_queue_socket_epoll_refuses_is_an_error_not_a_crash():
    twin = Direction(Impairment(delay_ms=1), random.Random(0))
    core = Core()
    with open(__file__) as regular:  # epoll cannot watch a regular file
        with pytest.raises(OSError):
            core.add(regular.fileno(), 3, twin.params(), twin.random_state())
    assert core.stats()["queues"] == []


def test_a_short_read_still_decides_the_packet_whose_tail_it_lost():
    twin = Direction(Impairment(delay_ms=1), random.Random(0))
    core = Core()
    index = core.add(-1, 3, twin.params(), twin.random_state())
    whole = packet_message(3, 41, b"w" * 400)
    core.feed(index, whole[:100], 1.0, True)        # a short read: the id arrived
    core.feed(index, whole[:100], 1.0)              # the same bytes, not cut: malformed
    stats = core.stats()
    assert stats["queues"][0][0] == 1 and stats["held"] == 1 and stats["malformed"] == 1


@pytest.mark.parametrize("tick_s", [0.0, 0.0005])
def test_busy_mode_reads_and_releases_on_the_tick_within_half_a_tick(tick_s):
    """A stream of a packet every 0.2 ms: with a 0.5 ms tick the core goes busy (ticks
    counted), releases every packet, none more than half a tick early, and leaves busy mode
    once the stream has stopped and nothing is held; without a tick it never ticks."""
    import threading
    import time

    twin = Direction(Impairment(delay_ms=5), random.Random(3))
    engine_end, kernel_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    kernel_end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    control_r, control_w = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    core = Core(tick_s=tick_s)
    core.add(engine_end.fileno(), 3, twin.params(), twin.random_state())
    count = 1500

    def stream():
        start = time.monotonic()
        for pid in range(1, count + 1):
            while time.monotonic() < start + pid * 0.0002:
                pass
            kernel_end.send(packet_message(3, pid, b"p" * 64))
        time.sleep(0.1)  # every delay (5 ms) over, the stream long gone
        control_w.send(b"x")

    got, done = [], threading.Event()

    def drain():  # as the kernel does: a datagram socket holds only a few verdict sends
        while not done.is_set():
            got.extend(verdicts(kernel_end))
            time.sleep(0.001)
        got.extend(verdicts(kernel_end))

    threads = [threading.Thread(target=stream), threading.Thread(target=drain)]
    for t in threads:
        t.start()
    while not core.run((control_r.fileno(),), 0.5):
        pass
    done.set()
    for t in threads:
        t.join()
    stats = core.stats()
    assert sorted(pid for _, pid in got) == list(range(1, count + 1))
    assert {v for v, _ in got} == {nfq.NF_ACCEPT} and stats["held"] == 0
    if tick_s:
        assert stats["ticks"] > 0 and stats["busy"] == 0
        assert stats["early_max_s"] <= tick_s / 2 + 1e-9
    else:
        assert stats["ticks"] == 0 and stats["early_max_s"] == 0
