"""The transceiver's shared-socket demultiplexer, with real UDP sockets on loopback.

The sessions here are recording ports (the mux's only contract with a session); the full
aiortc sessions on the mux are covered in test_transceiver.py and test_edge.py.
"""
from __future__ import annotations

import asyncio
import os
import socket

from aioice import stun

from services.transceiver import mux as mux_module
from services.transceiver.mux import MuxCounters, MuxPort, SharedSocket
from services.wire import hop
from tests.conftest import until


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


def loopback_udp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    return s


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
        client = loopback_udp()
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
        relay = loopback_udp()
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
        relay = loopback_udp()
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
        client = loopback_udp()
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
        big = mux.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
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


# ------------------------------------------------------------ hostile input: bounds and drops

def _delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def test_every_datagram_is_delivered_or_counted_under_exactly_one_drop_reason():
    """One datagram of each kind, through a relay and directly: each moves ``delivered`` or
    exactly one of ``MuxCounters.DROPS``, never both and never none."""
    learned = ("198.51.100.7", 40000)
    stranger = ("203.0.113.9", 50000)
    cases = [  # (name, via relay as client or None for direct, datagram, the one counter)
        ("check", learned, check("ufragK", "k" * 22), "delivered"),
        ("media", learned, b"\x80media", "delivered"),
        ("response", learned, check("", None, response=True), "delivered"),
        ("direct check", None, check("ufragK", "k" * 22), "delivered"),
        ("truncated header", "raw", bytes([hop.MAGIC, 0, 1]), "bad_hop_header"),
        ("unknown flags", "raw", bytes([hop.MAGIC, 0x80]) + bytes(6) + b"\x80", "bad_hop_header"),
        ("towards client", "raw", hop.encode(learned, hop.TO_CLIENT) + b"\x80", "bad_hop_header"),
        ("empty after header", learned, b"", "empty"),
        ("empty", None, b"", "empty"),
        ("stun range garbage", learned, b"\x00\x01garbage", "stun_malformed"),
        ("stun range garbage, direct", None, b"\x03" * 40, "stun_malformed"),
        ("one byte in stun range", None, b"\x00", "stun_malformed"),
        ("unknown ufrag", stranger, check("nobody", "k" * 22), "stun_unknown_ufrag"),
        ("no integrity", stranger, check("ufragK", None), "stun_unauthenticated"),
        ("bad integrity", stranger, check("ufragK", "x" * 22), "stun_unauthenticated"),
        ("response from stranger", stranger, check("", None, response=True),
         "stun_unknown_address"),
        ("media from stranger", stranger, b"\x80media", "unknown_address"),
        ("dtls from stranger, direct", "stranger-direct", b"\x16dtls", "unknown_address"),
    ]

    async def scenario():
        mux = await SharedSocket.open("127.0.0.1", 0)
        port = RecordingPort("ufragK", "k" * 22)
        mux.register(port)
        relay, direct, other = (loopback_udp() for _ in range(3))
        relay.sendto(hop.encode(learned) + check("ufragK", "k" * 22), mux.address)
        await _settle()
        out = []
        for name, via, data, _ in cases:
            before = vars(mux.counters).copy()
            if via is None:
                direct.sendto(data, mux.address)
            elif via == "raw":
                relay.sendto(data, mux.address)
            elif via == "stranger-direct":
                other.sendto(data, mux.address)
            else:
                relay.sendto(hop.encode(via) + data, mux.address)
            await _settle()
            out.append((name, _delta(before, vars(mux.counters))))
        for s in (relay, direct, other):
            s.close()
        totals = vars(mux.counters).copy()
        mux.close()
        return out, totals

    out, totals = run(scenario())
    ignore = {"datagrams_in", "from_relays", "datagrams_out", "parked", "parked_sent",
              "delivered_rtp"}  # a share of delivered, not an outcome of its own
    for (name, delta), (_, _, _, want) in zip(out, cases):
        assert delta["datagrams_in"] == 1, name
        counted = {k: v for k, v in delta.items() if k not in ignore}
        assert counted == {want: 1}, (name, counted)
    assert totals["datagrams_in"] == totals["delivered"] + sum(
        totals[k] for k in MuxCounters.DROPS)


def test_ten_thousand_unknown_addresses_leave_the_mux_state_unchanged():
    """10,000 datagrams naming 10,000 different unknown clients (through a relay's hop header,
    of every kind a stranger can send) change nothing the mux holds: the hop-header cache
    keeps exactly the learned client's entry (before, churn like this cleared it)."""
    learned = ("198.51.100.7", 40000)

    async def scenario():
        mux = await SharedSocket.open("127.0.0.1", 0)
        port = RecordingPort("ufragU", "u" * 22)
        mux.register(port)
        relay = loopback_udp()
        relay.sendto(hop.encode(learned) + check("ufragU", "u" * 22), mux.address)
        relay.sendto(hop.encode(learned) + b"\x80first", mux.address)  # caches its header
        await _settle()
        before, counters = mux.state_sizes(), vars(mux.counters).copy()
        kinds = [check("nobody", "u" * 22), check("ufragU", "wrong" * 5),
                 check("", None, response=True), b"\x80rtp-like", b"\x17dtls", b"\x01junk"]
        n = 10_000
        for i in range(n):
            client = (f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}", 1024 + i)
            relay.sendto(hop.encode(client) + kinds[i % len(kinds)], mux.address)
            if i % 500 == 499:  # the loop reads between batches: no kernel drops
                await until(lambda: mux.counters.datagrams_in >= counters["datagrams_in"] + i + 1)
        await until(lambda: mux.counters.datagrams_in == counters["datagrams_in"] + n)
        after = mux.state_sizes()
        relay.sendto(hop.encode(learned) + b"\x80after", mux.address)
        await _settle()
        delta = _delta(counters, vars(mux.counters))
        cache = dict(mux._hop_clients)
        mux.close()
        relay.close()
        return before, after, delta, port.media, cache

    before, after, delta, media, cache = run(scenario())
    assert before == {"learned_addresses": 1, "ufrags": 1, "parked": 0, "parked_lists": 0,
                      "hop_cache": 1}
    assert after == before
    assert cache == {hop.encode(learned): learned}
    assert media == [b"\x80first", b"\x80after"]
    assert delta.get("kernel_drops", 0) == 0
    assert (delta["stun_unknown_ufrag"], delta["stun_unauthenticated"],
            delta["stun_unknown_address"], delta["unknown_address"],
            delta["stun_malformed"]) == (1667, 1667, 1667, 3333, 1666)


def test_a_flood_of_parked_datagrams_keeps_the_cap_and_counts_the_rest(monkeypatch):
    """100 datagrams towards unlearned addresses: _PARK_LIMIT parked, the rest counted in
    parked_dropped; expired ones make room and are counted; the lists of quiet sessions are
    swept; a session that ends takes its parked datagrams with it (counted), and a send after
    that leaves nothing behind."""
    monkeypatch.setattr(mux_module, "_PARK_TTL", 0.2)

    async def scenario():
        mux = await SharedSocket.open("127.0.0.1", 0)
        a, b = RecordingPort("ufragA", "a" * 22), RecordingPort("ufragB", "b" * 22)
        mux.register(a)
        mux.register(b)
        for i in range(100):
            mux.sendto(a, b"check-%d" % i, ("192.0.2.1", 1000 + i))
        flood = mux.state_sizes()["parked"], vars(mux.counters).copy()
        mux.sendto(b, b"one", ("192.0.2.2", 1))
        await asyncio.sleep(0.25)
        mux.sendto(b, b"later", ("192.0.2.2", 2))  # sweeps: a's list and b's first expire
        swept = mux.state_sizes(), vars(mux.counters).copy()
        mux.unregister(b)
        mux.sendto(b, b"after-unregister", ("192.0.2.2", 3))
        ended = mux.state_sizes(), vars(mux.counters).copy()
        mux.close()
        return flood, swept, ended

    (parked, c1), (sizes2, c2), (sizes3, c3) = run(scenario())
    assert parked == mux_module._PARK_LIMIT
    assert (c1["parked"], c1["parked_dropped"]) == (mux_module._PARK_LIMIT,
                                                    100 - mux_module._PARK_LIMIT)
    assert sizes2["parked"] == 1 and sizes2["parked_lists"] == 1  # a's empty list is gone
    assert c2["parked_expired"] == mux_module._PARK_LIMIT + 1
    assert sizes3["parked"] == 0 and sizes3["parked_lists"] == 0
    assert c3["send_unregistered"] == 1
    for c, now in ((c2, 1), (c3, 0)):
        assert c["parked"] == c["parked_sent"] + c["parked_expired"] + now


def test_learned_addresses_per_session_are_capped_least_recently_checked_first():
    """A session's client authenticating from more addresses than _ADDR_LIMIT: the least
    recently checked ones are forgotten (and their cached hop headers with them); an address
    checked again stays."""
    limit = mux_module._ADDR_LIMIT

    async def scenario():
        mux = await SharedSocket.open("127.0.0.1", 0)
        port = RecordingPort("ufragL", "l" * 22)
        mux.register(port)
        relay = loopback_udp()
        clients = [("198.51.100.7", 41000 + i) for i in range(limit + 4)]
        for i, client in enumerate(clients):
            relay.sendto(hop.encode(client) + check("ufragL", "l" * 22), mux.address)
            relay.sendto(hop.encode(client) + b"\x80m", mux.address)
            if i == limit - 1:  # the first one checks again: the most recent now
                relay.sendto(hop.encode(clients[0]) + check("ufragL", "l" * 22), mux.address)
        await _settle()
        full = mux.state_sizes(), mux.counters.addresses_evicted
        before = mux.counters.unknown_address
        for client in clients:
            relay.sendto(hop.encode(client) + b"\x80n", mux.address)
        await _settle()
        forgotten = mux.counters.unknown_address - before
        mux.unregister(port)
        empty = mux.state_sizes()
        mux.close()
        relay.close()
        return full, forgotten, empty

    (sizes, evicted), forgotten, empty = run(scenario())
    assert sizes["learned_addresses"] == limit and evicted == 4
    assert sizes["hop_cache"] <= limit
    assert forgotten == 4  # clients[1:5], not clients[0], which checked again
    assert empty == {"learned_addresses": 0, "ufrags": 0, "parked": 0, "parked_lists": 0,
                     "hop_cache": 0}


def test_checks_for_no_session_are_dropped_before_aioice_parses_them(monkeypatch):
    """The routing ufrag is public: a flood of checks that route here but name no session must
    cost a walk to USERNAME, not aioice's parse of every attribute; a session's checks still
    get the full parse (and the integrity check)."""
    parsed = []
    real_parse = mux_module.stun.parse_message
    monkeypatch.setattr(mux_module.stun, "parse_message",
                        lambda data, **kw: parsed.append(bytes(data)) or real_parse(data, **kw))

    async def scenario():
        mux = await SharedSocket.open("127.0.0.1", 0)
        port = RecordingPort("ufragK", "k" * 22)
        mux.register(port)
        client = loopback_udp()
        strangers = [check(f"nobody{k}", "k" * 22) for k in range(50)]
        for data in strangers:
            client.sendto(data, mux.address)
        client.sendto(check("ufragK", "x" * 22), mux.address)  # its ufrag, bad integrity
        client.sendto(check("ufragK", "k" * 22), mux.address)
        await until(lambda: mux.counters.datagrams_in == 52)
        client.close()
        mux.close()
        return mux.counters, port

    counters, port = run(scenario())
    assert counters.stun_unknown_ufrag == 50 and counters.stun_unauthenticated == 1
    assert len(port.stun) == 1 and counters.delivered == 1
    assert len(parsed) == 2  # only the two checks for the session


def test_the_socket_is_read_in_bounded_batches():
    """One readiness event reads up to _READ_BATCH datagrams (asyncio's transport would read one
    per turn of the loop, and a turn runs every session's callbacks); the rest wait for the
    next."""
    import time

    async def scenario():
        mux = await SharedSocket.open("127.0.0.1", 0)
        client = loopback_udp()
        for k in range(100):
            client.sendto(b"\x80media%d" % k, mux.address)
        time.sleep(0.05)  # blocking: the loop does not read meanwhile
        mux._on_readable()  # one readiness event
        first = mux.counters.datagrams_in
        await until(lambda: mux.counters.datagrams_in == 100)
        client.close()
        mux.close()
        return first, mux.counters

    first, counters = run(scenario())
    assert first == mux_module._READ_BATCH
    assert counters.unknown_address == 100
