"""The native media plane (services/mediaplane/_mediaplane.c) against an independent SRTP
peer: pylibsrtp (the libsrtp aiortc bundles, on OpenSSL) protects what the plane unprotects and
the other way round, on real loopback UDP sockets, with each of the plane's SRTP
implementations (its own AES-GCM, srtp_gcm.c, and Debian's libsrtp2). Bad input is dropped and
counted, never delivered to another session."""
from __future__ import annotations

import contextlib
import os
import socket
import struct
import time

import pylibsrtp
import pytest

from bench.fuzz_mediaplane import rtp
from services.mediaplane._mediaplane import Plane
from services.wire import hop

PROFILES = {"AES128_CM_SHA1_80": (pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80, 30),
            "AEAD_AES_256_GCM": (pylibsrtp.Policy.SRTP_PROFILE_AEAD_AES_256_GCM, 44)}
# (profile, master key and salt bytes, the plane's srtp=): every implementation the plane has
CRYPTO = {"AES128_CM_SHA1_80/libsrtp": (*PROFILES["AES128_CM_SHA1_80"], "openssl"),
          "AEAD_AES_128_GCM/own": (pylibsrtp.Policy.SRTP_PROFILE_AEAD_AES_128_GCM, 28, "openssl"),
          "AEAD_AES_256_GCM/own": (*PROFILES["AEAD_AES_256_GCM"], "openssl"),
          "AEAD_AES_256_GCM/libsrtp": (*PROFILES["AEAD_AES_256_GCM"], "libsrtp")}
SILENCE = b"\xf8\xff\xfe"
MID_ID, AST_ID = 1, 3


class Peer:
    """A client: its SRTP sessions (keys crossed with the plane's) and a UDP socket."""

    def __init__(self, profile: int, key_len: int) -> None:
        self.up_key, self.down_key = os.urandom(key_len), os.urandom(key_len)
        self.tx = pylibsrtp.Session(pylibsrtp.Policy(
            key=self.up_key, ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND, srtp_profile=profile))
        self.rx = pylibsrtp.Session(pylibsrtp.Policy(
            key=self.down_key, ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND, srtp_profile=profile))
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(2)
        self.address = self.sock.getsockname()


@pytest.fixture
def server():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    yield sock
    sock.close()


def add(plane: Plane, peer: Peer, profile: int, relay=None, seq: int = 1000, pcm=False,
        ssrc: int = 0x11223344) -> int:
    return plane.add(peer.address, relay, profile, peer.up_key, peer.down_key, ssrc, seq,
                     90000, 111, b"0", MID_ID, AST_ID, SILENCE, pcm)


def records(blob: bytes | None) -> list[tuple[int, bytes]]:
    out, blob = [], blob or b""
    while blob:
        channel, length = struct.unpack_from("!IH", blob)
        out.append((channel, blob[6:6 + length]))
        blob = blob[6 + length:]
    return out


def batch(*items: tuple[int, bytes]) -> bytes:
    return b"".join(struct.pack("!IH", c, len(p)) + p for c, p in items)


@pytest.mark.parametrize("name", PROFILES)
def test_caller_rtp_reaches_the_agent_batch_and_replies_go_out_as_srtp(server, name):
    profile, key_len = PROFILES[name]
    plane, peer = Plane(server.fileno(), 16), Peer(profile, key_len)
    channel = add(plane, peer, profile)
    for i in range(3):
        packet = peer.tx.protect(rtp(500 + i, 960 * i, 0xCAFE, b"opus-%d" % i))
        assert plane.process(packet, peer.address) is None
    assert records(plane.take_batch()) == [(channel, b"opus-0"), (channel, b"opus-1"),
                                          (channel, b"opus-2")]
    assert plane.take_batch() is None
    assert plane.put_batch(batch((channel, b"reply"))) == 1
    assert plane.tick() == 1 and plane.tick() == 1  # the reply, then the silence packet
    sent = [peer.rx.unprotect(peer.sock.recv(2048)) for _ in range(2)]
    for i, packet in enumerate(sent):
        first, pt, seq, ts, ssrc = struct.unpack_from("!BBHII", packet)
        assert (first & 0xC0, pt & 0x7F, pt & 0x80, seq, ts, ssrc) == (
            0x80, 111, 0x80, 1000 + i, 90000 + 960 * i, 0x11223344)
        assert packet[12:14] == b"\xbe\xde"   # one-byte header extensions: mid, abs-send-time
        ext_len = struct.unpack_from("!H", packet, 14)[0] * 4
        ext = packet[16:16 + ext_len]
        assert ext[0] == (MID_ID << 4) and ext[1:2] == b"0" and ext[2] >> 4 == AST_ID
        assert packet[16 + ext_len:] == (b"reply" if i == 0 else SILENCE)
    stats = plane.stats(channel)
    assert (stats["rx_ssrc"], stats["packets_received"], stats["base_seq"], stats["max_seq"],
            stats["packets_sent"]) == (0xCAFE, 3, 500, 502, 2)
    counters = plane.counters()
    assert counters["rtp_in"] == 3 and counters["rtp_out"] == 2 and counters["to_python"] == 0


def test_a_cleared_session_sends_silence_instead_of_the_agent_frames_it_held(server):
    profile, key_len = PROFILES["AES128_CM_SHA1_80"]
    plane, peer = Plane(server.fileno(), 4), Peer(profile, key_len)
    channel = add(plane, peer, profile)
    assert plane.put_batch(batch((channel, b"one"), (channel, b"two"), (channel, b"three"))) == 3
    plane.tick()
    assert peer.rx.unprotect(peer.sock.recv(2048)).endswith(b"one")
    assert plane.clear(channel) == 2 and plane.clear(channel) == 0
    assert plane.clear(channel + 1) == 0   # no such session: nothing to clear
    plane.tick()
    assert peer.rx.unprotect(peer.sock.recv(2048)).endswith(SILENCE)
    assert plane.put_batch(batch((channel, b"next"),)) == 1   # the next reply plays
    plane.tick()
    assert peer.rx.unprotect(peer.sock.recv(2048)).endswith(b"next")


@pytest.mark.parametrize("crypto", CRYPTO)
def test_rollover_across_the_sequence_wrap_both_ways(server, crypto):
    profile, key_len, srtp = CRYPTO[crypto]
    plane, peer = Plane(server.fileno(), 4, srtp), Peer(profile, key_len)
    channel = add(plane, peer, profile, seq=65533)
    got = []
    for i in range(8):  # 65530 .. 65535, 0, 1: libsrtp's rollover counter on both sides
        seq = (65530 + i) & 0xFFFF
        assert plane.process(peer.tx.protect(rtp(seq, 960 * i, 7, bytes([i]))),
                             peer.address) is None
        got += records(plane.take_batch())
    assert [p for _, p in got] == [bytes([i]) for i in range(8)]
    stats = plane.stats(channel)
    assert (stats["cycles"], stats["max_seq"], stats["packets_received"]) == (65536, 1, 8)
    plane.tick(5)   # 65533 .. 65535, 0, 1: the peer decrypts across the wrap
    seqs = [struct.unpack_from("!H", peer.rx.unprotect(peer.sock.recv(2048)), 2)[0]
            for _ in range(5)]
    assert seqs == [65533, 65534, 65535, 0, 1]
    plane.tick(1)
    assert struct.unpack_from("!H", peer.rx.unprotect(peer.sock.recv(2048)), 2)[0] == 2


@pytest.mark.parametrize("crypto", CRYPTO)
def test_replayed_forged_truncated_and_strangers_packets_are_dropped_and_counted(server, crypto):
    profile, key_len, srtp = CRYPTO[crypto]
    plane = Plane(server.fileno(), 4, srtp)
    peer, other = Peer(profile, key_len), Peer(profile, key_len)
    channel = add(plane, peer, profile)
    good = peer.tx.protect(rtp(1, 0, 9, b"x"))
    assert plane.process(good, peer.address) is None
    assert plane.process(good, peer.address) is None                    # replayed
    forged = bytearray(peer.tx.protect(rtp(2, 960, 9, b"y")))
    forged[-1] ^= 1
    assert plane.process(bytes(forged), peer.address) is None           # tag fails
    assert plane.process(good[:11], peer.address) is None               # shorter than RTP
    # another client's packet under the peer's keys reaches no session: Python's to judge
    assert plane.process(other.tx.protect(rtp(1, 0, 9, b"z")), other.address) is not None
    # STUN, DTLS and SRTCP from the session's own address are Python's too
    for datagram in (b"\x00\x01\x00\x00" + bytes(16), b"\x16\xfe\xfd" + bytes(10),
                     b"\x80\xc8\x00\x06" + bytes(24)):
        assert plane.process(datagram, peer.address) == datagram
    c = plane.counters()
    assert (c["rtp_in"], c["drop_srtp_replay"], c["drop_srtp_auth"],
            c["drop_rtp_malformed"], c["to_python"]) == (1, 1, 1, 1, 4)
    assert records(plane.take_batch()) == [(channel, b"x")]


def test_relayed_sessions_answer_through_the_relay_that_last_delivered(server):
    profile, key_len = PROFILES["AES128_CM_SHA1_80"]
    plane, peer = Plane(server.fileno(), 4), Peer(profile, key_len)
    relay = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    relay.bind(("127.0.0.1", 0))
    relay.settimeout(2)
    channel = add(plane, peer, profile, relay=relay.getsockname())
    header = hop.encode(peer.address, hop.TO_SERVER)
    packet = peer.tx.protect(rtp(10, 0, 5, b"via"))
    assert plane.process(packet, peer.address) is not None        # not relayed: not this flow
    assert plane.process(header + packet, relay.getsockname()) is None
    assert records(plane.take_batch()) == [(channel, b"via")]
    plane.tick()
    data = relay.recv(2048)
    decoded, payload = hop.decode(data)
    assert decoded.client == peer.address and decoded.direction == hop.TO_CLIENT
    assert peer.rx.unprotect(bytes(payload))[-len(SILENCE):] == SILENCE
    relay.close()


def test_a_moved_session_takes_and_sends_at_its_new_address_only(server):
    """A client that moved (ICE nominated its pair from a new address): the same SRTP
    contexts and stream, another address; through a relay, then directly."""
    profile, key_len = PROFILES["AES128_CM_SHA1_80"]
    plane, peer = Plane(server.fileno(), 8), Peer(profile, key_len)
    other = Peer(profile, key_len)
    channel = add(plane, peer, profile)
    assert plane.process(peer.tx.protect(rtp(1, 0, 5, b"one")), peer.address) is None
    moved = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)   # the client's new address
    moved.bind(("127.0.0.1", 0))
    moved.settimeout(2)
    assert plane.move(channel, moved.getsockname(), None)
    before = peer.tx.protect(rtp(2, 960, 5, b"two"))
    assert plane.process(before, peer.address) == before        # the old address: Python's
    assert plane.process(peer.tx.protect(rtp(3, 1920, 5, b"three")), moved.getsockname()) is None
    assert records(plane.take_batch()) == [(channel, b"one"), (channel, b"three")]
    assert plane.tick() == 1
    assert peer.rx.unprotect(moved.recv(2048))[-len(SILENCE):] == SILENCE  # the same stream
    # the new address is the session's alone; an address of another session is refused
    second = add(plane, other, profile)
    with pytest.raises(ValueError, match="has a session"):
        plane.move(channel, other.address, None)
    relay = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    relay.bind(("127.0.0.1", 0))
    relay.settimeout(2)
    assert plane.move(channel, peer.address, relay.getsockname())
    header = hop.encode(peer.address, hop.TO_SERVER)
    assert plane.process(header + peer.tx.protect(rtp(4, 2880, 5, b"four")),
                         relay.getsockname()) is None
    plane.tick()
    decoded, _ = hop.decode(relay.recv(2048))
    assert decoded.client == peer.address
    assert not plane.move(0xFFFF, peer.address, None) and plane.stats(second) is not None
    with pytest.raises(ValueError):
        plane.move(channel, ("not an address", 1), None)
    assert plane.stats(channel)["packets_received"] == 3
    for sock in (moved, relay):
        sock.close()


def test_a_removed_session_matches_nothing_and_its_channel_is_not_reused(server):
    profile, key_len = PROFILES["AES128_CM_SHA1_80"]
    plane, peer = Plane(server.fileno(), 2), Peer(profile, key_len)
    first = add(plane, peer, profile)
    assert plane.remove(first) and not plane.remove(first) and plane.sessions == 0
    packet = peer.tx.protect(rtp(1, 0, 5, b"late"))
    assert plane.process(packet, peer.address) == packet   # to Python, which drops it
    second = add(plane, peer, profile)
    assert second != first
    assert plane.put_batch(batch((first, b"old"), (second, b"new"))) == 1
    assert plane.counters()["batch_unknown_channel"] == 1
    # a full plane says so; a record cut short ends the batch, counted
    add(plane, Peer(profile, key_len), profile)
    with pytest.raises(OverflowError):
        add(plane, Peer(profile, key_len), profile)
    assert plane.put_batch(batch((second, b"ok")) + b"\0\0") == 1
    assert plane.counters()["batch_bad_record"] == 1


def test_the_tick_and_the_batch_walk_exactly_the_live_sessions_as_they_come_and_go(server):
    """The per-tick loops walk the live sessions' slots, packed (not every slot of the
    capacity): after removals in the middle and new sessions in the freed slots, a tick sends
    one packet to each live session and none to a removed one, and the agent's batch holds
    each live session's frame."""
    profile, key_len = PROFILES["AES128_CM_SHA1_80"]
    plane = Plane(server.fileno(), 8)
    peers = [Peer(profile, key_len) for _ in range(6)]
    channels = [add(plane, peer, profile) for peer in peers[:5]]
    for k in (1, 3):
        plane.remove(channels[k])
    channels.append(add(plane, peers[5], profile))         # takes a freed slot

    def ticked(live: set[int]) -> None:
        assert plane.tick() == len(live) == plane.sessions
        for k, peer in enumerate(peers):
            peer.sock.settimeout(0.2 if k in live else 0.05)
            try:
                got = peer.sock.recv(2048)
            except socket.timeout:
                got = None
            assert (got is not None) == (k in live), k

    ticked({0, 2, 4, 5})
    plane.remove(channels[4])          # the session whose slot moved when 1 was removed
    ticked({0, 2, 5})
    channels[4] = add(plane, peers[4], profile)
    live = {0, 2, 4, 5}
    ticked(live)
    for k in live:
        packet = peers[k].tx.protect(rtp(1, 0, 0xA0 + k, b"frame%d" % k))
        assert plane.process(packet, peers[k].address) is None
    assert sorted(records(plane.take_batch())) == sorted(
        (channels[k], b"frame%d" % k) for k in live)
    assert plane.take_batch() is None


def test_pcm_sessions_decode_for_the_agent_and_encode_its_frames(server):
    profile, key_len = PROFILES["AES128_CM_SHA1_80"]
    plane, peer = Plane(server.fileno(), 2), Peer(profile, key_len)
    from services import libopus
    encoder, decoder = libopus.Encoder("voip", 32000, 5, 960), libopus.Decoder()
    tone = struct.pack("<960h", *[int(8000 * ((i // 24) % 2 * 2 - 1)) for i in range(960)])
    channel = add(plane, peer, profile, pcm=True)
    for i in range(3):
        plane.process(peer.tx.protect(rtp(i, 960 * i, 3, encoder.encode(tone))), peer.address)
    got = records(plane.take_batch())
    assert [(c, len(p)) for c, p in got] == [(channel, 1920)] * 3
    assert max(abs(v) for v in struct.unpack("<960h", got[-1][1])) > 2000  # audio, not silence
    plane.put_batch(batch((channel, tone)))
    plane.tick()
    payload = peer.rx.unprotect(peer.sock.recv(2048))
    ext_len = struct.unpack_from("!H", payload, 14)[0] * 4
    assert len(decoder.decode(payload[16 + ext_len:])) == 1920
    bad = plane.counters()["batch_bad_record"]
    assert plane.put_batch(batch((channel, bytes(1300)))) == 0   # neither PCM nor Opus
    assert plane.counters()["batch_bad_record"] == bad + 1
    # After the agent's audio: three silent frames through the encoder (the sound ends as the
    # encoder shaped it; the next audio starts from silence), then the cached packet, as the
    # Python path's AgentAudioTrack does; audio again restarts the count.
    def sent(ticks):
        plane.tick(ticks)
        out = []
        for _ in range(ticks):
            packet = peer.rx.unprotect(peer.sock.recv(2048))
            out.append(packet[16 + struct.unpack_from("!H", packet, 14)[0] * 4:])
        return out

    after = sent(5)
    assert after[3:] == [SILENCE, SILENCE] and SILENCE not in after[:3]
    levels = [max(map(abs, struct.unpack("<960h", decoder.decode(p)))) for p in after[:3]]
    assert levels[-1] < 200, levels   # the tone's tail (the codec's look-ahead), then quiet
    assert plane.counters()["drop_encode"] == 0
    plane.put_batch(batch((channel, tone)))
    again = sent(5)
    assert SILENCE not in again[:4] and again[4] == SILENCE
    # An agent that encodes its own audio (a TTS streaming Opus): its payloads go out as they
    # are, and the cached silence right after them (no sound of the plane's encoder to end)
    opus = [encoder.encode(tone) for _ in range(2)]
    plane.put_batch(batch(*((channel, p) for p in opus)))
    assert sent(4) == opus + [SILENCE, SILENCE]


def test_pcm_sessions_encode_as_the_plane_was_told(server):
    """The transceiver's OpusSettings reach the plane's encoders (they once did not: every
    pcm16 session encoded with libopus's voip default whatever the transceiver said)."""
    from services import libopus
    profile, key_len = PROFILES["AES128_CM_SHA1_80"]
    speech = struct.pack("<960h", *[int(6000 * ((i // 40) % 2 * 2 - 1)) for i in range(960)])
    modes = {}
    for name, settings in (("default", {}), ("told", dict(
            opus_application=libopus.APPLICATION["voip"], opus_bitrate=6000,
            opus_complexity=0))):
        plane, peer = Plane(server.fileno(), 1, **settings), Peer(profile, key_len)
        channel = add(plane, peer, profile, pcm=True)
        plane.put_batch(batch((channel, speech)))
        plane.tick()
        packet = peer.rx.unprotect(peer.sock.recv(2048))
        payload = packet[16 + struct.unpack_from("!H", packet, 14)[0] * 4:]
        modes[name] = (payload[0] >> 3, len(payload))   # TOC config (RFC 6716 3.1), size
    # the default (voip, its automatic bitrate) codes this in CELT full band (config 31); told
    # 6 kbit/s, the encoder drops to SILK (configs 0-11) in a few bytes
    assert modes["default"][0] == 31 and modes["default"][1] > 60, modes
    assert modes["told"][0] < 12 and modes["told"][1] < 30, modes
    for bad in (dict(opus_application=1), dict(opus_complexity=11), dict(opus_bitrate=100)):
        with pytest.raises(ValueError):
            Plane(server.fileno(), 1, **bad)


def test_a_client_session_on_its_own_socket_plays_its_script_and_logs_arrivals(server):
    """A light client's session: its own socket, its peer the only source it takes, its
    script sent in a loop, every arrival logged (nothing queued for an agent)."""
    profile, key_len = PROFILES["AES128_CM_SHA1_80"]
    peer = Peer(profile, key_len)          # here: the edge, which the client calls
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.bind(("127.0.0.1", 0))
    client.setblocking(False)
    plane = Plane(-1, 4)
    script = batch((0, b"tone-a"), (0, b"tone-b"))
    channel = plane.add(peer.address, None, profile, peer.up_key, peer.down_key, 77, 10, 0,
                        111, b"0", MID_ID, AST_ID, SILENCE, False, client.fileno(), script)
    plane.tick(3)
    payloads = []
    for _ in range(3):
        packet = peer.rx.unprotect(peer.sock.recv(2048))
        ext_len = struct.unpack_from("!H", packet, 14)[0] * 4
        payloads.append(packet[16 + ext_len:])
    assert payloads == [b"tone-a", b"tone-b", b"tone-a"]
    for i in range(3):
        peer.sock.sendto(peer.tx.protect(rtp(100 + i, 960 * i, 0xAB, b"e" * (20 + i))),
                         client.getsockname())
    stranger = Peer(profile, key_len)
    stranger.sock.sendto(stranger.tx.protect(rtp(1, 0, 5, b"x")), client.getsockname())
    peer.sock.sendto(b"\x00\x01\x00\x00" + bytes(16), client.getsockname())  # STUN
    import time
    time.sleep(0.05)
    back = plane.read_session(channel)
    assert [addr for _, addr in back] == [stranger.address, peer.address]
    arrivals = list(struct.iter_unpack("=dIHH", plane.take_arrivals(channel)))
    assert [(ssrc, seq, size) for _, ssrc, seq, size in arrivals] == [
        (0xAB, 100, 20), (0xAB, 101, 21), (0xAB, 102, 22)]
    assert all(0 < at <= time.monotonic() for at, *_ in arrivals)
    assert plane.take_arrivals(channel) == b"" and plane.take_batch() is None
    assert plane.counters()["wrong_peer"] == 1
    assert plane.remove(channel)
    client.close()


def _opus_frames(n: int, hz: float = 440.0) -> list[bytes]:
    """``n`` 20 ms mono Opus payloads of a tone (PyAV's libopus, not the plane's)."""
    import av
    import numpy as np
    codec = av.CodecContext.create("libopus", "w")
    codec.sample_rate, codec.layout, codec.format, codec.bit_rate = 48000, "mono", "s16", 32000
    out = []
    for i in range(n + 4):
        t = (np.arange(960) + i * 960) / 48000
        frame = av.AudioFrame.from_ndarray(
            (np.sin(2 * np.pi * hz * t) * 8000).astype("<i2").reshape(1, -1), format="s16",
            layout="mono")
        frame.sample_rate, frame.pts = 48000, i * 960
        out.extend(bytes(p) for p in codec.encode(frame))
    return out[:n]


def test_a_keeping_client_session_logs_what_it_hears_and_decodes_it_in_the_order_given(server):
    """A conversation's caller: each payload heard is logged with its sequence number, RTP
    timestamp and wall-clock arrival; decode gives 20 ms of PCM per record in the order given
    (its playout order), silence for what libopus refuses, and refuses records cut short."""
    profile, key_len = PROFILES["AES128_CM_SHA1_80"]
    peer = Peer(profile, key_len)
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.bind(("127.0.0.1", 0))
    client.setblocking(False)
    plane = Plane(-1, 4)
    args = (peer.address, None, profile, peer.up_key, peer.down_key, 77, 10, 0, 111, b"0",
            MID_ID, AST_ID, SILENCE, False, client.fileno())
    with pytest.raises(ValueError):       # keep is a client session's: it needs a script
        plane.add(*args, keep=True)
    channel = plane.add(*args, batch((0, SILENCE)), keep=True)
    frames = _opus_frames(3)
    before = time.time()
    for i, payload in enumerate(frames + [b"\x03\x00"]):   # the last: a code-3 packet of 0 frames
        peer.sock.sendto(peer.tx.protect(rtp(500 + i, 960 * i, 0xAB, payload)),
                         client.getsockname())
    sent, sent_mono = time.time(), time.monotonic()
    time.sleep(0.05)   # a busy event loop: read 50 ms after they arrived
    assert plane.read_session(channel) == []
    blob, heard, pos = plane.take_heard(channel), [], 0
    while pos < len(blob):
        at, seq, ts, size = struct.unpack_from("=dHIH", blob, pos)
        heard.append((at, seq, ts, blob[pos + 16:pos + 16 + size]))
        pos += 16 + size
    assert [(seq, ts, p) for _, seq, ts, p in heard] == [
        (500 + i, 960 * i, p) for i, p in enumerate(frames + [b"\x03\x00"])]
    # stamped when the kernel had them (SO_TIMESTAMPNS), not when they were read
    assert all(before <= at <= sent + 0.01 for at, *_ in heard), (before, sent, heard)
    assert plane.take_heard(channel) == b""
    # the plane hands nothing to an agent and logs the arrivals as any client session
    arrivals = plane.take_arrivals(channel)
    assert plane.take_batch() is None and len(arrivals) == 4 * 16
    assert all(struct.unpack_from("=d", arrivals, i)[0] <= sent_mono + 0.01
               for i in range(0, len(arrivals), 16))
    order = [frames[1], frames[0], frames[2], b"\x03\x00"]
    pcm = plane.decode(channel, b"".join(struct.pack("=H", len(p)) + p for p in order))
    assert len(pcm) == 4 * 1920
    import numpy as np
    samples = np.frombuffer(pcm, dtype="<i2").reshape(4, 960)
    assert (np.abs(samples[:3]).max(axis=1) > 1000).all()   # the tone, through libopus
    assert not samples[3].any() and plane.counters()["drop_decode"] == 1
    for bad in (b"\x05", struct.pack("=H", 9) + b"short", struct.pack("=H", 0)):
        with pytest.raises(ValueError):
            plane.decode(channel, bad)
    # a session that keeps nothing has no log and decodes nothing
    other = plane.add(peer.address, None, profile, peer.up_key, peer.down_key, 78, 10, 0, 111,
                      b"0", MID_ID, AST_ID, SILENCE, False, client.fileno(), batch((0, SILENCE)))
    assert plane.take_heard(other) is None
    with pytest.raises(ValueError):
        plane.decode(other, b"")
    assert plane.remove(channel) and plane.take_heard(channel) is None
    client.close()


def test_a_keeping_clients_full_log_drops_and_counts_what_does_not_fit(server):
    profile, key_len = PROFILES["AES128_CM_SHA1_80"]
    peer = Peer(profile, key_len)
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.bind(("127.0.0.1", 0))
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 21)
    client.setblocking(False)
    plane = Plane(-1, 1)
    channel = plane.add(peer.address, None, profile, peer.up_key, peer.down_key, 77, 10, 0, 111,
                        b"0", MID_ID, AST_ID, SILENCE, False, client.fileno(),
                        batch((0, SILENCE)), keep=True)
    payload = bytes(1000)          # 1016 bytes a record: 64 fit in 65536
    for i in range(70):
        peer.sock.sendto(peer.tx.protect(rtp(i, 960 * i, 0xAB, payload)), client.getsockname())
    deadline = time.monotonic() + 2
    while plane.counters()["rtp_in"] < 70 and time.monotonic() < deadline:
        plane.read_session(channel, 8)
    assert len(plane.take_heard(channel)) == 64 * 1016
    assert plane.counters()["heard_lost"] == 6
    client.close()


def test_a_tick_of_one_send_group_sends_for_its_sessions_only(server):
    profile, key_len = PROFILES["AES128_CM_SHA1_80"]
    plane = Plane(server.fileno(), 4)
    peers = [Peer(profile, key_len) for _ in range(3)]
    for group, peer in enumerate(peers):
        plane.add(peer.address, None, profile, peer.up_key, peer.down_key, 5 + group, 1, 0,
                  111, b"0", MID_ID, AST_ID, SILENCE, group=group % 2)
    with pytest.raises(ValueError):
        plane.add(("127.0.0.1", 9), None, profile, peers[0].up_key, peers[0].down_key, 9, 1,
                  0, 111, b"0", MID_ID, AST_ID, SILENCE, group=256)
    assert plane.tick(2, 1) == 2          # two frames of session 1, the only one in group 1
    assert plane.tick(1, 0) == 2 and plane.tick(1) == 3
    got = []
    for peer in peers:
        n = 0
        with contextlib.suppress(TimeoutError, BlockingIOError, socket.timeout):
            peer.sock.settimeout(0.2)
            while True:
                peer.sock.recv(2048)
                n += 1
        got.append(n)
    assert got == [2, 3, 2]


def test_a_server_session_on_its_own_socket_queues_what_it_hears_for_the_agent():
    """A port-per-session transceiver's session: its own socket, no script: what its client
    sends is queued for the agent, the agent's replies go out on that socket, no arrival
    log."""
    profile, key_len = PROFILES["AEAD_AES_256_GCM"]
    peer = Peer(profile, key_len)          # the client
    own = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    own.bind(("127.0.0.1", 0))
    own.setblocking(False)
    plane = Plane(-1, 4)
    channel = plane.add(peer.address, None, profile, peer.up_key, peer.down_key, 77, 10, 0,
                        111, b"0", MID_ID, AST_ID, SILENCE, False, own.fileno())
    peer.sock.sendto(peer.tx.protect(rtp(5, 0, 0xAB, b"caller")), own.getsockname())
    time.sleep(0.05)
    assert plane.read_session(channel) == []
    assert records(plane.take_batch()) == [(channel, b"caller")]
    assert plane.take_arrivals(channel) is None
    plane.put_batch(batch((channel, b"agent")))
    plane.tick()
    packet, source = peer.sock.recvfrom(2048)
    clear = peer.rx.unprotect(packet)
    assert source == own.getsockname() and clear.endswith(b"agent")
    assert plane.remove(channel)
    own.close()


def test_a_session_through_a_turn_channel_speaks_channeldata_with_its_server():
    """A light client's session through a TURN server (RFC 8656 12): ChannelData of its
    channel both ways, to and from the server only; the allocation's STUN, another channel's
    data and the peer's DTLS inside the channel go back to Python unchanged."""
    profile, key_len = PROFILES["AES128_CM_SHA1_80"]
    turn = Peer(profile, key_len)          # the TURN server: it relays the edge's SRTP
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.bind(("127.0.0.1", 0))
    client.setblocking(False)
    plane = Plane(-1, 4)
    script = batch((0, b"tone"))
    with pytest.raises(ValueError, match="0x4000-0x4FFF"):
        plane.add(turn.address, None, profile, turn.up_key, turn.down_key, 77, 10, 0, 111,
                  b"0", MID_ID, AST_ID, SILENCE, False, client.fileno(), script,
                  turn_channel=0x5000)
    channel = plane.add(turn.address, None, profile, turn.up_key, turn.down_key, 77, 10, 0,
                        111, b"0", MID_ID, AST_ID, SILENCE, False, client.fileno(), script,
                        turn_channel=0x4001)
    plane.tick()
    data = turn.sock.recv(2048)
    number, length = struct.unpack_from("!HH", data)
    assert (number, length) == (0x4001, len(data) - 4)
    assert turn.rx.unprotect(data[4:]).endswith(b"tone")
    to = client.getsockname()
    srtp = turn.tx.protect(rtp(100, 0, 0xAB, b"echo"))
    turn.sock.sendto(struct.pack("!HH", 0x4001, len(srtp)) + srtp, to)
    other = struct.pack("!HH", 0x4002, len(srtp)) + turn.tx.protect(rtp(101, 960, 0xAB, b"x"))
    dtls = struct.pack("!HH", 0x4001, 13) + b"\x16\xfe\xfd" + bytes(10)
    stun = b"\x01\x01\x00\x00" + bytes(16)
    for datagram in (other, dtls, stun):
        turn.sock.sendto(datagram, to)
    time.sleep(0.05)
    back = plane.read_session(channel)
    assert back == [(other, turn.address), (dtls, turn.address), (stun, turn.address)]
    arrivals = list(struct.iter_unpack("=dIHH", plane.take_arrivals(channel)))
    assert [(ssrc, seq, size) for _, ssrc, seq, size in arrivals] == [(0xAB, 100, 4)]
    stranger = Peer(profile, key_len)
    forged = struct.pack("!HH", 0x4001, len(srtp)) + srtp   # from anyone but the server
    stranger.sock.sendto(forged, to)
    time.sleep(0.05)
    assert plane.read_session(channel) == [(forged, stranger.address)]
    assert plane.counters()["wrong_peer"] == 1 and plane.counters()["rtp_in"] == 1
    assert plane.remove(channel)
    client.close()


def add_rtcp(plane: Plane, peer: Peer, profile: int, ssrc: int = 0x11223344) -> int:
    return plane.add(peer.address, None, profile, peer.up_key, peer.down_key, ssrc, 1000,
                     90000, 111, b"0", MID_ID, AST_ID, SILENCE, False, rtcp=True,
                     cname=b"plane-cname")


def ntp_middle(ntp: int) -> int:
    return (ntp >> 16) & 0xFFFFFFFF


def reports(peer: Peer) -> list:
    """The next datagram the peer gets, as aiortc parses its RTCP (an independent parser)."""
    from aiortc.rtp import RtcpPacket
    return RtcpPacket.parse(peer.rx.unprotect_rtcp(peer.sock.recv(2048)))


@pytest.mark.parametrize("crypto", CRYPTO)
def test_the_plane_reports_a_peers_stream_as_rfc_3550_says_and_reads_the_rtt_off_its_rr(server,
                                                                                          crypto):
    """SR with our stream's counts and this instant's NTP/RTP pair, a report block on the
    peer's stream (extended highest sequence across a wrap, cumulative and fractional loss,
    LSR/DLSR answering the peer's SR), SDES CNAME; the peer's RR answering our SR gives the
    RTT (RFC 3550 6.4.1), an RR naming no SR of ours gives none."""
    from aiortc.rtp import (RtcpReceiverInfo, RtcpRrPacket, RtcpSdesPacket, RtcpSenderInfo,
                             RtcpSrPacket)
    profile, key_len, srtp = CRYPTO[crypto]
    plane, peer = Plane(server.fileno(), 2, srtp), Peer(profile, key_len)
    channel = add_rtcp(plane, peer, profile)
    for seq in (65530, 65531, 65533, 65535, 0, 1):      # 65532 and 65534 lost, then a wrap
        assert plane.process(peer.tx.protect(rtp(seq, 960 * seq, 0xCAFE, b"v")),
                             peer.address) is None
    peer_ntp = 0x0123456789ABCDEF
    sr = RtcpSrPacket(ssrc=0xCAFE, sender_info=RtcpSenderInfo(
        ntp_timestamp=peer_ntp, rtp_timestamp=1, packet_count=6, octet_count=6))
    assert plane.process(peer.tx.protect_rtcp(bytes(sr)), peer.address) is None
    plane.tick(3)                                        # three frames: an SR, not an RR
    for _ in range(3):
        peer.sock.recv(2048)
    time.sleep(0.05)
    before = time.time()
    assert plane.report(channel)
    ours, sdes = reports(peer)
    after = time.time()
    assert isinstance(ours, RtcpSrPacket) and ours.ssrc == 0x11223344
    assert (ours.sender_info.packet_count, ours.sender_info.octet_count) == (3, 3 * len(SILENCE))
    sent_at = ours.sender_info.ntp_timestamp / 2**32 - 2208988800
    assert before - 0.001 <= sent_at <= after
    # the RTP timestamp of that instant: the third frame's, moved on by the time since
    assert 0 <= (ours.sender_info.rtp_timestamp - (90000 + 2 * 960)) % 2**32 < 48000 * 0.5
    (block,) = ours.reports
    assert (block.ssrc, block.highest_sequence, block.packets_lost) == (0xCAFE, 65536 + 1, 2)
    assert block.fraction_lost == 2 * 256 // 8
    assert block.lsr == ntp_middle(peer_ntp)
    assert 0.05 <= block.dlsr / 65536 <= after - before + 0.5
    assert isinstance(sdes, RtcpSdesPacket) and sdes.chunks[0].items == [(1, b"plane-cname")]
    assert plane.stats(channel)["rtt_s"] is None

    def rr(lsr: int, dlsr: int) -> bytes:
        return peer.tx.protect_rtcp(bytes(RtcpRrPacket(ssrc=0xCAFE, reports=[RtcpReceiverInfo(
            ssrc=0x11223344, fraction_lost=0, packets_lost=0, highest_sequence=3, jitter=0,
            lsr=lsr, dlsr=dlsr)])))

    lsr = ntp_middle(ours.sender_info.ntp_timestamp)
    plane.process(rr(lsr ^ 0x5A5A, 0), peer.address)     # no SR of ours
    plane.process(rr(lsr, 65536 * 60), peer.address)     # it says it waited a minute
    assert plane.stats(channel)["rtt_samples"] == 0
    plane.process(rr(lsr, 0), peer.address)
    answered = time.time()
    stats = plane.stats(channel)
    assert stats["rtt_samples"] == 1 and stats["rtcp_in"] == 4
    assert 0 <= stats["rtt_s"] <= answered - sent_at + 0.001
    assert stats["remote"] == {"fraction_lost": 0, "packets_lost": 0, "highest_sequence": 3,
                               "jitter": 0}
    assert plane.counters()["rtcp_in"] == 4 and plane.counters()["rtcp_out"] == 1


@pytest.mark.parametrize("crypto", CRYPTO)
def test_bad_rtcp_is_dropped_and_counted_and_rtcp_of_a_session_without_it_is_pythons(server,
                                                                                      crypto):
    """Truncated, unauthenticated, replayed and malformed-inside SRTCP: dropped by reason; a
    BYE is seen; remove(bye=True) sends a last report ending in BYE; a session whose RTCP
    aiortc keeps passes its SRTCP up unchanged."""
    from aiortc.rtp import RtcpByePacket, RtcpRrPacket
    profile, key_len, srtp = CRYPTO[crypto]
    plane, peer = Plane(server.fileno(), 4, srtp), Peer(profile, key_len)
    channel = add_rtcp(plane, peer, profile)
    good = peer.tx.protect_rtcp(bytes(RtcpRrPacket(ssrc=0xCAFE, reports=[])))
    assert plane.process(good, peer.address) is None
    assert plane.process(good, peer.address) is None                     # replayed
    forged = bytearray(peer.tx.protect_rtcp(bytes(RtcpRrPacket(ssrc=0xCAFE, reports=[]))))
    forged[-1] ^= 1
    assert plane.process(bytes(forged), peer.address) is None
    assert plane.process(good[:6], peer.address) is None                 # truncated
    inside = bytearray(bytes(RtcpRrPacket(ssrc=0xCAFE, reports=[])))
    inside[3] = 9                                                        # longer than it is
    assert plane.process(peer.tx.protect_rtcp(bytes(inside)), peer.address) is None
    bye = peer.tx.protect_rtcp(bytes(RtcpRrPacket(ssrc=0xCAFE, reports=[]))
                               + bytes(RtcpByePacket(sources=[0xCAFE])))
    assert plane.process(bye, peer.address) is None
    c = plane.counters()
    assert (c["rtcp_in"], c["drop_rtcp_replay"], c["drop_rtcp_auth"],
            c["drop_rtcp_malformed"], c["rtcp_bad_part"], c["rtcp_bye"]) == (3, 1, 1, 1, 1, 1)
    assert plane.stats(channel)["bye"] and c["to_python"] == 0
    assert plane.remove(channel, True)
    last = reports(peer)
    assert isinstance(last[0], RtcpRrPacket) and isinstance(last[-1], RtcpByePacket)
    assert last[-1].sources == [0x11223344]
    other = Peer(profile, key_len)
    add(plane, other, profile)
    theirs = other.tx.protect_rtcp(bytes(RtcpRrPacket(ssrc=7, reports=[])))
    assert plane.process(theirs, other.address) == theirs
    with pytest.raises(ValueError):   # RTP of payload type 72 would read as an SR (RFC 5761)
        plane.add(Peer(profile, key_len).address, None, profile, peer.up_key, peer.down_key, 1,
                  0, 0, 72, b"0", MID_ID, AST_ID, SILENCE, False, rtcp=True)


def test_a_client_session_never_answers_for_the_shared_socket_after_the_table_is_rebuilt(server):
    """The address table is rebuilt once removals leave enough tombstones; a session with a
    socket of its own must not come back into it (found by the fuzzer: its peer's packets on
    the shared socket were then taken for it)."""
    profile, key_len = PROFILES["AES128_CM_SHA1_80"]
    plane, edge = Plane(server.fileno(), 4), Peer(profile, key_len)
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.bind(("127.0.0.1", 0))
    plane.add(edge.address, None, profile, edge.up_key, edge.down_key, 1, 0, 0, 111, b"0",
              MID_ID, AST_ID, SILENCE, False, client.fileno(), b"")
    for _ in range(4):   # enough tombstones for a rebuild (a table of 8 for 4 sessions)
        plane.remove(add(plane, Peer(profile, key_len), profile))
    packet = edge.tx.protect(rtp(1, 0, 5, b"x"))
    assert plane.process(packet, edge.address) == packet   # the shared socket's: Python's
    client.close()


def test_a_peer_that_churns_ssrcs_is_bounded_and_a_bad_padding_count_is_malformed(server):
    """libsrtp keeps a stream per remote SSRC and walks them per packet: a session takes at
    most a few SSRCs that authenticated (found by the fuzzer: 50,000 SSRCs made a packet cost
    309 us); a padding count of 0 is malformed (RFC 3550 5.1: it counts itself)."""
    profile, key_len = PROFILES["AES128_CM_SHA1_80"]
    plane, peer = Plane(server.fileno(), 2), Peer(profile, key_len)
    channel = add(plane, peer, profile)
    for ssrc in range(1, 8):
        plane.process(peer.tx.protect(rtp(1, 0, ssrc, b"s")), peer.address)
    c = plane.counters()
    assert (c["rtp_in"], c["drop_ssrc_limit"]) == (4, 3)
    plane.process(peer.tx.protect(rtp(2, 960, 2, b"again")), peer.address)  # a known one
    assert plane.counters()["rtp_in"] == 5
    bad = bytearray(rtp(3, 1920, 2, b"pad", padding=1))
    bad[-1] = 0
    plane.process(peer.tx.protect(bytes(bad)), peer.address)
    assert plane.counters()["drop_rtp_malformed"] == 1
    with pytest.raises(OverflowError):
        plane.remove(channel + (1 << 32))   # would alias the channel
    assert plane.sessions == 1
    with pytest.raises(RuntimeError):
        plane.__init__(server.fileno(), 2)


def replay_order(indices: list[int], rng) -> list[int]:
    """A receive order of ``indices``: mostly as sent, with local reordering, duplicates,
    packets far behind (outside the replay window) and repeats of the latest."""
    order = []
    for k, index in enumerate(indices):
        order.append(index)
        roll = rng.random()
        if roll < 0.1 and k:
            order.append(indices[rng.randrange(max(0, k - 8), k)])          # late or repeated
        elif roll < 0.13 and k > 40:
            order.append(indices[rng.randrange(0, k - 30)])                # far behind
        elif roll < 0.16 and k + 3 < len(indices):
            order[-1:] = [indices[k + 1], index]                           # early
    return order


@pytest.mark.parametrize("profile_name", ["AEAD_AES_128_GCM", "AEAD_AES_256_GCM"])
def test_the_own_gcm_takes_and_drops_every_packet_as_libsrtp_does(server, profile_name):
    """The same datagrams, in an order with reordering, replays, packets far behind and
    sequence jumps across several rollovers, to a plane on its own AES-GCM and one on libsrtp:
    the same packets delivered, the same drops by reason, RTP and SRTCP."""
    import random

    from aiortc.rtp import RtcpRrPacket
    profile = getattr(pylibsrtp.Policy, "SRTP_PROFILE_" + profile_name)
    key_len = {"AEAD_AES_128_GCM": 28, "AEAD_AES_256_GCM": 44}[profile_name]
    rng = random.Random(7)
    peer = Peer(profile, key_len)
    planes = {srtp: Plane(server.fileno(), 2, srtp) for srtp in ("openssl", "libsrtp")}
    channels = {srtp: add_rtcp(p, peer, profile) for srtp, p in planes.items()}
    # packet indices (ROC << 16 | SEQ) as the peer sends them: dense runs and jumps below 2^15,
    # starting high so the first rollover comes early
    index, sent = 65000, {}
    while len(sent) < 3000:
        sent[index] = peer.tx.protect(rtp(index & 0xFFFF, 960 * index & 0xFFFFFFFF, 0xCAFE,
                                          index.to_bytes(6, "big")))
        index += rng.choice((1, 1, 1, 2, 1, 1, 1, 1, 5, 1100, 20000))
    rtcp = {i: peer.tx.protect_rtcp(bytes(RtcpRrPacket(ssrc=0xCAFE, reports=[])))
            for i in range(1, 400)}
    got = {srtp: [] for srtp in planes}
    for kind, datagrams in (("rtp", sent), ("rtcp", rtcp)):
        for i in replay_order(sorted(datagrams), rng):
            for srtp, plane in planes.items():
                before = plane.counters()
                assert plane.process(datagrams[i], peer.address) is None
                after = plane.counters()
                got[srtp].append((kind, i, {k: after[k] - before[k] for k in after
                                            if after[k] != before[k]}))
    assert got["openssl"] == got["libsrtp"]
    counters = planes["openssl"].counters()
    assert counters["drop_srtp_replay"] > 100 and counters["drop_rtcp_replay"] > 10
    assert planes["openssl"].stats(channels["openssl"])["cycles"] >= 3 * 65536
    payloads = {srtp: [p for _, p in records(plane.take_batch())] for srtp, plane in planes.items()}
    assert payloads["openssl"] == payloads["libsrtp"] and payloads["openssl"]
