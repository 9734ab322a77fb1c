"""The relay as a real process on loopback: routing, opaque forwarding, drops, Redis recovery.

Next hops are plain UDP sockets standing in for cluster relays / transceivers; they read the
hop header the relay puts in front of every datagram, and answer a flow's first packet (as a
transceiver answers an authenticated check) where a test needs the flow established. Pending
flows themselves are tested in tests/test_relay_pending.py.
"""
from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.relay.counters import COUNTERS, scrape
from services.wire import hop
from services.wire.stun import binding_request, binding_success
from services.wire.ufrag import UfragCodec, secret_from_env
from tests.conftest import REPO, free_port
from tests.logcheck import events, service_records

CODEC = UfragCodec(secret_from_env(None))  # the relay's default secret
RTP = b"\x80\x6f" + bytes(170)           # an RTP-looking datagram
ANSWER = binding_success()  # a STUN binding success response
DTLS = b"\x16\xfe\xfd" + bytes(90)        # a DTLS-looking datagram (handshake record)


def udp(timeout: float = 1.0) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.settimeout(timeout)
    return s


def stun_for(cluster: int, transceiver: int = 1) -> bytes:
    return binding_request(f"{CODEC.encode(cluster, transceiver)}:cli1".encode())


def recv_hop(sock: socket.socket) -> tuple[hop.HopHeader, bytes, tuple[str, int]]:
    data, src = sock.recvfrom(65535)
    header, payload = hop.decode(data)
    return header, bytes(payload), src


def answer(next_hop: socket.socket, client: socket.socket, relay_hop_addr) -> None:
    """The next hop answers the client's check; the client gets it: the flow is established."""
    next_hop.sendto(hop.encode(client.getsockname(), hop.TO_CLIENT) + ANSWER, relay_hop_addr)
    assert client.recvfrom(2048)[0] == ANSWER


def open_flow(client: socket.socket, vip, next_hop: socket.socket, cluster: int,
              transceiver: int = 1):
    """A check from ``client`` through the relay, answered: returns the relay's hop address."""
    client.sendto(stun_for(cluster, transceiver), vip)
    header, _, relay_hop_addr = recv_hop(next_hop)
    assert header.client == client.getsockname()
    answer(next_hop, client, relay_hop_addr)
    return relay_hop_addr


def nothing_arrives(sock: socket.socket, wait: float = 0.3) -> bool:
    sock.settimeout(wait)
    try:
        sock.recvfrom(65535)
        return False
    except TimeoutError:
        return True


def relay_world(tmp_path, relay_factory, *args: str):
    """Two fake cluster relays and a factory for an ingress relay routing to them (with
    ``args`` before each start's own)."""
    hops = {1: udp(), 2: udp()}
    routes = tmp_path / "routes.toml"
    routes.write_text("[routes]\n" + "".join(
        f'{c} = "127.0.0.1:{s.getsockname()[1]}"\n' for c, s in hops.items()))
    port = free_port()

    def start(*extra: str):
        return relay_factory(["--tier", "ingress", "--routes", str(routes), "--listen",
                              "127.0.0.1", "--port", str(port), "--hop-bind", "127.0.0.1",
                              *args, *extra])

    yield {"hops": hops, "vip": ("127.0.0.1", port), "start": start, "routes": routes}
    for s in hops.values():
        s.close()


@pytest.fixture
def world(tmp_path, relay_factory):
    yield from relay_world(tmp_path, relay_factory)


def test_stun_creates_a_flow_to_the_right_next_hop_and_media_follows(world):
    relay = world["start"]()
    client = udp()
    client.sendto(stun_for(2), world["vip"])
    header, payload, relay_hop_addr = recv_hop(world["hops"][2])
    assert header.client == client.getsockname() and header.direction == hop.TO_SERVER
    assert payload[:2] == b"\x00\x01"  # the binding request itself, unchanged
    answer(world["hops"][2], client, relay_hop_addr)
    for datagram in (DTLS, RTP, RTP):
        client.sendto(datagram, world["vip"])
        header, payload, _ = recv_hop(world["hops"][2])
        assert payload == datagram and header.client == client.getsockname()
    assert nothing_arrives(world["hops"][1], 0.1)
    m = relay.wait_for(lambda m: m["packets_to_server"] == 4)
    assert m["flows_created"] == 1 and m["flows_active"] == 1 and m["flows_pending"] == 0
    assert m["bytes_to_server"] == len(stun_for(2)) + len(DTLS) + 2 * len(RTP)
    records = service_records(relay.log(), "relay")  # every line, workers' too, is JSON
    [created] = events(records, "flow_created")
    [started] = events(records, "relay_started")
    assert created["client"] == "%s:%d" % client.getsockname()
    assert (created["cluster"], created["transceiver"], created["origin"]) == (2, 1, "stun")
    assert created["pid"] in started["worker_pids"] and created["pid"] != relay.proc.pid


def test_two_clients_two_clusters(world):
    world["start"]()
    a, b = udp(), udp()
    open_flow(a, world["vip"], world["hops"][1], 1)
    open_flow(b, world["vip"], world["hops"][2], 2, 9)
    b.sendto(RTP, world["vip"])
    a.sendto(DTLS, world["vip"])
    assert recv_hop(world["hops"][2])[1] == RTP
    assert recv_hop(world["hops"][1])[1] == DTLS


def test_return_traffic_reaches_only_clients_with_a_flow(world):
    relay = world["start"]()
    client, stranger = udp(), udp()
    client.sendto(stun_for(1), world["vip"])
    _, _, relay_hop_addr = recv_hop(world["hops"][1])
    answer = hop.encode(client.getsockname(), hop.TO_CLIENT) + b"\x80answer"
    world["hops"][1].sendto(answer, relay_hop_addr)
    data, src = client.recvfrom(2048)
    assert data == b"\x80answer" and src == world["vip"]  # from the public port, header gone
    # A client without a flow: never reflected to it.
    world["hops"][1].sendto(hop.encode(stranger.getsockname(), hop.TO_CLIENT) + b"x",
                            relay_hop_addr)
    # The right client, but from a socket that is not the flow's next hop.
    world["hops"][2].sendto(answer, relay_hop_addr)
    # No hop header at all.
    world["hops"][1].sendto(b"\x80no header", relay_hop_addr)
    assert nothing_arrives(stranger) and nothing_arrives(client)
    m = relay.wait_for(lambda m: m["drops_return_no_flow"] == 1
                       and m["drops_return_wrong_source"] == 1 and m["drops_bad_hop_header"] == 1)
    assert m["packets_to_client"] == 1 and m["bytes_to_client"] == len(b"\x80answer")


def test_bad_first_packets_are_dropped_and_counted_and_the_relay_keeps_running(world):
    relay = world["start"]()
    vip = world["vip"]
    forged = udp()
    good = CODEC.encode(1, 1)
    flipped = good[:5] + ("A" if good[5] != "A" else "B") + good[6:]
    forged.sendto(binding_request(f"{flipped}:x".encode()), vip)             # forged hint
    forged.sendto(binding_request(b"notaroutingufrag:x"), vip)               # not ours at all
    forged.sendto(stun_for(1)[:30], vip)                                     # truncated STUN
    overrun = bytearray(stun_for(1))
    overrun[22:24] = (200).to_bytes(2, "big")                                # attribute past end
    forged.sendto(bytes(overrun), vip)
    no_user = bytearray(stun_for(1)[:20])
    no_user[2:4] = b"\x00\x00"
    forged.sendto(bytes(no_user), vip)                                       # no USERNAME
    forged.sendto(b"\xc8" + random.Random(1).randbytes(300), vip)            # random bytes
    forged.sendto(RTP, vip)                                                  # media, no flow
    forged.sendto(stun_for(3), vip)                                          # no route for cluster 3
    big = udp()
    big.sendto(b"\x00\x01" + bytes(65000), vip)                              # 64 KiB datagram
    m = relay.wait_for(lambda m: sum(v for k, v in m.items() if k.startswith("drops_")) >= 9)
    assert m["drops_bad_ufrag"] == 2
    assert m["drops_stun_malformed"] == 2
    assert m["drops_stun_no_username"] == 1
    assert m["drops_unknown_not_stun"] == 2
    assert m["drops_no_route"] == 1
    assert m["drops_oversize"] == 1
    assert m["flows_created"] == 0
    assert all(nothing_arrives(s, 0.1) for s in world["hops"].values())
    # Still alive and routing.
    client = udp()
    client.sendto(stun_for(1), vip)
    assert recv_hop(world["hops"][1])[0].client == client.getsockname()


def test_a_relay_notes_its_lag_at_an_audio_frames_resolution(world):
    """A worker wakes for a 20 ms tick of its own (services/lag.py's resolution): an idle
    relay logs no lagged second, and one held up 40 ms per readiness event (each tick then
    ~20 ms late) does, with the
    tens of samples a second that make "a tenth of them late" mean something."""
    idle = world["start"]()
    time.sleep(1.5)
    idle.stop()
    log = service_records(idle.log(), "relay")
    assert not events(log, "loop_lag")
    [summary] = events(log, "loop_lag_summary")
    assert summary["seconds_observed"] >= 1 and summary["seconds_lagged"] == 0

    slow = world["start"]("--test-processing-delay-ms", "40")
    sender = udp()
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:  # junk from an unknown address: one event each
        sender.sendto(RTP, world["vip"])
        time.sleep(0.005)
    slow.stop()
    lagged = events(service_records(slow.log(), "relay"), "loop_lag")
    assert lagged and max(e["samples"] for e in lagged) >= 10, lagged
    assert all(e["late"] >= 0.1 * e["samples"] for e in lagged), lagged


def test_random_first_bytes_are_dropped_by_reason(world):
    relay = world["start"]()
    s = udp()
    s.sendto(b"\x80" + os.urandom(100), world["vip"])  # RTP range, no flow
    s.sendto(b"\x17" + os.urandom(100), world["vip"])  # DTLS range, no flow
    s.sendto(b"\x02" + os.urandom(100), world["vip"])  # STUN range, garbage
    m = relay.wait_for(lambda m: m["drops_unknown_not_stun"] == 2 and m["drops_stun_malformed"] == 1)
    assert m["flows_created"] == 0


def test_flow_table_cap(world):
    relay = world["start"]("--max-flows", "2")
    clients = [udp() for _ in range(3)]
    for c in clients[:2]:
        open_flow(c, world["vip"], world["hops"][1], 1)
    clients[2].sendto(stun_for(1), world["vip"])  # two established flows: the table is full
    assert nothing_arrives(world["hops"][1])
    m = relay.wait_for(lambda m: m["drops_flow_table_full"] == 1)
    assert m["flows_active"] == 2


def test_idle_flows_expire_and_then_get_no_return_traffic(world):
    relay = world["start"]("--idle-timeout", "0.5")
    client = udp()
    relay_hop_addr = open_flow(client, world["vip"], world["hops"][1], 1)
    relay.wait_for(lambda m: m["flows_expired"] == 1 and m["flows_active"] == 0, timeout=5)
    [expired] = events(service_records(relay.log(), "relay"), "flow_expired")
    assert expired["client"] == "%s:%d" % client.getsockname() and expired["packets_up"] == 1
    assert expired["packets_down"] == 1
    world["hops"][1].sendto(hop.encode(client.getsockname(), hop.TO_CLIENT) + b"late",
                            relay_hop_addr)
    assert nothing_arrives(client)
    client.sendto(RTP, world["vip"])  # media after expiry, no Redis: dropped
    relay.wait_for(lambda m: m["drops_unknown_not_stun"] == 1 and m["drops_return_no_flow"] == 1)


def _moved_by_an_answered_check(world, client) -> tuple:
    """``client``'s flow to cluster 1, then checks from its address for cluster 2 (a NAT gave
    the address to a caller whose session is there): the flow stays until cluster 2 answers
    one, then follows. Returns the relay's hop address."""
    hop1, hop2 = world["hops"][1], world["hops"][2]
    open_flow(client, world["vip"], hop1, 1)
    client.sendto(stun_for(1), world["vip"])        # the flow's own consent check: stays
    assert recv_hop(hop1)[1][:2] == b"\x00\x01"
    client.sendto(stun_for(2), world["vip"])        # goes to cluster 2, which does not answer
    header, payload, _ = recv_hop(hop2)
    assert header.client == client.getsockname() and payload[:2] == b"\x00\x01"
    client.sendto(RTP, world["vip"])                # unanswered (forged?): nothing moved
    assert recv_hop(hop1)[1] == RTP and nothing_arrives(hop2, 0.1)
    client.sendto(stun_for(2), world["vip"])
    _, _, relay_hop_addr = recv_hop(hop2)
    answer(hop2, client, relay_hop_addr)            # cluster 2 answers: the flow follows
    client.sendto(RTP, world["vip"])
    assert recv_hop(hop2)[1] == RTP and nothing_arrives(hop1, 0.1)
    return relay_hop_addr


def test_a_check_routed_elsewhere_moves_its_addresss_flow_once_answered(world):
    """Without it the address stayed pinned to the first cluster (the fast path forwarded
    the new caller's checks there) until it was idle for 30 s: the new caller never
    connected through this relay."""
    relay = world["start"]()
    client = udp()
    relay_hop_addr = _moved_by_an_answered_check(world, client)
    world["hops"][1].sendto(hop.encode(client.getsockname(), hop.TO_CLIENT) + b"old",
                            relay_hop_addr)         # the old cluster no longer reaches it
    assert nothing_arrives(client, 0.2)
    m = relay.wait_for(lambda m: m["flows_moved"] == 1 and m["drops_return_wrong_source"] == 1)
    assert m["flows_created"] == 1 and m["flows_active"] == 1
    [moved] = events(service_records(relay.log(), "relay"), "flow_moved")
    assert moved["client"] == "%s:%d" % client.getsockname()
    assert (moved["cluster"], moved["transceiver"]) == (2, 1)
    assert moved["next_hop"].endswith(str(world["hops"][2].getsockname()[1]))
    assert moved["previous_next_hop"].endswith(str(world["hops"][1].getsockname()[1]))


def test_a_moved_flow_is_recovered_from_redis_on_its_new_route(world, redis_server):
    args = ("--redis", redis_server.url, "--relay-id", "ingress-move")
    relay = world["start"](*args)
    client = udp()
    _moved_by_an_answered_check(world, client)
    relay.wait_for(lambda m: m["flows_moved"] == 1 and m["redis_writes"] == 2)
    relay.kill()   # a restarted relay must not send the address back to the old cluster
    relay = world["start"](*args)
    client.sendto(RTP, world["vip"])
    assert recv_hop(world["hops"][2])[1] == RTP and nothing_arrives(world["hops"][1], 0.1)
    relay.wait_for(lambda m: m["flows_recovered"] == 1)


def test_restarted_relay_recovers_flows_from_redis_before_any_new_stun(world, redis_server):
    args = ("--redis", redis_server.url, "--relay-id", "ingress-test")
    relay = world["start"](*args)
    client = udp()
    open_flow(client, world["vip"], world["hops"][2], 2)
    relay.wait_for(lambda m: m["redis_writes"] == 1)
    relay.kill()  # a crash: the new process starts with an empty flow table
    relay = world["start"](*args)
    client.sendto(RTP, world["vip"])  # media only; no STUN is sent after the restart
    header, payload, relay_hop_addr = recv_hop(world["hops"][2])
    assert payload == RTP and header.client == client.getsockname()
    m = relay.wait_for(lambda m: m["flows_recovered"] == 1)
    assert m["flows_created"] == 0 and m["redis_hits"] == 1
    # The recovered flow also carries the return path.
    world["hops"][2].sendto(hop.encode(client.getsockname(), hop.TO_CLIENT) + b"back",
                            relay_hop_addr)
    assert client.recvfrom(100)[0] == b"back"


def test_unknown_media_is_looked_up_once_and_then_negatively_cached(world, redis_server):
    relay = world["start"]("--redis", redis_server.url)
    s = udp()
    for _ in range(5):
        s.sendto(RTP, world["vip"])
    m = relay.wait_for(lambda m: m["drops_unknown_not_stun"] == 5)
    assert m["redis_lookups"] == 1 and m["redis_hits"] == 0


def test_forwarding_continues_when_redis_goes_away(world, redis_server):
    relay = world["start"]("--redis", redis_server.url)
    old = udp()
    open_flow(old, world["vip"], world["hops"][1], 1)
    relay.wait_for(lambda m: m["redis_writes"] == 1 and m["redis_up"] == 1)
    redis_server.stop()
    old.sendto(RTP, world["vip"])
    assert recv_hop(world["hops"][1])[1] == RTP  # existing flow: from memory
    new = udp()
    open_flow(new, world["vip"], world["hops"][2], 2)  # new flow: from the ufrag and the answer
    new.sendto(RTP, world["vip"])
    assert recv_hop(world["hops"][2])[1] == RTP
    m = relay.wait_for(lambda m: m["redis_up"] == 0 and m["redis_writes_dropped"] >= 1)
    assert m["redis_errors"] >= 1 and m["flows_active"] == 2
    [down] = events(service_records(relay.log(), "relay"), "redis_down")
    assert down["level"] == "WARNING" and down["error"]


def test_two_tier_chain_ingress_cluster_transceiver(tmp_path, relay_factory):
    """client -> ingress relay -> cluster relay -> transceiver, and the answer back."""
    transceiver = udp()
    cluster_port, cluster_internal, ingress_port = free_port(), free_port(), free_port()
    cluster_routes = tmp_path / "cluster.toml"
    cluster_routes.write_text(
        f'cluster_id = 4\n[routes]\n7 = "127.0.0.1:{transceiver.getsockname()[1]}"\n')
    ingress_routes = tmp_path / "ingress.toml"
    ingress_routes.write_text(f'[routes]\n4 = "127.0.0.1:{cluster_internal}"\n')
    cluster = relay_factory(["--tier", "cluster", "--routes", str(cluster_routes), "--listen",
                             "127.0.0.1", "--port", str(cluster_port), "--internal",
                             f"127.0.0.1:{cluster_internal}", "--hop-bind", "127.0.0.1"])
    ingress = relay_factory(["--tier", "ingress", "--routes", str(ingress_routes), "--listen",
                             "127.0.0.1", "--port", str(ingress_port), "--hop-bind", "127.0.0.1"])
    client = udp()
    client.sendto(stun_for(4, 7), ("127.0.0.1", ingress_port))
    header, payload, cluster_hop = recv_hop(transceiver)
    assert header.client == client.getsockname() and payload[:2] == b"\x00\x01"
    transceiver.sendto(hop.encode(client.getsockname(), hop.TO_CLIENT) + b"\x80hello", cluster_hop)
    data, src = client.recvfrom(100)
    assert data == b"\x80hello" and src == ("127.0.0.1", ingress_port)
    client.sendto(RTP, ("127.0.0.1", ingress_port))  # both tiers established by that answer
    assert recv_hop(transceiver)[1] == RTP
    # A hint for another cluster is refused by the cluster tier.
    client2 = udp()
    client2.sendto(stun_for(5, 7), ("127.0.0.1", cluster_port))
    cluster.wait_for(lambda m: m["drops_no_route"] == 1)
    c = cluster.metrics()
    # Each relay publishes its counters every 0.5 s, on its own phase: wait for the ingress's.
    i = ingress.wait_for(lambda m: m["packets_to_server"] >= 2 and m["packets_to_client"] >= 1)
    assert c["packets_to_server"] == 2 and c["packets_to_client"] == 1
    assert i["packets_to_server"] == 2 and i["packets_to_client"] == 1


@pytest.mark.parametrize("fixed_hop_port", [True, False])
def test_a_restarted_ingress_resumes_the_chain_only_on_a_fixed_hop_port(
        tmp_path, relay_factory, redis_server, fixed_hop_port):
    """An ingress killed mid-flow and restarted recovers the flow from Redis. The cluster relay
    accepts the recovered flow's media only from the address it learned the flow from: with
    --hop-port the new ingress has it; without, its datagrams are dropped as wrong_prev_hop."""
    transceiver = udp()
    cluster_port, cluster_internal, ingress_port = free_port(), free_port(), free_port()
    (tmp_path / "cluster.toml").write_text(
        f'cluster_id = 4\n[routes]\n7 = "127.0.0.1:{transceiver.getsockname()[1]}"\n')
    (tmp_path / "ingress.toml").write_text(f'[routes]\n4 = "127.0.0.1:{cluster_internal}"\n')
    cluster = relay_factory(["--tier", "cluster", "--routes", str(tmp_path / "cluster.toml"),
                             "--listen", "127.0.0.1", "--port", str(cluster_port), "--internal",
                             f"127.0.0.1:{cluster_internal}", "--hop-bind", "127.0.0.1"])
    args = ["--tier", "ingress", "--routes", str(tmp_path / "ingress.toml"), "--listen",
            "127.0.0.1", "--port", str(ingress_port), "--hop-bind", "127.0.0.1", "--redis",
            redis_server.url, "--relay-id", "ingress-x"]
    if fixed_hop_port:
        args += ["--hop-port", str(free_port())]
    ingress = relay_factory(args)
    client = udp()
    open_flow(client, ("127.0.0.1", ingress_port), transceiver, 4, 7)
    ingress.wait_for(lambda m: m["redis_writes"] == 1)
    ingress.kill()
    ingress = relay_factory(args)
    client.sendto(RTP, ("127.0.0.1", ingress_port))  # media only, no STUN after the restart
    ingress.wait_for(lambda m: m["flows_recovered"] == 1 and m["packets_to_server"] == 1)
    if fixed_hop_port:
        header, payload, cluster_hop = recv_hop(transceiver)
        assert payload == RTP and header.client == client.getsockname()
        transceiver.sendto(hop.encode(client.getsockname(), hop.TO_CLIENT) + b"back",
                           cluster_hop)
        assert client.recvfrom(100)[0] == b"back"
    else:
        assert nothing_arrives(transceiver)
        cluster.wait_for(lambda m: m["drops_wrong_prev_hop"] == 1)


def test_two_workers_share_the_port_and_forward_every_flow(world):
    relay = world["start"]("--workers", "2")
    clients = [udp() for _ in range(40)]
    for c in clients:
        c.sendto(stun_for(1), world["vip"])
    firsts = [recv_hop(world["hops"][1]) for _ in clients]
    seen = {header.client for header, _, _ in firsts}
    assert seen == {c.getsockname() for c in clients}
    by_addr = {c.getsockname(): c for c in clients}
    for header, _, relay_hop_addr in firsts:  # each answer goes back through its worker
        answer(world["hops"][1], by_addr[header.client], relay_hop_addr)
    for c in clients:
        c.sendto(RTP, world["vip"])
    assert {recv_hop(world["hops"][1])[0].client for _ in clients} == seen
    relay.wait_for(lambda m: m["flows_active"] == 40)
    per_worker = relay.metrics_by_worker()["flows_active"]
    assert len(per_worker) == 2 and all(n > 0 for n in per_worker.values())  # both took flows
    raw = subprocess.run(["ss", "-uanp"], capture_output=True, text=True).stdout
    port = f":{world['vip'][1]} "
    assert sum(1 for line in raw.splitlines() if port in line) == 2  # one socket per worker
    # scrape() (prometheus_client's parser) sums the workers like the fixture's line parser.
    totals = scrape(f"http://127.0.0.1:{relay.metrics_port}/metrics")
    assert totals == {k: int(v) for k, v in relay.metrics().items()}
    assert set(totals) == set(COUNTERS)
    assert totals["flows_active"] == 40 and totals["packets_to_server"] == 80
    assert totals["flows_created"] == 40 and totals["packets_to_client"] == 40
    records = service_records(relay.log(), "relay")
    assert len({r["pid"] for r in events(records, "flow_created")}) == 2
    assert len(events(records, "worker_started")) == 2


@pytest.mark.parametrize("secret", [None, "a deployment's own secret, 32+ bytes"])
def test_the_development_secret_is_a_warning_and_a_gauge(world, monkeypatch, secret):
    if secret is None:
        monkeypatch.delenv("VOICEEDGE_UFRAG_SECRET", raising=False)
    else:
        monkeypatch.setenv("VOICEEDGE_UFRAG_SECRET", secret)
    relay = world["start"]()
    text = urllib.request.urlopen(f"http://127.0.0.1:{relay.metrics_port}/metrics").read()
    [gauge] = [s for f in text_string_to_metric_families(text.decode()) for s in f.samples
               if s.name == "voiceedge_ufrag_dev_secret"]
    assert gauge.labels == {"service": "relay"} and gauge.value == (secret is None)
    records = service_records(relay.log(), "relay")
    warnings = events(records, "ufrag_dev_secret")
    assert len(warnings) == (secret is None)
    assert all(w["level"] == "WARNING" and "VOICEEDGE_UFRAG_SECRET" in w["note"] for w in warnings)
    assert events(records, "relay_started")[0]["ufrag_dev_secret"] is (secret is None)


@pytest.mark.parametrize("args, message", [
    (["--tier", "ingress", "--routes", "/nonexistent.toml"], "does not exist"),
    (["--tier", "cluster", "--routes", "ROUTES"], "needs cluster_id"),
    (["--tier", "ingress", "--routes", "ROUTES", "--port", "70000"], "not a UDP port"),
    (["--tier", "ingress", "--routes", "ROUTES", "--cpus", "x"], "not a list"),
    (["--tier", "ingress", "--routes", "ROUTES", "--cpus", "4096"], "does not have online"),
    (["--tier", "ingress", "--routes", "ROUTES", "--realtime", "0"], "not a real-time priority"),
    (["--tier", "ingress", "--routes", "ROUTES", "--realtime", "100"], "not a real-time priority"),
])
def test_cli_errors_are_one_clear_line(tmp_path, args, message):
    routes = tmp_path / "routes.toml"
    routes.write_text('[routes]\n1 = "127.0.0.1:9"\n')
    args = [str(routes) if a == "ROUTES" else a for a in args]
    proc = subprocess.run([sys.executable, "-m", "voiceedge", "relay", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=30)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_busy_port_is_a_clear_error(tmp_path):
    routes = tmp_path / "routes.toml"
    routes.write_text('[routes]\n1 = "127.0.0.1:9"\n')
    holder = udp()  # no SO_REUSEPORT: the relay cannot share this port
    proc = subprocess.run(
        [sys.executable, "-m", "voiceedge", "relay", "--tier", "ingress", "--routes", str(routes),
         "--listen", "127.0.0.1", "--port", str(holder.getsockname()[1]), "--metrics", "none"],
        capture_output=True, text=True, cwd=REPO, timeout=30)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    # found before any bind, with who holds it (services/relay/lifeline.py)
    port = holder.getsockname()[1]
    assert (f"cannot start the relay: UDP 127.0.0.1:{port} is already held by pid "
            f"{os.getpid()}") in proc.stderr, proc.stderr


def test_a_turn_serves_the_next_hops_before_first_packets():
    """Under a flood of first packets both kinds are ready at once; calls' datagrams from the
    next hops go first (docs/relay.md, "Under a flood")."""
    from services.relay.worker import established_first

    public, hop, internal, cache = 5, 6, 7, 8
    assert established_first([(public, 1), (hop, 1), (internal, 1)], public) == [hop, internal,
                                                                                   public]
    assert established_first([(cache, 1), (public, 1), (hop, 1)], public) == [cache, hop, public]
    assert established_first([(public, 1)], public) == [public]
    assert established_first([(internal, 1), (hop, 1)], public) == [internal, hop]
    assert established_first([], public) == []
