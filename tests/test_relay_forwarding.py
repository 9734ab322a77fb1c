"""The relay's two forwardings, one script: ``--forwarding native`` (the C fast path,
services/relay/_fastpath.c) and ``--forwarding python`` (every datagram through the worker's
Python handlers, the reference) must deliver the same datagrams and count the same things.

client -> ingress relay A or B -> cluster relay -> a stand-in transceiver, and back; the
client's flow moves from A to B half way, as a client whose network changed would.
"""
from __future__ import annotations

import pytest

from services.relay.config import FORWARDINGS
from services.wire import hop
from tests.conftest import free_port
from tests.test_relay import RTP, nothing_arrives, recv_hop, stun_for, udp


@pytest.fixture(params=FORWARDINGS)
def chain(request, tmp_path, relay_factory):
    transceiver = udp()
    cluster_internal = free_port()
    (tmp_path / "cluster.toml").write_text(
        f'cluster_id = 4\n[routes]\n7 = "127.0.0.1:{transceiver.getsockname()[1]}"\n')
    (tmp_path / "ingress.toml").write_text(f'[routes]\n4 = "127.0.0.1:{cluster_internal}"\n')
    forwarding = ["--forwarding", request.param]
    cluster = relay_factory(["--tier", "cluster", "--routes", str(tmp_path / "cluster.toml"),
                             "--listen", "127.0.0.1", "--port", str(free_port()), "--internal",
                             f"127.0.0.1:{cluster_internal}", "--hop-bind", "127.0.0.1",
                             *forwarding])
    vips = []
    for _ in range(2):
        vips.append(("127.0.0.1", free_port()))
        relay_factory(["--tier", "ingress", "--routes", str(tmp_path / "ingress.toml"),
                       "--listen", "127.0.0.1", "--port", str(vips[-1][1]), "--hop-bind",
                       "127.0.0.1", *forwarding])
    yield {"transceiver": transceiver, "cluster": cluster, "vips": vips}
    transceiver.close()


def test_both_forwardings_carry_a_moving_client_alike(chain):
    transceiver, cluster, (a, b) = chain["transceiver"], chain["cluster"], chain["vips"]
    client = udp()
    me = client.getsockname()

    def check_via(vip):
        client.sendto(stun_for(4, 7), vip)
        header, payload, cluster_hop = recv_hop(transceiver)
        assert header.client == me and payload[:2] == b"\x00\x01"
        transceiver.sendto(hop.encode(me, hop.TO_CLIENT) + b"\x01\x01answer", cluster_hop)
        assert client.recvfrom(100) == (b"\x01\x01answer", vip)
        return cluster_hop

    cluster_hop = check_via(a)
    for k in range(5):
        client.sendto(RTP + bytes([k]), a)
        assert recv_hop(transceiver)[1] == RTP + bytes([k])
    for k in range(3):
        transceiver.sendto(hop.encode(me, hop.TO_CLIENT) + b"\x80down" + bytes([k]), cluster_hop)
        assert client.recvfrom(100) == (b"\x80down" + bytes([k]), a)
    check_via(b)  # the client's network changed: its checks now come through B
    client.sendto(RTP + b"B", b)
    assert recv_hop(transceiver)[1] == RTP + b"B"
    client.sendto(RTP + b"A", a)  # A still has its flow; the cluster relay refuses A's copy
    assert nothing_arrives(transceiver)
    m = cluster.wait_for(lambda m: m["drops_wrong_prev_hop"] == 1)
    assert m["packets_to_server"] == 1 + 5 + 1 + 1 and m["packets_to_client"] == 1 + 3 + 1
    assert m["flows_active"] == 1
