"""Pending flows and first-packet limits (services/relay/admission.py), on a real relay process.

The routing ufrag is public, so a routable first packet opens only a pending flow: STUN passes,
nothing else, until the next hop answers. Clients come from distinct loopback addresses
(127.a.b.c) to exercise the per-IP and per-/24 caps.
"""
from __future__ import annotations

import os
import socket
import time

import pytest

from services.relay.admission import FirstPacketLimiter, PendingFlows, source_keys
from services.relay.config import ADMISSIONS
from services.relay import mmsg
from services.relay.config import RelayConfig, RouteTable
from services.relay.worker import RelayWorker
from services.wire import hop
from services.wire.stun import binding_request
from tests.conftest import free_port
from tests.logcheck import events, service_records
from tests import test_relay
from tests.test_relay import ANSWER, DTLS, RTP, answer, nothing_arrives, recv_hop, stun_for, udp



@pytest.fixture(params=ADMISSIONS)
def world(request, tmp_path, relay_factory):
    """An ingress relay and two stand-in next hops; every test here runs on both first-packet
    admissions (--admission python, the reference, and native)."""
    yield from test_relay.relay_world(tmp_path, relay_factory, "--admission", request.param)


def udp_from(host: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((host, 0))
    s.settimeout(1.0)
    return s


def test_a_pending_flow_forwards_only_stun_until_its_next_hop_answers(world):
    relay = world["start"]()
    client, hop1 = udp(), world["hops"][1]
    client.sendto(stun_for(1), world["vip"])
    _, _, relay_hop_addr = recv_hop(hop1)
    for junk in (DTLS, RTP, os.urandom(300), b"\x00" * 1200):
        client.sendto(junk, world["vip"])
    client.sendto(stun_for(1), world["vip"])  # a retransmitted check still passes
    header, payload, _ = recv_hop(hop1)
    assert payload[:2] == b"\x00\x01" and header.client == client.getsockname()
    assert nothing_arrives(hop1, 0.2)
    m = relay.wait_for(lambda m: m["drops_pending_not_stun"] == 4)
    assert m["flows_pending"] == 1 and m["flows_created"] == 0 and m["flows_pending_created"] == 1
    assert not events(service_records(relay.log(), "relay"), "flow_created")
    answer(hop1, client, relay_hop_addr)
    client.sendto(RTP, world["vip"])
    assert recv_hop(hop1)[1] == RTP
    m = relay.wait_for(lambda m: m["flows_created"] == 1)
    assert m["flows_pending"] == 0 and m["flows_active"] == 1
    [created] = events(service_records(relay.log(), "relay"), "flow_created")
    assert created["client"] == "%s:%d" % client.getsockname()


def test_an_unanswered_pending_flow_expires_and_gets_no_return_traffic(world, redis_server):
    relay = world["start"]("--pending-ttl", "0.5", "--redis", redis_server.url)
    client = udp()
    client.sendto(stun_for(1), world["vip"])
    _, _, relay_hop_addr = recv_hop(world["hops"][1])
    m = relay.wait_for(lambda m: m["flows_pending_expired"] == 1, timeout=5)
    assert m["flows_active"] == 0 and m["flows_pending"] == 0
    assert m["redis_writes"] == 0  # never established: never in Redis
    assert m["packets_to_server"] == 1  # what it forwarded stays counted
    world["hops"][1].sendto(hop.encode(client.getsockname(), hop.TO_CLIENT) + ANSWER,
                            relay_hop_addr)
    assert nothing_arrives(client)
    relay.wait_for(lambda m: m["drops_return_no_flow"] == 1)


def test_pending_flows_are_capped_per_source_ip_and_per_prefix(world):
    relay = world["start"]("--pending-per-ip", "3", "--pending-per-prefix", "5")
    same_ip = [udp_from("127.0.9.1") for _ in range(5)]
    same_prefix = [udp_from(f"127.0.9.{k}") for k in range(2, 6)]
    other_prefix = udp_from("127.0.10.1")
    for s in same_ip + same_prefix + [other_prefix]:
        s.sendto(stun_for(1), world["vip"])
        time.sleep(0.002)  # in order: the caps decide by arrival
    m = relay.wait_for(lambda m: m["drops_pending_per_ip"] == 2
                       and m["drops_pending_per_prefix"] == 2)
    # 3 from 127.0.9.1, 2 more from its /24 (5 in all), and the one from another /24
    assert m["flows_pending"] == 6
    arrived = {recv_hop(world["hops"][1])[0].client for _ in range(6)}
    assert arrived == ({s.getsockname() for s in same_ip[:3] + same_prefix[:2]}
                       | {other_prefix.getsockname()})
    assert nothing_arrives(world["hops"][1], 0.1)


def test_a_full_pending_table_evicts_its_oldest_flow_and_real_clients_still_get_in(world):
    relay = world["start"]("--max-pending", "4")
    attackers = [udp_from(f"127.0.{20 + k}.1") for k in range(6)]
    for s in attackers:
        s.sendto(stun_for(1), world["vip"])
        time.sleep(0.002)
    firsts = {}
    for _ in attackers:
        header, _, relay_hop_addr = recv_hop(world["hops"][1])
        firsts[header.client] = relay_hop_addr
    m = relay.wait_for(lambda m: m["flows_pending_evicted"] == 2)
    assert m["flows_pending"] == 4 and m["flows_active"] == 4
    # The two oldest are gone: an answer for them is not reflected; the newest is answered.
    oldest, newest = attackers[0], attackers[-1]
    world["hops"][1].sendto(hop.encode(oldest.getsockname(), hop.TO_CLIENT) + ANSWER,
                            firsts[oldest.getsockname()])
    assert nothing_arrives(oldest)
    answer(world["hops"][1], newest, firsts[newest.getsockname()])
    relay.wait_for(lambda m: m["flows_created"] == 1 and m["flows_pending"] == 3)


def test_first_packets_are_rate_limited_per_source_ip(world):
    relay = world["start"]("--first-packet-rate", "0.1", "--first-packet-burst", "10")
    flooder = [udp_from("127.0.30.1") for _ in range(4)]
    junk = binding_request(b"notaroutingufrag:x")  # STUN: parsed, so it spends tokens
    for k in range(40):
        flooder[k % 4].sendto(junk, world["vip"])
    m = relay.wait_for(lambda m: m["drops_rate_limited"] + m["drops_bad_ufrag"] == 40)
    assert m["drops_rate_limited"] == 30  # a burst of 10; one token per 10 s after it
    # Another source is not affected; the flooder's own check is refused.
    client = udp_from("127.0.31.1")
    client.sendto(stun_for(1), world["vip"])
    assert recv_hop(world["hops"][1])[0].client == client.getsockname()
    flooder[0].sendto(stun_for(1), world["vip"])
    assert nothing_arrives(world["hops"][1], 0.1)
    relay.wait_for(lambda m: m["drops_rate_limited"] == 31)


def test_media_from_unknown_addresses_spends_no_tokens_without_redis(world):
    """After a restart without Redis, a client's media must not eat the tokens its next
    consent check needs: non-STUN from an unknown address is dropped before the bucket."""
    relay = world["start"]("--first-packet-rate", "0.1", "--first-packet-burst", "2")
    client = udp_from("127.0.32.1")
    for _ in range(50):
        client.sendto(RTP, world["vip"])
    client.sendto(stun_for(1), world["vip"])
    assert recv_hop(world["hops"][1])[0].client == client.getsockname()
    m = relay.wait_for(lambda m: m["drops_unknown_not_stun"] == 50)
    assert m["drops_rate_limited"] == 0


def test_without_pending_flows_the_first_packet_opens_the_flow_for_everything(world):
    """The unhardened behaviour, kept for the hostile benchmark's comparison."""
    relay = world["start"]("--no-pending-flows")
    client = udp()
    client.sendto(stun_for(1), world["vip"])
    recv_hop(world["hops"][1])
    client.sendto(RTP, world["vip"])
    assert recv_hop(world["hops"][1])[1] == RTP
    m = relay.wait_for(lambda m: m["flows_created"] == 1)
    assert m["flows_pending_created"] == 0 and m["flows_pending"] == 0


def test_ingress_and_cluster_relays_both_wait_for_the_transceivers_answer(tmp_path,
                                                                       relay_factory):
    transceiver = udp()
    cluster_internal, ingress_port = free_port(), free_port()
    (tmp_path / "c.toml").write_text(
        f'cluster_id = 4\n[routes]\n7 = "127.0.0.1:{transceiver.getsockname()[1]}"\n')
    (tmp_path / "i.toml").write_text(f'[routes]\n4 = "127.0.0.1:{cluster_internal}"\n')
    cluster = relay_factory(["--tier", "cluster", "--routes", str(tmp_path / "c.toml"),
                             "--listen", "127.0.0.1", "--port", str(free_port()), "--internal",
                             f"127.0.0.1:{cluster_internal}", "--hop-bind", "127.0.0.1"])
    ingress = relay_factory(["--tier", "ingress", "--routes", str(tmp_path / "i.toml"),
                             "--listen", "127.0.0.1", "--port", str(ingress_port),
                             "--hop-bind", "127.0.0.1"])
    vip = ("127.0.0.1", ingress_port)
    client = udp()
    client.sendto(stun_for(4, 7), vip)
    _, _, cluster_hop = recv_hop(transceiver)
    client.sendto(RTP, vip)  # dropped at the ingress: pending there
    assert nothing_arrives(transceiver, 0.2)
    ingress.wait_for(lambda m: m["drops_pending_not_stun"] == 1 and m["flows_pending"] == 1)
    cluster.wait_for(lambda m: m["flows_pending"] == 1)
    answer(transceiver, client, cluster_hop)
    client.sendto(RTP, vip)
    assert recv_hop(transceiver)[1] == RTP
    for relay in (ingress, cluster):
        relay.wait_for(lambda m: m["flows_created"] == 1 and m["flows_pending"] == 0)


# ---------------------------------------------------------------- in-process pieces


class _Flow:
    def __init__(self, key, created, ip, prefix):
        self.key, self.created, self.ip_key, self.prefix_key = key, created, ip, prefix


def test_pending_table_counts_release_on_every_way_out():
    table = PendingFlows(cap=3, per_ip=2, per_prefix=3, ttl_s=1.0)
    a, b = _Flow("a", 0, b"ip1", b"p1"), _Flow("b", int(1e9), b"ip1", b"p1")
    assert table.add("a", a) is None and table.add("b", b) is None
    assert table.refusal(b"ip1", b"p1") == "pending_per_ip"
    assert table.refusal(b"ip2", b"p1") is None
    c = _Flow("c", int(2e9), b"ip2", b"p1")
    table.add("c", c)
    assert table.refusal(b"ip3", b"p1") == "pending_per_prefix"
    assert table.add("d", _Flow("d", int(3e9), b"ip9", b"p9")) is a  # full: the oldest goes
    table.remove("b", b)
    assert table.refusal(b"ip1", b"p1") is None and len(table) == 2
    assert [k for k, _ in table.expired(int(3.5e9))] == ["c"]  # d is 0.5 s old: stays
    assert len(table) == 1 and table.refusal(b"ip3", b"p1") is None


def test_limiter_refills_and_forgets_full_buckets():
    limiter = FirstPacketLimiter(rate=10, burst=3)
    ip = source_keys(mmsg.sockaddr("10.0.0.1", 5))[0]
    assert ip == bytes([10, 0, 0, 1])
    assert [limiter.allow(ip, 0) for _ in range(4)] == [True, True, True, False]
    assert limiter.allow(ip, int(0.1e9)) and not limiter.allow(ip, int(0.1e9))
    limiter.sweep(int(0.2e9))
    assert len(limiter) == 1  # 1 token of 3: still remembered
    limiter.sweep(int(1e9))
    assert len(limiter) == 0
    v6 = source_keys(mmsg.sockaddr("2001:db8::1", 5))
    assert v6 == (bytes.fromhex("20010db8" + "0" * 23 + "1"), bytes.fromhex("20010db800000000"))


class _StuckCache:
    """A flow cache whose lookups never come back (Redis is slow)."""

    writes = writes_dropped = lookups = hits = errors = 0
    up = True

    def lookup(self, key, client) -> bool:
        return True

    def write_many(self, items) -> None:
        pass

    def refresh(self, clients) -> None:
        pass

    def stop(self) -> None:
        pass


def test_redis_lookups_in_flight_are_bounded():
    routes = RouteTable.from_dict({"routes": {"1": "127.0.0.1:9"}}, "ingress")
    worker = RelayWorker(RelayConfig(routes=routes, listen=("127.0.0.1", free_port()),
                                     hop_bind="127.0.0.1", metrics=None, max_lookups=3),
                         cache=_StuckCache())
    senders = [udp_from(f"127.0.40.{k}") for k in range(1, 7)]
    try:
        for s in senders:
            s.sendto(RTP, worker.sockets.public.getsockname())
        time.sleep(0.05)
        worker._on_public()
        while worker.backlog:
            worker._drain_backlog()
    finally:
        for s in senders:
            s.close()
        worker.sockets.close()
    assert worker.recovery.in_flight == 3
    assert worker.drops.counts["recovery_busy"] == 3



def test_first_packets_wait_in_a_bounded_backlog_and_known_flows_do_not():
    """The socket is drained at fast-path speed: first packets go to the backlog (dropped
    unparsed when it is full); a known flow's datagram is handled at once. (The Python
    admission's: the native one handles IPv4 first packets at once, at a third of the cost.)"""
    routes = RouteTable.from_dict({"routes": {"1": "127.0.0.1:9"}}, "ingress")
    worker = RelayWorker(RelayConfig(routes=routes, listen=("127.0.0.1", free_port()),
                                     hop_bind="127.0.0.1", metrics=None, backlog=4,
                                     admission="python"))
    vip = worker.sockets.public.getsockname()
    senders = [udp_from(f"127.0.41.{k}") for k in range(1, 11)]
    try:
        for s in senders:
            s.sendto(stun_for(1), vip)
        time.sleep(0.05)
        worker._on_public()
        assert len(worker.backlog) == 4 and worker.drops.counts["overload"] == 6
        assert worker.table.created == worker.table.pending_created == 0  # nothing parsed yet
        while worker.backlog:  # a chunk at a time, between looks at the sockets
            worker._drain_backlog()
        assert len(worker.backlog) == 0 and len(worker.table.pending) == 4
        # The pending flows' next datagrams are theirs: handled at once, not queued.
        senders[0].sendto(RTP, vip)
        time.sleep(0.05)
        worker._on_public()
        assert len(worker.backlog) == 0 and worker.drops.counts["pending_not_stun"] == 1
    finally:
        for s in senders:
            s.close()
        worker.sockets.close()


@pytest.mark.parametrize("admission", ADMISSIONS)
def test_the_datagram_paths_leave_no_reference_cycles(admission):
    """A relay worker runs without Python's garbage collector (a collection stalls every
    datagram for tens of ms): every kind of hostile datagram, pending flows opened, evicted,
    established and expired, must leave nothing that only a collection would free."""
    import gc
    import random

    from bench.hostile.cases import CaseStream, Forge, build_templates

    routes = RouteTable.from_dict({"routes": {"1": "127.0.0.1:9"}}, "ingress")
    next_hop = udp()
    routes.routes[1] = next_hop.getsockname()
    worker = RelayWorker(RelayConfig(routes=routes, listen=("127.0.0.1", free_port()),
                                     hop_bind="127.0.0.1", metrics=None, max_pending=40,
                                     pending_ttl=0.3, admission=admission))
    vip, relay_hop = worker.sockets.public.getsockname(), worker.sockets.hop.getsockname()
    senders = [udp_from(f"127.0.{50 + k // 8}.{1 + k % 8}") for k in range(64)]
    forge = Forge(cluster_id=1)
    stream = CaseStream(build_templates(4, forge=forge), 7, {}, forge=forge)
    rng = random.Random(3)
    gc.collect()
    gc.disable()
    try:
        for _ in range(20):
            for (_, datagram), s in zip(stream.take(256), rng.choices(senders, k=256)):
                try:
                    s.sendto(datagram, vip)
                except OSError:  # jumbo
                    pass
            time.sleep(0.02)
            batches = -1
            while batches != worker.receive_batches:   # until the public socket is drained
                batches = worker.receive_batches
                worker._on_public()
            while worker.backlog:
                worker._drain_backlog()
            next_hop.settimeout(0.0)
            try:  # answer a few of the checks forwarded: their flows are established
                for _ in range(3):
                    header, _, _ = recv_hop(next_hop)
                    next_hop.sendto(hop.encode(header.client, hop.TO_CLIENT) + ANSWER,
                                    relay_hop)
            except (BlockingIOError, OSError):
                pass
            time.sleep(0.01)
            worker._on_return()
            worker._sweep(time.monotonic_ns())
            worker.counters()
        worker._sweep(time.monotonic_ns() + 60 * 10**9)  # every flow idle: all go
        table, c = worker.table, worker.counters()
        assert (c["flows_pending_created"] > 40 and c["flows_pending_evicted"]
                and c["flows_pending_expired"])
        assert table.created and table.expired
        assert gc.collect() == 0
    finally:
        gc.enable()
        for s in senders + [next_hop]:
            s.close()
        worker.sockets.close()
