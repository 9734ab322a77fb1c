"""Hostile cases for the fuzzing benchmark: templates built once, cheap mutations per case.

Templates are real messages built with scapy (its STUN layer and attributes, its RTP layer)
or as raw record bytes (DTLS, TURN ChannelData), a few hundred per kind; the structure-aware
STUN kinds draw their shapes from hypothesis strategies (attribute lists, lengths that lie,
ufrag bytes). A million cases then come from ``CaseStream``: a template per case, changed by
byte-level mutations that keep its kind what it says (a new transaction id, a freshly forged
or bit-flipped ufrag, the live call's ufrag, a length field edited, a bit flipped past the
demultiplexing byte, a truncation). Everything follows from one seed, so two runs send the
same cases (the live ufrag, known only at attack time, is the one exception).

Forged ufrags are tagged with the development secret, the one the relay uses unless told
otherwise (services/wire/ufrag.py): an attacker who knows the secret, or who copied a ufrag
from any SDP answer, has a ufrag that routes.
"""
from __future__ import annotations

import random
import struct
import time
import zlib
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from scapy.contrib.stun import (
    STUN, STUNFingerprint, STUNGenericTlv, STUNIceControlling, STUNMessageIntegrity,
    STUNPriority, STUNUseCandidate, STUNUsername,
)
from scapy.layers.rtp import RTP

from services.wire.stun import MAGIC_COOKIE
from services.wire.ufrag import DEV_SECRET, UFRAG_LENGTH, UfragCodec

# Every kind's datagrams come from their own source addresses (bench/hostile/fuzz.py), so the
# order here is part of the wire format of a run: kind i sends from 127.(100+i).x.y.
KINDS = (
    "stun_bad_cookie",       # an ICE check whose magic cookie is wrong
    "stun_length_past_end",  # header length past the datagram (or the datagram cut short)
    "stun_attr_overflow",    # an attribute whose length runs past the message
    "stun_bad_integrity",    # routable ufrag; MESSAGE-INTEGRITY/FINGERPRINT truncated, wrong, misplaced
    "ufrag_forged",          # a full ICE check, ufrag tagged with the public dev secret, wrong MI
    "ufrag_bitflip",         # a valid ufrag with one bit flipped
    "ufrag_replay",          # the live call's ufrag, from other addresses, wrong MI
    "username_huge",         # USERNAME of 300 bytes up to a 64 KiB datagram
    "stun_mutated",          # hypothesis: any type, cookie, attribute list and length
    "rtp",                   # RTP and RTCP from unknown addresses
    "dtls",                  # DTLS records from unknown addresses
    "channeldata",           # TURN ChannelData
    "jumbo",                 # datagrams larger than any receive slot
    "empty",                 # zero-byte datagrams
    "forged_then_media",     # a forged check opens a flow, then RTP/DTLS/junk from that address
    "forged_many_ports",     # forged checks from one address and many ports
)
KIND_INDEX = {k: i for i, k in enumerate(KINDS)}
OPENER_EVERY = 8  # forged_then_media: a source sends a forged check every this many rounds

STUN_BINDING_REQUEST = 0x0001
FINGERPRINT_XOR = 0x5354554E
ICE_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_PLACEHOLDER = b"R" * UFRAG_LENGTH  # where the live ufrag goes (ufrag_replay)


@dataclass(frozen=True)
class Template:
    """One prebuilt datagram. ``ufrag_at``: offset of the server ufrag (20 bytes), -1 when
    there is none to rewrite; ``fingerprint``: the last attribute is a FINGERPRINT to fix after
    a rewrite (so that only what the kind says is wrong is wrong); ``opener``: the check that
    opens a flow (forged_then_media)."""

    kind: str
    data: bytes
    ufrag_at: int = -1
    fingerprint: bool = False
    opener: bool = False


@dataclass(frozen=True)
class Forge:
    """Routing ufrags for the edge under test (cluster and transceiver of the demo edge)."""

    cluster_id: int = 1
    transceiver_id: int = 1
    secret: bytes = DEV_SECRET

    def ufrag(self, rng: random.Random) -> bytes:
        """A ufrag whose tag verifies: it routes to the transceiver."""
        nonce = rng.getrandbits(48).to_bytes(6, "big")
        return UfragCodec(self.secret).encode(self.cluster_id, self.transceiver_id, nonce).encode()

    def pool(self, rng: random.Random, n: int) -> list[bytes]:
        codec = UfragCodec(self.secret)
        return [codec.encode(self.cluster_id, self.transceiver_id,
                             rng.getrandbits(48).to_bytes(6, "big")).encode() for _ in range(n)]


# ---------------------------------------------------------------- STUN with scapy

def fix_fingerprint(buf: bytearray) -> None:
    """Make the trailing FINGERPRINT of ``buf`` right for what precedes it (RFC 8489 14.7)."""
    crc = (zlib.crc32(bytes(buf[:-8])) ^ FINGERPRINT_XOR) & 0xFFFFFFFF
    struct.pack_into("!I", buf, len(buf) - 4, crc)


def _client_ufrag(rng: random.Random) -> bytes:
    return "".join(rng.choice(ICE_CHARS) for _ in range(rng.choice((4, 8, 16)))).encode()


def tlv(attr_type: int, value: bytes, length: int | None = None) -> STUNGenericTlv:
    """Any attribute; ``length`` may lie about ``value``."""
    return STUNGenericTlv(type=attr_type, length=length, value=value)


def stun_message(attributes: list, rng: random.Random, *, message_type: int = STUN_BINDING_REQUEST,
                 cookie: int = MAGIC_COOKIE, fingerprint: bool = False) -> bytearray:
    """A STUN message built by scapy, with a right FINGERPRINT appended when asked."""
    attrs = list(attributes) + ([STUNFingerprint(crc_32=0)] if fingerprint else [])
    pkt = STUN(stun_message_type=message_type, length=0, magic_cookie=cookie,
               transaction_id=rng.getrandbits(96), attributes=attrs)
    buf = bytearray(bytes(pkt))
    struct.pack_into("!H", buf, 2, len(buf) - 20)  # scapy packs the length signed: past 32 KiB
    if fingerprint:
        fix_fingerprint(buf)
    return buf


def ice_attributes(username: bytes, rng: random.Random, *, integrity: bool = True) -> list:
    """What a browser's ICE check carries, USERNAME first, MESSAGE-INTEGRITY of a key the
    sender does not have (random bytes are as good as any wrong HMAC)."""
    attrs = [STUNUsername(username=username), STUNPriority(priority=rng.getrandbits(31)),
             STUNIceControlling(tie_breaker=rng.getrandbits(64))]
    if rng.random() < 0.5:
        attrs.append(STUNUseCandidate())
    if integrity:
        attrs.append(STUNMessageIntegrity(hmac_sha1=rng.getrandbits(160)))
    return attrs


def ice_check(server_ufrag: bytes, rng: random.Random, **kw) -> bytearray:
    username = server_ufrag + b":" + _client_ufrag(rng)
    return stun_message(ice_attributes(username, rng), rng, fingerprint=True, **kw)


def _ufrag_template(kind: str, data: bytearray, ufrag: bytes, **kw) -> Template:
    return Template(kind, bytes(data), ufrag_at=bytes(data).find(ufrag), **kw)


# ---------------------------------------------------------------- hypothesis strategies

def ufrags(forge: Forge) -> st.SearchStrategy[bytes]:
    """Server ufrags: tag-valid, one bit off, right alphabet but wrong, or any bytes."""
    codec = UfragCodec(forge.secret)
    valid = st.binary(min_size=6, max_size=6).map(
        lambda n: codec.encode(forge.cluster_id, forge.transceiver_id, n).encode())

    def flipped(draw_pair):
        ufrag, bit = draw_pair
        b = bytearray(ufrag)
        b[bit // 8] ^= 1 << (bit % 8)
        return bytes(b)

    return st.one_of(
        valid,
        st.tuples(valid, st.integers(0, UFRAG_LENGTH * 8 - 1)).map(flipped),
        st.text(alphabet=ICE_CHARS, min_size=0, max_size=40).map(str.encode),
        st.binary(max_size=40),
    )


def attribute_lists(forge: Forge, max_size: int = 12) -> st.SearchStrategy[list]:
    """Attribute lists as (type, value, declared length or None)."""
    username = st.tuples(ufrags(forge), st.sampled_from([b":", b"", b"::"]),
                         st.binary(max_size=16)).map(lambda t: t[0] + t[1] + t[2])
    known = st.sampled_from([0x0006, 0x0008, 0x0024, 0x0025, 0x8028, 0x8029, 0x802A, 0x0014,
                             0x0015, 0x0009, 0x8022, 0x001C, 0x000D])
    attr = st.one_of(
        st.tuples(st.just(0x0006), username, st.none()),
        st.tuples(known, st.binary(max_size=40), st.none()),
        st.tuples(st.integers(0, 0xFFFF), st.binary(max_size=64), st.none()),
        st.tuples(st.one_of(known, st.integers(0, 0xFFFF)), st.binary(max_size=32),
                  st.integers(0, 0xFFFF)),  # a length that may lie
    )
    return st.lists(attr, max_size=max_size)


@st.composite
def stun_messages(draw, forge: Forge) -> bytes:
    """A structure-aware hostile STUN message: any type, mostly the right cookie, an
    attribute list, and a header length that is right, wrong, or absurd."""
    message_type = draw(st.one_of(st.sampled_from([0x0001, 0x0011, 0x0101, 0x0111, 0x0003,
                                                   0x0004, 0x0016]), st.integers(0, 0x3FFF)))
    cookie = draw(st.one_of(st.just(MAGIC_COOKIE), st.integers(0, 0xFFFFFFFF)))
    tid = draw(st.integers(0, (1 << 96) - 1))
    attrs = [tlv(t, v, n) for t, v, n in draw(attribute_lists(forge))]
    if draw(st.booleans()):  # USERNAME first, as a browser puts it: the relay reads it
        attrs.insert(0, tlv(0x0006, draw(ufrags(forge)) + b":" + draw(st.binary(max_size=8))))
    data = bytearray(bytes(STUN(stun_message_type=message_type, length=0, magic_cookie=cookie,
                                transaction_id=tid, attributes=attrs)))
    length = draw(st.one_of(st.none(), st.integers(0, 0xFFFF)))
    struct.pack_into("!H", data, 2, len(data) - 20 if length is None else length)
    tail = draw(st.one_of(st.just(b""), st.binary(max_size=12)))
    return bytes(data + tail)


@st.composite
def overflowing_messages(draw, forge: Forge) -> bytes:
    """Well-framed STUN (is_stun holds) with one attribute whose declared length runs past
    the end of the message, after a valid prefix of attributes."""
    # No USERNAME before the liar: the relay stops walking at the first USERNAME.
    prefix = [tlv(t, v) for t, v, _ in draw(attribute_lists(forge, max_size=4)) if t != 0x0006]
    liar_type = draw(st.one_of(st.just(0x0006), st.integers(0, 0xFFFF)))
    value = draw(st.binary(max_size=32))
    overflow = draw(st.one_of(st.integers(1, 8), st.integers(9, 0xFFFF)))
    # Past the value and its padding: the value may be followed by nothing at all.
    declared = min(0xFFFF, len(value) + (-len(value) % 4) + overflow)
    attrs = prefix + [STUNGenericTlv(type=liar_type, length=declared, value=value)]
    rng = random.Random(draw(st.integers(0, 2**32)))
    return bytes(stun_message(attrs, rng))  # scapy writes the value as it is, padded to 4


def draw_examples(strategy: st.SearchStrategy, n: int, seed_value: int) -> list:
    """``n`` values of ``strategy`` (fewer if it runs out), the same for the same seed."""
    out: list = []

    @seed(seed_value)
    @settings(max_examples=n, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(value) -> None:
        out.append(value)

    collect()
    return out


# ---------------------------------------------------------------- one builder per kind

def build_stun_bad_cookie(rng, n, forge):
    out = []
    for _ in range(n):
        cookie = rng.choice((0, 0xA442_2112, MAGIC_COOKIE ^ (1 << rng.randrange(32)),
                             rng.getrandbits(32) | 1))
        if cookie == MAGIC_COOKIE:
            cookie ^= 1
        ufrag = forge.ufrag(rng)
        out.append(_ufrag_template("stun_bad_cookie", ice_check(ufrag, rng, cookie=cookie),
                                   ufrag))
    return out


def build_stun_length_past_end(rng, n, forge):
    out = []
    for _ in range(n):
        ufrag = forge.ufrag(rng)
        data = ice_check(ufrag, rng)
        if rng.random() < 0.5:  # header length past the datagram
            length = min(0xFFFC, len(data) - 20 + 4 * rng.choice((1, 2, 16, rng.randrange(1, 16000))))
            struct.pack_into("!H", data, 2, length)
        else:  # the datagram cut short, the header unchanged
            del data[rng.randrange(21, len(data)):]
        out.append(_ufrag_template("stun_length_past_end", data, ufrag))
    return out


def build_stun_attr_overflow(rng, n, forge, seed_value=0):
    return [Template("stun_attr_overflow", d)
            for d in draw_examples(overflowing_messages(forge), n, seed_value)]


def build_stun_bad_integrity(rng, n, forge):
    """Routable ufrag; MESSAGE-INTEGRITY and FINGERPRINT wrong in every way that keeps the
    framing valid."""
    def variant(k, username):
        base = ice_attributes(username, rng, integrity=False)
        mi = STUNMessageIntegrity(hmac_sha1=rng.getrandbits(160))
        if k == 0:  # MI truncated to 10 bytes
            return stun_message(base + [tlv(0x0008, rng.randbytes(10))], rng), False
        if k == 1:  # MI of SHA-256 size
            return stun_message(base + [tlv(0x0008, rng.randbytes(32))], rng, fingerprint=True), True
        if k == 2:  # MI missing, FINGERPRINT right
            return stun_message(base, rng, fingerprint=True), True
        if k == 3:  # FINGERPRINT wrong
            data = stun_message(base + [mi], rng, fingerprint=True)
            data[-1] ^= 0x5A
            return data, False
        if k == 4:  # FINGERPRINT before MI
            return stun_message(base + [STUNFingerprint(crc_32=rng.getrandbits(32)), mi], rng), False
        if k == 5:  # FINGERPRINT truncated to 2 bytes
            return stun_message(base + [mi, tlv(0x8028, rng.randbytes(2))], rng), False
        if k == 6:  # MI twice
            return stun_message(base + [mi, mi], rng, fingerprint=True), True
        return stun_message(base + [tlv(0x0008, b"")], rng), False  # MI empty

    out = []
    for i in range(n):
        ufrag = forge.ufrag(rng)
        data, fp = variant(i % 8, ufrag + b":" + _client_ufrag(rng))
        out.append(_ufrag_template("stun_bad_integrity", data, ufrag, fingerprint=fp))
    return out


def build_ufrag_forged(rng, n, forge):
    out = []
    for _ in range(n):
        ufrag = forge.ufrag(rng)
        out.append(_ufrag_template("ufrag_forged", ice_check(ufrag, rng), ufrag, fingerprint=True))
    return out


def build_ufrag_bitflip(rng, n, forge):
    # A valid ufrag here; CaseStream flips one of its bits per case (half of them in the
    # live call's ufrag).
    out = []
    for _ in range(n):
        ufrag = forge.ufrag(rng)
        out.append(_ufrag_template("ufrag_bitflip", ice_check(ufrag, rng), ufrag, fingerprint=True))
    return out


def build_ufrag_replay(rng, n, forge):
    return [_ufrag_template("ufrag_replay", ice_check(_PLACEHOLDER, rng), _PLACEHOLDER,
                            fingerprint=True) for _ in range(n)]


def build_username_huge(rng, n, forge):
    out = []
    for _ in range(n):
        size = rng.choice((300, 513, 1000, 1400, 2000, 4000, 16000, 65000, rng.randrange(256, 65400)))
        ufrag = forge.ufrag(rng)
        style = rng.randrange(3)
        if style == 0:    # routable ufrag, then a huge client part
            username = ufrag + b":" + rng.choice(ICE_CHARS).encode() * size
        elif style == 1:  # no colon at all
            username = ufrag + bytes(rng.getrandbits(8) for _ in range(16)) * (size // 16)
        else:             # colons everywhere
            username = (ufrag + b":") * (size // 21)
        username = username[:65400]
        data = stun_message([STUNUsername(username=username)], rng)
        out.append(_ufrag_template("username_huge", data, ufrag))
    return out


def build_stun_mutated(rng, n, forge, seed_value=0):
    return [Template("stun_mutated", d) for d in draw_examples(stun_messages(forge), n, seed_value)]


def build_rtp(rng, n, forge):
    out = []
    for _ in range(n):
        if rng.random() < 0.8:
            pkt = RTP(payload_type=rng.choice((0, 8, 96, 111, 127, rng.randrange(128))),
                      marker=rng.getrandbits(1), sequence=rng.getrandbits(16),
                      timestamp=rng.getrandbits(32), sourcesync=rng.getrandbits(32),
                      extension=rng.random() < 0.1)
            if rng.random() < 0.1:
                pkt.sync = [rng.getrandbits(32) for _ in range(rng.randrange(1, 16))]
            data = bytes(pkt) + rng.randbytes(rng.choice((0, 3, 80, 160, 1200)))
        else:  # RTCP: sender/receiver reports, SDES, BYE, APP
            pt = rng.randrange(200, 205)
            body = rng.randbytes(4 * rng.randrange(1, 30))
            data = struct.pack("!BBH", 0x80 | rng.randrange(32), pt, len(body) // 4) + body
        out.append(Template("rtp", data))
    return out


def dtls_record(rng: random.Random, content_type: int | None = None, body: bytes | None = None,
                length: int | None = None) -> bytes:
    """A DTLS record header (RFC 6347 4.1) and body."""
    content_type = content_type if content_type is not None else rng.choice((20, 21, 22, 23))
    version = rng.choice((0xFEFD, 0xFEFF, 0x0303, rng.getrandbits(16)))
    body = body if body is not None else rng.randbytes(rng.choice((1, 2, 12, 100, 1000)))
    length = len(body) if length is None else length
    return (struct.pack("!BHH", content_type, version, rng.getrandbits(16))
            + rng.getrandbits(48).to_bytes(6, "big") + struct.pack("!H", length) + body)


def build_dtls(rng, n, forge):
    out = []
    for _ in range(n):
        style = rng.randrange(4)
        if style == 0:  # a ClientHello-looking handshake
            hello = (b"\x01" + (200).to_bytes(3, "big") + b"\x00\x00" + b"\x00\x00\x00"
                     + (200).to_bytes(3, "big") + b"\xfe\xfd" + rng.randbytes(194))
            data = dtls_record(rng, 22, hello)
        elif style == 1:  # length past the datagram
            data = dtls_record(rng, length=rng.randrange(1, 0x10000))
        elif style == 2:  # several records in one datagram
            data = b"".join(dtls_record(rng) for _ in range(rng.randrange(2, 6)))
        else:  # any content type in the DTLS range
            data = dtls_record(rng, rng.randrange(20, 64))
        out.append(Template("dtls", data))
    return out


def build_channeldata(rng, n, forge):
    out = []
    for _ in range(n):
        body = rng.randbytes(rng.choice((0, 4, 100, 500)))
        length = rng.choice((len(body), len(body), rng.getrandbits(16)))
        out.append(Template("channeldata", struct.pack("!HH", rng.randrange(0x4000, 0x5000),
                                                       length) + body))
    return out


def build_jumbo(rng, n, forge):
    """Datagrams larger than the relay's receive slot (2 KiB): a routable STUN check padded
    out, RTP-looking, or zeros. Few distinct ones: they are sent as they are."""
    out = []
    for i in range(min(n, 24)):
        size = rng.choice((2049, 4096, 9000, 16384, 32768, 65507, rng.randrange(2049, 65508)))
        style = i % 3
        if style == 0:
            ufrag = forge.ufrag(rng)
            head = bytes(stun_message([STUNUsername(username=ufrag + b":x")], rng))
            body = head + bytes(size - len(head))
            data = bytearray(body)
            struct.pack_into("!H", data, 2, len(data) - 20 - (len(data) - 20) % 4)
            data = bytes(data)
        elif style == 1:
            data = bytes(RTP(payload_type=111, sourcesync=rng.getrandbits(32))) + bytes(size - 12)
        else:
            data = bytes(size)
        out.append(Template("jumbo", data))
    return out


def build_empty(rng, n, forge):
    return [Template("empty", b"")]


def build_forged_then_media(rng, n, forge):
    """Openers (forged checks) and what follows them from the same address: RTP, DTLS,
    ChannelData and junk past the STUN range."""
    half = max(1, n // 2)
    openers = [Template("forged_then_media", t.data, t.ufrag_at, True, opener=True)
               for t in build_ufrag_forged(rng, half, forge)]
    media = [Template("forged_then_media", t.data)
             for t in build_rtp(rng, half // 2, forge) + build_dtls(rng, half // 4, forge)
             + build_channeldata(rng, half // 8, forge)]
    media += [Template("forged_then_media", bytes([rng.randrange(4, 256)]) + rng.randbytes(
        rng.choice((0, 20, 200)))) for _ in range(max(1, half - len(media)))]
    return openers + media


def build_forged_many_ports(rng, n, forge):
    return [Template("forged_many_ports", t.data, t.ufrag_at, True)
            for t in build_ufrag_forged(rng, n, forge)]


# Each kind's builder: (rng, n, forge) -> n templates; the hypothesis kinds also take
# ``seed_value``. In the order of KINDS (tests/test_hostile_fuzz.py checks).
BUILDERS = {
    "stun_bad_cookie": build_stun_bad_cookie,
    "stun_length_past_end": build_stun_length_past_end,
    "stun_attr_overflow": build_stun_attr_overflow,
    "stun_bad_integrity": build_stun_bad_integrity,
    "ufrag_forged": build_ufrag_forged,
    "ufrag_bitflip": build_ufrag_bitflip,
    "ufrag_replay": build_ufrag_replay,
    "username_huge": build_username_huge,
    "stun_mutated": build_stun_mutated,
    "rtp": build_rtp,
    "dtls": build_dtls,
    "channeldata": build_channeldata,
    "jumbo": build_jumbo,
    "empty": build_empty,
    "forged_then_media": build_forged_then_media,
    "forged_many_ports": build_forged_many_ports,
}
_HYPOTHESIS_KINDS = {"stun_attr_overflow", "stun_mutated"}


def build_templates(per_kind: int, seed_value: int = 1, forge: Forge = Forge()
                    ) -> dict[str, list[Template]]:
    """``per_kind`` templates of every kind (fewer for jumbo and empty), from ``seed_value``."""
    out = {}
    for i, kind in enumerate(KINDS):
        rng = random.Random(seed_value * 1000 + i)
        if kind in _HYPOTHESIS_KINDS:
            out[kind] = BUILDERS[kind](rng, per_kind, forge, seed_value=seed_value * 1000 + i)
        else:
            out[kind] = BUILDERS[kind](rng, per_kind, forge)
        if not out[kind]:
            raise RuntimeError(f"no templates for {kind}")
    return out


# ---------------------------------------------------------------- the case stream

class CaseStream:
    """Cases ``(kind index, datagram)``, kinds in turn, each derived from a random template of
    its kind by that kind's mutations. ``sources[kind]``: how many sockets send that kind's
    cases in turn (forged_then_media opens each source's flow first, and again every
    OPENER_EVERY rounds); ``live_ufrag``: the real call's ufrag for ufrag_replay (and half of
    ufrag_bitflip); forged ufrags stand in when it is None."""

    def __init__(self, templates: dict[str, list[Template]], seed_value: int,
                 sources: dict[str, int], live_ufrag: bytes | None = None,
                 forge: Forge = Forge()) -> None:
        self.rng = random.Random(seed_value)
        self.templates = [templates[k] for k in KINDS]
        self.sources = [max(1, sources.get(k, 1)) for k in KINDS]
        self.sent = [0] * len(KINDS)
        self.pool = forge.pool(random.Random(seed_value + 1), 4096)
        self.live = live_ufrag
        if live_ufrag is not None and len(live_ufrag) != UFRAG_LENGTH:
            raise ValueError("live ufrag must be 20 bytes")
        opener = [t for t in templates["forged_then_media"] if t.opener]
        self.openers = opener or templates["ufrag_forged"]
        self.media = [t for t in templates["forged_then_media"] if not t.opener]
        self.kind = 0
        derive = {
            "stun_bad_cookie": self._stun_kept, "stun_length_past_end": self._length_past_end,
            "stun_attr_overflow": self._stun_kept, "stun_bad_integrity": self._stun_kept,
            "ufrag_forged": self._stun_kept, "ufrag_bitflip": self._bitflip,
            "ufrag_replay": self._replay, "username_huge": self._tid_only,
            "stun_mutated": self._mutated, "rtp": self._media_mutation,
            "dtls": self._dtls, "channeldata": self._channeldata, "jumbo": self._as_is,
            "empty": self._as_is, "forged_then_media": self._then_media,
            "forged_many_ports": self._stun_kept,
        }
        self._derive = [derive[k] for k in KINDS]

    def take(self, n: int) -> list[tuple[int, bytes]]:
        out = []
        kinds, choice = len(KINDS), self.rng.choice
        for _ in range(n):
            k = self.kind
            self.kind = (k + 1) % kinds
            out.append((k, self._derive[k](choice(self.templates[k]), k)))
            self.sent[k] += 1
        return out

    # -- mutations (each keeps its kind what it says it is)

    def _tid(self, buf: bytearray) -> None:
        if len(buf) >= 20:
            buf[8:20] = self.rng.getrandbits(96).to_bytes(12, "big")

    def _put_ufrag(self, buf: bytearray, t: Template, ufrag: bytes) -> None:
        if t.ufrag_at >= 0 and t.ufrag_at + UFRAG_LENGTH <= len(buf):
            buf[t.ufrag_at:t.ufrag_at + UFRAG_LENGTH] = ufrag

    def _finish(self, buf: bytearray, t: Template) -> bytes:
        if t.fingerprint:
            fix_fingerprint(buf)
        return bytes(buf)

    def _stun_kept(self, t: Template, k: int) -> bytes:
        """A new transaction id and a freshly forged ufrag; what was wrong stays wrong."""
        buf = bytearray(t.data)
        self._tid(buf)
        self._put_ufrag(buf, t, self.rng.choice(self.pool))
        return self._finish(buf, t)

    def _tid_only(self, t: Template, k: int) -> bytes:
        buf = bytearray(t.data)
        self._tid(buf)
        return bytes(buf)

    def _length_past_end(self, t: Template, k: int) -> bytes:
        buf = bytearray(t.data)
        self._tid(buf)
        self._put_ufrag(buf, t, self.rng.choice(self.pool))
        if self.rng.random() < 0.5:
            struct.pack_into("!H", buf, 2, min(0xFFFC, len(buf) - 20 + 4 * self.rng.randrange(1, 4096)))
        return bytes(buf)

    def _bitflip(self, t: Template, k: int) -> bytes:
        buf = bytearray(t.data)
        self._tid(buf)
        rng = self.rng
        ufrag = self.live if self.live is not None and rng.random() < 0.5 else rng.choice(self.pool)
        flipped = bytearray(ufrag)
        bit = rng.randrange(UFRAG_LENGTH * 8)
        flipped[bit // 8] ^= 1 << (bit % 8)
        self._put_ufrag(buf, t, bytes(flipped))
        return self._finish(buf, t)

    def _replay(self, t: Template, k: int) -> bytes:
        buf = bytearray(t.data)
        self._tid(buf)
        self._put_ufrag(buf, t, self.live if self.live is not None else self.rng.choice(self.pool))
        return self._finish(buf, t)

    def _mutated(self, t: Template, k: int) -> bytes:
        rng = self.rng
        buf = bytearray(t.data)
        self._tid(buf)
        roll = rng.random()
        if roll < 0.25 and buf:
            bit = rng.randrange(len(buf) * 8)
            buf[bit // 8] ^= 1 << (bit % 8)
        elif roll < 0.4 and len(buf) >= 4:
            struct.pack_into("!H", buf, 2, rng.getrandbits(16))
        elif roll < 0.55 and buf:
            del buf[rng.randrange(len(buf)):]
        return bytes(buf)

    def _flip_past_first(self, buf: bytearray) -> None:
        if len(buf) > 1:
            bit = self.rng.randrange(8, len(buf) * 8)
            buf[bit // 8] ^= 1 << (bit % 8)

    def _media_mutation(self, t: Template, k: int) -> bytes:
        buf = bytearray(t.data)
        roll = self.rng.random()
        if roll < 0.5:
            self._flip_past_first(buf)
        elif roll < 0.6 and len(buf) > 1:
            del buf[self.rng.randrange(1, len(buf)):]
        return bytes(buf)

    def _dtls(self, t: Template, k: int) -> bytes:
        buf = bytearray(t.data)
        roll = self.rng.random()
        if roll < 0.3 and len(buf) >= 13:
            struct.pack_into("!H", buf, 11, self.rng.getrandbits(16))
        elif roll < 0.7:
            self._flip_past_first(buf)
        return bytes(buf)

    def _channeldata(self, t: Template, k: int) -> bytes:
        buf = bytearray(t.data)
        if self.rng.random() < 0.3:
            struct.pack_into("!H", buf, 2, self.rng.getrandbits(16))
        else:
            self._flip_past_first(buf)
        return bytes(buf)

    def _as_is(self, t: Template, k: int) -> bytes:
        return t.data

    def _then_media(self, t: Template, k: int) -> bytes:
        rounds = self.sent[k] // self.sources[k]
        if rounds % OPENER_EVERY == 0:
            return self._stun_kept(self.rng.choice(self.openers), k)
        return self._media_mutation(self.rng.choice(self.media), k)


def generator_rate(templates: dict[str, list[Template]], cases: int = 200_000, seed_value: int = 1
                   ) -> float:
    """Cases per second ``CaseStream`` derives on this machine (one core)."""
    stream = CaseStream(templates, seed_value, {k: 64 for k in KINDS}, live_ufrag=None)
    start = time.perf_counter()
    done = 0
    while done < cases:
        done += len(stream.take(min(4096, cases - done)))
    return done / (time.perf_counter() - start)
