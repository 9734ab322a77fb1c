"""The relay's first-packet admission in C (services/relay/_admission.c) against the Python
rules it replaces, decision by decision: routing.Router (STUN walk, the ufrag's tag, the route
table), admission.FirstPacketLimiter and admission.PendingFlows. The live relay runs on both
admissions in tests/test_relay_pending.py."""
from __future__ import annotations

import random
import struct

import pytest

from bench.hostile.flood import binding_request
from services.relay import mmsg
from services.relay._admission import NOT_STUN, REASONS, Admission
from services.relay.admission import FirstPacketLimiter, PendingFlows, source_keys
from services.relay.config import RouteTable
from services.relay.flows import sockaddr_key
from services.relay.routing import Router
from services.wire.stun import binding_request as plain_request
from services.wire.ufrag import UfragCodec

SECRET = b"a-test-secret-of-some-length"
ROUTES = {1: ("10.0.0.1", 3479), 2: ("10.0.0.2", 3479), 7: ("10.0.0.7", 3479)}


def admission(tier="ingress", cluster_id=-1, rate=0.0, burst=1.0, cap=1 << 16, per_ip=1 << 16,
              per_prefix=1 << 16, ttl_ns=10**12) -> Admission:
    return Admission(SECRET, tier == "ingress", cluster_id, {k: i for i, k in enumerate(ROUTES)},
                     rate, burst, 65_536, cap, per_ip, per_prefix, ttl_ns)


def client(ip: str, port: int) -> bytes:
    return mmsg.sockaddr(ip, port)


def first(native: Admission, datagram: bytes, sockaddr: bytes, now: int = 0, room: int = 1 << 20):
    """first()'s result as the worker reads it: the next hop's index, a drop reason, or
    "not_stun"; and the hop header it wrote."""
    header = bytearray(8)
    result = native.first(datagram, sockaddr, now, room, mmsg.address_of(header))
    if result == NOT_STUN:
        return "not_stun", None
    return (result if result >= 0 else REASONS[-1 - result]), bytes(header)


def mutants(rng: random.Random, codec: UfragCodec) -> list[bytes]:
    """STUN-range datagrams a flood or a fuzzer would send: routable checks, and ones broken
    in every field the router reads."""
    out = []
    for _ in range(400):
        cluster = rng.choice([1, 2, 3, 7, 4095])
        transceiver = rng.choice([1, 2, 7, rng.randrange(4096)])
        good = binding_request(codec.encode(cluster, transceiver), rng)
        b = bytearray(good)
        kind = rng.randrange(9)
        if kind == 1:                               # a byte anywhere
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif kind == 2:                             # inside the ufrag
            b[24 + rng.randrange(20)] = rng.choice(b"+/=-_.:aZ09\x00\xff")
        elif kind == 3:                             # truncated
            b = b[:rng.randrange(len(b))]
        elif kind == 4:                             # the length field
            struct.pack_into("!H", b, 2, rng.randrange(65536))
        elif kind == 5:                             # the USERNAME's length
            struct.pack_into("!H", b, 22, rng.randrange(64))
        elif kind == 6:                             # another secret's ufrag
            b = bytearray(binding_request(UfragCodec(b"x" * 20).encode(1, 1), rng))
        elif kind == 7:                             # no USERNAME at all
            b = bytearray(plain_request(b"")[:20])
            b[2:4] = b"\0\0"
        elif kind == 8:                             # a ufrag without the remote part
            b = bytearray(plain_request(codec.encode(2, 5).encode()))
        out.append(bytes(b))
    return out


@pytest.mark.parametrize("tier,cluster_id", [("ingress", -1), ("cluster", 3)])
def test_every_first_packet_routes_or_drops_as_the_python_router_says(tier, cluster_id):
    rng, codec = random.Random(11), UfragCodec(SECRET)
    routes = RouteTable(tier, ROUTES, None if cluster_id < 0 else cluster_id)
    router = Router(codec, routes, lambda addr: addr)
    native, hops = admission(tier, cluster_id), list(ROUTES.values())
    seen = set()
    for k, datagram in enumerate(mutants(rng, codec)):
        sockaddr = client(f"127.1.{k >> 8}.{k & 255}", 5000 + k)
        expected = router.route(memoryview(datagram))
        got, header = first(native, datagram, sockaddr)
        if isinstance(expected, str):
            assert got == expected, (datagram.hex(), got, expected)
        else:
            assert hops[got] == expected[2], (datagram.hex(), got, expected)
            # the hop header towards the server: magic, TO_SERVER, the client's port and IPv4
            assert header == bytes((0x0E, 0)) + sockaddr[2:8]
        seen.add(got if isinstance(got, str) else "routed")
    assert {"routed", "stun_malformed", "bad_ufrag", "no_route", "stun_no_username"} <= seen


@pytest.mark.parametrize("sources,sweep_every", [(12, 997), (300, 41)])
def test_the_token_buckets_answer_as_the_python_limiter_does(sources, sweep_every):
    """With many sources and frequent sweeps, most sweeps forget some buckets and move the
    others down (the C sweep keeps its buckets dense and renumbers them in the map)."""
    rng = random.Random(5)
    py = FirstPacketLimiter(rate=50, burst=20)
    native = admission(rate=50, burst=20)
    ips = [bytes([10, 0, k >> 8, k & 255]) for k in range(sources)] + [bytes(range(16)),
                                                                      bytes(16)]
    now = 0
    for step in range(20_000):
        now += rng.choice((0, 1_000, 100_000, 5_000_000, 300_000_000))
        if step % sweep_every == 0:
            py.sweep(now)
            native.sweep(now)
            assert len(py) == native.counters()["sources"], step
        ip = rng.choice(ips)
        assert native.allow(ip, now) == py.allow(ip, now), (step, ip)


def test_pending_flows_are_capped_evicted_taken_and_expired_as_python_keeps_them():
    """The same first packets from the same sources through PendingFlows (the reference) and
    the C table: the same refusals, the same flows alive after every step, the same counts."""
    rng, codec = random.Random(3), UfragCodec(SECRET)
    cap, per_ip, per_prefix, ttl = 50, 4, 9, 300_000_000
    py = PendingFlows(cap, per_ip, per_prefix, ttl / 1e9)
    native = admission(cap=cap, per_ip=per_ip, per_prefix=per_prefix, ttl_ns=ttl)
    check = binding_request(codec.encode(7, 1), rng)

    class Entry:   # what PendingFlows holds
        def __init__(self, key, sockaddr, now):
            self.key, self.created = key, now
            self.ip_key, self.prefix_key = source_keys(sockaddr)

    now, live = 0, {}
    for step in range(5_000):
        now += rng.choice((1_000, 1_000_000, 50_000_000))
        roll = rng.random()
        if roll < 0.05 and live:                    # a next hop answered
            key = rng.choice(list(live))
            assert native.take(key)[0] == 2          # ROUTES' third next hop: cluster 7
            py.remove(key, live.pop(key))
            continue
        if roll < 0.08:
            native.sweep(now)
            for key, _ in py.expired(now):
                live.pop(key)
            continue
        sockaddr = client(f"127.2.{rng.randrange(12)}.{rng.randrange(6)}", rng.randrange(1, 40))
        key = sockaddr_key(sockaddr)
        got, _ = first(native, check, sockaddr, now)
        if key in live:                              # its own pending flow: passes
            assert got == 2, step
            continue
        refusal = py.refusal(*source_keys(sockaddr))
        if refusal is not None:
            assert got == refusal, step
            continue
        assert got == 2, (step, got)
        entry = Entry(key, sockaddr, now)
        evicted = py.add(key, entry)
        live[key] = entry
        if evicted is not None:
            live.pop(evicted.key)
        assert len(native) == len(py) == len(live), step
    for key in live:
        assert native.hop_of(key) == 2
    counters = native.counters()
    assert counters["evicted"] > 0 and counters["expired"] > 0 and counters["taken"] > 0


def test_a_pending_flow_passes_stun_only_and_a_full_table_makes_room_or_refuses():
    codec, rng = UfragCodec(SECRET), random.Random(1)
    native = admission(cap=2)
    check = binding_request(codec.encode(1, 1), rng)
    a, b, c = (client("127.3.0.1", p) for p in (1, 2, 3))
    assert first(native, check, a)[0] == 0
    assert first(native, b"\x16\xfe\xfd" + bytes(40), a)[0] == "pending_not_stun"
    assert first(native, check[:30], a)[0] == "pending_not_stun"      # STUN range, badly framed
    assert first(native, b"\x17" + bytes(40), b)[0] == "not_stun"        # no flow: Python's
    assert first(native, check, b)[0] == 0
    assert first(native, check, c, room=0)[0] == 0                     # the oldest (a) went
    assert native.hop_of(sockaddr_key(a)) == -1 and native.counters()["evicted"] == 1
    empty = admission()
    assert first(empty, check, a, room=0)[0] == "flow_table_full"
    with pytest.raises(ValueError):
        first(native, check, mmsg.sockaddr("::1", 5))
    with pytest.raises(ValueError):
        admission(cap=0)
