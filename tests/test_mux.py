"""The transceiver's shared-socket demultiplexer, with real UDP sockets on loopback.

The sessions here are recording ports (the mux's only contract with a session); the full
aiortc sessions on the mux are covered in test_transceiver.py and test_edge.py.
"""
from __future__ import annotations

import asyncio
import os
import socket

from aioice import stun

from services.transceiver.mux import MuxPort, SharedSocket
from services.wire import hop


class RecordingPort(MuxPort):
    def __init__(self, ufrag: str, password: str) -> None:
        self.ufrag, self.password = ufrag, password.encode()
        self.stun: list[tuple[bytes, tuple]] = []
        self.media: list[bytes] = []

    def datagram_received(self, data, addr) -> None:
        self.stun.append((data, addr))

    def media_received(self, data) -> None:
        self.media.append(data)


def check(ufrag: str, password: str | None, response: bool = False) -> bytes:
    msg = stun.Message(message_method=stun.Method.BINDING,
                       message_class=stun.Class.RESPONSE if response else stun.Class.REQUEST,
                       transaction_id=os.urandom(12))
    if not response:
        msg.attributes["USERNAME"] = f"{ufrag}:client"
    if password is not None:
        msg.add_message_integrity(password.encode())
    return bytes(msg)


async def _settle() -> None:
    await asyncio.sleep(0.05)


def run(coro):
    return asyncio.run(coro)


def test_stun_routes_by_ufrag_only_after_integrity_and_media_by_learned_address():
    async def scenario():
        mux = await SharedSocket.open("127.0.0.1", 0)
        a, b = RecordingPort("ufragA", "p" * 22), RecordingPort("ufragB", "q" * 22)
        mux.register(a)
        mux.register(b)
        client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        client.bind(("127.0.0.1", 0))
        client.setblocking(False)
        target = mux.address
        client.sendto(b"\x80media-before-check", target)        # unknown address: dropped
        client.sendto(check("ufragA", "wrong-password-xxxxxx"), target)  # bad integrity
        client.sendto(check("nobody", "p" * 22), target)          # unknown ufrag
        await _settle()
        assert (a.stun, a.media, b.stun) == ([], [], [])
        client.sendto(check("ufragB", "q" * 22), target)          # authenticated: learned
        client.sendto(b"\x17dtls-record", target)
        await _settle()
        assert len(b.stun) == 1 and b.stun[0][1] == client.getsockname()
        assert b.media == [b"\x17dtls-record"] and a.media == []
        c = mux.counters
        assert (c.unknown_address, c.stun_unauthenticated, c.stun_unknown_ufrag) == (1, 1, 1)
        mux.unregister(b)
        client.sendto(b"\x17after-unregister", target)
        await _settle()
        assert b.media == [b"\x17dtls-record"] and mux.counters.unknown_address == 2
        mux.close()
        client.close()

    run(scenario())


def test_relay_encapsulation_is_unwrapped_and_answers_go_back_through_the_relay():
    async def scenario():
        mux = await SharedSocket.open("127.0.0.1", 0)
        port = RecordingPort("ufragR", "r" * 22)
        mux.register(port)
        relay = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        relay.bind(("127.0.0.1", 0))
        relay.settimeout(1)
        real_client = ("198.51.100.7", 40000)  # only ever written into headers, never sent to
        relay.sendto(hop.encode(real_client) + check("ufragR", "r" * 22), mux.address)
        await _settle()
        assert port.stun[0][1] == real_client  # ICE sees the client's real address
        mux.sendto(port, b"\x80answer", real_client)
        data, _ = relay.recvfrom(2048)
        header, payload = hop.decode(data)
        assert header.client == real_client and header.direction == hop.TO_CLIENT
        assert bytes(payload) == b"\x80answer"
        relay.sendto(hop.encode(real_client, hop.TO_CLIENT) + b"x", mux.address)  # wrong way
        await _settle()
        assert mux.counters.bad_hop_header == 1
        mux.close()
        relay.close()

    run(scenario())


def test_hop_headers_are_remembered_per_client_and_a_wrong_way_one_never_is():
    """The mux keeps parsed hop headers (both ways); every datagram still lands on the
    right session and goes back to the right client, and a header towards the client is
    refused however often it comes."""
    async def scenario():
        mux = await SharedSocket.open("127.0.0.1", 0)
        relay = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        relay.bind(("127.0.0.1", 0))
        relay.settimeout(1)
        ports = {}
        for n, client in enumerate([("198.51.100.7", 40000), ("198.51.100.7", 40001)]):
            port = ports[client] = RecordingPort(f"ufrag{n}", f"{n}" * 22)
            mux.register(port)
            relay.sendto(hop.encode(client) + check(f"ufrag{n}", f"{n}" * 22), mux.address)
        await _settle()
        for k in range(3):
            for client, port in ports.items():
                relay.sendto(hop.encode(client) + bytes([0x80, k]) + client[0].encode(),
                             mux.address)
                mux.sendto(port, bytes([0x80, k]), client)
        await _settle()
        back = []
        for _ in range(6):
            data, _ = relay.recvfrom(2048)
            header, payload = hop.decode(data)
            back.append((header.client, header.direction, bytes(payload)))
        for _ in range(3):
            relay.sendto(hop.encode(("198.51.100.7", 40000), hop.TO_CLIENT) + b"\x80",
                         mux.address)
        await _settle()
        mux.close()
        relay.close()
        return ports, back, mux.counters.bad_hop_header

    ports, back, bad = run(scenario())
    for client, port in ports.items():
        assert port.media == [bytes([0x80, k]) + client[0].encode() for k in range(3)]
    assert sorted(back) == sorted((client, hop.TO_CLIENT, bytes([0x80, k]))
                                  for client in ports for k in range(3))
    assert bad == 3


def test_checks_to_unlearned_addresses_are_parked_then_sent_when_the_address_is_learned():
    async def scenario():
        mux = await SharedSocket.open("127.0.0.1", 0)
        port = RecordingPort("ufragP", "s" * 22)
        mux.register(port)
        client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        client.bind(("127.0.0.1", 0))
        client.settimeout(1)
        mux.sendto(port, b"parked-check", client.getsockname())
        mux.sendto(port, b"to-elsewhere", ("127.0.0.1", 9))
        await _settle()
        assert mux.counters.parked == 2 and mux.counters.datagrams_out == 0
        client.sendto(check("ufragP", "s" * 22), mux.address)
        await _settle()  # the mux runs in this loop: let it take the check
        data, _ = client.recvfrom(2048)
        assert data == b"parked-check"  # sent the moment the authenticated check arrived
        assert mux.counters.parked_sent == 1
        mux.close()
        client.close()

    run(scenario())


def test_a_ufrag_cannot_be_registered_twice():
    async def scenario():
        mux = await SharedSocket.open("127.0.0.1", 0)
        mux.register(RecordingPort("same", "p" * 22))
        try:
            mux.register(RecordingPort("same", "q" * 22))
        except ValueError as exc:
            return str(exc)
        finally:
            mux.close()

    assert "already registered" in run(scenario())


def test_the_shared_socket_has_room_for_a_stall_and_counts_what_the_kernel_drops():
    """The one socket gets a large receive buffer (it takes what a socket per session would
    each take); datagrams the kernel still drops (buffer full) are counted in kernel_drops."""
    async def scenario():
        mux = await SharedSocket.open("127.0.0.1", 0)
        big = mux.transport.get_extra_info("socket").getsockopt(socket.SOL_SOCKET,
                                                               socket.SO_RCVBUF)
        mux.close()
        small = await SharedSocket.open("127.0.0.1", 0, buffer_bytes=4096)
        sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for _ in range(200):  # the loop does not run meanwhile: nothing is read
            sender.sendto(b"\x80" + bytes(199), small.address)
        drops = small.read_kernel_drops()
        counted = vars(small.counters)["kernel_drops"]
        small.close()
        sender.close()
        return big, drops, counted

    big, drops, counted = run(scenario())
    assert big >= 4 << 20            # (the kernel reports twice what was set)
    assert drops > 0 and counted == drops
