"""The hostile-input fuzzing benchmark (bench/hostile/): its cases are what their kinds say,
the first-packet parsers they aim at survive them (hypothesis), and a quick run against a
live edge (relay, transceiver, signaling, one real call) breaks no rule."""
from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bench.hostile.cases import (
    BUILDERS, KINDS, OPENER_EVERY, CaseStream, Forge, attribute_lists, build_templates,
    stun_messages, tlv,
)
from services.wire import hop
from services.wire.stun import StunError, is_stun, read_username, server_ufrag
from services.wire.ufrag import UfragCodec, UfragError

FORGE = Forge()
CODEC = UfragCodec(FORGE.secret)
LIVE = FORGE.ufrag(random.Random(99))


@pytest.fixture(scope="module")
def templates():
    return build_templates(12, seed_value=5)


def relay_view(data: bytes) -> str:
    """What the relay makes of a first packet (services/relay/routing.py ``Router.route``)."""
    if not data:
        return "empty"
    if len(data) > 2048:
        return "oversize"
    if data[0] > 3:
        return "not_stun"
    try:
        username = read_username(data)
    except StunError:
        return "malformed" if not is_stun(data) else "overflow"
    if username is None:
        return "no_username"
    ufrag = server_ufrag(username)
    if ufrag == LIVE:
        return "live"
    try:
        CODEC.decode(ufrag)
    except UfragError:
        return "bad_ufrag"
    return "routable"


EXPECTED = {
    "stun_bad_cookie": {"malformed"}, "stun_length_past_end": {"malformed"},
    "stun_attr_overflow": {"overflow"}, "stun_bad_integrity": {"routable"},
    "ufrag_forged": {"routable"}, "ufrag_bitflip": {"bad_ufrag"}, "ufrag_replay": {"live"},
    "username_huge": {"routable", "bad_ufrag", "oversize"}, "rtp": {"not_stun"},
    "dtls": {"not_stun"}, "channeldata": {"not_stun"}, "jumbo": {"oversize"},
    "empty": {"empty"}, "forged_then_media": {"routable", "not_stun"},
    "forged_many_ports": {"routable"},
}
DEMUX = {"rtp": range(128, 192), "dtls": range(20, 64), "channeldata": range(64, 80)}


def test_every_kind_is_what_it_says(templates):
    stream = CaseStream(templates, 3, {k: 4 for k in KINDS}, live_ufrag=LIVE)
    seen = {k: Counter() for k in KINDS}
    for k, data in stream.take(len(KINDS) * 400):
        kind = KINDS[k]
        seen[kind][relay_view(data)] += 1
        if kind in DEMUX:
            assert data[0] in DEMUX[kind], (kind, data[:4].hex())
    for kind, expected in EXPECTED.items():
        assert set(seen[kind]) <= expected, (kind, seen[kind])
    assert len(seen["stun_mutated"]) >= 3  # mutation reaches several outcomes
    assert seen["forged_then_media"]["not_stun"] > seen["forged_then_media"]["routable"] > 0


def test_every_kind_has_its_builder_in_the_order_of_the_kinds(templates):
    # the order is the wire format of a run (kind i sends from 127.(100+i).x.y)
    assert tuple(BUILDERS) == KINDS
    assert all(t.kind == kind for kind in KINDS for t in templates[kind]), \
        {kind: {t.kind for t in templates[kind]} for kind in KINDS}


def test_the_same_seed_sends_the_same_cases(templates):
    def cases(seed):
        return CaseStream(templates, seed, {k: 4 for k in KINDS}, live_ufrag=LIVE).take(3000)

    assert cases(7) == cases(7)
    assert cases(7) != cases(8)


def test_forged_then_media_opens_every_source_first(templates):
    sources = 5
    stream = CaseStream(templates, 1, {k: sources for k in KINDS})
    k = KINDS.index("forged_then_media")
    mine = [d for kind, d in stream.take(len(KINDS) * sources * OPENER_EVERY * 2) if kind == k]
    views = [relay_view(d) for d in mine]
    for round_start in (0, sources * OPENER_EVERY):
        assert views[round_start:round_start + sources] == ["routable"] * sources
    assert set(views[sources:sources * OPENER_EVERY]) == {"not_stun"}


# ---------------------------------------------------------------- the parsers under fire

@settings(max_examples=150, deadline=None)
@given(st.one_of(st.binary(max_size=200), stun_messages(FORGE)))
def test_the_relay_first_packet_parsing_fails_only_as_it_says(data):
    """read_username returns USERNAME, None, or raises StunError; what it returns lies inside
    the message; the ufrag check raises only UfragError."""
    try:
        username = read_username(data)
    except StunError:
        return
    assert is_stun(data)
    if username is None:
        return
    end = 20 + ((data[2] << 8) | data[3])
    assert username in data[20:end]
    try:
        CODEC.decode(server_ufrag(username))
    except UfragError:
        pass


@settings(max_examples=100, deadline=None)
@given(attribute_lists(FORGE, max_size=6), st.binary(min_size=1, max_size=40))
def test_read_username_finds_the_first_username(attrs, name):
    """Well-framed messages: the relay reads the first USERNAME, whatever surrounds it."""
    from bench.hostile.cases import stun_message

    plain = [tlv(t, v) for t, v, _ in attrs if t != 0x0006]
    cut = len(plain) // 2
    data = bytes(stun_message(plain[:cut] + [tlv(0x0006, name)] + plain[cut:],
                              random.Random(len(name))))
    assert read_username(data) == name


class _Port:
    """The mux's contract with a session (services/transceiver/mux.py MuxPort)."""

    def __init__(self, ufrag: str) -> None:
        self.ufrag, self.password = ufrag, b"p" * 22
        self.received: list = []

    def datagram_received(self, data, addr) -> None:
        self.received.append(data)

    def media_received(self, data) -> None:
        self.received.append(data)


EMPTY_PRIORITY = b"\x00\x01\x00\x04\x21\x12\xa4\x42" + bytes(12) + b"\x00\x24\x00\x00"


@settings(max_examples=200, deadline=None)
@given(st.one_of(stun_messages(FORGE), st.binary(max_size=120)))
@example(EMPTY_PRIORITY)  # a binding request with a zero-length PRIORITY (found by this test)
def test_the_transceiver_mux_survives_hostile_stun(data):
    """What a pending flow forwards reaches the transceiver's shared socket: nothing there
    may raise (an exception in the datagram callback costs a traceback per datagram)."""
    from services.transceiver.mux import SharedSocket

    mux = SharedSocket()
    mux.register(_Port(LIVE.decode()))
    mux.datagram_received(hop.encode(("127.100.0.1", 4000)) + data, ("10.77.0.1", 40000))
    mux.datagram_received(data, ("127.100.0.1", 4000))


# ---------------------------------------------------------------- against a live edge

NEVER_ROUTE = ("stun_bad_cookie", "stun_length_past_end", "stun_attr_overflow",
               "ufrag_bitflip", "rtp", "dtls", "channeldata", "jumbo", "empty")


@pytest.mark.netns
def test_quick_run_against_a_live_edge(tmp_path):
    from bench.hostile.fuzz import AFTER, FuzzConfig, lines, run

    config = FuzzConfig.quick()
    config = type(config)(**{**config.__dict__, "workdir": tmp_path})
    result = run(config)
    table = "\n".join(lines(result))
    col = result["columns"][AFTER]
    assert col["sent_total"] == config.cases, table
    came_back = sum(r["datagrams"] for w in ("sockets", "wire")
                    for r in col["came_back"][w].values())
    assert came_back == 0, table
    assert col["forwarded_other_total"] == 0, table
    for kind in NEVER_ROUTE:
        row = col["forwarded"][kind]
        assert row["stun"] + row["other"] == 0, (kind, table)
    assert col["forwarded"]["ufrag_forged"]["stun"] > 0, table  # the capture sees forwarding
    assert all(col["alive"].values()), col["alive"]
    assert not col["crash_lines"], col["crash_lines"]
    calls = col["live_calls"]
    assert calls["ok"] == calls["calls"] == config.live_calls, calls
    assert calls["attack"]["packets"] > 0 and calls["attack"]["loss_pct"] <= 5.0, calls
    assert result["violations"] == [], "\n".join(result["violations"])
