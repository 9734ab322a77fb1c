"""A call's first packet through a relay worker: forwarded first, bookkept after.

In-process worker on loopback, driven one readiness event at a time, with a stand-in for the
Redis flow cache that records what it is handed: the first packet reaches the next hop with
nothing written (the flow is pending); the next hop's answer reaches the client before the
``flow_created`` line is written, and the flow's Redis write waits for the sweep, where the
new flows go in one batch (waking the cache thread at once made it compete for the GIL with
the answer to that very packet).
"""
from __future__ import annotations

import logging
import socket
import time

import pytest

from services.relay.config import ADMISSIONS
from services.logs import Event
from services.relay.config import RelayConfig, RouteTable
from services.relay.worker import RelayWorker
from services.wire import hop
from services.wire.stun import binding_request, binding_success
from services.wire.ufrag import UfragCodec, secret_from_env
from tests.conftest import free_port

CODEC = UfragCodec(secret_from_env(None))
ANSWER = binding_success()  # a STUN binding success response


class RecordingCache:
    """What the worker hands to the flow cache, in order."""

    def __init__(self, calls: list) -> None:
        self.calls = calls
        self.writes = self.writes_dropped = self.lookups = self.hits = self.errors = 0
        self.up = True

    def write(self, client, flow) -> None:
        self.calls.append(("write", [client]))

    def write_many(self, items) -> None:
        self.calls.append(("write_many", [client for client, _ in items]))

    def refresh(self, clients) -> None:
        pass

    def stop(self) -> None:
        pass


@pytest.mark.parametrize("admission", ADMISSIONS)
def test_first_packets_are_forwarded_before_they_are_logged_and_written_to_redis(caplog,
                                                                                 admission):
    caplog.set_level(logging.INFO, "voiceedge.relay")
    next_hop = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    next_hop.bind(("127.0.0.1", 0))
    next_hop.settimeout(1)
    routes = RouteTable.from_dict({"routes": {"1": f"127.0.0.1:{next_hop.getsockname()[1]}"}},
                                  "ingress")
    calls: list = []
    worker = RelayWorker(RelayConfig(routes=routes, listen=("127.0.0.1", free_port()),
                                     hop_bind="127.0.0.1", metrics=None, admission=admission),
                         cache=RecordingCache(calls))
    def recorded(batch, label: str) -> None:
        flush = batch.flush

        def recorded_flush(fd: int) -> int:
            sent = flush(fd)
            calls.append((label, sent))
            return sent

        batch.flush = recorded_flush

    recorded(worker.tx_hop, "sent")       # towards the next hop
    recorded(worker.tx_out, "answered")   # towards clients
    handler = logging.Handler()
    handler.emit = lambda record: calls.append(("logged", record.msg.name)) \
        if isinstance(record.msg, Event) else None
    logging.getLogger("voiceedge.relay").addHandler(handler)
    clients = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(3)]
    try:
        for i, c in enumerate(clients):
            c.bind(("127.0.0.1", 0))
            c.sendto(binding_request(f"{CODEC.encode(1, 1)}:cli{i}".encode()),
                     worker.sockets.public.getsockname())
        addresses = [c.getsockname() for c in clients]
        time.sleep(0.05)
        worker._on_public()  # one readiness event: the three first packets
        if admission == "python":   # to the backlog: nothing sent yet
            assert len(worker.backlog) == 3 and calls == [("sent", 0)]
            calls.clear()
            worker._drain_backlog()  # the worker's loop, between two looks at its sockets
        else:                       # the C admission forwards them at once
            assert len(worker.backlog) == 0
        firsts = [next_hop.recvfrom(2048) for _ in clients]
        got = [hop.decode(data)[0].client for data, _ in firsts]
        pending = list(calls)
        for client, (_, relay_hop) in zip(got, firsts):
            next_hop.sendto(hop.encode(client, hop.TO_CLIENT) + ANSWER, relay_hop)
        time.sleep(0.05)
        worker._on_return()  # one readiness event: the three answers
        answers = [c.recvfrom(2048)[0] for c in clients]
        before_sweep = list(calls)
        worker._sweep(time.monotonic_ns())
    finally:
        logging.getLogger("voiceedge.relay").removeHandler(handler)
        for c in clients:
            c.close()
        next_hop.close()
        worker.sockets.close()

    assert got == addresses                   # forwarded, in the order they came
    assert pending == [("sent", 3)]           # pending: not logged, not written
    assert answers == [ANSWER] * 3
    assert before_sweep == [("sent", 3), ("answered", 3)] + [("logged", "flow_created")] * 3
    assert calls[len(before_sweep):] == [("write_many", addresses)]  # Redis: at the sweep
    assert worker.table.created == 3


def test_the_flow_cache_writes_a_batch_as_one_pipeline_and_counts_it(redis_server):
    import redis

    from services.relay.flowcache import CachedFlow, FlowCache

    cache = FlowCache(redis_server.url, "batch-test", ttl=60.0, max_queue=16)
    cache.start()
    flows = [(("10.0.0.1", 5000 + i), CachedFlow(("10.0.9.9", 3479), None, 2, 1))
             for i in range(3)]
    try:
        cache.write_many(flows)
        deadline = time.monotonic() + 5
        while cache.writes < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        keys = sorted(k.decode() for k in redis.Redis.from_url(redis_server.url).keys("*"))
        redis_server.stop()
        cache.write_many(flows[:2])  # Redis gone: the batch is dropped and counted
        while cache.writes_dropped < 2 and time.monotonic() < deadline + 5:
            time.sleep(0.02)
    finally:
        cache.stop()
    assert cache.writes == 3
    assert keys == [f"voiceedge:relay:batch-test:flow:10.0.0.1:{5000 + i}" for i in range(3)]
    assert cache.writes_dropped == 2 and not cache.up


def test_a_cluster_relay_moves_a_flow_only_on_a_stun_check_through_another_ingress():
    """The cluster tier's first-packet path: a check through ingress A opens the flow, media
    through ingress B is dropped (``wrong_prev_hop``), a check through B moves the flow to B,
    and from then on the transceiver's answers go to B; a client's own datagram to the public
    port is not the flow of a client behind an ingress."""
    transceiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    transceiver.bind(("127.0.0.1", 0))
    transceiver.settimeout(1)
    routes = RouteTable.from_dict(
        {"cluster_id": 1, "routes": {"1": "127.0.0.1:%d" % transceiver.getsockname()[1]}},
        "cluster")
    worker = RelayWorker(RelayConfig(routes=routes, listen=("127.0.0.1", free_port()),
                                     internal=("127.0.0.1", free_port()),
                                     hop_bind="127.0.0.1", metrics=None))
    internal = worker.sockets.internal.getsockname()
    ingress_a, ingress_b, client = (socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                                    for _ in range(3))
    check = binding_request(f"{CODEC.encode(1, 1)}:cli".encode())
    media = b"\x80\x6f" + bytes(98)
    try:
        for s, host in ((ingress_a, "127.0.0.1"), (ingress_b, "127.0.0.2"), (client, "127.0.0.3")):
            s.bind((host, 0))
            s.settimeout(1)
        behind = hop.encode(client.getsockname(), hop.TO_SERVER)
        answer = hop.encode(client.getsockname(), hop.TO_CLIENT) + ANSWER

        relay_hop = worker.sockets.hop.getsockname()

        def step(sender, data, to, handler):
            sender.sendto(data, to)
            time.sleep(0.05)
            handler()

        step(ingress_a, behind + check, internal, worker._on_internal)
        assert transceiver.recvfrom(2048)[0] == behind + check  # as the ingress sent it
        step(ingress_b, behind + media, internal, worker._on_internal)  # not STUN: dropped
        step(transceiver, answer, relay_hop, worker._on_return)
        assert ingress_a.recvfrom(2048)[0] == answer
        step(ingress_b, behind + check, internal, worker._on_internal)  # moves the flow
        assert transceiver.recvfrom(2048)[0] == behind + check
        step(transceiver, answer, relay_hop, worker._on_return)
        assert ingress_b.recvfrom(2048)[0] == answer
        step(client, media, worker.sockets.public.getsockname(), worker._on_public)
        counters = worker.counters()
    finally:
        for s in (transceiver, ingress_a, ingress_b, client):
            s.close()
        worker.sockets.close()
    assert counters["drops_wrong_prev_hop"] == 2  # B's media, then the client's own datagram
    assert counters["flows_created"] == 1 and counters["flows_active"] == 1
    assert counters["packets_to_server"] == 2 and counters["packets_to_client"] == 2
    assert sum(v for k, v in counters.items() if k.startswith("drops_")) == 2
